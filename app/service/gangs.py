"""The waiting half of the gang barrier: bind calls of members park here until the core says
their group completed, was released, or timed out (see extender.gang). Also where the
members filter turned away for missing ones are sent back to kube-scheduler once the group
has its members (QUORUM)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from typing import TypeVar

from app.kube.events import EventRecorder, PodEvent
from app.service.metrics import Metrics
from extender.gang import GangEvent, GangEventKind
from extender.model import BindPlan
from extender.scheduler import Scheduler

__all__ = ["GangWaiters"]

log = logging.getLogger("schedext.gangs")

_T = TypeVar("_T")


class GangWaiters:
    """One future per waiting group: None when it completes, the reason when it fails."""

    def __init__(self, metrics: Metrics, events: EventRecorder) -> None:
        self._metrics = metrics
        self._events = events
        self._futures: dict[str, asyncio.Future[str | None]] = {}

    def run(self, scheduler: Scheduler, call: Callable[[Scheduler], _T]) -> _T:
        """``call(scheduler)``, then the gang effects it recorded: the one place the shell
        takes the core's gang events. In a ``finally``, because a call that raises has
        recorded events too (a refused bind may have released its group)."""
        try:
            return call(scheduler)
        finally:
            self.dispatch(scheduler.take_gang_events(), scheduler)

    def dispatch(self, events: Iterable[GangEvent], scheduler: Scheduler) -> None:
        """Perform the core's gang effects: wake or fail the binds waiting for each group."""
        for event in events:
            self._metrics.gang_event(event.kind.value)
            if event.kind is GangEventKind.COMPLETE:
                self._metrics.holds.wait.observe(scheduler.gang_waited(event.group, time.time()))
            if event.kind is GangEventKind.QUORUM:
                log.info(
                    "gang quorum",
                    extra={"group": event.group, "requeued": [pod for pod, _ in event.pods]},
                )
                self._metrics.requeued("gang", len(event.pods))
                for pod, uid in event.pods:
                    self._events.requeue(pod, uid)
                continue
            outcome = None if event.kind is GangEventKind.COMPLETE else event.reason
            if outcome is None:
                log.info("gang complete", extra={"group": event.group})
            else:
                log.warning(
                    "gang released",
                    extra={"group": event.group, "outcome": event.kind.value, "reason": outcome},
                )
                reason = "GangTimedOut" if event.kind is GangEventKind.TIMED_OUT else "GangReleased"
                for pod, uid in event.pods:
                    self._events.record(PodEvent(pod, reason, outcome, warning=True, uid=uid))
            future = self._futures.pop(event.group, None)
            if future is not None and not future.done():
                future.set_result(outcome)

    async def wait(
        self, plan: BindPlan, scheduler: Scheduler, clock: Callable[[], float]
    ) -> str | None:
        """Wait until ``plan``'s group completes (None) or fails (the reason).

        Whatever ends the wait, a failure has released the group in the core first: the group
        is released by the core (competition, expiry loop) and its event fails this wait, or
        this wait's own timer fires and ends the group's wait in the core (even if the core's
        clock has not quite reached the deadline yet). The caller drops ``plan``'s own
        reservation on every failure as well."""
        group = plan.group
        deadline = scheduler.gang_deadline(group) if group is not None else None
        if group is None or deadline is None:
            return None  # not a gang member, or its own reservation completed the group
        future = self._futures.get(group)
        if future is None:
            future = self._futures[group] = asyncio.get_running_loop().create_future()
        try:
            # shield: one member timing out must not cancel the group's shared future.
            # asyncio.timeout, not wait_for: on Python 3.11, wait_for swallows a cancellation
            # that comes as the future completes.
            async with asyncio.timeout(max(0.0, deadline - clock())):
                return await asyncio.shield(future)
        except TimeoutError:
            self.run(scheduler, lambda core: core.time_out_group(group))
            if future.done():
                return future.result()
            # The group's wait had already ended some other way without this future hearing
            # of it (a later round of the group waits on a new future).
            return f"schedext: group {group} did not complete in time"
