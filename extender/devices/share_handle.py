"""How a node offers GPU shares to the kubelet: the *handle* resource its device plugin serves,
the device IDs it lists for it, and the node-level share capacity it writes on the Node.

Why two ways. The kubelet's device-plugin client reads ``ListAndWatch`` with gRPC's default
4 MiB receive limit, and one listed device is one unit of the resource. Share memory in MiB as
device IDs would be 81,559 IDs for one H100 (about 650,000 and 13 MB per message on an 8-GPU
node): impossible. So the agent writes share memory and cores on its Node's
``status.capacity`` as plain node-level extended resources (:func:`node_capacity`), which
kube-scheduler's NodeResourcesFit counts like any other, and its device plugin serves only a
small *handle*: the share count resource (``schedext.io/gpu-shares``), ``slots`` IDs per GPU.
The handle is what makes the kubelet call the plugin's ``Allocate`` for a share pod at all,
and the plugin answers with the GPU schedext chose (:mod:`extender.devices.share_allocation`).

When the cluster's share resources have no count resource (gpushare's, memory in GiB), the
handle is the memory resource itself, one ID per GiB of each GPU (80 for an 80 GiB GPU). A
memory resource in MiB with no count resource cannot be served: :func:`share_handle` says so.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from extender.config import ShareResources
from extender.devices.allocation import NodePod
from extender.devices.gpus import Gpu

__all__ = [
    "SLOT_SEPARATOR",
    "ShareHandle",
    "ShareHandleError",
    "node_capacity",
    "sharable",
    "share_handle",
    "slot_gpu",
]

# A handle's device ID: "<GPU UUID>::<k>". UUIDs never contain it ("GPU-6bd689b3-...").
SLOT_SEPARATOR = "::"
CORES_PER_GPU = 100  # the cores resource counts percent of one GPU's SMs
_MIB_PER_GIB = 1024


class ShareHandleError(ValueError):
    """The share resources as configured cannot be served through the kubelet."""


@dataclass(frozen=True, slots=True)
class ShareHandle:
    """The resource the share device plugin registers, and what one of its IDs stands for.

    ``unit_mib`` None: the count resource, ``slots`` IDs per GPU, one per share of a GPU a pod
    may hold (so at most ``slots`` containers hold a share of one GPU at once, as the kubelet
    counts). Else the memory resource, one ID per ``unit_mib`` of each GPU's memory."""

    resource: str
    unit_mib: int | None = None
    slots: int = 32

    def device_ids(self, gpu: Gpu) -> tuple[str, ...]:
        count = self.slots if self.unit_mib is None else gpu.memory_mib // self.unit_mib
        return tuple(f"{gpu.uuid}{SLOT_SEPARATOR}{k}" for k in range(count))

    def per_gpu(self, pod: NodePod) -> int:
        """How many of the handle's IDs the pod names for each GPU it takes a share of."""
        if self.unit_mib is None:
            return 1
        return max(1, -(-pod.share_memory_mib // self.unit_mib))


def share_handle(resources: ShareResources, gpu_resource: str, *, slots: int = 32) -> ShareHandle:
    """The handle for ``resources``; :class:`ShareHandleError` when none can be served."""
    if slots < 1:
        raise ShareHandleError("share slots must be at least 1 per GPU")
    if resources.count is not None:
        if resources.count == gpu_resource:
            raise ShareHandleError(
                f"the share count resource is {gpu_resource}, which the agent serves as whole "
                "GPUs (one device per GPU): one kubelet resource cannot count both"
            )
        return ShareHandle(resources.count, None, slots)
    if resources.memory_unit_mib != _MIB_PER_GIB:
        raise ShareHandleError(
            f"{resources.memory} counts MiB and no share count resource is set: as device "
            "plugin devices that would be one per MiB, about 81,559 per 80 GiB GPU, more than "
            "the kubelet can read"
        )
    return ShareHandle(resources.memory, resources.memory_unit_mib, slots)


def slot_gpu(device_id: str) -> str:
    """The GPU UUID a handle's device ID belongs to."""
    return device_id.rpartition(SLOT_SEPARATOR)[0] or device_id


def sharable(gpu: Gpu) -> bool:
    """Whether shares may go on ``gpu`` now: healthy, and a whole device (MIG slices are
    offered apart)."""
    return gpu.health.healthy and not gpu.mig_enabled


def node_capacity(
    gpus: Iterable[Gpu], resources: ShareResources, handle: ShareHandle
) -> Mapping[str, str]:
    """What the agent writes on its Node's ``status.capacity`` and ``allocatable``: share
    memory (in the resource's unit, whole units per GPU) and cores (100 per GPU) of the
    sharable GPUs. The handle is left out: the kubelet counts it from the plugin's IDs."""
    usable = [g for g in gpus if sharable(g)]
    capacity: dict[str, str] = {}
    if resources.memory != handle.resource:
        unit = resources.memory_unit_mib
        capacity[resources.memory] = str(sum(g.memory_mib // unit for g in usable))
    if resources.cores is not None and resources.cores != handle.resource:
        capacity[resources.cores] = str(CORES_PER_GPU * len(usable))
    return capacity
