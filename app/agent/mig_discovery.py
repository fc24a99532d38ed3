"""A GPU's MIG devices, read through :class:`~app.agent.nvml.Nvml`: the UUID and profile of
each MIG device configured on a GPU in MIG mode.

NVML numbers a GPU's MIG devices 0 to ``nvmlDeviceGetMaxMigDeviceCount`` - 1 (7 on an H100)
whether or not one is configured at an index: an empty index answers NOT_FOUND and is
skipped. The profile comes from the MIG device's name ("NVIDIA H100 80GB HBM3 MIG 1g.10gb":
what follows " MIG "), which is what ``nvidia-smi -L`` shows and what NVIDIA's own device
plugin named resources after: one call per device, and no table of profile ids per GPU
model to keep up to date. A MIG device whose UUID or name cannot be read, or whose name
carries no profile, is left out: it cannot be named to the kubelet, and nothing is handed out
that cannot be named. Reading the layout is all the agent does: it never creates, destroys or
changes MIG devices.
"""

from __future__ import annotations

from functools import partial

from app.agent.nvml import ERROR_GPU_IS_LOST, Nvml, NvmlError, optional
from extender.devices.gpus import MigSlice
from extender.devices.mig_slices import profile_from_name

__all__ = ["read_migs"]


def read_migs(nvml: Nvml, index: int) -> tuple[MigSlice, ...]:
    """The MIG devices configured on GPU ``index`` (in MIG mode), in NVML's order. Raises
    :class:`NvmlError` only for GPU_IS_LOST (the caller publishes the GPU as lost)."""
    try:
        count = nvml.mig_device_count(index)
    except NvmlError as error:
        if error.code == ERROR_GPU_IS_LOST:
            raise
        return ()
    slices = []
    for mig in range(max(0, count)):
        try:
            uuid = nvml.mig_uuid(index, mig)
            profile = profile_from_name(nvml.mig_name(index, mig))
        except NvmlError as error:
            if error.code == ERROR_GPU_IS_LOST:
                raise
            continue  # NOT_FOUND: nothing configured at this index; else unreadable
        if uuid and profile is not None:
            gpu_instance = optional(partial(nvml.mig_gpu_instance_id, index, mig))
            compute_instance = optional(partial(nvml.mig_compute_instance_id, index, mig))
            slices.append(MigSlice(profile, uuid, gpu_instance, compute_instance))
    return tuple(slices)
