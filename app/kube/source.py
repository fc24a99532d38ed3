"""The live-cluster inventory source: list+watch of nodes and pods feeding the core."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from typing import Any

from app.kube.api import KubeApi
from app.kube.podgroups import PODGROUPS_PATH, write_statuses_forever
from app.kube.watch import Relist, Resource, Sink, watch_forever
from app.service import Service
from extender.scheduler import Scheduler

__all__ = ["NODES", "PODGROUPS", "PODS", "ClusterSource"]

log = logging.getLogger("schedext.cluster")

JSON = dict[str, Any]

NODES = Resource(name="nodes", path="/api/v1/nodes")
# Terminal pods hold nothing; a pod that finishes leaves this selection, which the watch
# reports as a DELETED event (as kube-scheduler's own pod informer does).
PODS = Resource(
    name="pods",
    path="/api/v1/pods",
    field_selector="status.phase!=Succeeded,status.phase!=Failed",
)
# scheduler-plugins' coscheduling CRD; without it there are simply no gangs.
PODGROUPS = Resource(name="podgroups", path=f"{PODGROUPS_PATH}/podgroups", optional=True)


class _NodeSink:
    def __init__(self, scheduler: Scheduler) -> None:
        self._scheduler = scheduler

    def relist(self) -> Relist:
        return self._scheduler.node_relist()

    def upsert(self, obj: JSON) -> None:
        self._scheduler.upsert_node(obj)

    def delete(self, obj: JSON) -> None:
        name = (obj.get("metadata") or {}).get("name")
        if isinstance(name, str):
            self._scheduler.delete_node(name)


class _PodSink:
    def __init__(self, scheduler: Scheduler) -> None:
        self._scheduler = scheduler

    def relist(self) -> Relist:
        return self._scheduler.pod_relist()

    def upsert(self, obj: JSON) -> None:
        self._scheduler.upsert_pod(obj)

    def delete(self, obj: JSON) -> None:
        uid = (obj.get("metadata") or {}).get("uid")
        if isinstance(uid, str):
            self._scheduler.delete_pod(uid)


class _PodGroupSink:
    def __init__(self, scheduler: Scheduler) -> None:
        self._scheduler = scheduler

    def relist(self) -> Relist:
        return self._scheduler.pod_group_relist()

    def upsert(self, obj: JSON) -> None:
        self._scheduler.upsert_pod_group(obj)

    def delete(self, obj: JSON) -> None:
        self._scheduler.delete_pod_group(obj)


class ClusterSource:
    """Verbs are refused until nodes and pods have both been listed once, so that no
    decision is made on a partial inventory (and restarts rebuild every GPU holding from the
    pods' annotations before the first bind)."""

    def __init__(
        self,
        api: KubeApi,
        *,
        server: str,
        resources: Iterable[Resource] = (NODES, PODS, PODGROUPS),
        status_interval_s: float = 2.0,
    ) -> None:
        self._api = api
        self._resources = tuple(resources)
        self._status_interval_s = status_interval_s
        self._tasks: list[asyncio.Task[None]] = []
        self.description = f"cluster at {server}"

    async def start(self, service: Service) -> None:
        service.readiness.set_not_ready(
            "inventory not synced: nodes, pods and podgroups not listed yet"
        )
        pending = {resource.name for resource in self._resources}
        sinks: dict[str, Sink] = {
            "nodes": _NodeSink(service.scheduler),
            "pods": _PodSink(service.scheduler),
            "podgroups": _PodGroupSink(service.scheduler),
        }

        def listed_callback(name: str) -> Callable[[], None]:
            def listed() -> None:
                pending.discard(name)
                if not pending and not service.readiness.ready:
                    service.readiness.set_ready()
                    log.info("inventory synced: nodes, pods and podgroups listed")

            return listed

        for resource in self._resources:
            watcher = watch_forever(
                self._api, resource, sinks[resource.name], on_listed=listed_callback(resource.name)
            )
            self._tasks.append(asyncio.create_task(watcher, name=f"watch-{resource.name}"))
        statuses = write_statuses_forever(
            self._api, service.scheduler, interval_s=self._status_interval_s
        )
        self._tasks.append(asyncio.create_task(statuses, name="podgroup-status"))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        await self._api.close()
