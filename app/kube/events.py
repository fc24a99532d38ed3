"""What schedext writes about pods besides their Binding.

Kubernetes Events, for decisions kube-scheduler does not report itself: a gang that timed
out or gave its reservations back, an address claimed for a StatefulSet identity, an
ElasticQuota that cannot apply, a DRA object schedext cannot read or count. And the one pod
write that is not an Event: the ``schedext.io/requeued-at`` annotation on a pod filter turned
away, once what it waited for is there: a gang member turned away for missing members, once
they exist; a pod turned away for an address, GPUs, a share's room, a MIG device or quota
headroom, once schedext sees it freed (see extender.capacity_waits).
kube-scheduler retries a pod an extender rejected only on a cluster event it sees, and an
update of the pod itself is one.

Recording never blocks a verb: writes queue up (bounded) and a background task performs
them; when the queue is full, writes are dropped and counted."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import socket
from dataclasses import dataclass
from typing import Protocol

from app.kube.api import KubeApi
from app.kube.errors import ApiError, ApiNotFoundError
from extender import names

__all__ = [
    "ApiEventRecorder",
    "DraEvent",
    "EventRecorder",
    "LogEventRecorder",
    "NodeEvent",
    "PodEvent",
    "PodGroupEvent",
    "QuotaEvent",
]

log = logging.getLogger("schedext.events")


@dataclass(frozen=True, slots=True)
class PodEvent:
    pod: str  # namespace/name
    reason: str  # CamelCase, e.g. GangTimedOut
    message: str
    warning: bool = False
    uid: str = ""


@dataclass(frozen=True, slots=True)
class NodeEvent:
    """An event on a Node (``kubectl describe node`` shows it): a node agent's annotation that
    schedext could not read."""

    node: str
    reason: str
    message: str
    warning: bool = True
    uid: str = ""


@dataclass(frozen=True, slots=True)
class QuotaEvent:
    """An event on an ElasticQuota (``kubectl describe elasticquota``): one that cannot apply,
    or that another quota of its namespace shadows."""

    quota: str  # namespace/name
    reason: str
    message: str
    warning: bool = True
    uid: str = ""


@dataclass(frozen=True, slots=True)
class DraEvent:
    """An event on a DRA object (``kubectl describe resourceclaim``): one schedext cannot
    read, or a claim holding a device schedext cannot count."""

    kind: str  # ResourceClaim | ResourceSlice | DeviceClass | DeviceTaintRule
    key: str  # namespace/name for a ResourceClaim, the name otherwise
    reason: str
    message: str
    warning: bool = True
    uid: str = ""


@dataclass(frozen=True, slots=True)
class PodGroupEvent:
    """An event on a PodGroup (``kubectl describe podgroup``): a topology annotation that
    is not followed."""

    group: str  # namespace/name
    reason: str
    message: str
    warning: bool = True
    uid: str = ""


Event = PodEvent | NodeEvent | QuotaEvent | DraEvent | PodGroupEvent

# The API of each DRA kind an event can name (DeviceTaintRules are served in v1beta2 only).
_DRA_VERSIONS = {
    "ResourceClaim": "resource.k8s.io/v1",
    "ResourceSlice": "resource.k8s.io/v1",
    "DeviceClass": "resource.k8s.io/v1",
    "DeviceTaintRule": "resource.k8s.io/v1beta2",
}


def _subject(event: Event) -> dict[str, str]:
    if isinstance(event, PodEvent):
        return {"pod": event.pod}
    if isinstance(event, QuotaEvent):
        return {"elasticquota": event.quota}
    if isinstance(event, DraEvent):
        return {event.kind.lower(): event.key}
    if isinstance(event, PodGroupEvent):
        return {"podgroup": event.group}
    return {"node": event.node}


@dataclass(frozen=True, slots=True)
class Requeue:
    """Have kube-scheduler retry this pod (an update of the pod is a cluster event for it)."""

    pod: str  # namespace/name
    uid: str


class EventRecorder(Protocol):
    def record(self, event: Event) -> None: ...

    def requeue(self, pod: str, uid: str) -> None: ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


class LogEventRecorder:
    """Without an API server (demo, snapshot) events are log lines."""

    def record(self, event: Event) -> None:
        extra = {**_subject(event), "reason": event.reason, "event_message": event.message}
        log.info("event", extra=extra)

    def requeue(self, pod: str, uid: str) -> None:
        log.info("requeue", extra={"pod": pod, "uid": uid})

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None


class ApiEventRecorder:
    def __init__(self, api: KubeApi, *, capacity: int = 1000) -> None:
        self._api = api
        self._queue: asyncio.Queue[Event | Requeue] = asyncio.Queue(maxsize=capacity)
        self._task: asyncio.Task[None] | None = None
        self._instance = socket.gethostname()
        self.dropped = 0

    def record(self, event: Event) -> None:
        self._put(event)

    def requeue(self, pod: str, uid: str) -> None:
        self._put(Requeue(pod, uid))

    def _put(self, item: Event | Requeue) -> None:
        try:
            self._queue.put_nowait(item)
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
            item = await self._queue.get()
            try:
                if isinstance(item, Requeue):
                    await self._touch(item)
                else:
                    await self._post(item)
            except ApiError as error:
                what = "requeue" if isinstance(item, Requeue) else "record event for"
                subject = (
                    item.pod
                    if isinstance(item, Requeue)
                    else ", ".join(f"{k} {v}" for k, v in _subject(item).items())
                )
                log.warning("cannot %s %s: %s", what, subject, error)

    async def _touch(self, requeue: Requeue) -> None:
        """Merge-patch the annotation; the UID makes it a no-op error on a pod re-created
        under the same name, and a pod already gone is nothing to retry."""
        namespace, _, name = requeue.pod.partition("/")
        now = dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
        body = {"metadata": {"uid": requeue.uid, "annotations": {names.REQUEUED_AT: now}}}
        try:
            await self._api.merge_patch(f"/api/v1/namespaces/{namespace}/pods/{name}", body)
        except ApiNotFoundError:
            return

    async def _post(self, event: Event) -> None:
        involved: dict[str, str]
        if isinstance(event, QuotaEvent):
            namespace, _, name = event.quota.partition("/")
            involved = {
                "apiVersion": "scheduling.x-k8s.io/v1alpha1",
                "kind": "ElasticQuota",
                "namespace": namespace,
                "name": name,
                "uid": event.uid,
            }
        elif isinstance(event, PodGroupEvent):
            namespace, _, name = event.group.partition("/")
            involved = {
                "apiVersion": "scheduling.x-k8s.io/v1alpha1",
                "kind": "PodGroup",
                "namespace": namespace,
                "name": name,
                "uid": event.uid,
            }
        elif isinstance(event, DraEvent):
            namespace, name = _dra_object(event)
            involved = {
                "apiVersion": _DRA_VERSIONS.get(event.kind, "resource.k8s.io/v1"),
                "kind": event.kind,
                "name": name,
                "uid": event.uid,
            }
            if event.kind == "ResourceClaim":
                involved["namespace"] = namespace
        elif isinstance(event, NodeEvent):
            # Node events live in "default", as the kubelet's own do.
            namespace, name = "default", event.node
            involved = {"apiVersion": "v1", "kind": "Node", "name": name, "uid": event.uid}
        else:
            namespace, _, name = event.pod.partition("/")
            involved = {
                "apiVersion": "v1",
                "kind": "Pod",
                "namespace": namespace,
                "name": name,
                "uid": event.uid,
            }
        now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{name}.", "namespace": namespace},
            "involvedObject": involved,
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


def _dra_object(event: DraEvent) -> tuple[str, str]:
    """The namespace of the event and the object's name: a claim's own namespace; a
    cluster-scoped object's events live in "default", as a Node's do."""
    if event.kind == "ResourceClaim":
        namespace, _, name = event.key.partition("/")
        return namespace, name
    return "default", event.key
