"""Which GPUs the kubelet's device requests get: the pods on one node as the agent sees them
(:class:`NodePod`), and the matching of an ``Allocate`` or ``GetPreferredAllocation`` to the
pod schedext bound.

The kubelet does not say which pod a device request is for: ``Allocate`` carries only device
IDs. The agent therefore matches it to a pod bound to this node that has not been given its
GPUs yet, the oldest bind first, and answers with the GPUs schedext chose for that pod, not
those the kubelet named.

Why the oldest bind: the kubelet admits pods one at a time, in the order it sees them, and
asks for a pod's devices while admitting it; of the pods still waiting for their GPUs, the
one bound first is the one the kubelet reaches first. :func:`match_pod` states the rule; the
decisions below (:func:`grant` for ``Allocate``, :func:`preferred` for
``GetPreferredAllocation``) build on it and never hand out an unhealthy GPU or one that is
allocated to, or chosen for, another pod.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from extender.devices.gpus import Gpu
from extender.devices.placement import pick_gpus

__all__ = [
    "AllocationError",
    "Grant",
    "NodePod",
    "chosen_uuids",
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

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


class AllocationError(ValueError):
    """Why an ``Allocate`` cannot be answered (the RPC's status message, for ``kubectl
    describe``): the kubelet then fails the container, and retries it, rather than start it
    on GPUs it may not have."""


@dataclass(frozen=True, slots=True)
class Grant:
    """The GPUs one container gets, and the pod they are recorded on (None: no pod on this
    node was seen waiting for them, so nothing can be recorded; see :func:`grant`)."""

    pod: NodePod | None
    uuids: tuple[str, ...]


def _pending(pod: NodePod) -> bool:
    return len(pod.allocated) < pod.gpus


def _remaining_chosen(pod: NodePod) -> int:
    if pod.gpu_uuids is not None:
        return sum(1 for uuid in pod.gpu_uuids if uuid not in pod.allocated)
    return max(0, len(pod.gpu_ids or ()) - len(pod.allocated))


def _admission_order(pod: NodePod) -> tuple[float, str, str]:
    return (pod.bound_at, pod.namespace, pod.name)


def match_pod(pods: Sequence[NodePod], size: int) -> NodePod | None:
    """The pod an ``Allocate`` (or ``GetPreferredAllocation``) of ``size`` devices is for.

    Among the pods not fully allocated yet: first those schedext bound (``gpu_ids`` set)
    whose chosen GPUs not yet allocated number exactly ``size``; then those schedext did not
    bind that still need exactly ``size``. Within each, the oldest bind first (ties by
    namespace/name), the order the kubelet admits them in. None when no pod waits for
    ``size`` GPUs (the pod watch may lag the kubelet: the caller decides what then)."""
    waiting = sorted((p for p in pods if _pending(p)), key=_admission_order)
    for pod in waiting:
        if pod.gpu_ids is not None and _remaining_chosen(pod) == size:
            return pod
    for pod in waiting:
        if pod.gpu_ids is None and pod.gpus - len(pod.allocated) == size:
            return pod
    return None


def chosen_uuids(
    pod: NodePod, uuid_by_index: Mapping[int, str], size: int | None = None
) -> tuple[str, ...] | None:
    """The UUIDs schedext chose for ``pod`` that it has not been given yet, the first ``size``
    of them (all when None): ``gpu_uuids`` when the bind wrote them, else ``gpu_ids`` through
    ``uuid_by_index``. None when the pod names an index this node does not have (or schedext
    did not bind it): better to refuse than to guess which GPU was meant."""
    if pod.gpu_uuids is not None:
        chosen = pod.gpu_uuids
    elif pod.gpu_ids is not None:
        if any(i not in uuid_by_index for i in pod.gpu_ids):
            return None
        chosen = tuple(uuid_by_index[i] for i in pod.gpu_ids)
    else:
        return None
    left = tuple(uuid for uuid in chosen if uuid not in pod.allocated)
    return left if size is None else left[:size]


def own_pick(
    free: Sequence[int], groups: Sequence[Sequence[int]], size: int
) -> tuple[int, ...] | None:
    """The agent's own choice for a pod schedext did not bind, among ``free`` (healthy, not in
    use) GPU indices: the same NVLink rule as schedext's bind (:func:`pick_gpus`)."""
    return pick_gpus(sorted(set(free)), groups, size)


