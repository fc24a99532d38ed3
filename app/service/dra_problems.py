"""What DRA's claims ledger could not read or count, told to the operator.

The ledger keeps what it cannot read (an unknown apiVersion, an attribute of no known kind, a
claim naming a device no slice has) and refuses objects past its capacity; and on a node
whose GPUs schedext counts, a device a claim holds that cannot be mapped to a GPU index (no
agent UUIDs, a UUID the agent does not list) is not counted in use. Each is a
:class:`~extender.dra.Problem` (the object's kind and key, and why:
``Scheduler.dra_problems``). Here each becomes one log line and one Warning event on the
object (``kubectl describe resourceclaim``), once when first seen: not on every pass, and
again only when it comes back or its reason changes (a new reason is a new problem). The
gauge ``schedext_dra_problems{kind}`` counts what the ledger reports now.

The decision, what is new and what is gone, is :func:`compare`, a function of values; the
:class:`DraProblemReporter` reads the ledger now and then (every :data:`CHECK_INTERVAL_S`: the
read is a pass over it) and does the I/O. Only once the inventory is synced (before, a claim
whose slice is not listed yet would look like a problem), and only the leader logs and posts
events; every synced replica exports the gauge. At most :data:`NEW_PER_PASS` new problems are
reported per pass; the rest wait for the next passes, so that a relist full of problems does
not flood the event queue.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Final

from app.kube.events import DraEvent, EventRecorder
from app.kube.readiness import Readiness
from extender.dra import Problem
from extender.scheduler import Scheduler

__all__ = [
    "CHECK_INTERVAL_S",
    "KINDS",
    "NEW_PER_PASS",
    "REASON",
    "Comparison",
    "DraProblemReporter",
    "compare",
    "counts",
    "event_for",
]

log = logging.getLogger("schedext.dra")

# The kinds of object a problem can be about; the gauge has a series for each.
KINDS: Final = ("ResourceSlice", "ResourceClaim", "DeviceClass", "DeviceTaintRule", "Pod")
REASON: Final = "DraProblem"  # the Warning events' reason
CHECK_INTERVAL_S: Final = 10.0
NEW_PER_PASS: Final = 20


@dataclass(frozen=True, slots=True)
class Comparison:
    """One pass's decision."""

    new: tuple[Problem, ...]  # to report now: not reported before (the first ``limit``)
    gone: tuple[Problem, ...]  # reported before, and not there any more
    held_back: int  # new ones past ``limit``, left for a later pass
    reported: frozenset[Problem]  # what stands reported after this pass


def compare(reported: frozenset[Problem], current: Iterable[Problem], *, limit: int) -> Comparison:
    """What to report of ``current`` given what was ``reported`` before: the problems not
    reported yet, in order, at most ``limit`` of them; and those that are gone."""
    now = frozenset(current)
    fresh = sorted(now - reported)
    new = tuple(fresh[:limit])
    return Comparison(
        new=new,
        gone=tuple(sorted(reported - now)),
        held_back=len(fresh) - len(new),
        reported=(reported & now) | frozenset(new),
    )


def counts(problems: Iterable[Problem]) -> dict[str, int]:
    """The problems by kind of object: every kind of :data:`KINDS`, 0 when none."""
    found = Counter(problem.kind for problem in problems)
    return {kind: found[kind] for kind in (*KINDS, *sorted(set(found) - set(KINDS)))}


def event_for(problem: Problem) -> DraEvent | None:
    """The Warning event on the problem's object; None for a pod (its key is a UID: a pod
    refused at capacity is known by nothing else)."""
    if problem.kind == "Pod":
        return None
    return DraEvent(problem.kind, problem.key, REASON, problem.reason)


class DraProblemReporter:
    def __init__(
        self,
        events: EventRecorder,
        publish: Callable[[Mapping[str, int]], None],
        *,
        interval_s: float = CHECK_INTERVAL_S,
        limit: int = NEW_PER_PASS,
    ) -> None:
        self._events = events
        self._publish = publish  # the gauge's values, by kind
        self._interval_s = interval_s
        self._limit = limit
        self._reported: frozenset[Problem] = frozenset()
        self._checked_at: float | None = None

    def check(self, scheduler: Scheduler, readiness: Readiness, now: float) -> None:
        """Read the ledger's problems, if a pass is due, and report what is new."""
        if not readiness.synced:
            return
        if self._checked_at is not None and now - self._checked_at < self._interval_s:
            return
        self._checked_at = now
        problems = scheduler.dra_problems()
        self._publish(counts(problems))
        if not readiness.leading:
            return
        decided = compare(self._reported, problems, limit=self._limit)
        for problem in decided.new:
            log.warning(
                "%s %s: %s",
                problem.kind,
                problem.key,
                problem.reason,
                extra={"kind": problem.kind, "object": problem.key, "reason": problem.reason},
            )
            event = event_for(problem)
            if event is not None:
                self._events.record(event)
        for problem in decided.gone:
            log.info(
                "%s %s: resolved (%s)",
                problem.kind,
                problem.key,
                problem.reason,
                extra={"kind": problem.kind, "object": problem.key},
            )
        if decided.held_back:
            log.warning("%d more DRA problems, reported in the next passes", decided.held_back)
        self._reported = decided.reported
