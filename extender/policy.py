"""The filter policy (which nodes can host a pod, and why not) and the GPU choice of bind.

Every function here is purely computational: it reads an :class:`Inventory` and values, and
returns values. The caller (the service shell) performs any effect. Scoring lives in
:mod:`extender.scoring`, one module per objective.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Hashable, Sequence
from operator import itemgetter
from typing import Any, NamedTuple, TypeVar

import numpy as np
import numpy.typing as npt

from extender.addressing import ip_conditions, ip_context, ip_messages
from extender.columns import DRA_MIXED, DRA_NONE, DRA_OWNED
from extender.config import GpuScoring, PolicyConfig
from extender.devices.placement import pick_gpus
from extender.inventory import IdArray, Inventory
from extender.kinds import Conditions, Kind, asked
from extender.model import RANKED, FilterVerdict, PodRequest, Reason, Rejection, WorkloadClass
from extender.node_state import NodeView
from extender.packed import PackedNames, count_codes

# GpuScoring and PolicyConfig live in extender.config; named here too, where the filter's
# callers have long imported them from.
__all__ = [
    "GpuScoring",
    "PolicyConfig",
    "choose_gpus",
    "filter_ids",
    "filter_nodes",
    "node_reasons",
    "reason_messages",
    "reject_all",
]

CodeArray = npt.NDArray[np.int8]


# ------------------------------------------------------------------------------- filter


def node_reasons(
    inventory: Inventory, request: PodRequest, ids: IdArray, config: PolicyConfig
) -> CodeArray:
    """Per node id, the rank of the reason it cannot host the pod (:data:`RANKED`; 0: it
    fits): the first reason in PRECEDENCE that applies."""
    a = inventory.arrays
    # kube-scheduler usually names most of the cluster: then every condition is evaluated on
    # whole columns (contiguous, no gather each) and the codes are gathered once at the end.
    whole = 2 * len(ids) >= len(a.alive)

    def col(column: npt.NDArray[_T]) -> npt.NDArray[_T]:
        return column if whole else column.take(ids)  # take: twice as fast as [ids]

    # The reason that wins is the smallest rank that applies (_NONE: none does). What the
    # nodes' specs alone decide comes from a cache; only what pods hold (free GPUs, free CPU,
    # addresses) is evaluated per call.
    ranks = col(_spec_ranks(inventory, request, config))
    held: Conditions = []
    dra_owned = col(a.dra_owner) == DRA_OWNED if request.gpus_via_dra else None
    for kind in asked(request):
        conditions = kind.held_conditions(inventory, request, col)
        held += _off_dra(conditions, dra_owned) if kind.via_dra else conditions
    if request.workload is WorkloadClass.CPU_INTENSIVE:
        held.append((col(a.cpu_free) < request.cpu_milli, Reason.CPU_FREE))
    context = ip_context(inventory, request)
    if context is not None:
        rows = np.arange(len(a.alive), dtype=np.int32) if whole else ids
        held += ip_conditions(inventory, request, rows, context)
    for failed, reason in held:  # new arrays: the cached ranks are never written
        ranks = np.minimum(ranks, _rank_where(failed, reason))
    if whole:
        ranks = ranks.take(ids)
    # _NONE (128) becomes FITS (rank 0), every reason's rank (< 128) stays: one cheap pass.
    return np.bitwise_and(ranks, np.uint8(0x7F)).view(np.int8)


def _spec_ranks(
    inventory: Inventory, request: PodRequest, config: PolicyConfig
) -> npt.NDArray[np.uint8]:
    """Per slot, the rank of the reason the nodes' specs alone give (_NONE: none), for the
    pod's shape: computed once per shape until a node changes."""
    cpu_bound = request.workload is WorkloadClass.CPU_INTENSIVE
    kinds = tuple((kind, kind.spec_key(request)) for kind in asked(request))
    shape = _SpecShape(
        bool(kinds) and not config.dra.fence,
        request.gpus_via_dra,
        request.dra_gpus > 0,
        request.needs_gpu_node,
        request.gpu_model,
        request.gpu_memory_mib,
        request.cpu_milli if cpu_bound else None,
        config.cpu_intensive_min_cpu_milli if cpu_bound else None,
        kinds,
    )
    return inventory.spec_derived(shape, lambda: _judge_specs(inventory, shape))


