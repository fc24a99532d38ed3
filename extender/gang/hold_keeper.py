"""The review that starts, keeps and ends gangs' holds (:mod:`extender.gang.holds` says why
they exist), run by the shell about every second with the wall-clock time.

Each review, for each hold that stands: it ends (ENDED) when its PodGroup is gone, when the
gang has every member it needs placed, or when one of its nodes is gone (the next review
chooses again); it expires (EXPIRED) at its maximum age, and the gang's wait starts afresh.
Then, for each gang that waits (all its members exist, too few are placed): a hold its PodGroup
records is adopted (a restart, or a new leader); otherwise, once it has waited ``after_s``, and
if it does not fit now, and its team quota lets it in, it gets the hold
:func:`~extender.gang.hold_choice.choose_hold` finds, if any (why not is kept, for explain).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from extender.config import PolicyConfig
from extender.gang.coordinator import GangCoordinator
from extender.gang.hold_choice import choose_hold
from extender.gang.holds import Hold, HoldBook, HoldEventKind, read_hold_record
from extender.gang.spec import PodGroupSpec
from extender.inventory import IntArray, Inventory
from extender.model import HoldingKind, PodRequest

__all__ = ["HoldKeeper", "HoldTimes"]

_NONE = PodGroupSpec(namespace="", name="", min_member=1)
# A gang that got no hold is looked at again after this many seconds.
RETRY_S = 10.0


@dataclass(frozen=True, slots=True)
class HoldTimes:
    """``after_s``: how long a gang waits before it may get a hold (0: never);
    ``max_s``: how long a hold lasts at most."""

    after_s: float = 120.0
    max_s: float = 900.0


@dataclass(slots=True)
class HoldKeeper:
    inventory: Inventory
    config: PolicyConfig
    gangs: GangCoordinator
    times: HoldTimes = HoldTimes()
    book: HoldBook = field(default_factory=HoldBook)
    # Per gang that waits: since when (Unix seconds), and why it has no hold, if it has not.
    waiting_since: dict[str, float] = field(default_factory=dict)
    why_not: dict[str, str] = field(default_factory=dict)
    _last: float | None = None
    # Per gang that got no hold: when to look again (a choice reads every pod's holding:
    # not every second for a gang that cannot have one).
    _retry_at: dict[str, float] = field(default_factory=dict)
    # The records on PodGroups of holds that ended, until the PodGroup no longer carries them
    # (the shell removes them): not adopted again meanwhile.
    _ended: dict[str, str] = field(default_factory=dict)

    def review(self, now: float, admitted: Callable[[PodRequest], bool]) -> None:
        """One review at ``now`` (see the module docstring); ``admitted``: whether the team
        quota lets a gang (given by one member) in."""
        if self._last is not None:
            self.book.account(self.inventory, max(0.0, now - self._last))
        self._last = now
        specs = {spec.key: spec for spec in self.gangs.book.specs()}
        self._adopt_and_end(specs, now)
        releasable: dict[int, IntArray] = {}  # by the gang's priority, read once per review
        for spec in specs.values():
            if not self._waits(spec):
                self._forget(spec.key)
                continue
            since = self.waiting_since.setdefault(spec.key, now)
            due = self.times.after_s > 0 and now - since >= self.times.after_s
            if due and self.book.get(spec.key) is None and now >= self._retry_at.get(spec.key, now):
                self._start(spec, now, since, admitted, releasable)

    def _adopt_and_end(self, specs: dict[str, PodGroupSpec], now: float) -> None:
        for spec in specs.values():
            if (
                spec.hold
                and self.book.get(spec.key) is None
                and self._ended.get(spec.key) != spec.hold
            ):
                # A restart, or a new leader; or a record left over: adopted, then ended below.
                self._adopt(spec, now)
        self._ended = {
            g: text for g, text in self._ended.items() if specs.get(g, _NONE).hold == text
        }
        for hold in self.book.holds():
            self._keep_or_end(hold, specs.get(hold.group), now)
        for group in [g for g in self.waiting_since if g not in specs]:
            self._forget(group)

    def _forget(self, group: str) -> None:
        self.waiting_since.pop(group, None)
        self.why_not.pop(group, None)
        self._retry_at.pop(group, None)

    def _start(
        self,
        spec: PodGroupSpec,
        now: float,
        since: float,
        admitted: Callable[[PodRequest], bool],
        releasable: dict[int, IntArray],
    ) -> None:
        """A hold for the gang, if it does not fit now, its quota lets it in, and one place
        would hold it (why not is kept, and looked at again in :data:`RETRY_S`)."""
        needed = self.gangs.unplaced(spec)
        if self.gangs.fits_now(spec) or not admitted(needed[0]):
            return
        priority = min(r.priority for r in needed)
        if priority not in releasable:
            releasable[priority] = _releasable(self.inventory, priority)
        level = self.gangs.topology(spec).required
        choice = choose_hold(
            self.inventory, self.config, needed=needed, level=level,
            releasable=releasable[priority],
        )  # fmt: skip
        if not choice.need:
            self.why_not[spec.key] = f"no hold: {choice.why_not}"
            self._retry_at[spec.key] = now + RETRY_S
            return
        self.why_not.pop(spec.key, None)
        self._retry_at.pop(spec.key, None)
        hold = Hold(
            group=spec.key, priority=priority, need=tuple(sorted(choice.need.items())),
            started=now, expires=now + self.times.max_s, waiting_since=since,
            level=level if choice.domain else "", domain=choice.domain,
        )  # fmt: skip
        waited = f"it has waited {now - since:.0f}s for {sum(r.gpus for r in needed)} GPUs"
        self.book.start(hold, uid=spec.uid, reason=waited)

    def take_over(self, now: float) -> None:
        """This replica answers the verbs from now on (it was elected, or it has just synced):
        the holds of an earlier term are forgotten and those the PodGroups record adopted at
        once, so that filter keeps pods off them from its first answer, not from the first
        review (up to a second later: small pods took the held GPUs meanwhile). Their STARTED
        events wait for that review."""
        self.book.clear()
        self._last = None  # the idle GPUs are counted from the first review on
        for spec in self.gangs.book.specs():
            if spec.hold and self._ended.get(spec.key) != spec.hold:
                self._adopt(spec, now)

    def waited(self, group: str, now: float) -> float:
        """How long ``group`` waited until it completed at ``now`` (0 when no review saw it
        wait: it was placed within a second); it waits no more."""
        since = self.waiting_since.pop(group, None)
        return 0.0 if since is None else max(0.0, now - since)

    # -------------------------------------------------------------- internals

    def _waits(self, spec: PodGroupSpec) -> bool:
        return self.gangs.book.member_count(spec.key) >= spec.min_member and bool(
            self.gangs.unplaced(spec)
        )

    def _adopt(self, spec: PodGroupSpec, now: float) -> None:
        hold = read_hold_record(spec.key, spec.hold)
        if hold is None:
            return
        self.waiting_since[spec.key] = min(hold.waiting_since, now)
        self.book.start(hold, uid=spec.uid, reason="adopted from its PodGroup")

    def _keep_or_end(self, hold: Hold, spec: PodGroupSpec | None, now: float) -> None:
        uid = spec.uid if spec is not None else ""
        if spec is not None and spec.hold:
            self._ended[hold.group] = spec.hold  # if it ends now
        if spec is None:
            self.book.end(hold.group, HoldEventKind.ENDED, "its PodGroup is gone")
        elif self.gangs.book.member_count(spec.key) < spec.min_member:
            why = f"it has fewer than minMember ({spec.min_member}) pods now"
            self.book.end(hold.group, HoldEventKind.ENDED, why, uid=uid)
        elif not self.gangs.unplaced(spec):
            self.book.end(hold.group, HoldEventKind.ENDED, "its members are placed", uid=uid)
        elif now >= hold.expires:
            self.book.end(
                hold.group, HoldEventKind.EXPIRED,
                f"it reached its maximum age ({self.times.max_s:g}s): the gang waits afresh",
                uid=uid,
            )  # fmt: skip
            self.waiting_since[hold.group] = now
        elif gone := [node for node, _ in hold.need if node not in self.inventory]:
            self.book.end(hold.group, HoldEventKind.ENDED, f"node {gone[0]} is gone", uid=uid)
        else:
            self._ended.pop(hold.group, None)  # it stands


def _releasable(inventory: Inventory, priority: int) -> IntArray:
    """Per node id, the GPUs held by bound pods in no gang of at most ``priority``."""
    out = np.zeros(len(inventory.arrays.alive), dtype=np.int64)
    for holding in inventory.holdings():
        if (
            holding.gpus
            and holding.group is None
            and holding.kind is HoldingKind.BOUND
            and holding.priority <= priority
            and holding.node in inventory
        ):
            out[int(inventory.ids([holding.node])[0])] += holding.gpus
    return out
