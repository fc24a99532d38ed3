"""Which GPUs the kubelet's device requests get: the pods on one node as the agent sees them
(:class:`NodePod`), and the matching of an ``Allocate`` or ``GetPreferredAllocation`` to the
pod schedext bound and to the container in it.

The kubelet does not say which pod or container a device request is for: ``Allocate`` carries
only device IDs. It admits one pod at a time and asks for each of its containers' devices in
turn (:mod:`extender.devices.containers` has its rules, init and sidecar containers
included). So a request goes to the next container, not given its devices yet, of:

1. a pod already part-way through (some container given its devices): the pod the kubelet is
   admitting;
2. else the pod schedext bound longest ago (its PodScheduled time): the kubelet admits pods in
   the order it sees them, and of the pods still waiting, the one bound first comes first;
3. else a pod schedext did not bind, oldest first;

whose next container asks for exactly that many devices. The container gets the devices it
reuses from the pod's init containers, then devices schedext chose for the pod that no
container of it has: never a device outside that set, never an unhealthy one, never one that
another pod holds or awaits. A pod schedext did not bind gets the agent's own NVLink-aware
pick among the free devices (:func:`own_pick`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from extender import names
from extender.devices.containers import (
    ContainerAsk,
    ContainerGrant,
    NextContainer,
    PodContainer,
    Role,
    asks_for,
    granted_devices,
    next_container,
)
from extender.devices.gpus import Gpu
from extender.devices.placement import pick_gpus

__all__ = [
    "AllocationError",
    "Grant",
    "Match",
    "NoPodWaitingError",
    "NodePod",
    "admission_rank",
    "chosen_uuids",
    "fresh_chosen",
    "grant",
    "in_use",
    "match_pod",
    "own_pick",
    "preferred",
]


@dataclass(frozen=True, slots=True)
class NodePod:
    """A live pod on the agent's node that asks for the GPU resource, a share of GPUs, or MIG
    devices."""

    uid: str
    namespace: str
    name: str
    gpus: int  # the GPU resource, summed over the pod's containers (init containers: max)
    # schedext.io/gpu-ids: the indices schedext chose; None when schedext did not bind it.
    gpu_ids: tuple[int, ...] | None = None
    # schedext.io/gpu-uuids: the same GPUs by UUID, when the node published UUIDs at bind.
    gpu_uuids: tuple[str, ...] | None = None
    # schedext.io/gpu-allocated: the UUIDs the agent already gave this pod's containers.
    allocated: tuple[str, ...] = ()
    # When it was bound (its PodScheduled condition's lastTransitionTime, Unix seconds; the
    # creation time when absent): the oldest bind is admitted first.
    bound_at: float = 0.0
    # MIG devices instead of GPUs: per profile, how many (extender.devices.mig_allocation),
    # and schedext.io/mig-uuids, the ones schedext chose (None: it did not bind the pod).
    mig: tuple[tuple[str, int], ...] = ()
    mig_uuids: tuple[str, ...] | None = None
    # A share of GPUs instead of whole ones (``gpus`` is then 0): on ``shares`` distinct GPUs,
    # this much memory (MiB) and compute (percent of the SMs; 0: none asked) on each; what
    # bind wrote (schedext.io/gpu-share-*), else what the pod's resources ask.
    shares: int = 0
    share_memory_mib: int = 0
    share_cores: int = 0
    # Its containers in the kubelet's order, with the devices each asks for; empty when not
    # known (then the pod reads as one container asking for all of them).
    containers: tuple[PodContainer, ...] = ()
    # schedext.io/gpu-allocated by container: what the agent gave each. ``allocated`` is the
    # same devices for the whole pod.
    grants: tuple[ContainerGrant, ...] = ()

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    def recorded(self) -> tuple[ContainerGrant, ...]:
        """The grants, or ``allocated`` as one unnamed grant where no container is named."""
        if self.grants:
            return self.grants
        return (ContainerGrant("", self.allocated),) if self.allocated else ()

    def asks(self, resource: str, *, whole: int, per_device: int = 1) -> tuple[ContainerAsk, ...]:
        """Its containers that ask for ``resource``, as device counts; one unnamed container
        asking for ``whole`` devices when its containers are not known."""
        found = asks_for(self.containers, resource, per_device=per_device)
        if found or self.containers:
            return found
        return (ContainerAsk("", Role.APP, whole),) if whole > 0 else ()


class AllocationError(ValueError):
    """Why an ``Allocate`` cannot be answered (the RPC's status message, for ``kubectl
    describe``): the kubelet then fails the container, and retries it, rather than start it
    on GPUs it may not have."""


class NoPodWaitingError(AllocationError):
    """No pod on the node waits for this request, and the devices the kubelet named may not
    be given to a pod nobody has seen: the pod watch may not have shown the pod yet (the
    caller may wait for it), or nobody asked."""


@dataclass(frozen=True, slots=True)
class Grant:
    """The GPUs one container gets, and the pod they are recorded on (None: no pod on this
    node was seen waiting for them, so nothing can be recorded; see :func:`grant`)."""

    pod: NodePod | None
    uuids: tuple[str, ...]
    container: str = ""  # the container's name ("" where its pod's containers are unknown)


@dataclass(frozen=True, slots=True)
class Match:
    """The pod a request is for, and what its next container gets from its own devices."""

    pod: NodePod
    step: NextContainer


def admission_rank(pod: NodePod, *, placed: bool) -> tuple[int, float, str, str]:
    """Which pod a request goes to first, lowest first (the module docstring's order): the
    pod part-way through admission, then pods schedext ``placed``, then the others, each the
    oldest bind first (ties by namespace/name). Shares and MIG devices rank alike."""
    tier = 0 if pod.recorded() else 1 if placed else 2
    return (tier, pod.bound_at, pod.namespace, pod.name)


def match_pod(
    pods: Sequence[NodePod],
    size: int,
    *,
    resource: str = names.GPU_RESOURCE,
    named: Sequence[str] = (),
) -> Match | None:
    """The pod (and its next container) an ``Allocate`` or ``GetPreferredAllocation`` of
    ``size`` whole GPUs of ``resource`` is for, in the order of the module docstring; the
    devices the kubelet ``named`` go first among those the container reuses. None when no pod
    waits for ``size`` GPUs (the pod watch may lag the kubelet: the caller decides what
    then)."""
    found: list[tuple[tuple[int, float, str, str], Match]] = []
    for pod in pods:
        if pod.gpus <= 0:
            continue
        step = next_container(pod.asks(resource, whole=pod.gpus), pod.recorded(), named=named)
        if step is None or step.ask.count != size:
            continue
        found.append((admission_rank(pod, placed=pod.gpu_ids is not None), Match(pod, step)))
    return min(found, key=lambda f: f[0])[1] if found else None


def chosen_uuids(pod: NodePod, uuid_by_index: Mapping[int, str]) -> tuple[str, ...] | None:
    """Every GPU schedext chose for ``pod``, by UUID: ``gpu_uuids`` when the bind wrote them,
    else ``gpu_ids`` through ``uuid_by_index``. None when the pod names an index this node
    does not have (or schedext did not bind it): better to refuse than to guess which GPU was
    meant."""
    if pod.gpu_uuids is not None:
        return pod.gpu_uuids
    if pod.gpu_ids is None or any(i not in uuid_by_index for i in pod.gpu_ids):
        return None
    return tuple(uuid_by_index[i] for i in pod.gpu_ids)


def fresh_chosen(
    pod: NodePod, chosen: Sequence[str], count: int, *, named: Sequence[str] = ()
) -> tuple[str, ...]:
    """``count`` of the devices schedext chose for the pod that no container of it holds, in
    the chosen order: those the kubelet ``named`` when there is a choice (so that its books
    name what the container gets); fewer when fewer are left."""
    held = set(granted_devices(pod.recorded()))
    left = [u for u in chosen if u not in held]
    taken = set(([u for u in left if u in named] + [u for u in left if u not in named])[:count])
    return tuple(u for u in left if u in taken)


def own_pick(
    free: Sequence[int], groups: Sequence[Sequence[int]], size: int
) -> tuple[int, ...] | None:
    """The agent's own choice for a pod schedext did not bind, among ``free`` (healthy, not in
    use) GPU indices: the same NVLink rule as schedext's bind (:func:`pick_gpus`)."""
    return pick_gpus(sorted(set(free)), groups, size)


