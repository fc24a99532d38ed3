"""The gang book: PodGroups, their member pods, the groups whose members wait at the bind
barrier, and the effects recorded for the shell (:class:`GangEvent`)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import Enum

from extender.gang.spec import PodGroupSpec
from extender.model import PodRequest

__all__ = ["GangBook", "GangEvent", "GangEventKind"]


class GangEventKind(Enum):
    COMPLETE = "complete"  # quorum reached: the waiting members may bind
    RELEASED = "released"  # the group gave its reservations back (lost a competition, or
    # cannot complete); its waiting binds fail
    TIMED_OUT = "timed_out"  # the group did not reach quorum in time; same effect
    QUORUM = "quorum"  # minMember pods exist now: the members filter turned away for the
    # missing ones are to be retried (``pods``)


@dataclass(frozen=True, slots=True)
class GangEvent:
    kind: GangEventKind
    group: str
    reason: str = ""
    uids: tuple[str, ...] = ()  # the members whose reservations were released
    pods: tuple[tuple[str, str], ...] = ()  # (namespace/name, uid) of those members, if known


@dataclass(slots=True)
class _Waiting:
    started: float
    deadline: float
    uids: set[str] = field(default_factory=set)


class GangBook:
    """PodGroups, their member pods, and the groups whose members wait at the bind barrier."""

    def __init__(self, *, default_timeout_s: float = 20.0, max_wait_s: float = 20.0) -> None:
        if default_timeout_s <= 0 or max_wait_s <= 0:
            raise ValueError("gang timeouts must be > 0")
        self._default_timeout_s = default_timeout_s
        self._max_wait_s = max_wait_s
        self._specs: dict[str, PodGroupSpec] = {}
        # group -> member uid -> the member's request (None once known only as bound)
        self._members: dict[str, dict[str, PodRequest | None]] = {}
        self._member_of: dict[str, str] = {}
        self._waiting: dict[str, _Waiting] = {}
        # group -> uid -> namespace/name of the members filter turned away for missing ones.
        # kube-scheduler retries a pod an extender rejected only on a later cluster event, and
        # the arrival of the last member is none (an unscheduled pod's creation does not
        # requeue others): without a nudge they would wait for the barrier of the members
        # that did pass to time out, or for kube-scheduler's five-minute flush.
        self._held_back: dict[str, dict[str, str]] = {}
        self._events: list[GangEvent] = []
        # group -> how its last wait at the barrier ended without completing (timed out,
        # released), until the group completes: what an operator asks when a gang is stuck.
        self._failures: dict[str, GangEvent] = {}

    # ------------------------------------------------------------------ reads

    def spec(self, group: str) -> PodGroupSpec | None:
        return self._specs.get(group)

    def specs(self) -> list[PodGroupSpec]:
        return list(self._specs.values())

    def group_of(self, uid: str) -> str | None:
        """The group pod ``uid`` is tracked in; None when in none."""
        return self._member_of.get(uid)

    def member_count(self, group: str) -> int:
        return len(self._members.get(group, {}))

    def members(self, group: str) -> dict[str, PodRequest | None]:
        return dict(self._members.get(group, {}))

    def waiting_groups(self) -> list[str]:
        return list(self._waiting)

    def waiting_uids(self, group: str) -> set[str]:
        waiting = self._waiting.get(group)
        return set(waiting.uids) if waiting else set()

    def deadline(self, group: str) -> float | None:
        waiting = self._waiting.get(group)
        return waiting.deadline if waiting else None

    def failure(self, group: str) -> GangEvent | None:
        """How the group's last wait at the barrier ended without completing (a TIMED_OUT or
        RELEASED event); None when it has not failed since it last completed."""
        return self._failures.get(group)

    def take_events(self) -> list[GangEvent]:
        """The effects recorded since the last call (the shell performs them)."""
        events, self._events = self._events, []
        return events

    def timeout_for(self, spec: PodGroupSpec) -> float:
        """The group's wait, capped so that a waiting bind answers kube-scheduler before its
        extender httpTimeout."""
        return min(spec.timeout_s or self._default_timeout_s, self._max_wait_s)

    # ----------------------------------------------------------------- groups

    def upsert_group(self, spec: PodGroupSpec) -> None:
        self._specs[spec.key] = spec
        self._check_quorum(spec.key)

    def delete_group(self, key: str) -> None:
        self._specs.pop(key, None)
        self._failures.pop(key, None)

    def replace_groups(self, specs: Iterable[PodGroupSpec]) -> None:
        self._specs = {spec.key: spec for spec in specs}
        self._failures = {g: e for g, e in self._failures.items() if g in self._specs}

    # ---------------------------------------------------------------- members

    def track(self, uid: str, group: str | None, request: PodRequest | None) -> None:
        """Record that pod ``uid`` exists in ``group`` (None: in no group)."""
        old = self._member_of.get(uid)
        if old is not None and old != group:
            self.forget(uid)
        if group is None:
            return
        members = self._members.setdefault(group, {})
        if request is not None or uid not in members:
            members[uid] = request
        self._member_of[uid] = group
        if group in self._held_back:
            self._check_quorum(group)

    def hold_back(self, group: str, uid: str, pod: str) -> None:
        """Filter turned member ``uid`` (``pod``: namespace/name) away: too few members."""
        self._held_back.setdefault(group, {})[uid] = pod

    def _check_quorum(self, group: str) -> None:
        spec = self._specs.get(group)
        held = self._held_back.get(group)
        if spec is None or not held or self.member_count(group) < spec.min_member:
            return
        del self._held_back[group]
        pods = tuple(sorted((pod, uid) for uid, pod in held.items()))
        self._events.append(GangEvent(GangEventKind.QUORUM, group, uids=tuple(held), pods=pods))

    def forget(self, uid: str) -> None:
        group = self._member_of.pop(uid, None)
        if group is None:
            return
        members = self._members.get(group)
        if members is not None:
            members.pop(uid, None)
            if not members:
                del self._members[group]
        held = self._held_back.get(group)
        if held is not None:
            held.pop(uid, None)
            if not held:
                del self._held_back[group]
        waiting = self._waiting.get(group)
        if waiting is not None:
            waiting.uids.discard(uid)

    def replace_members(self, members: Iterable[tuple[str, str, PodRequest | None]]) -> None:
        """A pod relist: exactly these (uid, group, request) members exist."""
        self._members.clear()
        self._member_of.clear()
        for uid, group, request in members:
            self.track(uid, group, request)
        for waiting in self._waiting.values():
            waiting.uids.intersection_update(self._member_of)
        for group in list(self._held_back):
            held = {u: p for u, p in self._held_back[group].items() if u in self._member_of}
            if held:
                self._held_back[group] = held
                self._check_quorum(group)
            else:
                del self._held_back[group]

    # ---------------------------------------------------------------- barrier

    def join(self, group: str, uid: str, *, now: float, placed: int) -> bool:
        """A member reserved its place; True when that completes the group (quorum)."""
        spec = self._specs[group]
        if placed >= spec.min_member:
            waiting = self._waiting.pop(group, None)
            self._failures.pop(group, None)
            self._events.append(
                GangEvent(
                    GangEventKind.COMPLETE, group, uids=tuple(waiting.uids) if waiting else ()
                )
            )
            return True
        waiting = self._waiting.get(group)
        if waiting is None:
            waiting = self._waiting[group] = _Waiting(now, now + self.timeout_for(spec))
        waiting.uids.add(uid)
        return False

    def release(self, group: str, kind: GangEventKind, reason: str) -> tuple[str, ...]:
        """End the group's wait; returns the members whose reservations must go."""
        waiting = self._waiting.pop(group, None)
        uids = tuple(sorted(waiting.uids)) if waiting else ()
        members = self._members.get(group, {})
        pods = tuple((r.key, uid) for uid in uids if (r := members.get(uid)) is not None)
        event = GangEvent(kind, group, reason=reason, uids=uids, pods=pods)
        self._events.append(event)
        self._failures[group] = event
        return uids

    def overdue(self, now: float) -> list[str]:
        return [group for group, waiting in self._waiting.items() if waiting.deadline <= now]
