"""The MPS supervisor's rule (app.agent.mps.MpsDaemons) over an in-memory control and a
clock the test moves: which GPUs get a daemon, and when a dead one is started again."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import pytest

from app.agent.mps import MpsDaemons, MpsError
from extender.devices.gpus import Gpu, GpuHealth

SICK = GpuHealth(healthy=False, reason="XID 79: GPU fell off the bus")


@dataclass
class Control:
    """Daemons that run until the test says one died; ``broken`` ones fail to start."""

    alive: set[str] = field(default_factory=set)
    broken: set[str] = field(default_factory=set)
    started: list[str] = field(default_factory=list)

    async def start(self, uuid: str) -> None:
        if uuid in self.broken:
            raise MpsError(f"cannot start the daemon for {uuid}")
        self.started.append(uuid)
        self.alive.add(uuid)

    async def stop(self, uuid: str) -> None:
        self.alive.discard(uuid)

    def running(self, uuid: str) -> bool:
        return uuid in self.alive


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def supervised(gpus: list[Gpu]) -> tuple[Control, Clock, MpsDaemons]:
    control, clock = Control(), Clock()
    daemons = MpsDaemons(
        control, lambda: gpus, retry_first_s=1.0, retry_max_s=4.0, stable_s=10.0, clock=clock
    )
    return control, clock, daemons


def test_only_healthy_whole_gpus_get_a_daemon() -> None:
    gpus = [
        Gpu(index=0, uuid="GPU-0"),
        Gpu(index=1, uuid="GPU-1", health=SICK),
        Gpu(index=2, uuid="GPU-2", mig_enabled=True),
    ]
    control, _, daemons = supervised(gpus)
    asyncio.run(daemons.check())
    asyncio.run(daemons.check())  # running: not started twice
    assert control.started == ["GPU-0"]
    assert daemons.starts == 1


# The daemon is found dead at every check (it died since the last): when is it started?
@pytest.mark.parametrize(
    ("checks", "expected"),
    [
        # Dying young: 1 s after the first start, then 2 s, then 4 s (the cap) after each.
        ([0.0, 0.5, 1.0, 2.0, 3.0, 4.0, 6.9, 7.0, 8.0, 10.9, 11.0], [0.0, 1.0, 3.0, 7.0, 11.0]),
        # Last started longer than stable_s ago: back to the first delay (21, not 24).
        ([0.0, 1.0, 3.0, 20.0, 20.5, 21.0], [0.0, 1.0, 3.0, 20.0, 21.0]),
    ],
    ids=["dying young doubles the wait", "a stable daemon waits the first delay again"],
)
def test_backoff(checks: list[float], expected: list[float]) -> None:
    control, clock, daemons = supervised([Gpu(index=0, uuid="GPU-0")])
    starts = []
    for at in checks:
        clock.now = at
        control.alive.clear()
        before = len(control.started)
        asyncio.run(daemons.check())
        if len(control.started) > before:
            starts.append(at)
    assert starts == expected


def test_a_daemon_that_cannot_start_is_retried_later() -> None:
    control, clock, daemons = supervised([Gpu(index=0, uuid="GPU-0")])
    control.broken.add("GPU-0")
    asyncio.run(daemons.check())
    control.broken.clear()
    clock.now = 0.5
    asyncio.run(daemons.check())
    assert control.started == []
    clock.now = 1.0
    asyncio.run(daemons.check())
    assert control.started == ["GPU-0"]
