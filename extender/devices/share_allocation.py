"""Which GPU a share pod's container gets when the kubelet calls ``Allocate`` for the share
handle (:mod:`extender.devices.share_handle`), and the limits it runs under.

The rule is the whole-GPU rule of :mod:`extender.devices.allocation`: the kubelet does not say
which pod a request is for, so it goes to the oldest-bound share pod on the node that has not
been given its GPUs yet and asks for that many of the handle's IDs; it gets the GPUs schedext
chose for it (``schedext.io/gpu-uuids``, else ``schedext.io/gpu-ids``), whatever IDs the
kubelet named. Unlike a whole GPU, a share has no fallback: a share pod schedext did not place
is refused, because nobody chose its GPU and the agent must not guess one that may be full.

Its limits are the share's: ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` (memory per visible device,
by the ordinal the container sees) and ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` (cores), which
the CUDA MPS server enforces when the agent runs one for the GPU (:func:`share_envs`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from extender.devices.allocation import AllocationError, NodePod, chosen_uuids
from extender.devices.gpus import Gpu
from extender.devices.share_handle import ShareHandle, slot_gpu
from extender.names import GPU_IDS

__all__ = [
    "MEMORY_LIMIT_ENV",
    "PIPE_DIRECTORY_ENV",
    "THREAD_PERCENTAGE_ENV",
    "NoShareWaitingError",
    "ShareGrant",
    "grant_share",
    "match_share",
    "preferred_share",
    "share_envs",
]

MEMORY_LIMIT_ENV = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
THREAD_PERCENTAGE_ENV = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
PIPE_DIRECTORY_ENV = "CUDA_MPS_PIPE_DIRECTORY"


class NoShareWaitingError(AllocationError):
    """No share pod on the node waits for this many of the handle's IDs: the pod watch may
    not have shown it yet (the caller may wait for it), or nobody asked."""


@dataclass(frozen=True, slots=True)
class ShareGrant:
    """The GPUs one container gets a share of, the pod it is recorded on, and the share."""

    pod: NodePod
    uuids: tuple[str, ...]
    memory_mib: int
    cores: int


def _devices_left(pod: NodePod) -> int:
    """The GPUs of the pod's share not given to a container yet."""
    if pod.gpu_uuids is not None:
        return sum(1 for uuid in pod.gpu_uuids if uuid not in pod.allocated)
    if pod.gpu_ids is not None:
        return max(0, len(pod.gpu_ids) - len(pod.allocated))
    return max(0, pod.shares - len(pod.allocated))


def _needs(pod: NodePod, handle: ShareHandle) -> int:
    """How many of the handle's IDs the rest of the pod's share asks for."""
    return _devices_left(pod) * handle.per_gpu(pod)


def _admission_order(pod: NodePod) -> tuple[float, str, str]:
    return (pod.bound_at, pod.namespace, pod.name)


def match_share(pods: Sequence[NodePod], handle: ShareHandle, size: int) -> NodePod | None:
    """The share pod an ``Allocate`` (or ``GetPreferredAllocation``) of ``size`` handle IDs is
    for: among the share pods not given all their GPUs, those schedext placed whose remaining
    GPUs ask for exactly ``size`` IDs, then those it did not place (to be refused by name),
    each the oldest bind first (ties by namespace/name). None when nobody waits for ``size``."""
    waiting = sorted(
        (p for p in pods if p.shares > 0 and _devices_left(p) > 0), key=_admission_order
    )
    for placed in (True, False):
        for pod in waiting:
            if (pod.gpu_ids is not None) == placed and _needs(pod, handle) == size:
                return pod
    return None


