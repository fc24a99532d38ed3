"""Polling until a condition holds: the one wait every control-plane test and benchmark uses,
with the API server's restarts counted as "not yet" rather than as failures; and the same for
a test that runs on an event loop (:func:`until`), whose awaited work must go on meanwhile."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TypeVar

import httpx

T = TypeVar("T")


def wait_for(
    predicate: Callable[[], T],
    timeout: float = 30.0,
    interval: float = 0.2,
    message: str = "condition not met",
    *,
    retry_on: tuple[type[BaseException], ...] = (httpx.TransportError,),
) -> T:
    """Poll ``predicate`` until it returns a truthy value, and return that value.

    Exceptions of the ``retry_on`` types count as "not yet" (e.g. the apiserver restarting).
    On timeout raises AssertionError with ``message`` and the last value or exception seen.
    """
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        try:
            value = predicate()
        except retry_on as exc:
            last = exc
        else:
            if value:
                return value
            last = value
        if time.monotonic() >= deadline:
            raise AssertionError(f"{message} (waited {timeout:g}s; last observed: {last!r})")
        time.sleep(interval)


async def until(
    predicate: Callable[[], T],
    timeout: float = 5.0,
    interval: float = 0.01,
    message: str = "condition not met",
) -> T:
    """As :func:`wait_for`, on the event loop: ``predicate`` is polled between awaits, so the
    tasks it observes (served plugins, an agent) run in between."""
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        if time.monotonic() >= deadline:
            raise AssertionError(f"{message} (waited {timeout:g}s; last observed: {value!r})")
        await asyncio.sleep(interval)
    return value