class _SpecShape(NamedTuple):
    """What of a pod the nodes' specs are judged against (the key of their cached ranks)."""

    refuses_mixed: bool  # it asks a kind of GPU, and nodes both DRA and the plugin offer are
    # not fenced (extender.dra.ownership)
    gpus_via_dra: bool  # its whole GPUs go through DRA where DRA owns the node (KEP-5004)
    dra_claims: bool  # its claims ask GPUs: any node DRA offers GPUs on has GPUs for it
    needs_gpu_node: bool
    gpu_model: str | None
    gpu_memory_mib: int | None
    cpu_milli: int | None  # CPU-intensive pods only
    cpu_intensive_min_cpu_milli: int | None  # likewise
    kinds: tuple[tuple[Kind[Any], Hashable], ...]  # each kind asked, with its spec key


def _judge_specs(inventory: Inventory, shape: _SpecShape) -> npt.NDArray[np.uint8]:
    a = inventory.arrays
    conditions: Conditions = []
    # On a node DRA owns, a pod whose GPUs DRA serves is DRA's to judge: kube-scheduler's
    # DynamicResources plugin fits its devices; schedext only rates the node.
    dra_owned = a.dra_owner == DRA_OWNED if shape.gpus_via_dra else None
    if shape.refuses_mixed:
        conditions.append((a.dra_owner == DRA_MIXED, Reason.GPU_OWNER_MIXED))
    if shape.needs_gpu_node:
        no_gpus = a.gpu_total + a.gpu_mig <= 0
        if dra_owned is not None:
            no_gpus &= ~dra_owned
        if shape.dra_claims:
            no_gpus &= a.dra_owner == DRA_NONE
        conditions.append((no_gpus, Reason.NO_GPUS))
        if shape.gpu_model is not None:
            allowed = inventory.model_mask(shape.gpu_model)
            conditions.append((~allowed[a.model], Reason.GPU_MODEL))
        if shape.gpu_memory_mib is not None:
            conditions.append((a.gpu_memory_mib < shape.gpu_memory_mib, Reason.GPU_MEMORY))
    for kind, key in shape.kinds:  # each kind the pod asks for, GPU or not
        spec_conditions = kind.spec_conditions(inventory, key)
        conditions += _off_dra(spec_conditions, dra_owned) if kind.via_dra else spec_conditions
    if shape.cpu_milli is not None and shape.cpu_intensive_min_cpu_milli is not None:
        threshold = shape.cpu_intensive_min_cpu_milli
        conditions.append((a.cpu_alloc < threshold, Reason.CPU_THRESHOLD))
        conditions.append((a.cpu_alloc < shape.cpu_milli, Reason.CPU_TOTAL))
    # A slot that is not alive (unused, or the sentinel of unknown names) is UNKNOWN_NODE.
    ranks = np.where(a.alive, _NONE, _RANK[Reason.UNKNOWN_NODE])
    for failed, reason in conditions:
        np.minimum(ranks, _rank_where(failed, reason), out=ranks)
    ranks.flags.writeable = False
    return ranks


def _off_dra(conditions: Conditions, dra_owned: npt.NDArray[np.bool_] | None) -> Conditions:
    """A kind's conditions, failing nowhere DRA owns (``dra_owned``; None: they stand)."""
    if dra_owned is None:
        return conditions
    return [(failed & ~dra_owned, reason) for failed, reason in conditions]


def _rank_where(failed: npt.NDArray[np.bool_], reason: Reason) -> npt.NDArray[np.uint8]:
    """``reason``'s rank where ``failed``, else _NONE: ``np.where`` with two ufuncs (``where``
    and ``take`` go through numpy's function dispatch, a few µs a call on the filter path)."""
    return np.subtract(_NONE, np.multiply(failed.view(np.uint8), _NONE - _RANK[reason]))


_NONE = np.uint8(128)  # no reason applies (yet): above every rank, and 128 & 0x7F is FITS
_RANK = {reason: np.uint8(rank) for rank, reason in enumerate(RANKED)}
_FITS = np.int8(0)  # FITS's rank, as numpy's own scalar: comparing with an IntEnum costs 5 µs
_T = TypeVar("_T", bound=np.generic)


