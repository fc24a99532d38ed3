"""Which GPU a share pod's container gets when the kubelet calls ``Allocate`` for the share
handle (:mod:`extender.devices.share_handle`), and the limits it runs under.

The rule is the whole-GPU rule of :mod:`extender.devices.allocation`: the kubelet does not say
which pod or container a request is for, so it goes to the next container, not given its
share yet, of the share pod part-way through admission, else of the oldest-bound share pod on
the node, that asks for that many of the handle's IDs; it gets what it reuses from the pod's
init containers, then GPUs schedext chose for the pod (``schedext.io/gpu-uuids``, else
``schedext.io/gpu-ids``) that no container of it has, whatever IDs the kubelet named. Unlike
a whole GPU, a share has no fallback: a share pod schedext did not place is refused, because
nobody chose its GPU and the agent must not guess one that may be full.

Its limits are the share's: ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` (memory per visible device,
by the ordinal the container sees) and ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` (cores), which
the CUDA MPS server enforces when the agent runs one for the GPU (:func:`share_envs`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from extender.devices.allocation import (
    AllocationError,
    NodePod,
    NoPodWaitingError,
    admission_rank,
    chosen_uuids,
    fresh_chosen,
)
from extender.devices.containers import ContainerAsk, NextContainer, next_container
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


class NoShareWaitingError(NoPodWaitingError):
    """No share pod on the node waits for this many of the handle's IDs: the pod watch may
    not have shown it yet (the caller may wait for it), or nobody asked."""


@dataclass(frozen=True, slots=True)
class ShareGrant:
    """The GPUs one container gets a share of, the pod it is recorded on, and the share."""

    pod: NodePod
    uuids: tuple[str, ...]
    memory_mib: int
    cores: int
    container: str = ""  # the container's name ("" where its pod's containers are unknown)


@dataclass(frozen=True, slots=True)
class _ShareMatch:
    pod: NodePod
    step: NextContainer


def _asks(pod: NodePod, handle: ShareHandle) -> tuple[ContainerAsk, ...]:
    """The pod's containers that ask for a share, in GPUs (the handle names each GPU
    ``per_gpu`` times)."""
    return pod.asks(handle.resource, whole=pod.shares, per_device=handle.per_gpu(pod))


def _slot_gpus(ids: Sequence[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(slot_gpu(i) for i in ids))


def match_share(
    pods: Sequence[NodePod], handle: ShareHandle, size: int, *, named: Sequence[str] = ()
) -> NodePod | None:
    """The share pod an ``Allocate`` (or ``GetPreferredAllocation``) of ``size`` handle IDs is
    for: the one whose next container asks for that many, the pod part-way through admission
    first, then those schedext placed, then those it did not (to be refused by name), each the
    oldest bind first (ties by namespace/name). None when nobody waits for ``size``."""
    found = _match(pods, handle, size, named=named)
    return found.pod if found is not None else None


def _match(
    pods: Sequence[NodePod], handle: ShareHandle, size: int, *, named: Sequence[str] = ()
) -> _ShareMatch | None:
    gpus_named = _slot_gpus(named)
    found: list[tuple[tuple[int, float, str, str], _ShareMatch]] = []
    for pod in pods:
        if pod.shares <= 0:
            continue
        step = next_container(_asks(pod, handle), pod.recorded(), named=gpus_named)
        if step is None or step.ask.count * handle.per_gpu(pod) != size:
            continue
        rank = admission_rank(pod, placed=pod.gpu_ids is not None)
        found.append((rank, _ShareMatch(pod, step)))
    return min(found, key=lambda f: f[0])[1] if found else None


def grant_share(
    pods: Sequence[NodePod],
    gpus: Sequence[Gpu],
    handle: ShareHandle,
    requested: Sequence[str],
    *,
    one_gpu: bool = False,
) -> ShareGrant:
    """The share one container's ``Allocate`` of ``requested`` handle IDs gets: what it reuses,
    then GPUs schedext chose for :func:`match_share`'s pod. ``one_gpu``: refuse a container
    that would reach more than one GPU (an MPS client talks to one GPU's daemon). Raises
    :class:`NoShareWaitingError` when no pod waits, :class:`AllocationError` otherwise: for a
    pod schedext did not place, or GPUs that are missing, unhealthy, in MIG mode, or held whole
    by another pod."""
    size = len(requested)
    if size == 0:
        raise AllocationError("the kubelet asked for no devices")
    found = _match(pods, handle, size, named=requested)
    if found is None:
        raise NoShareWaitingError(
            f"no GPU share on this node awaits {size} {handle.resource} (a share pod must be "
            "placed by schedext and seen by the agent before the kubelet admits it)"
        )
    pod, step = found.pod, found.step
    if pod.gpu_ids is None:
        raise AllocationError(
            f"pod {pod.key} asks for a GPU share but schedext did not place it (no {GPU_IDS} "
            "annotation): a share gets only the GPU schedext chose, and nobody chose one. "
            "Schedule it with kube-scheduler and the schedext extender"
        )
    uuid_by_index = {gpu.index: gpu.uuid for gpu in gpus}
    chosen = chosen_uuids(pod, uuid_by_index)
    if chosen is None:
        raise AllocationError(
            f"pod {pod.key} was bound to GPUs {list(pod.gpu_ids)} this node does not have"
        )
    fresh = fresh_chosen(pod, chosen, step.fresh, named=_slot_gpus(requested))
    where = f"pod {pod.key}" + (f" container {step.ask.name}" if step.ask.name else "")
    if len(fresh) < step.fresh:
        raise AllocationError(
            f"{where} needs shares of {step.fresh} more GPUs than the {len(chosen)} schedext "
            f"chose for the pod leave"
        )
    uuids = step.reused + fresh
    by_uuid = {gpu.uuid: gpu for gpu in gpus}
    if missing := [u for u in uuids if u not in by_uuid]:
        raise AllocationError(f"GPUs chosen for {where} are not on this node: {missing}")
    if sick := [u for u in uuids if not by_uuid[u].health.healthy]:
        raise AllocationError(f"GPUs chosen for {where} are unhealthy: {sick}")
    if sliced := [u for u in uuids if by_uuid[u].mig_enabled]:
        raise AllocationError(f"GPUs chosen for {where} are in MIG mode: {sliced}")
    holders = {u: p.key for p in pods if p.gpus > 0 and p.uid != pod.uid for u in p.allocated}
    if held := [f"{u} ({holders[u]})" for u in uuids if u in holders]:
        raise AllocationError(f"GPUs chosen for {where} are held whole: {held}")
    if one_gpu and len(uuids) > 1:
        raise AllocationError(
            f"{where} asks for shares of {len(uuids)} GPUs in one container: under MPS a "
            "process reaches one GPU's daemon, so ask for one share per container"
        )
    return ShareGrant(pod, uuids, pod.share_memory_mib, pod.share_cores, step.ask.name)


def preferred_share(
    pods: Sequence[NodePod],
    gpus: Sequence[Gpu],
    handle: ShareHandle,
    *,
    available: Sequence[str],
    must_include: Sequence[str],
    size: int,
) -> tuple[str, ...]:
    """``GetPreferredAllocation`` for the handle: IDs on the GPUs the container of
    :func:`match_share`'s pod will get (what it reuses, then GPUs schedext chose), so that the
    kubelet's count per GPU follows the shares (an unhealthy GPU's IDs are those of the pods
    on it). Otherwise ``must_include`` topped up with the first available IDs. Only a hint:
    the kubelet tops up a short answer."""
    must = tuple(dict.fromkeys(must_include))
    offered = [i for i in dict.fromkeys(available) if i not in must]
    found = _match(pods, handle, size, named=must)
    if found is not None and found.pod.gpu_ids is not None:
        pod = found.pod
        uuid_by_index = {gpu.index: gpu.uuid for gpu in gpus}
        chosen = chosen_uuids(pod, uuid_by_index) or ()
        fresh = fresh_chosen(pod, chosen, found.step.fresh, named=_slot_gpus(available))
        targets = found.step.reused + fresh
        picked = list(must)
        for uuid in targets:
            on_gpu = [i for i in offered if slot_gpu(i) == uuid and i not in picked]
            taken = sum(1 for i in picked if slot_gpu(i) == uuid)
            picked += on_gpu[: max(0, handle.per_gpu(pod) - taken)]
        if len(picked) == size and {slot_gpu(i) for i in picked} <= set(targets):
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
