"""PodGroup status write-back: ``status.phase``, ``scheduled``, ``running`` and
``scheduleStartTime``, where scheduler-plugins' coscheduling keeps them, patched only when
they change."""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from typing import Any

from app.kube.api import KubeApi
from app.kube.errors import ApiError, ApiNotFoundError
from extender.scheduler import Scheduler

__all__ = ["PODGROUPS_PATH", "write_statuses_forever"]

log = logging.getLogger("schedext.podgroups")

PODGROUPS_PATH = "/apis/scheduling.x-k8s.io/v1alpha1"


async def write_statuses_forever(api: KubeApi, scheduler: Scheduler, *, interval_s: float) -> None:
    written: dict[str, dict[str, Any]] = {}
    while True:
        await asyncio.sleep(interval_s)
        await write_statuses(api, scheduler, written)


async def write_statuses(
    api: KubeApi, scheduler: Scheduler, written: dict[str, dict[str, Any]]
) -> None:
    """One pass: patch every group whose status differs from what we last wrote."""
    for spec in scheduler.pod_groups():
        status = scheduler.group_status(spec.key)
        if status is None:
            continue
        body: dict[str, Any] = {
            "phase": status.phase,
            "scheduled": status.scheduled,
            "running": status.running,
        }
        last = written.get(spec.key)
        if last is not None and all(last.get(k) == v for k, v in body.items()):
            continue
        started = last.get("scheduleStartTime") if last else None
        if status.phase in ("Scheduling", "Scheduled", "Running"):
            # First seen placing members (a short Scheduling phase may fall between passes).
            body["scheduleStartTime"] = started or dt.datetime.now(dt.UTC).strftime(
                "%Y-%m-%dT%H:%M:%SZ"
            )
        path = f"{PODGROUPS_PATH}/namespaces/{spec.namespace}/podgroups/{spec.name}/status"
        try:
            await api.merge_patch(path, {"status": body})
        except ApiNotFoundError:
            written.pop(spec.key, None)
            continue
        except ApiError as error:
            log.warning("cannot update PodGroup %s status: %s", spec.key, error)
            continue
        written[spec.key] = body
    for key in set(written) - {spec.key for spec in scheduler.pod_groups()}:
        del written[key]
