"""Kubernetes Events on pods, for schedext decisions kube-scheduler does not report itself:
a gang that timed out or gave its reservations back, an address claimed for a StatefulSet
identity. Recording never blocks a verb: events queue up (bounded) and a background task
posts them; when the queue is full, events are dropped and counted."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import socket
from dataclasses import dataclass
from typing import Protocol

from app.kube.api import KubeApi
from app.kube.errors import ApiError

__all__ = ["ApiEventRecorder", "EventRecorder", "LogEventRecorder", "PodEvent"]

log = logging.getLogger("schedext.events")


@dataclass(frozen=True, slots=True)
class PodEvent:
    pod: str  # namespace/name
    reason: str  # CamelCase, e.g. GangTimedOut
    message: str
    warning: bool = False
    uid: str = ""


class EventRecorder(Protocol):
    def record(self, event: PodEvent) -> None: ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


class LogEventRecorder:
    """Without an API server (demo, snapshot) events are log lines."""

    def record(self, event: PodEvent) -> None:
        log.info(
            "event",
            extra={"pod": event.pod, "reason": event.reason, "event_message": event.message},
        )

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None


class ApiEventRecorder:
    def __init__(self, api: KubeApi, *, capacity: int = 1000) -> None:
        self._api = api
        self._queue: asyncio.Queue[PodEvent] = asyncio.Queue(maxsize=capacity)
        self._task: asyncio.Task[None] | None = None
        self._instance = socket.gethostname()
        self.dropped = 0

    def record(self, event: PodEvent) -> None:
        try:
            self._queue.put_nowait(event)
        except asyncio.QueueFull:
            self.dropped += 1

    async def start(self) -> None:
        self._task = asyncio.create_task(self._post_forever(), name="event-recorder")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _post_forever(self) -> None:
        while True:
            event = await self._queue.get()
            try:
                await self._post(event)
            except ApiError as error:
                log.warning("cannot record event for %s: %s", event.pod, error)

    async def _post(self, event: PodEvent) -> None:
        namespace, _, name = event.pod.partition("/")
        now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{name}.", "namespace": namespace},
            "involvedObject": {
                "apiVersion": "v1",
                "kind": "Pod",
                "namespace": namespace,
                "name": name,
                "uid": event.uid,
            },
            "reason": event.reason,
            "message": event.message,
            "type": "Warning" if event.warning else "Normal",
            "source": {"component": "schedext"},
            "reportingComponent": "schedext",
            "reportingInstance": self._instance,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        await self._api.post(f"/api/v1/namespaces/{namespace}/events", body)
