"""Which MIG devices the kubelet's device requests for one MIG profile get: the decisions of
the node agent's MIG device plugins (one per profile, ``nvidia.com/mig-<profile>``).

The rules are those of whole GPUs (:mod:`extender.devices.allocation`), per profile. An
``Allocate`` carries only device IDs, so it is matched to the next container, not given its
devices of that profile yet, that asks for exactly the request's size: of the pod part-way
through admission first, then of the pods schedext bound (``schedext.io/mig-uuids``), then of
those it did not; the oldest bind first. The container gets what it reuses from the pod's init
containers (:mod:`extender.devices.containers`), then devices schedext chose for the pod that
no container of it has. A pod schedext did not bind gets a packed pick
(:func:`~extender.devices.mig_slices.pick_slices`, the rule schedext's bind uses) among the
healthy devices of the profile that nobody holds or awaits; with no pod to match, the devices
the kubelet named, if they are free. A MIG device is healthy when its GPU is.

What was given is recorded where GPUs' are (``schedext.io/gpu-allocated``), by container: GPU
and MIG UUIDs never collide, and a pod never takes both. A container given devices of two
profiles is recorded once per profile, each counted by its own plugin.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from extender.devices.allocation import (
    AllocationError,
    Grant,
    NodePod,
    NoPodWaitingError,
    admission_rank,
)
from extender.devices.containers import (
    ContainerGrant,
    NextContainer,
    granted_devices,
    next_container,
    of_devices,
)
from extender.devices.gpus import Gpu
from extender.devices.mig_slices import pick_slices, resource_name

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


@dataclass(frozen=True, slots=True)
class _MigMatch:
    pod: NodePod
    step: NextContainer
    grants: tuple[ContainerGrant, ...]  # the pod's grants of this profile's devices


def _asked(pod: NodePod, profile: str) -> int:
    return dict(pod.mig).get(profile, 0)


def _of_profile(profile: str, profile_of: Mapping[str, str]) -> frozenset[str]:
    return frozenset(uuid for uuid, p in profile_of.items() if p == profile)


def _chosen(pod: NodePod, profile: str, profile_of: Mapping[str, str]) -> tuple[str, ...]:
    """The devices of ``profile`` schedext chose for the pod."""
    return tuple(uuid for uuid in pod.mig_uuids or () if profile_of.get(uuid) == profile)


def _unknown(pod: NodePod, profile_of: Mapping[str, str]) -> list[str]:
    return [uuid for uuid in pod.mig_uuids or () if uuid not in profile_of]


def _match(
    pods: Sequence[NodePod],
    profile: str,
    size: int,
    profile_of: Mapping[str, str],
    *,
    named: Sequence[str] = (),
) -> _MigMatch | None:
    devices = _of_profile(profile, profile_of)
    resource = resource_name(profile)
    found: list[tuple[tuple[int, float, str, str], _MigMatch]] = []
    for pod in pods:
        whole = _asked(pod, profile)
        if whole <= 0:
            continue
        grants = of_devices(pod.recorded(), devices)
        step = next_container(pod.asks(resource, whole=whole), grants, named=named)
        if step is None or step.ask.count != size:
            continue
        rank = admission_rank(pod, placed=pod.mig_uuids is not None)
        found.append((rank, _MigMatch(pod, step, grants)))
    return min(found, key=lambda f: f[0])[1] if found else None


def match_mig_pod(
    pods: Sequence[NodePod],
    profile: str,
    size: int,
    profile_of: Mapping[str, str],
    *,
    named: Sequence[str] = (),
) -> NodePod | None:
    """The pod an ``Allocate`` of ``size`` devices of ``profile`` is for (see the module
    docstring)."""
    found = _match(pods, profile, size, profile_of, named=named)
    return found.pod if found is not None else None


def _in_use(pods: Iterable[NodePod], profile_of: Mapping[str, str]) -> frozenset[str]:
    """The devices given to live pods, and those schedext chose for bound pods."""
    used: set[str] = set()
    for pod in pods:
        used.update(pod.allocated)
        used.update(granted_devices(pod.grants))
        used.update(pod.mig_uuids or ())
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


def _fresh(found: _MigMatch, chosen: Sequence[str], named: Sequence[str]) -> tuple[str, ...]:
    held = set(granted_devices(found.grants))
    left = [u for u in chosen if u not in held]
    ordered = [u for u in left if u in named] + [u for u in left if u not in named]
    taken = set(ordered[: found.step.fresh])
    return tuple(u for u in left if u in taken)


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
    found = _match(pods, profile, size, profile_of, named=requested)
    others = [p for p in pods if found is None or p.uid != found.pod.uid]
    used = _in_use(others, profile_of)
    if found is None:
        if all(u in healthy and u not in used for u in requested):
            return Grant(None, tuple(requested))
        raise NoPodWaitingError(
            f"no pod on this node awaits {size} MIG {profile} devices, and the requested "
            f"devices {list(requested)} are not all healthy and free"
        )
    pod, step = found.pod, found.step
    where = f"pod {pod.key}" + (f" container {step.ask.name}" if step.ask.name else "")
    if pod.mig_uuids is not None:
        if unknown := _unknown(pod, profile_of):
            raise AllocationError(
                f"pod {pod.key} was bound to MIG devices this node does not have: {unknown}"
            )
        chosen = _chosen(pod, profile, profile_of)
        fresh = _fresh(found, chosen, requested)
        if len(fresh) < step.fresh:
            raise AllocationError(
                f"{where} needs {step.fresh} more MIG {profile} devices than schedext chose "
                f"for the pod ({list(chosen)}) leave"
            )
    else:
        held = frozenset(granted_devices(found.grants))
        picked = _own_pick(devices, profile, used | held, step.fresh) if step.fresh else ()
        if picked is None:
            raise AllocationError(
                f"{where} needs {step.fresh} MIG {profile} devices; fewer are healthy and free"
            )
        fresh = picked
    uuids = step.reused + fresh
    if sick := [u for u in uuids if u not in healthy]:
        raise AllocationError(f"MIG devices chosen for {where} are unhealthy: {sick}")
    if taken := [u for u in uuids if u in used]:
        raise AllocationError(f"MIG devices chosen for {where} are in use: {taken}")
    return Grant(pod, uuids, step.ask.name)


def preferred_mig(
    pods: Sequence[NodePod],
    gpus: Sequence[Gpu],
    profile: str,
    *,
    available: Sequence[str],
    must_include: Sequence[str],
    size: int,
) -> tuple[str, ...]:
    """``GetPreferredAllocation`` for ``profile``: what the container of the pod
    :func:`match_mig_pod` finds reuses, then devices schedext chose, when all are available
    and include ``must_include``; else ``must_include`` plus a packed pick among the other
    available healthy devices, those nobody holds or awaits first. Only a hint (the kubelet
    tops up a short answer)."""
    devices = [d for d in mig_devices(gpus) if d.profile == profile]
    profile_of = _profiles(devices)
    offered = {u for u in available if u in profile_of}
    must = tuple(dict.fromkeys(must_include))
    found = _match(pods, profile, size, profile_of, named=must)
    if found is not None and found.pod.mig_uuids is not None:
        chosen = _chosen(found.pod, profile, profile_of)
        uuids = found.step.reused + _fresh(found, chosen, available)
        if len(uuids) == size and offered.issuperset(uuids) and set(must) <= set(uuids):
            return uuids
    need = size - len(must)
    if need <= 0:
        return must[:size]
    others = [p for p in pods if found is None or p.uid != found.pod.uid]
    used = _in_use(others, profile_of) | frozenset(must)
    among = frozenset(offered)
    picked = (
        _own_pick(devices, profile, used, need, among)
        or _own_pick(devices, profile, frozenset(must), need, among)
        or tuple(u for u in sorted(offered) if u not in must)[:need]
    )
    return must + picked