def grant_share(
    pods: Sequence[NodePod],
    gpus: Sequence[Gpu],
    handle: ShareHandle,
    requested: Sequence[str],
    *,
    one_gpu: bool = False,
) -> ShareGrant:
    """The share one container's ``Allocate`` of ``requested`` handle IDs gets: the GPUs
    schedext chose for :func:`match_share`'s pod. ``one_gpu``: refuse a container that would
    reach more than one GPU (an MPS client talks to one GPU's daemon). Raises
    :class:`NoShareWaitingError` when no pod waits, :class:`AllocationError` otherwise: for a
    pod schedext did not place, or GPUs that are missing, unhealthy, in MIG mode, or held whole
    by another pod."""
    size = len(requested)
    if size == 0:
        raise AllocationError("the kubelet asked for no devices")
    pod = match_share(pods, handle, size)
    if pod is None:
        raise NoShareWaitingError(
            f"no GPU share on this node awaits {size} {handle.resource} (a share pod must be "
            "placed by schedext and seen by the agent before the kubelet admits it)"
        )
    if pod.gpu_ids is None:
        raise AllocationError(
            f"pod {pod.key} asks for a GPU share but schedext did not place it (no {GPU_IDS} "
            "annotation): a share gets only the GPU schedext chose, and nobody chose one. "
            "Schedule it with kube-scheduler and the schedext extender"
        )
    uuid_by_index = {gpu.index: gpu.uuid for gpu in gpus}
    uuids = chosen_uuids(pod, uuid_by_index, size // handle.per_gpu(pod))
    if uuids is None:
        raise AllocationError(
            f"pod {pod.key} was bound to GPUs {list(pod.gpu_ids)} this node does not have"
        )
    by_uuid = {gpu.uuid: gpu for gpu in gpus}
    if missing := [u for u in uuids if u not in by_uuid]:
        raise AllocationError(f"GPUs chosen for pod {pod.key} are not on this node: {missing}")
    if sick := [u for u in uuids if not by_uuid[u].health.healthy]:
        raise AllocationError(f"GPUs chosen for pod {pod.key} are unhealthy: {sick}")
    if sliced := [u for u in uuids if by_uuid[u].mig_enabled]:
        raise AllocationError(f"GPUs chosen for pod {pod.key} are in MIG mode: {sliced}")
    holders = {u: p.key for p in pods if p.gpus > 0 and p.uid != pod.uid for u in p.allocated}
    if held := [f"{u} ({holders[u]})" for u in uuids if u in holders]:
        raise AllocationError(f"GPUs chosen for pod {pod.key} are held whole: {held}")
    if one_gpu and len(uuids) > 1:
        raise AllocationError(
            f"pod {pod.key} asks for shares of {len(uuids)} GPUs in one container: under MPS a "
            "process reaches one GPU's daemon, so ask for one share per container"
        )
    return ShareGrant(pod, uuids, pod.share_memory_mib, pod.share_cores)


def preferred_share(
    pods: Sequence[NodePod],
    gpus: Sequence[Gpu],
    handle: ShareHandle,
    *,
    available: Sequence[str],
    must_include: Sequence[str],
    size: int,
) -> tuple[str, ...]:
    """``GetPreferredAllocation`` for the handle: IDs on the GPUs schedext chose for the pod
    :func:`match_share` finds, so that the kubelet's count per GPU follows the shares (an
    unhealthy GPU's IDs are those of the pods on it). Otherwise ``must_include`` topped up
    with the first available IDs. Only a hint: the kubelet tops up a short answer."""
    must = tuple(dict.fromkeys(must_include))
    offered = [i for i in dict.fromkeys(available) if i not in must]
    pod = match_share(pods, handle, size)
    if pod is not None and pod.gpu_ids is not None:
        uuid_by_index = {gpu.index: gpu.uuid for gpu in gpus}
        chosen = chosen_uuids(pod, uuid_by_index, size // handle.per_gpu(pod)) or ()
        picked = list(must)
        for uuid in chosen:
            on_gpu = [i for i in offered if slot_gpu(i) == uuid and i not in picked]
            taken = sum(1 for i in picked if slot_gpu(i) == uuid)
            picked += on_gpu[: max(0, handle.per_gpu(pod) - taken)]
        if len(picked) == size and {slot_gpu(i) for i in picked} <= set(chosen):
            return tuple(picked)
    return (must + tuple(offered))[:size]


def share_envs(grant: ShareGrant, *, pipe_directory: str | None = None) -> Mapping[str, str]:
    """The environment a share's container gets beside ``NVIDIA_VISIBLE_DEVICES``: the memory
    limit per visible device (ordinals as the container sees them: 0 is the first granted
    GPU), the SM percentage when cores were asked, and the MPS pipe directory when the agent
    runs MPS for the GPU (without a daemon, the limits are read by nobody)."""
    envs = {MEMORY_LIMIT_ENV: ",".join(f"{i}={grant.memory_mib}M" for i in range(len(grant.uuids)))}
    if grant.cores:
        envs[THREAD_PERCENTAGE_ENV] = str(grant.cores)
    if pipe_directory is not None:
        envs[PIPE_DIRECTORY_ENV] = pipe_directory
    return envs
