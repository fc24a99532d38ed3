"""Which MIG devices the kubelet's device requests for one MIG profile get: the decisions of
the node agent's MIG device plugins (one per profile, ``nvidia.com/mig-<profile>``).

The rules are those of whole GPUs (:mod:`extender.devices.allocation`), per profile. An
``Allocate`` carries only device IDs, so it is matched to a pod on this node still waiting for
MIG devices of that profile: first the pods schedext bound (``schedext.io/mig-uuids``) whose
chosen devices of the profile not yet given number exactly the request's size, then the pods
it did not bind that still need that many; the oldest bind first. A pod schedext bound gets
exactly the devices schedext chose. A pod it did not bind gets a packed pick
(:func:`~extender.devices.mig_slices.pick_slices`, the rule schedext's bind uses) among the
healthy devices of the profile that nobody holds or awaits; with no pod to match, the devices
the kubelet named, if they are free. A MIG device is healthy when its GPU is.

What was given is recorded where GPUs' are (``schedext.io/gpu-allocated``): GPU and MIG UUIDs
never collide, and a pod never takes both.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from extender.devices.allocation import AllocationError, Grant, NodePod
from extender.devices.gpus import Gpu
from extender.devices.mig_slices import pick_slices

__all__ = ["MigDevice", "grant_mig", "match_mig_pod", "mig_devices", "preferred_mig"]


@dataclass(frozen=True, slots=True)
class MigDevice:
    """One MIG device of this node, as its device plugin lists it."""

    gpu: int  # the GPU it is on (NVML index)
    profile: str
    uuid: str
    healthy: bool  # its GPU's health
    numa_node: int | None = None


def mig_devices(gpus: Iterable[Gpu]) -> tuple[MigDevice, ...]:
    """Every MIG device of the GPUs in MIG mode, in GPU order then NVML's."""
    return tuple(
        MigDevice(gpu.index, mig.profile, mig.uuid, gpu.health.healthy, gpu.numa_node)
        for gpu in gpus
        if gpu.mig_enabled
        for mig in gpu.migs
    )


def _profiles(devices: Iterable[MigDevice]) -> dict[str, str]:
    return {device.uuid: device.profile for device in devices}


def _asked(pod: NodePod, profile: str) -> int:
    return dict(pod.mig).get(profile, 0)


def _waiting(pod: NodePod, profile: str, profile_of: Mapping[str, str]) -> int:
    """How many devices of ``profile`` the pod asks for and has not been given."""
    given = sum(1 for uuid in pod.allocated if profile_of.get(uuid) == profile)
    return _asked(pod, profile) - given


def _chosen(pod: NodePod, profile: str, profile_of: Mapping[str, str]) -> tuple[str, ...]:
    """The devices of ``profile`` schedext chose for the pod that it has not been given."""
    return tuple(
        uuid
        for uuid in pod.mig_uuids or ()
        if profile_of.get(uuid) == profile and uuid not in pod.allocated
    )


def _unknown(pod: NodePod, profile_of: Mapping[str, str]) -> list[str]:
    return [uuid for uuid in pod.mig_uuids or () if uuid not in profile_of]


def _admission_order(pod: NodePod) -> tuple[float, str, str]:
    return (pod.bound_at, pod.namespace, pod.name)


def match_mig_pod(
    pods: Sequence[NodePod], profile: str, size: int, profile_of: Mapping[str, str]
) -> NodePod | None:
    """The pod an ``Allocate`` of ``size`` devices of ``profile`` is for (see the module
    docstring); a pod whose record names devices this node does not have is matched by what
    it still needs, so that its ``Allocate`` is refused with that reason."""
    waiting = sorted(
        (p for p in pods if _waiting(p, profile, profile_of) > 0), key=_admission_order
    )
    for pod in waiting:
        if pod.mig_uuids is None:
            continue
        if _unknown(pod, profile_of):
            left = _waiting(pod, profile, profile_of)
        else:
            left = len(_chosen(pod, profile, profile_of))
        if left == size:
            return pod
    for pod in waiting:
        if pod.mig_uuids is None and _waiting(pod, profile, profile_of) == size:
            return pod
    return None