def in_use(pods: Iterable[NodePod], uuid_by_index: Mapping[int, str]) -> frozenset[str]:
    """The UUIDs an own pick must leave alone: those allocated to live pods, and those schedext
    chose for bound pods not given them yet (their ``Allocate`` is still to come), shares
    included (a GPU that carries a share is nobody's whole GPU)."""
    used: set[str] = set()
    for pod in pods:
        used.update(pod.allocated)
        if pod.gpu_ids is not None and (_pending(pod) or pod.shares):
            used.update(chosen_uuids(pod, uuid_by_index) or ())
    return frozenset(used)


def _by_index(gpus: Iterable[Gpu]) -> dict[int, str]:
    return {gpu.index: gpu.uuid for gpu in gpus}


def grant(
    pods: Sequence[NodePod],
    gpus: Sequence[Gpu],
    groups: Sequence[Sequence[int]],
    requested: Sequence[str],
) -> Grant:
    """The GPUs one container's ``Allocate`` of ``requested`` device IDs (UUIDs) gets.

    The pod is :func:`match_pod`'s. A pod schedext bound gets exactly the GPUs schedext chose,
    whatever the kubelet named. A pod schedext did not bind gets :func:`own_pick` among the
    healthy GPUs nobody uses or awaits. No matching pod: the IDs the kubelet named, if every
    one is a healthy GPU nobody uses or awaits. Anything else raises
    :class:`AllocationError`; an unhealthy GPU is never granted."""
    size = len(requested)
    if size == 0:
        raise AllocationError("the kubelet asked for no devices")
    uuid_by_index = _by_index(gpus)
    healthy = {gpu.uuid for gpu in gpus if gpu.health.healthy}
    pod = match_pod(pods, size)
    others = [p for p in pods if pod is None or p.uid != pod.uid]
    used = in_use(others, uuid_by_index)
    if pod is not None and pod.gpu_ids is not None:
        uuids = chosen_uuids(pod, uuid_by_index, size)
        if uuids is None:
            raise AllocationError(
                f"pod {pod.key} was bound to GPUs {list(pod.gpu_ids)} this node does not have"
            )
        if sick := [u for u in uuids if u not in healthy]:
            raise AllocationError(f"GPUs chosen for pod {pod.key} are unhealthy: {sick}")
        if taken := [u for u in uuids if u in used]:
            raise AllocationError(f"GPUs chosen for pod {pod.key} are in use: {taken}")
        return Grant(pod, uuids)
    free = [g.index for g in gpus if g.uuid in healthy and g.uuid not in used]
    if pod is not None:
        picked = own_pick(free, groups, size)
        if picked is None:
            raise AllocationError(
                f"pod {pod.key} needs {size} GPUs; {len(free)} are healthy and free"
            )
        return Grant(pod, tuple(uuid_by_index[i] for i in picked))
    if all(u in healthy and u not in used for u in requested):
        return Grant(None, tuple(requested))
    raise AllocationError(
        f"no pod on this node awaits {size} GPUs, and the requested devices "
        f"{list(requested)} are not all healthy and free"
    )


def preferred(
    pods: Sequence[NodePod],
    gpus: Sequence[Gpu],
    groups: Sequence[Sequence[int]],
    *,
    available: Sequence[str],
    must_include: Sequence[str],
    size: int,
) -> tuple[str, ...]:
    """``GetPreferredAllocation``: which ``size`` of the ``available`` device IDs (UUIDs) the
    kubelet should pick, so that its own bookkeeping names the GPUs ``Allocate`` will grant.

    The pod schedext bound that :func:`match_pod` finds gets its chosen GPUs, when all are
    available and include ``must_include``. Otherwise ``must_include`` plus an NVLink-aware
    pick among the other available healthy GPUs, avoiding those allocated to or awaited by
    other pods when it can. Only a hint: may be shorter than ``size`` (the kubelet tops up)."""
    uuid_by_index = _by_index(gpus)
    index_by_uuid = {gpu.uuid: gpu.index for gpu in gpus}
    healthy = {gpu.uuid for gpu in gpus if gpu.health.healthy}
    offered = {u for u in available if u in healthy}
    must = tuple(dict.fromkeys(must_include))
    pod = match_pod(pods, size)
    if pod is not None and pod.gpu_ids is not None:
        uuids = chosen_uuids(pod, uuid_by_index, size)
        if uuids and len(uuids) == size and offered.issuperset(uuids) and set(must) <= set(uuids):
            return uuids
    need = size - len(must)
    if need <= 0:
        return must[:size]
    others = [p for p in pods if pod is None or p.uid != pod.uid]
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
