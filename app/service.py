"""The objects one running schedext process is made of, gathered for the routes."""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from starlette.requests import Request

from app.binder import Binder
from app.errors import BodyTimeoutError, BodyTooLargeError, NotReadyError
from app.events import EventRecorder
from app.gangs import GangWaiters
from app.metrics import Metrics
from app.settings import Settings
from app.victims import VictimWaits
from extender.scheduler import Scheduler

__all__ = ["Readiness", "Service"]


@dataclass(slots=True)
class Readiness:
    """Whether verbs may be answered: the inventory is synced and, with leader election, this
    replica leads. ``reason`` says why not."""

    synced: bool = False
    sync_reason: str = "inventory not synced"
    leading: bool = True  # stays True without leader election
    leader: str = ""

    @property
    def ready(self) -> bool:
        return self.synced and self.leading

    @property
    def reason(self) -> str:
        return next((why for why in self.checks().values() if why), "")

    def checks(self) -> dict[str, str]:
        """Each check of ``ready`` by name, with why it fails ("" when it passes): what
        ``/readyz/<check>`` answers. A standby passes ``synced`` (its pod is Ready) and fails
        ``leader`` (the Service does not select its pod, nor may it answer verbs)."""
        return {
            "synced": "" if self.synced else self.sync_reason,
            "leader": ""
            if self.leading
            else f"not the leader (the leader is {self.leader or 'not elected yet'})",
        }

    def set_ready(self) -> None:
        self.synced, self.sync_reason = True, ""

    def set_not_ready(self, reason: str) -> None:
        self.synced, self.sync_reason = False, reason

    def set_leading(self, leading: bool, leader: str) -> None:
        self.leading, self.leader = leading, leader


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

    def settle(self) -> None:
        """The inventory is loaded and will live as long as the process: take it out of the
        cyclic collector's sight. A full collection over 100,000 pods' state costs over 100 ms,
        which would stall the answers waiting behind it; after a freeze it costs nothing."""
        gc.collect()
        gc.freeze()

    def require_ready(self) -> None:
        if not self.readiness.ready:
            raise NotReadyError(self.readiness.reason)

    async def read_body(self, request: Request) -> bytes:
        """The request body, refused when over the size limit or too slow to arrive."""
        limit = self.settings.server.max_body_bytes
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            raise BodyTooLargeError(
                f"request body of {declared} bytes exceeds the {limit}-byte limit"
            )
        chunks: list[bytes] = []
        size = 0
        try:
            async with asyncio.timeout(self.settings.server.body_timeout_s):
                async for chunk in request.stream():
                    size += len(chunk)
                    if size > limit:
                        raise BodyTooLargeError(f"request body exceeds the {limit}-byte limit")
                    chunks.append(chunk)
        except TimeoutError:
            raise BodyTimeoutError(
                f"request body not received within {self.settings.server.body_timeout_s}s"
            ) from None
        return b"".join(chunks)