def _in_use(pods: Iterable[NodePod], profile_of: Mapping[str, str]) -> frozenset[str]:
    """The devices allocated to live pods, and those schedext chose for pods still waiting."""
    used: set[str] = set()
    for pod in pods:
        used.update(pod.allocated)
        used.update(uuid for uuid in pod.mig_uuids or () if uuid not in pod.allocated)
    return frozenset(u for u in used if u in profile_of)


def _own_pick(
    devices: Sequence[MigDevice],
    profile: str,
    used: frozenset[str],
    size: int,
    among: frozenset[str] | None = None,
) -> tuple[str, ...] | None:
    """A packed pick of ``size`` healthy devices of ``profile`` that are not ``used`` (and
    are ``among`` these, when given): onto the GPUs with the most devices in use first."""
    free = [
        (d.gpu, d.uuid)
        for d in devices
        if d.profile == profile
        and d.healthy
        and d.uuid not in used
        and (among is None or d.uuid in among)
    ]
    busy = Counter(d.gpu for d in devices if d.uuid in used)
    return pick_slices(free, busy, size)


def grant_mig(
    pods: Sequence[NodePod], gpus: Sequence[Gpu], profile: str, requested: Sequence[str]
) -> Grant:
    """The MIG devices of ``profile`` one container's ``Allocate`` of ``requested`` device
    IDs gets (see the module docstring); :class:`AllocationError` when none may be given,
    and never a device on an unhealthy GPU."""
    size = len(requested)
    if size == 0:
        raise AllocationError("the kubelet asked for no devices")
    devices = mig_devices(gpus)
    profile_of = _profiles(devices)
    healthy = {d.uuid for d in devices if d.healthy and d.profile == profile}
    pod = match_mig_pod(pods, profile, size, profile_of)
    others = [p for p in pods if pod is None or p.uid != pod.uid]
    used = _in_use(others, profile_of)
    if pod is not None and pod.mig_uuids is not None:
        if unknown := _unknown(pod, profile_of):
            raise AllocationError(
                f"pod {pod.key} was bound to MIG devices this node does not have: {unknown}"
            )
        uuids = _chosen(pod, profile, profile_of)[:size]
        if sick := [u for u in uuids if u not in healthy]:
            raise AllocationError(f"MIG devices chosen for pod {pod.key} are unhealthy: {sick}")
        if taken := [u for u in uuids if u in used]:
            raise AllocationError(f"MIG devices chosen for pod {pod.key} are in use: {taken}")
        return Grant(pod, uuids)
    if pod is not None:
        picked = _own_pick(devices, profile, used, size)
        if picked is None:
            raise AllocationError(
                f"pod {pod.key} needs {size} MIG {profile} devices; fewer are healthy and free"
            )
        return Grant(pod, picked)
    if all(u in healthy and u not in used for u in requested):
        return Grant(None, tuple(requested))
    raise AllocationError(
        f"no pod on this node awaits {size} MIG {profile} devices, and the requested devices "
        f"{list(requested)} are not all healthy and free"
    )


def preferred_mig(
    pods: Sequence[NodePod],
    gpus: Sequence[Gpu],
    profile: str,
    *,
    available: Sequence[str],
    must_include: Sequence[str],
    size: int,
) -> tuple[str, ...]:
    """``GetPreferredAllocation`` for ``profile``: the devices schedext chose for the pod
    :func:`match_mig_pod` finds, when all are available and include ``must_include``; else
    ``must_include`` plus a packed pick among the other available healthy devices, those
    nobody holds or awaits first. Only a hint (the kubelet tops up a short answer)."""
    devices = [d for d in mig_devices(gpus) if d.profile == profile]
    profile_of = _profiles(devices)
    offered = {u for u in available if u in profile_of}
    must = tuple(dict.fromkeys(must_include))
    pod = match_mig_pod(pods, profile, size, profile_of)
    if pod is not None and pod.mig_uuids is not None:
        uuids = _chosen(pod, profile, profile_of)[:size]
        if len(uuids) == size and offered.issuperset(uuids) and set(must) <= set(uuids):
            return uuids
    need = size - len(must)
    if need <= 0:
        return must[:size]
    others = [p for p in pods if pod is None or p.uid != pod.uid]
    used = _in_use(others, profile_of) | frozenset(must)
    among = frozenset(offered)
    picked = (
        _own_pick(devices, profile, used, need, among)
        or _own_pick(devices, profile, frozenset(must), need, among)
        or tuple(u for u in sorted(offered) if u not in must)[:need]
    )
    return must + picked
