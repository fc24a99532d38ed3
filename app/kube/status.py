"""Status write-back, patched only when it changes:

* PodGroup: ``status.phase``, ``scheduled``, ``running`` and ``scheduleStartTime``, where
  scheduler-plugins' coscheduling keeps them;
* IPPool: ``status.allocated`` and ``status.free``;
* ElasticQuota: ``status.used``, what the namespace's pods hold of each resource the quota
  names (:class:`QuotaStatusWriter`, on a slower clock of its own: use changes with every
  bind, and a busy namespace would otherwise be patched at every pass).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from typing import Any

from app.kube.api import KubeApi
from app.kube.errors import ApiError, ApiNotFoundError
from app.kube.readiness import Readiness
from extender.quotas import used_quantities
from extender.scheduler import Scheduler

__all__ = ["PODGROUPS_PATH", "SCHEDEXT_PATH", "QuotaStatusWriter", "StatusWriter"]

log = logging.getLogger("schedext.status")

PODGROUPS_PATH = "/apis/scheduling.x-k8s.io/v1alpha1"
SCHEDEXT_PATH = "/apis/schedext.io/v1alpha1"


class StatusWriter:
    def __init__(self, api: KubeApi, scheduler: Scheduler, readiness: Readiness) -> None:
        self._api = api
        self._scheduler = scheduler
        self._readiness = readiness
        self._written: dict[str, dict[str, Any]] = {}

    async def run_forever(self, *, interval_s: float) -> None:
        while True:
            await asyncio.sleep(interval_s)
            if self._readiness.ready:  # synced, and the leader when there are replicas
                await self.write_once()
            else:
                self._written.clear()  # the leader may have written meanwhile

    async def write_once(self) -> None:
        wanted: dict[str, tuple[str, dict[str, Any]]] = {}
        for spec in self._scheduler.pod_groups():
            status = self._scheduler.group_status(spec.key)
            if status is None:
                continue
            body: dict[str, Any] = {
                "phase": status.phase,
                "scheduled": status.scheduled,
                "running": status.running,
            }
            last = self._written.get(f"pg:{spec.key}") or {}
            if status.phase in ("Scheduling", "Scheduled", "Running"):
                # First seen placing members (a short Scheduling phase may fall between passes).
                body["scheduleStartTime"] = last.get("scheduleStartTime") or _now()
            path = f"{PODGROUPS_PATH}/namespaces/{spec.namespace}/podgroups/{spec.name}/status"
            wanted[f"pg:{spec.key}"] = (path, body)
        book = self._scheduler.inventory.addresses
        for pool in book.pools():
            free = book.free_count(pool)
            body = {"allocated": pool.size - free, "free": free}
            wanted[f"ip:{pool.name}"] = (f"{SCHEDEXT_PATH}/ippools/{pool.name}/status", body)
        for key, (path, body) in wanted.items():
            if self._written.get(key) == body:
                continue
            try:
                await self._api.merge_patch(path, {"status": body})
            except ApiNotFoundError:
                self._written.pop(key, None)
                continue
            except ApiError as error:
                log.warning("cannot update status of %s: %s", key, error)
                continue
            self._written[key] = body
        for key in set(self._written) - set(wanted):
            del self._written[key]


class QuotaStatusWriter:
    """``status.used`` of each quota that applies, merge-patched to the status subresource
    when it changed, at most once per quota per interval; only while ready (synced, and the
    leader when there are replicas)."""

    def __init__(self, api: KubeApi, scheduler: Scheduler, readiness: Readiness) -> None:
        self._api = api
        self._scheduler = scheduler
        self._readiness = readiness
        self._written: dict[tuple[str, str], dict[str, str]] = {}  # (key, uid) -> used

    async def run_forever(self, *, interval_s: float) -> None:
        while True:
            await asyncio.sleep(interval_s)
            if self._readiness.ready:
                await self.write_once()
            else:
                self._written.clear()  # the leader may have written meanwhile

    async def write_once(self) -> None:
        wanted: dict[tuple[str, str], dict[str, str]] = {}
        paths: dict[tuple[str, str], str] = {}
        for spec in self._scheduler.quotas():
            key = (spec.key, spec.uid)
            use = self._scheduler.namespace_use(spec.namespace)
            wanted[key] = used_quantities(spec, use)
            paths[key] = (
                f"{PODGROUPS_PATH}/namespaces/{spec.namespace}/elasticquotas/{spec.name}/status"
            )
        for key, used in wanted.items():
            last = self._written.get(key)
            if last == used:
                continue
            # A merge patch merges maps: a resource the quota no longer names is removed.
            body: dict[str, str | None] = {r: None for r in last or {} if r not in used}
            body.update(used)
            try:
                await self._api.merge_patch(paths[key], {"status": {"used": body}})
            except ApiNotFoundError:
                self._written.pop(key, None)
                continue
            except ApiError as error:
                log.warning("cannot update status of ElasticQuota %s: %s", key[0], error)
                continue
            self._written[key] = used
        for key in set(self._written) - set(wanted):
            del self._written[key]


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
