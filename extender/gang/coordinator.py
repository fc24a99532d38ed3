"""The gang decisions of every verb, in one place.

Each of :class:`~extender.scheduler.Scheduler`'s verbs asks one question here for a pod of a
gang (the shape of scheduler-plugins' coscheduling: the plugin a thin shim over a manager):
filter, whether the group lets the member through and onto which nodes (:meth:`filter`,
:meth:`keep_room`); prioritize, where the group already is (:meth:`affinity`); preempt,
whether the group still fits once a node frees GPUs (:meth:`eviction_check`); bind, whether
the member joins the barrier, wins a competition or gives way (:meth:`admit`). The
coordinator reads and writes the gang book and the inventory's reservations; time comes in as
``now``, and effects go out as :class:`~extender.gang.book.GangEvent` values in the book.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from extender import policy
from extender.config import PolicyConfig
from extender.errors import BindRefusedError
from extender.gang.book import GangBook, GangEventKind
from extender.gang.domain_fit import required_fit
from extender.gang.packing import FitCache, fits_all, member_nodes
from extender.gang.preference import preference
from extender.gang.spec import PodGroupSpec, min_resources_gap
from extender.gang.topology import Topology, group_topology
from extender.inventory import BoolArray, IdArray, Inventory
from extender.model import (
    FilterVerdict,
    GroupStatus,
    Holding,
    HoldingKind,
    PodRequest,
    Reason,
    Rejection,
)
from extender.scoring import GroupAffinity

__all__ = ["OPEN", "GangCoordinator", "GangGate"]


@dataclass(frozen=True, slots=True)
class GangGate:
    """What a member's group says before its nodes are judged: reject it on every node
    (``verdict``), or let it through onto the node ids in ``allowed`` (None: any)."""

    verdict: FilterVerdict | None = None
    allowed: BoolArray | None = None


OPEN = GangGate()  # a pod of no gang


class GangCoordinator:
    def __init__(
        self,
        inventory: Inventory,
        config: PolicyConfig,
        *,
        default_timeout_s: float = 20.0,
        max_wait_s: float = 20.0,
    ) -> None:
        self.book = GangBook(default_timeout_s=default_timeout_s, max_wait_s=max_wait_s)
        self._inventory, self._config = inventory, config
        # Whole-group fit answers for the current inventory state (every member's filter asks).
        self._fits = FitCache()

    # ----------------------------------------------------------------- filter

    def filter(self, request: PodRequest, node_names: Sequence[str]) -> GangGate:
        """:meth:`gate`, for filter: the member is recorded, and one turned away because
        members are missing is remembered, to be retried once they exist (a QUORUM event)."""
        group = request.group
        assert group is not None
        self.book.track(request.uid, group, request)
        gate = self.gate(request, node_names)
        if gate.verdict is not None and gate.verdict.rejections[0].reason is Reason.GANG_QUORUM:
            self.book.hold_back(group, request.uid, request.key)
        return gate

    def gate(self, request: PodRequest, node_names: Sequence[str]) -> GangGate:
        """Reject the member on every node while its group is unknown, short of members, short
        of its minResources, or cannot fit as a whole; else the nodes it may take so that the
        rest of its group still fits."""
        group = request.group
        assert group is not None
        spec = self.book.spec(group)
        if spec is None:
            message = f"schedext: pod group {group} not found"
            return _reject(node_names, message, Reason.GANG_NOT_FOUND)
        missing = spec.min_member - self.book.member_count(group)
        if missing > 0:
            message = f"schedext: waiting for {missing} more members of group {group}"
            return _reject(node_names, message, Reason.GANG_QUORUM)
        gaps = min_resources_gap(self._inventory, spec, self._config, self._holdings_of(group))
        if gaps:
            message = (
                f"schedext: not enough free resources for minResources of group {group}: "
                + "; ".join(gaps)
            )
            return _reject(node_names, message, Reason.GANG_CAPACITY)
        return self._room(request, spec, node_names)

    def _room(self, request: PodRequest, spec: PodGroupSpec, node_names: Sequence[str]) -> GangGate:
        """Whether the group's unplaced members fit at once (inside one domain of its required
        level, if it has one), and the nodes this member may take so that they still do."""
        group = spec.key
        needed = self._needed(spec, include=request)
        if not needed:
            return OPEN
        required = self.topology(spec).required
        if required:  # every member inside one domain of the level, or none placed at all
            fit = required_fit(
                self._inventory, self._config, group=group, level=required, request=request,
                needed=needed, placed=[h.node for h in self._holdings_of(group)], cache=self._fits,
            )  # fmt: skip
            if fit.refusal:
                return _reject(node_names, fit.refusal, Reason.GANG_CAPACITY)
            return GangGate(allowed=fit.allowed)
        allowed = None
        if needed[0].uid == request.uid:
            allowed = member_nodes(
                self._inventory, request, needed[1:], self._config, cache=self._fits
            )
        if not (allowed.any() if allowed is not None else self._fits_all(needed)):
            room = " or room for GPU shares" if any(r.share.devices for r in needed) else ""
            message = f"schedext: not enough free GPUs{room} for all of group {group}"
            return _reject(node_names, message, Reason.GANG_CAPACITY)
        return GangGate(allowed=allowed)

    def keep_room(
        self, request: PodRequest, verdict: FilterVerdict, passed_ids: IdArray, gate: GangGate
    ) -> tuple[FilterVerdict, IdArray]:
        """Of the nodes that passed, reject too those that would strand the rest of the group
        (evicting pods there may help); the ids of the nodes still passing."""
        allowed = gate.allowed
        if allowed is None or not len(passed_ids):
            return verdict, passed_ids
        keep = allowed[passed_ids]
        if keep.all():
            return verdict, passed_ids
        flags = keep.tolist()
        stranded = Rejection(
            f"schedext: the rest of group {request.group} would not fit with this member here",
            resolvable=Reason.GANG_CAPACITY.resolvable,
            nodes=[n for n, k in zip(verdict.passed, flags, strict=True) if not k],
            reason=Reason.GANG_CAPACITY,
        )
        passed = [n for n, k in zip(verdict.passed, flags, strict=True) if k]
        return FilterVerdict(passed, (*verdict.rejections, stranded)), passed_ids[keep]

    def topology(self, spec: PodGroupSpec) -> Topology:
        """The group's required and preferred levels (see :func:`group_topology`)."""
        members = [r for r in self.book.members(spec.key).values() if r is not None]
        return group_topology(spec.topology, members, self._config.topology_levels)

    # ------------------------------------------------------------- prioritize

    def affinity(self, request: PodRequest) -> GroupAffinity:
        """Where the member's group already runs, or how many GPUs it still needs."""
        group = request.group
        assert group is not None
        placed = [
            held.node
            for uid in self.book.members(group)
            if uid != request.uid and (held := self._inventory.holding(uid)) is not None
        ]
        spec = self.book.spec(group)
        preferred = self.topology(spec).preferred if spec is not None else ""
        if placed and not preferred:
            ids = self._inventory.ids(placed)
            a = self._inventory.arrays
            racks = [r for r, _ in Counter(a.rack[ids].tolist()).most_common()]
            zones = [z for z, _ in Counter(a.zone[ids].tolist()).most_common()]
            return GroupAffinity(racks=tuple(racks), zones=tuple(zones))
        needed = self._needed(spec, include=request) if spec is not None else [request]
        gpus = sum(r.gpus for r in needed) if not placed else 0
        if not preferred:
            return GroupAffinity(gpus_needed=gpus)
        levels = self._config.topology_levels
        rating = preference(self._inventory, levels, preferred, placed=placed, gpus_needed=gpus)
        return GroupAffinity(gpus_needed=gpus, topology=rating)

    def needed(self, request: PodRequest) -> list[PodRequest]:
        """The unplaced members, ``request`` among them, that its group still needs to reach
        minMember; just ``request`` once the group has them all placed (a team quota counts
        a gang whole: these together)."""
        group = request.group
        assert group is not None
        spec = self.book.spec(group)
        return (self._needed(spec, include=request) if spec is not None else []) or [request]

    def unplaced(self, spec: PodGroupSpec) -> list[PodRequest]:
        """The unplaced members its group still needs to reach minMember (none: placed)."""
        return self._needed(spec)

    def fits_now(self, spec: PodGroupSpec) -> bool:
        """Whether the group's unplaced members fit now, as its members' filter judges it."""
        needed = self._needed(spec)
        return not needed or self._room(needed[0], spec, ()).verdict is None

    # ---------------------------------------------------------------- preempt

    def eviction_check(self, request: PodRequest) -> Callable[[str, int], bool] | None:
        """For a gang preemptor: whether the rest of its group still fits once a node frees
        that many GPUs and the preemptor takes its own. None when the group is unknown: no
        node is worth preempting on for it."""
        group = request.group
        assert group is not None
        spec = self.book.spec(group)
        if spec is None:
            return None
        others = [r for r in self._needed(spec, include=request) if r.uid != request.uid]

        def group_can_fit(node: str, freed: int) -> bool:
            node_id = int(self._inventory.ids([node])[0])
            return self._fits_all(others, free_delta={node_id: freed - request.gpus})

        return group_can_fit

    # ------------------------------------------------------------------- bind

    def admit(self, request: PodRequest, holding: Holding, now: float) -> None:
        """A member reserved its place: join the barrier, or settle a competition between
        groups (see :mod:`extender.gang`). Raises BindRefusedError, its reservation gone, when
        its group gives way."""
        group = request.group
        assert group is not None
        spec = self.book.spec(group)
        if spec is None:
            self._inventory.remove_holding(holding.uid)
            raise BindRefusedError(f"pod {request.key}: pod group {group} not found")
        placed = self._placed(group)
        if placed >= spec.min_member or self._fits_all(self._needed(spec)):
            self.book.join(group, holding.uid, now=now, placed=placed)
            return
        blockers = [g for g in self.book.waiting_groups() if g != group]
        specs = [self.book.spec(b) for b in blockers]
        older_than_all = all(b is None or spec.age_key < b.age_key for b in specs)
        if blockers and older_than_all:
            freed = self._reserved_gpus(blockers)
            if self._fits_all(self._needed(spec), free_delta=freed):
                for blocker in blockers:
                    self.release(
                        blocker,
                        GangEventKind.RELEASED,
                        f"schedext: group {blocker} yielded to older group {group}",
                    )
                self.book.join(group, holding.uid, now=now, placed=placed)
                return
        self._inventory.remove_holding(holding.uid)
        reason = f"schedext: group {group} cannot complete now: too few free GPUs for its members"
        self.release(group, GangEventKind.RELEASED, reason)
        raise BindRefusedError(f"pod {request.key}: {reason}; its reservations were released")

    def time_out(self, group: str) -> None:
        """End the group's wait at the bind barrier: its time is up. Every reservation of the
        group is released and its waiting binds fail (a TIMED_OUT event); nothing happens for
        a group that is not waiting."""
        if self.book.deadline(group) is None:
            return
        spec = self.book.spec(group)
        timeout = self.book.timeout_for(spec) if spec else 0
        minimum = spec.min_member if spec else "?"
        self.release(
            group,
            GangEventKind.TIMED_OUT,
            f"schedext: group {group} did not reach minMember {minimum} within {timeout:g}s",
        )

    def expire(self, now: float) -> None:
        """End the waits of the groups past their timeout."""
        for group in self.book.overdue(now):
            self.time_out(group)

    # ------------------------------------------------------------------ reads

    def status(self, group: str) -> GroupStatus | None:
        """The PodGroup's status, as scheduler-plugins keeps it."""
        spec = self.book.spec(group)
        if spec is None:
            return None
        held = self._holdings_of(group)
        bound = [h for h in held if h.kind is HoldingKind.BOUND]
        running = sum(1 for h in bound if h.running)
        members = self.book.member_count(group)
        if running >= spec.min_member:
            phase = "Running"
        elif len(bound) >= spec.min_member:
            phase = "Scheduled"
        elif held:
            phase = "Scheduling"
        elif members >= spec.min_member:
            phase = "PreScheduling"
        else:
            phase = "Pending"
        return GroupStatus(phase, members, len(bound), running, len(held) - len(bound))

    # -------------------------------------------------------------- internals

    def _fits_all(
        self, requests: Iterable[PodRequest], free_delta: Mapping[int, int] | None = None
    ) -> bool:
        return fits_all(
            self._inventory, requests, self._config, free_delta=free_delta, cache=self._fits
        )

    def release(self, group: str, kind: GangEventKind, reason: str) -> None:
        """End the group's wait: its reservations go, its waiting binds fail (``reason``)."""
        for uid in self.book.release(group, kind, reason):
            held = self._inventory.holding(uid)
            if held is not None and held.kind is HoldingKind.RESERVED:
                self._inventory.remove_holding(uid)

    def _holdings_of(self, group: str) -> list[Holding]:
        """What the group's members hold, bound or reserved."""
        held = (self._inventory.holding(uid) for uid in self.book.members(group))
        return [h for h in held if h is not None]

    def _placed(self, group: str) -> int:
        return sum(1 for uid in self.book.members(group) if self._inventory.holding(uid))

    def _needed(self, spec: PodGroupSpec, include: PodRequest | None = None) -> list[PodRequest]:
        """The unplaced members that must still find GPUs for the group to reach minMember:
        ``include`` (the pod being decided) and the smallest of the others (a share is
        smaller than a whole GPU)."""
        members = self.book.members(spec.key)
        missing = spec.min_member - self._placed(spec.key)
        if missing <= 0:
            return []
        chosen: list[PodRequest] = []
        if include is not None and self._inventory.holding(include.uid) is None:
            chosen.append(include)
        others = [
            r
            for uid, r in members.items()
            if r is not None
            and self._inventory.holding(uid) is None
            and (include is None or uid != include.uid)
        ]
        others.sort(key=lambda r: (r.gpus, r.share.devices, r.share.memory_mib, r.share.cores))
        return chosen + others[: max(0, missing - len(chosen))]

    def _reserved_gpus(self, groups: Iterable[str]) -> dict[int, int]:
        """GPUs per node id held by the waiting members of ``groups``."""
        freed: dict[int, int] = {}
        for group in groups:
            for uid in self.book.waiting_uids(group):
                held = self._inventory.holding(uid)
                if held is not None and held.kind is HoldingKind.RESERVED:
                    node_id = int(self._inventory.ids([held.node])[0])
                    freed[node_id] = freed.get(node_id, 0) + held.gpus
        return freed


def _reject(node_names: Sequence[str], message: str, reason: Reason) -> GangGate:
    return GangGate(verdict=policy.reject_all(node_names, message, reason))
