"""The device nodes a container needs for the GPUs and MIG devices it is given.

A GPU's node is ``/dev/nvidia<minor>``, with NVML's minor number: not its index, which NVML
orders by PCI bus while the driver numbers nodes as it probes the GPUs, so on many machines
the two differ and a node named by index is another GPU's (:attr:`Gpu.device_node`).

A MIG device is reached through its GPU's node and two capability nodes, one for its GPU
instance and one for its compute instance: ``/dev/nvidia-caps/nvidia-cap<N>``, where the driver
lists N for each capability in ``/proc/driver/nvidia-caps/mig-minors``::

    gpu0/gi1/access 12
    gpu0/gi1/ci0/access 13

``gpu0`` there is the GPU's minor number, ``gi``/``ci`` the instance ids NVML gives for the MIG
device. Where any of these is unknown the capability nodes are left out, and the NVIDIA
container runtime, which reads ``NVIDIA_VISIBLE_DEVICES``, adds them as before.
"""

from __future__ import annotations

from collections.abc import Mapping

from extender.devices.gpus import Gpu, MigSlice

__all__ = ["CAPS_DIRECTORY", "mig_capability_nodes", "parse_mig_minors"]

CAPS_DIRECTORY = "nvidia-caps"  # under /dev
_MAX_LINES = 100_000  # the driver lists about 135 capabilities per possible GPU (4,322 for 32)


def parse_mig_minors(text: str) -> dict[str, int]:
    """``mig-minors`` as {capability: minor}; lines that do not read are skipped."""
    minors: dict[str, int] = {}
    for line in text.splitlines()[:_MAX_LINES]:
        name, _, number = line.strip().rpartition(" ")
        if name and number.isdigit():
            minors[name] = int(number)
    return minors


def mig_capability_nodes(gpu: Gpu, mig: MigSlice, minors: Mapping[str, int]) -> tuple[str, ...]:
    """The capability nodes (under /dev) of ``mig`` on ``gpu``: its GPU instance's, then its
    compute instance's; empty when the GPU's minor, the instance ids or the driver's minors
    are not known."""
    if gpu.minor is None or mig.gpu_instance is None or mig.compute_instance is None:
        return ()
    instance = f"gpu{gpu.minor}/gi{mig.gpu_instance}"
    names = (f"{instance}/access", f"{instance}/ci{mig.compute_instance}/access")
    if any(name not in minors for name in names):
        return ()
    return tuple(f"{CAPS_DIRECTORY}/nvidia-cap{minors[name]}" for name in names)
