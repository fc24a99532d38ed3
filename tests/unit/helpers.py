"""Shared setup for core tests: a Scheduler loaded with nodes and bound pods."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from extender.policy import PolicyConfig
from extender.scheduler import Scheduler


def scheduler_with(
    nodes: Iterable[dict[str, Any]],
    pods: Iterable[dict[str, Any]] = (),
    config: PolicyConfig | None = None,
) -> Scheduler:
    scheduler = Scheduler(config)
    for node in nodes:
        scheduler.upsert_node(node)
    for pod in pods:
        scheduler.upsert_pod(pod)
    return scheduler
