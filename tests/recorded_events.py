"""An event recorder for tests: keeps what the shell asks it to write (the API recorder
posts Events and patches pods)."""

from __future__ import annotations

from app.kube.events import Event


class RecordedEvents:
    def __init__(self) -> None:
        self.events: list[Event] = []
        self.requeued: list[tuple[str, str]] = []

    def record(self, event: Event) -> None:
        self.events.append(event)

    def requeue(self, pod: str, uid: str) -> None:
        self.requeued.append((pod, uid))

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None