def in_use(pods: Iterable[NodePod], uuid_by_index: Mapping[int, str]) -> frozenset[str]:
    """The UUIDs a grant to another pod must leave alone: those given to live pods, and
    those schedext chose for bound pods (their ``Allocate`` may still come), shares included
    (a GPU that carries a share is nobody's whole GPU)."""
    used: set[str] = set()
    for pod in pods:
        used.update(pod.allocated)
        used.update(granted_devices(pod.grants))
        if pod.gpu_ids is not None:
            used.update(chosen_uuids(pod, uuid_by_index) or ())
    return frozenset(used)


def _by_index(gpus: Iterable[Gpu]) -> dict[int, str]:
    return {gpu.index: gpu.uuid for gpu in gpus}


def grant(
    pods: Sequence[NodePod],
    gpus: Sequence[Gpu],
    groups: Sequence[Sequence[int]],
    requested: Sequence[str],
    *,
    resource: str = names.GPU_RESOURCE,
) -> Grant:
    """The GPUs one container's ``Allocate`` of ``requested`` device IDs (UUIDs) gets.

    The pod and container are :func:`match_pod`'s. The container of a pod schedext bound gets
    what it reuses, then GPUs schedext chose, whatever the kubelet named. One of a pod schedext
    did not bind gets what it reuses, then :func:`own_pick` among the healthy GPUs nobody
    holds or awaits. No matching pod: ``Grant(None, requested)`` when every requested GPU is
    healthy and nobody holds or awaits it (the caller may first wait for the pod watch).
    Anything else raises :class:`AllocationError`; an unhealthy GPU is never granted."""
    size = len(requested)
    if size == 0:
        raise AllocationError("the kubelet asked for no devices")
    uuid_by_index = _by_index(gpus)
    healthy = {gpu.uuid for gpu in gpus if gpu.health.healthy}
    match = match_pod(pods, size, resource=resource, named=requested)
    others = [p for p in pods if match is None or p.uid != match.pod.uid]
    used = in_use(others, uuid_by_index)
    if match is None:
        if all(u in healthy and u not in used for u in requested):
            return Grant(None, tuple(requested))
        raise NoPodWaitingError(
            f"no pod on this node awaits {size} GPUs, and the requested devices "
            f"{list(requested)} are not all healthy and free"
        )
    pod, step = match.pod, match.step
    where = f"pod {pod.key}" + (f" container {step.ask.name}" if step.ask.name else "")
    if pod.gpu_ids is not None:
        chosen = chosen_uuids(pod, uuid_by_index)
        if chosen is None:
            raise AllocationError(
                f"pod {pod.key} was bound to GPUs {list(pod.gpu_ids)} this node does not have"
            )
        fresh = fresh_chosen(pod, chosen, step.fresh, named=requested)
        if len(fresh) < step.fresh:
            raise AllocationError(
                f"{where} needs {step.fresh} more GPUs than the {len(chosen)} schedext chose "
                f"for the pod ({list(pod.gpu_ids)}) leave"
            )
        uuids = step.reused + fresh
    else:
        held = set(granted_devices(pod.recorded()))
        free = [g.index for g in gpus if g.uuid in healthy and g.uuid not in used | held]
        picked = own_pick(free, groups, step.fresh) if step.fresh else ()
        if picked is None:
            raise AllocationError(
                f"{where} needs {step.fresh} GPUs; {len(free)} are healthy and free"
            )
        uuids = step.reused + tuple(uuid_by_index[i] for i in picked)
    if sick := [u for u in uuids if u not in healthy]:
        raise AllocationError(f"GPUs chosen for {where} are unhealthy: {sick}")
    if taken := [u for u in uuids if u in used]:
        raise AllocationError(f"GPUs chosen for {where} are in use: {taken}")
    return Grant(pod, uuids, step.ask.name)


