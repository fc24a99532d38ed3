"""The objects one running schedext process is made of, gathered for the routes."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from starlette.types import Receive, Scope

from app.kube.binding import Binder
from app.kube.events import EventRecorder
from app.kube.readiness import Readiness
from app.service.errors import BodyTimeoutError, BodyTooLargeError, ClientGoneError, NotReadyError
from app.service.gangs import GangWaiters
from app.service.metrics import Metrics
from app.service.settings import Settings
from app.service.victims import VictimWaits
from extender.scheduler import Scheduler

__all__ = ["Service"]

log = logging.getLogger("schedext.service")

_T = TypeVar("_T")

# The longest the cyclic collector stays paused for a cold sync that does not finish.
SYNC_COLLECTOR_PAUSE_S = 300.0


@dataclass(slots=True)
class Service:
    settings: Settings
    scheduler: Scheduler
    binder: Binder
    metrics: Metrics
    gangs: GangWaiters
    victims: VictimWaits
    events: EventRecorder
    readiness: Readiness = field(default_factory=Readiness)
    clock: Callable[[], float] = time.monotonic
    description: str = ""  # where the inventory comes from, for logs and the root page
    # The timer that sends the retries the core held back, and when (see requeue_waiters).
    _requeue_timer: asyncio.TimerHandle | None = field(default=None, init=False, repr=False)
    _requeue_at: float | None = field(default=None, init=False, repr=False)
    # Called after each review of the gangs' holds (the writer of their PodGroup records).
    on_holds_reviewed: list[Callable[[], None]] = field(default_factory=list)
    # The term of readiness whose holds were taken over (see holds_current).
    _holds_term: int = field(default=0, init=False, repr=False)

    def begin_stop(self) -> None:
        """A stop began (SIGTERM): answer no new verb, and end every gang's wait at the bind
        barrier now, its reservations released and its binds failed with a reason that says
        so, rather than keep the lease while they wait out their timeout (up to
        gang.max_wait_s): kube-scheduler retries them on the next leader. Binds past the
        barrier finish (within bind.api_deadline_s) before the lease is released."""
        if self.readiness.stopping:
            return
        self.readiness.set_stopping()
        waiting = self.scheduler.waiting_groups()
        reason = "schedext: this replica is stopping; the group's wait ended, to be retried"
        self.core(lambda scheduler: scheduler.end_gang_waits(reason))
        log.info("stopping", extra={"gang_waits_ended": waiting})

    def holds_reviewed(self) -> None:
        for call in self.on_holds_reviewed:
            call()

    def core(self, call: Callable[[Scheduler], _T]) -> _T:
        """Ask the core something that may record gang events (a bind plan, an expiry): the
        events are performed before this returns or raises (see :meth:`GangWaiters.run`), and
        so are the retries of pods waiting for what it freed (a reservation given back)."""
        try:
            return self.gangs.run(self.scheduler, call)
        finally:
            self.requeue_waiters()

    def requeue_waiters(self) -> None:
        """Have kube-scheduler retry the pods filter turned away for what schedext has since
        seen freed: GPUs, a share's room, a MIG device, an address, quota headroom (see
        extender.capacity_waits); and the preemptors whose victims it has seen go (see
        extender.evictions). Called after every core call and every watch event, so that the
        retry follows the freeing at once; a retry the core holds back (one per pod per
        second) is sent by a timer when its time comes."""
        now = self.clock()
        nudges = self.scheduler.take_capacity_requeues(now)
        for kind in dict.fromkeys(nudge.kind for nudge in nudges):
            due = [(n.pod, n.uid) for n in nudges if n.kind == kind]
            self._requeue(f"{kind} freed", str(kind), due)
        self._requeue("victims gone", "preemptor", self.scheduler.take_preemptor_requeues())
        self._requeue_later(now)

    def _requeue(self, what: str, kind: str, due: list[tuple[str, str]]) -> None:
        if due:
            log.info(what, extra={"requeued": [pod for pod, _ in due]})
            self.metrics.requeued(kind, len(due))
            for pod, uid in due:
                self.events.requeue(pod, uid)

    def _requeue_later(self, now: float) -> None:
        """Call :meth:`requeue_waiters` again when the core's next held-back retry is due
        (unless a timer already will, as soon)."""
        due = self.scheduler.next_requeue_at()
        if due is None or (self._requeue_at is not None and self._requeue_at <= due):
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # outside the service's loop (a test calling it directly)
            return
        if self._requeue_timer is not None:
            self._requeue_timer.cancel()
        self._requeue_at = due
        # A little after its time, so that the core finds it due.
        self._requeue_timer = loop.call_later(max(0.0, due - now) + 0.005, self._requeue_due)

    def _requeue_due(self) -> None:
        self._requeue_timer = self._requeue_at = None
        self.requeue_waiters()

    def pause_collector(self, *, limit_s: float = SYNC_COLLECTOR_PAUSE_S) -> None:
        """No cyclic collections until :meth:`settle` (or ``limit_s``, for a sync that never
        ends). Decoding the first list allocates millions of objects that all live on, and
        each collection triggered on the way traversed the growing inventory again: a third
        of a cold sync's CPU (a 5,000-pod page decoded in 26 µs a pod without, 96 with the
        default thresholds). What a sync decodes holds no cycles; refcounting frees it."""
        gc.disable()
        with contextlib.suppress(RuntimeError):  # outside the service's loop: a test's call
            asyncio.get_running_loop().call_later(limit_s, gc.enable)

    def settle(self) -> None:
        """The inventory is loaded and will live as long as the process: take it out of the
        cyclic collector's sight. A full collection over 100,000 pods' state costs over 100 ms,
        which would stall the answers waiting behind it; after a freeze it costs nothing. The
        collector, paused for the sync, runs again from here."""
        gc.collect()
        gc.freeze()
        gc.enable()

    def not_synced(self) -> str:
        """Why the views (/inventory, explain, /ui) cannot answer yet: "" once the inventory
        is synced. A standby's inventory is synced: it answers them, not the verbs."""
        if self.readiness.synced:
            return ""
        reason = self.readiness.sync_reason or "inventory not synced"
        return reason if "not synced" in reason else f"inventory not synced: {reason}"

    def require_ready(self) -> None:
        if not self.readiness.ready:
            raise NotReadyError(self.readiness.reason)
        if self._holds_term != self.readiness.terms:
            self.holds_current()

    def holds_current(self) -> None:
        """Once per term of readiness (synced and leading anew), before its first verb or its
        first review of the holds, whichever comes first: the holds the PodGroups record
        stand from then on (Scheduler.take_over_holds)."""
        if self._holds_term != self.readiness.terms:
            self._holds_term = self.readiness.terms
            self.scheduler.take_over_holds(time.time())

    async def read_body(self, scope: Scope, receive: Receive) -> bytes:
        """The request body, refused when over the size limit or too slow to arrive.

        Read from the ASGI messages directly, under a timer of its own: Starlette's request
        stream and ``asyncio.timeout`` (an async generator, a context manager and three
        process-id lookups per call on Python 3.11) cost as much as the rest of the floor."""
        server = self.settings.server
        limit = server.max_body_bytes
        for name, value in scope["headers"]:
            if name == b"content-length" and value.isdigit() and int(value) > limit:
                raise BodyTooLargeError(
                    f"request body of {value.decode()} bytes exceeds the {limit}-byte limit"
                )
        loop = asyncio.get_running_loop()
        task = asyncio.current_task(loop)
        if task is None:  # pragma: no cover - ASGI servers run every request in a task
            raise RuntimeError("read_body outside a task")
        expired = False

        def expire() -> None:
            nonlocal expired
            expired = True
            task.cancel()

        timer = loop.call_later(server.body_timeout_s, expire)
        chunks: list[bytes] = []
        size = 0
        try:
            while True:
                message = await receive()
                if message["type"] != "http.request":
                    raise ClientGoneError("client disconnected before sending the whole body")
                chunk: bytes = message.get("body", b"")
                size += len(chunk)
                if size > limit:
                    raise BodyTooLargeError(f"request body exceeds the {limit}-byte limit")
                chunks.append(chunk)
                if not message.get("more_body", False):
                    break
        except asyncio.CancelledError:
            # Ours only if the timer fired and no one else asked to cancel the task too.
            if expired and task.uncancel() == 0:
                raise BodyTimeoutError(
                    f"request body not received within {server.body_timeout_s}s"
                ) from None
            raise
        finally:
            timer.cancel()
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)
