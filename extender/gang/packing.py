"""Whether a gang's unplaced members can all get their GPUs at once: an exact bin-packing
search with eligibility, within a step budget (:func:`fits_all`), and the nodes a member may
take so that the rest still fit (:func:`member_nodes`).

Members that take GPU shares are placed first, greedily, over the device grid of the nodes
they may use (:func:`extender.gang.share_packing.place_shares`: first-fit decreasing, onto
room on shared devices before opening free ones, and opening them away from the nodes the
whole-GPU members need). The free devices they open are taken from the whole GPUs the exact
search then packs the whole-GPU members into. The greedy guesses on which node to open
devices (the fewest free whole GPUs first, then the most): a group fits when one guess leaves
the whole-GPU members room. So an answer of True always comes with a placement of every
member. False may miss one: on small random clusters checked against every placement, about
one group in a thousand that fits (tests/unit/test_gangs.py), whose shares must be packed
onto devices better than first-fit decreasing packs them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Iterable, Mapping, Sequence

import numpy as np
import numpy.typing as npt

from extender import policy
from extender.config import PolicyConfig
from extender.gang.capacity import Within, free_gpus, inside, via_dra
from extender.gang.share_packing import after_shares, whole_demand
from extender.inventory import Inventory
from extender.kinds import asked
from extender.kinds.whole_gpu import WHOLE_GPU
from extender.model import RANKED, PodRequest, Reason

__all__ = ["FitCache", "eligible", "fits_all", "member_nodes"]


# The exact search gives up after this many search steps (a step: one member tried against
# the distinct free capacities left). With the pruning and memoisation below, real groups
# finish in a few dozen steps; the budget only bounds pathological inputs, at 10-20 ms.
SEARCH_BUDGET = 1_000
# Groups with more members than this, or whose members fall into more than this many
# eligibility classes (distinct sets of usable nodes), skip the exact search.
EXACT_MAX_MEMBERS = 256
EXACT_MAX_SHAPES = 60


class FitCache:
    """Answers of :func:`fits_all` and :func:`member_nodes`, and the per-request node masks
    they are built from, valid for one inventory state: a filter runs the same group check
    for every member of a group, and preemption once per candidate node. Any change of the
    inventory (its version, or its address book's) empties it."""

    def __init__(self, max_answers: int = 4096) -> None:
        self._max_answers = max_answers
        self._stamp: tuple[object, ...] = ()
        self.masks: dict[object, npt.NDArray[np.bool_]] = {}
        self.answers: dict[object, bool] = {}
        self.nodes: dict[object, npt.NDArray[np.bool_] | None] = {}

    def sync(self, inventory: Inventory, config: PolicyConfig) -> None:
        stamp = (id(inventory), inventory.version, inventory.addresses.version, config)
        if stamp != self._stamp:
            self._stamp = stamp
            self.masks.clear()
            self.answers.clear()
            self.nodes.clear()
        elif len(self.answers) + len(self.nodes) >= self._max_answers:
            self.answers.clear()
            self.nodes.clear()


def fits_all(
    inventory: Inventory,
    requests: Iterable[PodRequest],
    config: PolicyConfig,
    *,
    free_delta: Mapping[int, int] | None = None,
    cache: FitCache | None = None,
    budget: int = SEARCH_BUDGET,
    within: Within | None = None,
) -> bool:
    """Whether every request can get its GPUs at the same time, somewhere in the cluster.

    Each request needs ``gpus`` free GPUs, or room for its share on ``shares`` devices, on
    one node that satisfies its model, memory and CPU-class (and address) constraints;
    ``free_delta`` adds whole GPUs per node id (what releasing other reservations would
    free). Requests without GPUs need nothing here.

    Shares are placed first (see the module docstring). An exact search (see
    :func:`_exact_fit`) then decides for the whole GPUs, within ``budget`` steps per guess of
    the shares' placement; a search that runs out of steps falls back to best-fit
    decreasing, so the answer is never worse than that greedy's. A True answer always comes
    with a placement that was found.
    """
    requests = via_dra(list(requests))
    wanted = [r for r in requests if r.gpus > 0]
    sharing = [r for r in requests if r.share.devices > 0]
    if not wanted and not sharing:
        return True
    if cache is not None:
        cache.sync(inventory, config)
        answer_key = (
            frozenset(Counter((_shape(r), _size(r)) for r in (*wanted, *sharing)).items()),
            frozenset((free_delta or {}).items()),
            budget,
            within.key if within is not None else None,
        )
        cached = cache.answers.get(answer_key)
        if cached is not None:
            return cached
    base = inside(free_gpus(inventory, free_delta, dra=any(r.gpus_via_dra for r in wanted)), within)
    masks, classes = _classify(inventory, wanted, config, cache, within)
    order = sorted(range(len(wanted)), key=lambda i: (-wanted[i].gpus, classes[i]))
    sizes = [wanted[i].gpus for i in order]
    kinds = [classes[i] for i in order]
    verdict = False
    whole = whole_demand(base, masks, sizes, kinds)
    share_masks, share_kinds = _classify(inventory, sharing, config, cache, within)
    for free in after_shares(inventory, sharing, share_masks, share_kinds, free=base, wanted=whole):
        if not wanted:
            verdict = True
        elif len(sizes) <= EXACT_MAX_MEMBERS and len(masks) <= EXACT_MAX_SHAPES:
            found = _exact_fit(free, masks, sizes, kinds, budget)
            verdict = _greedy_fit(free, masks, sizes, kinds) if found is None else found
        else:
            verdict = _greedy_fit(free, masks, sizes, kinds)
        if verdict:
            break
    if cache is not None:
        cache.answers[answer_key] = verdict
    return verdict


def member_nodes(
    inventory: Inventory,
    request: PodRequest,
    others: Iterable[PodRequest],
    config: PolicyConfig,
    *,
    cache: FitCache | None = None,
    budget: int = SEARCH_BUDGET,
    within: Within | None = None,
) -> npt.NDArray[np.bool_] | None:
    """Per node id, whether placing ``request`` there leaves room for all of ``others``: the
    node gives ``request`` its GPUs now, and the others still fit (as :func:`fits_all`
    decides) once it has. No node at all when the group does not fit anywhere.

    This is what keeps kube-scheduler from choosing a node that makes its group impossible
    (with 5 and 4 free GPUs, a member of 3 must take the 5 for 2+2+2 to follow). None when
    the search ran out of budget, or for a member that takes no whole GPUs (a share, or
    nothing): judge the group as a whole then. The other members' shares are placed first
    (see the module docstring): the nodes are those that work with one of its guesses."""
    request, *others = via_dra([request, *others])
    rest = [r for r in others if r.gpus > 0]
    sharing = [r for r in others if r.share.devices > 0]
    if request.gpus <= 0:
        return None
    key: object = None
    if cache is not None:
        cache.sync(inventory, config)
        key = (
            "nodes",
            (_shape(request), request.gpus),
            frozenset(Counter((_shape(r), _size(r)) for r in (*rest, *sharing)).items()),
            budget,
            within.key if within is not None else None,
        )
        if key in cache.nodes:
            return cache.nodes[key]
    wanted = [request, *rest]
    masks, classes = _classify(inventory, wanted, config, cache, within)
    order = [0, *sorted(range(1, len(wanted)), key=lambda i: (-wanted[i].gpus, classes[i]))]
    answer: npt.NDArray[np.bool_] | None = None
    if len(wanted) <= EXACT_MAX_MEMBERS and len(masks) <= EXACT_MAX_SHAPES:
        sizes = [wanted[i].gpus for i in order]
        kinds = [classes[i] for i in order]
        base = inside(free_gpus(inventory, None, dra=request.gpus_via_dra), within)
        whole = whole_demand(base, masks, sizes, kinds)
        share_masks, share_kinds = _classify(inventory, sharing, config, cache, within)
        placed = after_shares(inventory, sharing, share_masks, share_kinds, free=base, wanted=whole)
        try:
            answer = np.zeros(len(base), dtype=np.bool_)
            for free in placed:
                packing = _Packing(free, masks, sizes, kinds, budget)
                for node_class, capacity in packing.first_choices():
                    answer |= (packing.node_class == node_class) & (
                        packing.node_capacity == capacity
                    )
        except _OutOfBudgetError:
            answer = None
        if answer is not None:
            answer.flags.writeable = False
    if cache is not None:
        cache.nodes[key] = answer
    return answer


def _size(request: PodRequest) -> tuple[Hashable, ...]:
    """What a request takes of each kind (with :func:`_shape`, its cache key)."""
    return tuple(kind.size(request) for kind in asked(request))


def _classify(
    inventory: Inventory,
    requests: Sequence[PodRequest],
    config: PolicyConfig,
    cache: FitCache | None,
    within: Within | None = None,
) -> tuple[list[npt.NDArray[np.bool_]], list[int]]:
    """One eligibility mask per distinct set of usable nodes (a class of members), and each
    request's class; only nodes ``within`` the one domain, when given."""
    masks: list[npt.NDArray[np.bool_]] = []
    class_of_shape: dict[object, int] = {}
    class_of_mask: dict[bytes, int] = {}
    classes: list[int] = []
    for request in requests:
        shape = _shape(request)
        index = class_of_shape.get(shape)
        if index is None:
            mask = _eligible(inventory, request, config, cache)
            mask = mask & within.nodes if within is not None else mask
            index = class_of_shape[shape] = class_of_mask.setdefault(mask.tobytes(), len(masks))
            if index == len(masks):
                masks.append(mask)
        classes.append(index)
    return masks, classes


def _shape(request: PodRequest) -> object:
    """What decides which nodes a request may use, apart from its GPU count (a node with
    enough free GPUs has enough GPUs) and its share's room (simulated). Address requests
    depend on the pod itself (who holds its address), so each is its own shape; a share's
    memory decides which devices are large enough."""
    if request.ip is not None:
        return request
    # gpus_via_dra: the nodes DRA owns are eligible too.
    shape = (request.gpu_model, request.gpu_memory_mib, request.workload, request.cpu_milli)
    shape_dra = (*shape, request.gpus_via_dra)
    return (*shape_dra, *(part for kind in asked(request) for part in kind.pack_shape(request)))


def _eligible(
    inventory: Inventory, request: PodRequest, config: PolicyConfig, cache: FitCache | None
) -> npt.NDArray[np.bool_]:
    """Per node id, whether the request could use the node if it had the GPUs free: every
    reason but "not free right now" (free GPUs and room for shares are simulated instead)."""
    key = _shape(request)
    if cache is not None and (mask := cache.masks.get(key)) is not None:
        return mask
    all_ids = np.arange(len(inventory.arrays.alive), dtype=np.int32)
    # The count is checked against free GPUs, or devices with room, in the simulation.
    one = (asked(request) or (WHOLE_GPU,))[0].unit(request)
    mask = _DYNAMIC[policy.node_reasons(inventory, one, all_ids, config)]
    mask.flags.writeable = False
    if cache is not None:
        cache.masks[key] = mask
    return mask


def eligible(
    inventory: Inventory, request: PodRequest, config: PolicyConfig, cache: FitCache
) -> npt.NDArray[np.bool_]:
    """Per node id, whether ``request`` could use the node if it had the GPUs free (a
    starving gang's hold, extender.gang.hold_choice); kept in ``cache`` per pod shape."""
    cache.sync(inventory, config)
    return _eligible(inventory, request, config, cache)


class _OutOfBudgetError(Exception):
    pass


# Per class of nodes, the distinct free capacities left and how many nodes have each:
# ((capacity, count), ...) by ascending capacity.
_Bins = tuple[tuple[int, int], ...]


def _exact_fit(
    free: npt.NDArray[np.int64],
    masks: Sequence[npt.NDArray[np.bool_]],
    sizes: Sequence[int],
    kinds: Sequence[int],
    budget: int,
) -> bool | None:
    """Whether the members fit, decided exactly; None when ``budget`` steps ran out."""
    try:
        return _Packing(free, masks, sizes, kinds, budget).fits()
    except _OutOfBudgetError:
        return None


class _Packing:
    """Bin packing with eligibility, searched exactly within a step budget.

    ``sizes`` and ``kinds`` give each member's GPUs and eligibility class, in the order they
    are placed (largest first, except that :meth:`first_choices` places member 0 first).
    Nodes that are eligible for the same member classes are interchangeable but for their
    free GPUs, so the state is, per such node class, the multiset of free capacities left,
    kept as (capacity, count) pairs. Capacities are capped at the group's total demand,
    capacities smaller than the smallest member are dropped, and counts are capped at the
    number of members left (no more nodes than that can be used): many clusters reduce to a
    few dozen pairs. The search tries each distinct (node class, capacity) once per member,
    tightest first (so its first descent is best-fit decreasing), prunes states whose
    capacity cannot cover the demand left (in total and per member class), and remembers
    states that failed. Raises :class:`_OutOfBudgetError` past ``budget`` steps.
    """

    def __init__(
        self,
        free: npt.NDArray[np.int64],
        masks: Sequence[npt.NDArray[np.bool_]],
        sizes: Sequence[int],
        kinds: Sequence[int],
        budget: int,
    ) -> None:
        self._sizes, self._kinds, self._budget = sizes, kinds, budget
        count = len(sizes)
        total = sum(sizes)
        self._smallest = min(sizes)
        signature = np.zeros(len(free), dtype=np.int64)
        for index, mask in enumerate(masks):
            signature |= mask.astype(np.int64) << index
        usable = (signature != 0) & (free >= self._smallest)
        node_sigs, inverse = np.unique(signature[usable], return_inverse=True)
        capacity = np.minimum(free[usable], total)
        # Per node id: its class and capped capacity (class -1: of no use to the group).
        self.node_class = np.full(len(free), -1, dtype=np.int64)
        self.node_class[usable] = inverse
        self.node_capacity = np.minimum(free, total)
        keys, counts = np.unique(inverse * (total + 1) + capacity, return_counts=True)
        per_class: list[list[tuple[int, int]]] = [[] for _ in node_sigs]
        for key, n in zip(keys.tolist(), counts.tolist(), strict=True):
            per_class[key // (total + 1)].append((key % (total + 1), min(n, count)))
        self._start: tuple[_Bins, ...] = tuple(tuple(bins) for bins in per_class)
        sigs = [int(s) for s in node_sigs.tolist()]
        # The node classes each member class may use, and the demand left per member class.
        self._usable_by = [
            [c for c, sig in enumerate(sigs) if sig >> kind & 1] for kind in range(len(masks))
        ]
        self._demand_left = [[0] * len(masks) for _ in range(count + 1)]
        for i in range(count - 1, -1, -1):
            self._demand_left[i] = list(self._demand_left[i + 1])
            self._demand_left[i][kinds[i]] += sizes[i]
        self._failed: set[tuple[int, tuple[_Bins, ...]]] = set()
        self._steps = 0

    def fits(self) -> bool:
        return self._search(0, self._start, self._rooms(self._start))

    def first_choices(self) -> set[tuple[int, int]]:
        """The (node class, capacity) choices for member 0 after which the rest still fit."""
        good = set()
        for capacity, node_class in self._options(0, self._start):
            after, rooms = self._place(
                0, self._start, self._rooms(self._start), node_class, capacity
            )
            if self._search(1, after, rooms):
                good.add((node_class, capacity))
        return good

    @staticmethod
    def _rooms(state: tuple[_Bins, ...]) -> tuple[int, ...]:
        return tuple(sum(c * n for c, n in bins) for bins in state)

    def _options(self, i: int, state: tuple[_Bins, ...]) -> list[tuple[int, int]]:
        size = self._sizes[i]
        return sorted(
            (c, node_class) for node_class in self._usable_by[self._kinds[i]]
            for c, _ in state[node_class] if c >= size
        )  # fmt: skip

    def _place(
        self,
        i: int,
        state: tuple[_Bins, ...],
        rooms: tuple[int, ...],
        node_class: int,
        capacity: int,
    ) -> tuple[tuple[_Bins, ...], tuple[int, ...]]:
        members_after = len(self._sizes) - i - 1
        bins = _take(state[node_class], capacity, self._sizes[i], self._smallest, members_after)
        after = (*state[:node_class], bins, *state[node_class + 1 :])
        room = sum(c * n for c, n in bins)
        return after, (*rooms[:node_class], room, *rooms[node_class + 1 :])

    def _search(self, i: int, state: tuple[_Bins, ...], rooms: tuple[int, ...]) -> bool:
        """Place members i.. into ``state``; ``rooms`` is each node class's capacity."""
        if i == len(self._sizes):
            return True
        if (i, state) in self._failed:
            return False
        self._steps += 1
        if self._steps > self._budget:
            raise _OutOfBudgetError
        left = self._demand_left[i]
        if sum(left) > sum(rooms) or any(
            need > sum(rooms[c] for c in self._usable_by[kind])
            for kind, need in enumerate(left)
            if need
        ):
            self._failed.add((i, state))
            return False
        for capacity, node_class in self._options(i, state):
            after, after_rooms = self._place(i, state, rooms, node_class, capacity)
            if self._search(i + 1, after, after_rooms):
                return True
        self._failed.add((i, state))
        return False


def _take(bins: _Bins, capacity: int, size: int, smallest: int, members_after: int) -> _Bins:
    """``bins`` after one node of ``capacity`` gave ``size`` GPUs, with counts capped at the
    members left (only this class is re-capped: the others stay valid, merely less merged)."""
    changed = dict(bins)
    changed[capacity] -= 1
    rest = capacity - size
    if rest >= smallest:
        changed[rest] = changed.get(rest, 0) + 1
    return tuple(sorted((c, min(n, members_after)) for c, n in changed.items() if n))


def _greedy_fit(
    free: npt.NDArray[np.int64],
    masks: Sequence[npt.NDArray[np.bool_]],
    sizes: Sequence[int],
    kinds: Sequence[int],
) -> bool:
    """Best-fit decreasing: largest member first, onto the eligible node with the fewest free
    GPUs that still holds it. Fast, and may miss a fit the exact search finds."""
    free = free.copy()
    for size, kind in zip(sizes, kinds, strict=True):
        eligible = np.flatnonzero(masks[kind] & (free >= size))
        if len(eligible) == 0:
            return False
        best = eligible[np.argmin(free[eligible])]
        free[best] -= size
    return True


# Indexed by a reason's rank (what node_reasons gives): the reasons a node may have now and
# still be usable by the group.
_USABLE = (
    Reason.FITS,
    Reason.GPU_FREE,
    Reason.GPU_SHARE_MEMORY,
    Reason.GPU_SHARE_CORES,
    Reason.CPU_FREE,
)
_DYNAMIC = np.array([r in _USABLE for r in RANKED])