def preferred(
    pods: Sequence[NodePod],
    gpus: Sequence[Gpu],
    groups: Sequence[Sequence[int]],
    *,
    available: Sequence[str],
    must_include: Sequence[str],
    size: int,
    resource: str = names.GPU_RESOURCE,
) -> tuple[str, ...]:
    """``GetPreferredAllocation``: which ``size`` of the ``available`` device IDs (UUIDs) the
    kubelet should pick, so that its own bookkeeping names the GPUs ``Allocate`` will grant.

    For the container :func:`match_pod` finds in a pod schedext bound: what it reuses (the
    kubelet's ``must_include``) and GPUs schedext chose, when all are available. Otherwise
    ``must_include`` plus an NVLink-aware pick among the other available healthy GPUs,
    avoiding those other pods hold or await when it can. Only a hint: may be shorter than
    ``size`` (the kubelet tops up)."""
    uuid_by_index = _by_index(gpus)
    index_by_uuid = {gpu.uuid: gpu.index for gpu in gpus}
    healthy = {gpu.uuid for gpu in gpus if gpu.health.healthy}
    offered = {u for u in available if u in healthy}
    must = tuple(dict.fromkeys(must_include))
    match = match_pod(pods, size, resource=resource, named=must)
    if match is not None and match.pod.gpu_ids is not None:
        chosen = chosen_uuids(match.pod, uuid_by_index) or ()
        fresh = fresh_chosen(match.pod, chosen, match.step.fresh, named=available)
        uuids = match.step.reused + fresh
        if len(uuids) == size and offered.issuperset(uuids) and set(must) <= set(uuids):
            return uuids
    need = size - len(must)
    if need <= 0:
        return must[:size]
    others = [p for p in pods if match is None or p.uid != match.pod.uid]
    used = in_use(others, uuid_by_index)
    candidates = [index_by_uuid[u] for u in offered if u in index_by_uuid and u not in must]
    clear = [i for i in candidates if uuid_by_index[i] not in used]
    # The must-include GPUs' NVLink peers first: best fit alone would happily cross a link.
    linked = {i for g in groups if any(uuid_by_index.get(j) in must for j in g) for i in g}
    picked = (
        own_pick([i for i in clear if i in linked], groups, need)
        or own_pick(clear, groups, need)
        or own_pick(candidates, groups, need)
        or tuple(sorted(candidates))[:need]
    )
    return must + tuple(uuid_by_index[i] for i in picked)
