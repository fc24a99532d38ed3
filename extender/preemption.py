"""Preemption that understands GPUs, addresses and gangs.

kube-scheduler proposes victims per candidate node from its in-tree filters only. It knows
GPU counts (``nvidia.com/gpu`` is visible in node allocatable), but not GPU models, GPU
indices or NVLink groups, addresses, or gangs. For each candidate node, schedext:

1. drops the node when even evicting every lower-priority pod there would not give the pod
   what it needs: GPUs of its model and memory, CPU and memory, and its address. Evicting a
   pod frees its address only when no IPClaim keeps it (a sticky or never-release claim
   outlives its pod), so a claimed address never makes a node a candidate;
2. otherwise returns the smallest set of lower-priority pods on that node that does. Pods may
   be added to kube-scheduler's list (by UID, from the same node), and pods may be left out of
   it when they free nothing the pod needs. When the requested GPUs can end up inside one
   NVLink/NUMA group, the set must achieve that too;
3. when the pod already has all that without evicting anything, kube-scheduler's list stands
   for needs only kube-scheduler sees. It is returned as it is (under whole-group with the
   rest of each proposed gang on the node) when every pod in it may be a victim; otherwise the
   node is dropped, since kube-scheduler's list holds only pods its own filters need gone.

How the set is chosen: the fewest pods. Among sets of that size, the one with:

* the lowest top priority (as kube-scheduler ranks candidates);
* then the lowest sum of priorities;
* then the least freed for nothing: whole GPUs for a whole-GPU preemptor; for a share
  preemptor, MiB of GPU memory (a share's memory on each of its devices, a whole GPU's full
  memory), so that a share evicts small shares before large ones or a whole-GPU pod;
* then the fewest pods holding an address (an address is worth keeping);
* then the most of kube-scheduler's own picks.

The search is exhaustive while that is cheap (a GPU node holds few pods). Beyond that it is a
greedy reprieve: evict every eligible pod, then spare them one at a time, most important
first, while the rest still suffice.

**GPU shares.** A share preemptor needs ``share.devices`` distinct devices that each
have room for its memory and cores once the victims go (:func:`extender.shares.room_after`,
judged by the rule bind places shares with, :func:`extender.shares.pick_share_gpus`): a share
victim frees its memory and cores on its devices, a whole victim frees whole devices. The
smallest set is therefore found on one device where one device suffices, never one share from
each of several devices. A whole-GPU preemptor needs devices that no pod holds whole and no
share is left on: on a node whose GPUs are all shared, every share of one device goes (the
device with the fewest). What a gang preemptor's check is told the victims free is whole GPUs
in both cases: the devices they leave free for a whole-GPU pod (a device whose every share
goes counts; one still shared does not).

Every returned list, whichever way it was chosen, obeys the same rules: only bound pods of
strictly lower priority, gang members as ``gang_victims`` says, ordered by decreasing priority,
never empty (the node is dropped instead), and nothing at all for a preemptor with
``preemptionPolicy: Never``.

**Gang victims** (``gang_victims``):

* ``protect``: a member of a gang is never chosen. A node where only gang members could free
  enough is dropped, so kube-scheduler picks a node without them.
* ``whole-group``: gang members may be chosen, but a gang is evicted whole on that node (and
  not at all when one of its members there may not be a victim). Its members elsewhere are
  added to ``NumPDBViolations``, so that kube-scheduler's candidate selection (fewest
  violations first) prefers nodes that break no gang.

A preemptor that is itself a gang member preempts on a node only if its whole group can then
fit (checked by the caller).

**Team quotas** (``rule``, from :func:`extender.quotas.victim_rule`): pods of a namespace
within its min are never victims of another namespace's preemptor; a reclaiming preemptor
(within its min) takes the smallest set from the borrowers' pods alone when they suffice, and
only otherwise from every pod it may take. Without quotas (``rule`` None), nothing changes.
"""

from __future__ import annotations

import ipaddress
import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum

from extender.addressing import IPContext, ip_context
from extender.inventory import Inventory
from extender.kinds import asked
from extender.kinds.whole_gpu import WHOLE_GPU, free_after, outside_freed
from extender.model import RANKED, Holding, HoldingKind, PodRequest, Reason, Victim
from extender.node_state import NodeView
from extender.policy import PolicyConfig, node_reasons
from extender.quotas import VictimRule

__all__ = ["GangVictims", "NodeVictims", "select_victims"]


class GangVictims(Enum):
    PROTECT = "protect"
    WHOLE_GROUP = "whole-group"


@dataclass(frozen=True, slots=True)
class NodeVictims:
    uids: list[str]  # ordered by decreasing priority
    extra_pdb_violations: int = 0  # gang members broken elsewhere (whole-group)
    # The GPUs in use outside schedext that evicting them frees too, each with why it was
    # held ("GPU 1 allocated by DRA to claim ml/train (pod ml/a)"): for the shell's log.
    frees: tuple[str, ...] = ()


