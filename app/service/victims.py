"""Filter's wait for victims kube-scheduler has seen go and schedext's watch has not yet.

The core says when to wait (``Scheduler.awaited_victims``, see extender.evictions); this
module does the waiting: it wakes on every applied pod event and asks again, until nothing is
awaited or the bound (``preemption.victim_wait_s``) passes. Either way the core settles the
approval, so that a preemptor waits at most once per preemption.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence

from app.service.metrics import Metrics
from extender import fields
from extender.fields import JSONObject
from extender.scheduler import Scheduler

__all__ = ["VictimWaits"]

log = logging.getLogger("schedext.preemption")


class VictimWaits:
    def __init__(self, metrics: Metrics, *, bound_s: float, clock: Callable[[], float]) -> None:
        self._metrics = metrics
        self._bound_s = bound_s
        self._clock = clock
        self._changed = asyncio.Event()
        self._waiting = 0

    def pods_changed(self) -> None:
        """A pod event was applied to the inventory: waiters look again. Costs a comparison
        when nobody waits (every pod event comes here)."""
        if self._waiting:
            self._changed.set()
            self._changed = asyncio.Event()

    def needed(self, scheduler: Scheduler, pod: JSONObject, node_names: Sequence[str]) -> bool:
        """Whether :meth:`wait` would wait: when not, filter can be answered at once, without
        a task (app.service.verb_protocol)."""
        if self._bound_s <= 0:
            return False  # waiting is switched off
        return bool(scheduler.awaited_victims(pod, node_names, self._clock()))

    async def wait(self, scheduler: Scheduler, pod: JSONObject, node_names: Sequence[str]) -> None:
        """Return once the inventory holds none of the victims ``pod`` awaits on
        ``node_names``, or after the bound; filter then judges the nodes as usual."""
        if self._bound_s <= 0:
            return  # waiting is switched off
        awaited = scheduler.awaited_victims(pod, node_names, self._clock())
        if not awaited:
            return
        deadline = self._clock() + self._bound_s
        self._waiting += 1
        self._metrics.victim_wait_started()
        try:
            while awaited:
                left = deadline - self._clock()
                if left <= 0:
                    break
                try:
                    async with asyncio.timeout(left):
                        await self._changed.wait()
                except TimeoutError:
                    break
                awaited = scheduler.awaited_victims(pod, node_names, self._clock())
        finally:
            self._waiting -= 1
            scheduler.victims_settled(pod)
            outcome = "timeout" if awaited else "gone"
            self._metrics.victim_wait_ended(outcome)
        meta = fields.obj(pod, "metadata")
        log.log(
            logging.WARNING if awaited else logging.INFO,
            "waited for victims",
            extra={
                "pod": f"{fields.text(meta, 'namespace')}/{fields.text(meta, 'name')}",
                "outcome": outcome,
                "victims": list(awaited),
            },
        )
