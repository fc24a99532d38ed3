"""The shell's side of gangs' holds (extender.gang.holds): the review every second, what it
started and ended told as PodGroup events, log lines and metrics, and the hold's cost.

The metrics: ``schedext_gang_hold_events_total{event}`` (started, ended, expired),
``schedext_gang_holds`` (standing now), ``schedext_gang_hold_idle_gpus`` (free GPUs the holds
keep idle now) and ``schedext_gang_hold_idle_gpu_seconds_total`` (their cost so far), and
``schedext_gang_wait_seconds``: how long each gang waited for room, observed when it completes.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from app.kube.events import EventRecorder, PodGroupEvent
from extender.gang.holds import HoldEvent, HoldEventKind
from extender.scheduler import Scheduler

__all__ = ["HoldMetrics", "HoldReporter"]

log = logging.getLogger("schedext.holds")

# Seconds: a gang placed at once, up to one that waited for hours.
_WAIT_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200, 14400)

_EVENT_REASONS = {
    HoldEventKind.STARTED: ("GangHoldStarted", False),
    HoldEventKind.ENDED: ("GangHoldEnded", False),
    HoldEventKind.EXPIRED: ("GangHoldExpired", True),
}


class HoldMetrics:
    def __init__(
        self, registry: CollectorRegistry, scheduler: Callable[[], Scheduler | None]
    ) -> None:
        self._holds = Counter(
            "schedext_gang_hold_events_total",
            "Holds of GPUs for gangs that waited too long (docs/gangs.md), by event: started, "
            "ended (the gang placed, or gone) and expired (at gang.hold_max_s).",
            ["event"],
            registry=registry,
        )
        self._idle = Counter(
            "schedext_gang_hold_idle_gpu_seconds_total",
            "GPU-seconds that holds kept free GPUs idle for their gangs: the holds' cost.",
            registry=registry,
        )
        self.wait = Histogram(
            "schedext_gang_wait_seconds",
            "How long each gang waited for room, from the first review (every second) that saw "
            "all its members exist and too few placed, until it completed; 0 for a gang placed "
            "before then.",
            buckets=_WAIT_BUCKETS,
            registry=registry,
        )
        registry.register(_HoldCollector(scheduler))

    def events(self, events: Iterable[HoldEvent]) -> None:
        for event in events:
            self._holds.labels(event.kind.value).inc()

    def idle(self, gpu_seconds: float) -> None:
        self._idle.inc(gpu_seconds)


class _HoldCollector(Collector):
    def __init__(self, scheduler: Callable[[], Scheduler | None]) -> None:
        self._scheduler = scheduler

    def collect(self) -> Iterable[GaugeMetricFamily]:
        scheduler = self._scheduler()
        yield GaugeMetricFamily(
            "schedext_gang_holds", "Holds of GPUs for gangs standing now.",
            value=len(scheduler.gang_holds()) if scheduler is not None else 0,
        )  # fmt: skip
        yield GaugeMetricFamily(
            "schedext_gang_hold_idle_gpus",
            "Free GPUs that holds keep idle now for their gangs.",
            value=scheduler.hold_idle() if scheduler is not None else 0,
        )


class HoldReporter:
    """Runs the review (when this replica leads) and tells what it changed."""

    def __init__(self, events: EventRecorder, metrics: HoldMetrics) -> None:
        self._events, self._metrics = events, metrics
        self._idle = 0.0  # the core's GPU-seconds idle already counted in the metric

    def review(self, scheduler: Scheduler, wall_now: float | None = None) -> list[HoldEvent]:
        now = time.time() if wall_now is None else wall_now
        events = scheduler.review_holds(now)
        total = scheduler.hold_idle_total()
        if total > self._idle:
            self._metrics.idle(total - self._idle)
        self._idle = total
        self._metrics.events(events)
        for event in events:
            self._tell(event)
        return events

    def _tell(self, event: HoldEvent) -> None:
        hold = event.hold
        reason, warning = _EVENT_REASONS[event.kind]
        if event.kind is HoldEventKind.STARTED:
            message = (
                f"holding {hold.gpus} GPUs on {hold.where} for the gang ({event.reason}); "
                "pods of no higher priority go elsewhere until it is placed"
            )
        else:
            message = f"hold of {hold.gpus} GPUs on {hold.where} {event.kind.value}: {event.reason}"
        log.log(
            logging.WARNING if warning else logging.INFO,
            f"gang hold {event.kind.value}",
            extra={"group": hold.group, "gpus": hold.gpus, "where": hold.where,
                   "why": event.reason},
        )  # fmt: skip
        if event.uid:
            self._events.record(
                PodGroupEvent(hold.group, reason, message, warning=warning, uid=event.uid)
            )