def select_victims(
    inventory: Inventory,
    request: PodRequest,
    candidates: Mapping[str, Sequence[Victim]],
    config: PolicyConfig,
    *,
    gang_victims: GangVictims = GangVictims.PROTECT,
    group_can_fit: Callable[[str, int], bool] | None = None,
    rule: VictimRule | None = None,
) -> dict[str, NodeVictims]:
    """Victims per candidate node worth preempting on (see the module docstring).

    ``group_can_fit(node, freed_gpus)``: for a gang preemptor, whether its whole group fits
    once ``freed_gpus`` whole GPUs are freed on ``node`` (devices the victims leave free for a
    whole-GPU pod; a device still shared is not one).
    """
    if request.preempt_never:
        return {}
    context = ip_context(inventory, request)
    result: dict[str, NodeVictims] = {}
    for node, proposed in candidates.items():
        if not proposed:
            continue  # kube-scheduler rejects a candidate with no victim
        chosen = _victims_on(
            inventory,
            request,
            node,
            proposed,
            config=config,
            context=context,
            gang_victims=gang_victims,
            rule=rule,
        )
        if chosen is None:
            continue
        freed = _whole_gpus_freed(inventory.node(node), chosen)
        if group_can_fit is not None and not group_can_fit(node, freed):
            continue
        view = inventory.node(node)
        result[node] = NodeVictims(
            uids=[h.uid for h in sorted(chosen, key=lambda h: -h.priority)],
            extra_pdb_violations=_broken_gang_members(inventory, chosen, node),
            frees=tuple(outside_freed(view, chosen).values()) if view is not None else (),
        )
    return result


def _victims_on(
    inventory: Inventory,
    request: PodRequest,
    node: str,
    proposed: Sequence[Victim],
    *,
    config: PolicyConfig,
    context: IPContext | None,
    gang_victims: GangVictims,
    rule: VictimRule | None = None,
) -> list[Holding] | None:
    code = RANKED[int(node_reasons(inventory, request, inventory.ids([node]), config)[0])]
    view = inventory.node(node)
    if view is None or (code is not Reason.FITS and not code.resolvable):
        return None
    units = _units(view, request, gang_victims)
    if rule is not None:
        units = [unit for unit in units if all(map(rule.allows, unit))]
    eligible = [h for unit in units for h in unit]
    need = _Need(request, view, context, inventory)
    if not need.met(eligible):
        return None
    proposed_uids = {v.uid for v in proposed}
    # Never a set that takes another team below its min (VictimRule.affordable).
    allowed = rule.affordable if rule is not None else None
    victims = None
    if rule is not None and rule.reclaim:
        # Borrowed capacity is taken back first: from the borrowers alone when they suffice.
        borrowed = [unit for unit in units if all(map(rule.first, unit))]
        if borrowed and need.met([h for unit in borrowed for h in unit]):
            victims = _smallest(borrowed, need, proposed_uids, allowed=allowed)
    if victims is None:
        # Beyond the borrowers (a reclaim), as few pods of others as the fewest pods allow.
        others = (lambda h: not rule.first(h)) if rule is not None and rule.reclaim else None
        victims = _smallest(units, need, proposed_uids, others, allowed=allowed)
        if victims is None:
            return None
    if not victims:
        # Nothing schedext tracks needs to go: kube-scheduler's list is for its own reasons.
        chosen = _proposed_units(units, proposed)
        return chosen if chosen is None or allowed is None or allowed(chosen) else None
    return victims


def _proposed_units(units: list[list[Holding]], proposed: Sequence[Victim]) -> list[Holding] | None:
    """kube-scheduler's own list, when it may be evicted as it is: each proposed pod with the
    rest of its unit (its gang on this node, under whole-group). kube-scheduler proposes the
    pods its own filters need gone, so one that may not be a victim (protected, not of lower
    priority, or not known here) drops the node rather than the pod."""
    unit_of = {h.uid: unit for unit in units for h in unit}
    chosen: dict[str, Holding] = {}
    for victim in proposed:
        unit = unit_of.get(victim.uid)
        if unit is None:
            return None
        chosen.update((h.uid, h) for h in unit)
    return list(chosen.values()) or None


# Exhaustive search is used while it stays cheap; beyond, a greedy reprieve.
_MAX_COMBINATIONS = 20_000


def _smallest(
    units: list[list[Holding]],
    need: _Need,
    proposed: set[str],
    spare_first: Callable[[Holding], bool] | None = None,
    *,
    allowed: Callable[[list[Holding]], bool] | None = None,
) -> list[Holding] | None:
    """The fewest units whose eviction meets the need, ranked as the module docstring says;
    with ``spare_first``, among the fewest, those with the fewest such pods first. Only sets
    ``allowed`` passes are considered; None when none is found."""
    if need.met([]):
        return []
    for size in range(1, len(units) + 1):
        if math.comb(len(units), size) > _MAX_COMBINATIONS:
            break
        best: tuple[tuple[int, int, int, int, int, int], list[Holding]] | None = None
        for combination in itertools.combinations(units, size):
            victims = [h for unit in combination for h in unit]
            if need.met(victims) and (allowed is None or allowed(victims)):
                key = (
                    sum(map(spare_first, victims)) if spare_first is not None else 0,
                    max(h.priority for h in victims),
                    sum(h.priority for h in victims),
                    sum(map(need.freed, victims)),
                    sum(1 for h in victims if h.ip),  # addresses are worth keeping
                    -sum(1 for h in victims if h.uid in proposed),
                )
                if best is None or key < best[0]:
                    best = (key, victims)
        if best is not None:
            return best[1]
    # Greedy: evict everything, then spare the most important first (highest priority, then
    # those that free the least, then pods kube-scheduler did not pick) while the rest suffice.
    victims = [h for unit in units for h in unit]
    order = sorted(units, key=lambda u: _reprieve_order(u, proposed, need.freed))
    if spare_first is not None:
        order.sort(key=lambda u: not any(map(spare_first, u)))  # stable: those first
    for unit in order:
        spared = [h for h in victims if h not in unit]
        if need.met(spared):
            victims = spared
    return victims if allowed is None or allowed(victims) else None