def reason_messages(
    request: PodRequest, config: PolicyConfig, inventory: Inventory | None = None
) -> list[str]:
    """Human reasons indexed by rank (:data:`RANKED`). They name the pod's need, not the node, so
    that kube-scheduler's event aggregates them ("0/50 nodes are available: 12 ..."); address
    reasons name the pool, the address and who holds it."""
    messages = list(
        _messages(
            request.gpu_model,
            request.gpu_memory_mib,
            request.cpu_milli,
            config.cpu_intensive_min_cpu_milli,
        )
    )
    for kind in asked(request):
        for reason, message in kind.messages(request).items():
            messages[_RANK[reason]] = message
    context = ip_context(inventory, request) if inventory is not None else None
    if context is not None:
        for reason, message in ip_messages(context).items():
            messages[_RANK[reason]] = message
    return messages


@functools.lru_cache(maxsize=256)
def _messages(
    gpu_model: str | None,
    gpu_memory_mib: int | None,
    cpu_milli: int,
    cpu_intensive_min_cpu_milli: int,
) -> tuple[str, ...]:
    """The reasons common to every pod, by its shape (each kind adds its own,
    :meth:`Kind.messages`): the same few shapes come through filter again and again, so they
    are written once each."""
    # Short: kube-scheduler decodes every rejected node's message (thousands per call).
    messages = {
        Reason.FITS: "",
        Reason.UNKNOWN_NODE: "schedext: node not in inventory",
        Reason.INVALID_POD: "schedext: invalid pod",
        Reason.GPU_OWNER_MIXED: (
            "schedext: node's GPUs are offered twice, by the device plugin and by DRA: "
            "run one of them, or set dra.fence"
        ),
        Reason.NO_GPUS: "schedext: node has no GPUs",
        Reason.GPU_MODEL: f"schedext: GPU model is not {gpu_model}",
        Reason.GPU_MEMORY: f"schedext: GPU memory under {gpu_memory_mib} MiB",
        Reason.CPU_THRESHOLD: (
            f"schedext: CPU-intensive needs {_cpu(cpu_intensive_min_cpu_milli)}+ CPU nodes"
        ),
        Reason.CPU_TOTAL: f"schedext: node has under {_cpu(cpu_milli)} CPU",
        Reason.CPU_FREE: f"schedext: under {_cpu(cpu_milli)} CPU free",
    }
    return tuple(messages.get(reason, f"schedext: {reason.name.lower()}") for reason in RANKED)


def filter_nodes(
    inventory: Inventory, request: PodRequest, node_names: Sequence[str], config: PolicyConfig
) -> FilterVerdict:
    """Which of ``node_names`` can host the pod, and why the others cannot."""
    return filter_ids(inventory, request, node_names, inventory.ids(node_names), config)[0]


def filter_ids(
    inventory: Inventory,
    request: PodRequest,
    node_names: Sequence[str],
    ids: IdArray,
    config: PolicyConfig,
) -> tuple[FilterVerdict, IdArray]:
    """:func:`filter_nodes` over names already resolved to ``ids``; also returns the ids of
    the nodes that passed."""
    codes = node_reasons(inventory, request, ids, config)
    fits = codes == _FITS
    if fits.all():
        return FilterVerdict(passed=node_names), ids
    messages = reason_messages(request, config, inventory)
    if isinstance(node_names, PackedNames):
        verdict = _packed_verdict(node_names, codes, messages)
        return _name_gpus(verdict, inventory, request), ids.compress(fits)
    # One stable sort by reason and one C-level gather of the names, then a slice per reason:
    # no Python step per node, and the passed nodes keep their input order.
    order = np.argsort(codes, kind="stable")
    ranked = codes[order]
    names = itemgetter(*order.tolist())(node_names) if len(order) > 1 else (node_names[0],)
    cuts = [0, *(np.flatnonzero(np.diff(ranked)) + 1).tolist(), len(ranked)]
    passed: list[str] = []
    rejections: list[Rejection] = []
    for start, end in itertools.pairwise(cuts):
        rank = int(ranked[start])
        reason = RANKED[rank]
        group = list(names[start:end])
        if reason is Reason.FITS:
            passed = group
            continue
        rejections.append(
            Rejection(
                message=messages[rank],
                resolvable=reason.resolvable,
                nodes=group,
                reason=reason,
                known_nodes=reason is not Reason.UNKNOWN_NODE,
            )
        )
    verdict = FilterVerdict(passed=passed, rejections=tuple(rejections))
    return _name_gpus(verdict, inventory, request), ids[fits]


_NAMED = frozenset({Reason.GPU_UNHEALTHY, Reason.GPU_IN_USE})


def _name_gpus(verdict: FilterVerdict, inventory: Inventory, request: PodRequest) -> FilterVerdict:
    """Each node turned away for unhealthy GPUs, or for GPUs in use by containers schedext
    did not place, gets its own message naming them and why ("GPU 3 unhealthy: XID 79: GPU
    fell off the bus", "GPU 3 in use by a container schedext did not place (kubelet: ...)"):
    the operator must see which device to replace or which pod to look at. Such nodes are
    few, so a group per node costs nothing that matters."""
    if not any(r.reason in _NAMED for r in verdict.rejections):
        return verdict
    rejections: list[Rejection] = []
    for rejection in verdict.rejections:
        if rejection.reason not in _NAMED:
            rejections.append(rejection)
            continue
        for name in rejection.nodes:
            view = inventory.node(name)
            message = (
                _unhealthy_message(view, request)
                if rejection.reason is Reason.GPU_UNHEALTHY
                else _in_use_message(view, request)
            )
            rejections.append(
                Rejection(
                    message,
                    resolvable=rejection.reason.resolvable,
                    nodes=[name],
                    reason=rejection.reason,
                )
            )
    return FilterVerdict(passed=verdict.passed, rejections=tuple(rejections))


def _unhealthy_message(view: NodeView | None, request: PodRequest) -> str:
    spec = view.spec if view is not None else None
    bad = spec.gpu_unhealthy if spec is not None else ()
    gpus = "; ".join(f"GPU {index} unhealthy: {why}" for index, why in bad)
    healthy = spec.gpu_healthy if spec is not None else 0
    return f"schedext: {gpus} ({healthy} healthy, pod needs {request.devices})"


def _in_use_message(view: NodeView | None, request: PodRequest) -> str:
    if view is None:
        return f"schedext: fewer than {request.gpus} free GPUs"
    outside = view.outside()
    named = "; ".join(dict.fromkeys(u.why for u in view.spec.gpu_in_use if u.gpu in outside))
    free = len(view.free_gpu_ids)
    return f"schedext: {named} ({free} free, pod needs {request.gpus})"


def _packed_verdict(names: PackedNames, codes: CodeArray, messages: list[str]) -> FilterVerdict:
    """The grouped verdict over packed names: each group a view (names and codes), written
    into the answer straight from the request's bytes; nothing per node here."""
    counts = count_codes(codes, len(messages))
    rejections = tuple(
        Rejection(
            message=messages[rank],
            resolvable=RANKED[rank].resolvable,
            nodes=names.subset(codes, rank, count),
            reason=RANKED[rank],
            # Plain names need no escaping, known to the inventory or not.
            known_nodes=True,
        )
        for rank, count in enumerate(counts)
        if count and rank != 0
    )
    passed = names.subset(codes, 0, counts[0])
    return FilterVerdict(passed=passed, rejections=rejections)


def reject_all(node_names: Sequence[str], message: str, reason: Reason) -> FilterVerdict:
    """Every node rejected with one reason: a pod no node can help, or (for a reason that is
    resolvable, such as a gang short of free GPUs) one that evicting pods may help."""
    rejection = Rejection(
        message,
        resolvable=reason.resolvable,
        # Packed names stay the request's bytes: plain, so they need no escaping either.
        nodes=node_names if isinstance(node_names, PackedNames) else list(node_names),
        reason=reason,
        known_nodes=isinstance(node_names, PackedNames),
    )
    return FilterVerdict(passed=[], rejections=(rejection,))


# ---------------------------------------------------------------------------- GPU choice


def choose_gpus(node: NodeView, count: int) -> tuple[int, ...] | None:
    """Which GPU indices to give a pod: inside the smallest group that can hold them all
    (best fit keeps larger groups whole for larger pods), else spanning as few groups as
    possible, taking the fullest groups first; lowest indices first within a group. None when
    the node lacks ``count`` free GPUs. The rule itself is shared with the node agent
    (:func:`extender.devices.placement.pick_gpus`)."""
    return pick_gpus(node.free_gpu_ids, node.spec.gpu_groups, count)


def _cpu(milli: int) -> str:
    return f"{milli // 1000}" if milli % 1000 == 0 else f"{milli}m"