def _units(view: NodeView, request: PodRequest, gang_victims: GangVictims) -> list[list[Holding]]:
    """What may be evicted, in the units that are evicted or spared together: one bound pod of
    strictly lower priority; a gang member never under protect, and under whole-group only
    with all its gang's members on this node, when every one of them may go."""

    def evictable(holding: Holding) -> bool:
        return holding.kind is HoldingKind.BOUND and holding.priority < request.priority

    units: list[list[Holding]] = []
    gangs: dict[str, list[Holding]] = {}
    for holding in view.holdings:
        if holding.group is None:
            if evictable(holding):
                units.append([holding])
        elif gang_victims is GangVictims.WHOLE_GROUP:
            gangs.setdefault(holding.group, []).append(holding)
    return units + [members for members in gangs.values() if all(map(evictable, members))]


def _reprieve_order(
    unit: list[Holding], proposed: set[str], freed: Callable[[Holding], int]
) -> tuple[int, int, bool, str]:
    return (
        -max(h.priority for h in unit),
        sum(map(freed, unit)),
        any(h.uid in proposed for h in unit),
        min(h.uid for h in unit),
    )


def _whole_gpus_freed(view: NodeView | None, victims: Sequence[Holding]) -> int:
    """How many more GPUs are free for a whole-GPU pod once ``victims`` are gone."""
    if view is None:
        return sum(h.gpus for h in victims)
    return len(free_after(view, victims)) - len(free_after(view, ()))


def _broken_gang_members(inventory: Inventory, victims: list[Holding], node: str) -> int:
    groups = {h.group for h in victims if h.group is not None}
    if not groups:
        return 0
    return sum(
        1
        for h in inventory.holdings()
        if h.group in groups and h.node != node and h.kind is HoldingKind.BOUND
    )


class _Need:
    """What the pod needs on one node, and whether evicting a set of pods gives it."""

    def __init__(
        self, request: PodRequest, view: NodeView, context: IPContext | None, inventory: Inventory
    ) -> None:
        self.request, self.view, self.context = request, view, context
        self._book = inventory.addresses
        # Only the pools that select this node can give the pod an address here.
        node_id = int(inventory.ids([view.spec.name])[0])
        self._pools = tuple(
            p for p in (context.pools if context else ()) if inventory.pool_mask(p)[node_id]
        )
        # What the pod asks of each kind, checked per set of victims; what a victim frees is
        # weighed in the unit of the first kind it asks (whole GPUs for a pod that asks none).
        kinds = asked(request)
        self._checks = [kind.victims_check(view, request) for kind in kinds]
        self._unit = kinds[0] if kinds else WHOLE_GPU

    def met(self, victims: list[Holding]) -> bool:
        request, view = self.request, self.view
        cpu = view.cpu_free + sum(h.cpu_milli for h in victims)
        memory = view.memory_free + sum(h.memory_bytes for h in victims)
        if cpu < request.cpu_milli or memory < request.memory_bytes:
            return False
        return all(check(victims) for check in self._checks) and self._address_met(victims)

    def freed(self, victim: Holding) -> int:
        """What evicting ``victim`` frees, in the unit the preemptor is short of
        (:meth:`Kind.freed`)."""
        return self._unit.freed(self.view, victim)

    def _address_met(self, victims: list[Holding]) -> bool:
        """Whether the pod gets its address here once ``victims`` are gone. Evicting a pod
        frees its address only when no claim keeps it (see :mod:`extender.addressing`)."""
        context = self.context
        if context is None:
            return True
        if context.sticky_busy is not None:
            return False
        holder = context.holder
        if holder is not None:
            return (
                bool(holder.uid)
                and not context.kept_by
                and any(h.uid == holder.uid for h in victims)
            )
        if context.target is not None:
            return True
        if any(p.name not in context.exhausted for p in self._pools):
            return True
        return any(self._frees_address(h) for h in victims)

    def _frees_address(self, victim: Holding) -> bool:
        """Whether evicting ``victim`` frees an address of a pool selecting this node."""
        if victim.ip is None:
            return False
        address = int(ipaddress.ip_address(victim.ip))
        context = self.context
        identity = context.identity if context else None
        return any(p.contains(address) for p in self._pools) and (
            self._book.kept_from(address, identity) is None
        )
