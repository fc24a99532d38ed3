"""The live-cluster inventory source: list+watch of everything the core decides on, plus the
background writers (status, claim release) and leader election.

It wires ``app.kube``'s informers and writers to the :class:`~app.service.assembly.Service` (its
readiness, metrics and victim waits), so it belongs to the service layer, beside
``app.service.sources``: ``app.kube`` itself stays plain Kubernetes I/O that knows nothing of the
service assembled around it."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from app.kube.api import KubeApi
from app.kube.claims import ClaimReleaser
from app.kube.events import EventRecorder
from app.kube.fence import Fences
from app.kube.hold_records import HoldRecords
from app.kube.leader import LeaderElector
from app.kube.role import LEADER, ROLE_LABEL, PodRoleLabel
from app.kube.shapes import NODE_DECODERS, POD_DECODERS
from app.kube.status import PODGROUPS_PATH, SCHEDEXT_PATH, QuotaStatusWriter, StatusWriter
from app.kube.watch import Relist, Resource, Sink, WatchHooks, watch_forever
from app.service.assembly import Service
from app.service.node_problems import UnfencedReporter
from app.service.quotas import QuotaSink
from app.service.settings import LeaderSettings
from extender.scheduler import Scheduler

__all__ = [
    "ELASTICQUOTAS",
    "IPCLAIMS",
    "IPPOOLS",
    "NODES",
    "PODGROUPS",
    "PODS",
    "STATEFULSETS",
    "ClusterSource",
]

log = logging.getLogger("schedext.cluster")

JSON = dict[str, Any]

NODES = Resource(name="nodes", path="/api/v1/nodes", decoders=NODE_DECODERS)
# Terminal pods hold nothing; a pod that finishes leaves this selection, which the watch
# reports as a DELETED event (as kube-scheduler's own pod informer does). Pages of 5,000: the
# API server's cost per page is large (a cold sync of 40,000 pods was ready in 5.5 s with
# 5,000 per page against 7.1 s with 1,000, at the same peak memory), and a page (about 26 MB
# of JSON) is decoded into little more than the few fields schedext keeps.
PODS = Resource(
    name="pods",
    path="/api/v1/pods",
    field_selector="status.phase!=Succeeded,status.phase!=Failed",
    page_size=5000,
    decoders=POD_DECODERS,
)
# Custom resources whose CRDs may be missing: without them, no gangs, no address pools or no
# team quotas.
PODGROUPS = Resource(name="podgroups", path=f"{PODGROUPS_PATH}/podgroups", optional=True)
ELASTICQUOTAS = Resource(
    name="elasticquotas", path=f"{PODGROUPS_PATH}/elasticquotas", optional=True
)
IPPOOLS = Resource(name="ippools", path=f"{SCHEDEXT_PATH}/ippools", optional=True)
IPCLAIMS = Resource(name="ipclaims", path=f"{SCHEDEXT_PATH}/ipclaims", optional=True)
STATEFULSETS = Resource(name="statefulsets", path="/apis/apps/v1/statefulsets")
DRA_PATH = "/apis/resource.k8s.io/v1"
DRA_TAINTS_PATH = "/apis/resource.k8s.io/v1beta2"  # DeviceTaintRules: only here in v1.36
# Dynamic Resource Allocation (extender.dra): the GPUs ResourceClaims hold. Optional: a cluster
# that does not serve resource.k8s.io (or, for DeviceTaintRules, its v1beta2 behind the
# DRADeviceTaintRules gate) runs as before, with one log line.
_DRA_HINT = "does the API server serve resource.k8s.io/v1?"
RESOURCESLICES = Resource(
    name="resourceslices",
    path=f"{DRA_PATH}/resourceslices",
    optional=True,
    missing_hint=_DRA_HINT,
)
RESOURCECLAIMS = Resource(
    name="resourceclaims",
    path=f"{DRA_PATH}/resourceclaims",
    optional=True,
    missing_hint=_DRA_HINT,
)
DEVICECLASSES = Resource(
    name="deviceclasses", path=f"{DRA_PATH}/deviceclasses", optional=True, missing_hint=_DRA_HINT
)
DEVICETAINTRULES = Resource(
    name="devicetaintrules",
    path=f"{DRA_TAINTS_PATH}/devicetaintrules",
    optional=True,
    missing_hint="resource.k8s.io/v1beta2 is served only with the DRADeviceTaintRules gate on",
)
RESOURCES = (
    NODES,
    PODS,
    PODGROUPS,
    ELASTICQUOTAS,
    IPPOOLS,
    IPCLAIMS,
    STATEFULSETS,
    RESOURCESLICES,
    RESOURCECLAIMS,
    DEVICECLASSES,
    DEVICETAINTRULES,
)
# The resources whose events may free what a pod turned away waits for.
_FREEING = frozenset(
    r.name
    for r in (
        NODES,
        PODS,
        ELASTICQUOTAS,
        IPPOOLS,
        IPCLAIMS,
        RESOURCESLICES,
        RESOURCECLAIMS,
        DEVICETAINTRULES,
    )
)


# The resources whose events may change what the fence covers (dra.fence): the pods holding
# GPUs, the devices advertised.
_FENCED = frozenset({PODS.name, RESOURCESLICES.name})


@dataclass(frozen=True, slots=True)
class _Sink:
    """Events of one resource, routed to the core's writer methods."""

    relist: Callable[[], Relist]
    upsert: Callable[[JSON], object]
    delete: Callable[[JSON], object]


def _sinks(scheduler: Scheduler, events: EventRecorder) -> dict[str, Sink]:
    def name(obj: JSON) -> str:
        return str((obj.get("metadata") or {}).get("name", ""))

    def uid(obj: JSON) -> str:
        return str((obj.get("metadata") or {}).get("uid", ""))

    return {
        "nodes": _Sink(
            scheduler.node_relist, scheduler.upsert_node, lambda o: scheduler.delete_node(name(o))
        ),
        "pods": _Sink(
            scheduler.pod_relist, scheduler.upsert_pod, lambda o: scheduler.delete_pod(uid(o))
        ),
        "podgroups": _Sink(
            scheduler.pod_group_relist, scheduler.upsert_pod_group, scheduler.delete_pod_group
        ),
        # Bad and shadowed quotas are skipped with a Warning event (app.service.quotas).
        "elasticquotas": QuotaSink(scheduler, events),
        "ippools": _Sink(
            scheduler.ip_pool_relist, scheduler.upsert_ip_pool, scheduler.delete_ip_pool
        ),
        "ipclaims": _Sink(
            scheduler.ip_claim_relist, scheduler.upsert_ip_claim, scheduler.delete_ip_claim
        ),
        "resourceslices": _Sink(
            scheduler.resource_slice_relist,
            scheduler.upsert_resource_slice,
            scheduler.delete_resource_slice,
        ),
        "resourceclaims": _Sink(
            scheduler.resource_claim_relist,
            scheduler.upsert_resource_claim,
            scheduler.delete_resource_claim,
        ),
        "deviceclasses": _Sink(
            scheduler.device_class_relist,
            scheduler.upsert_device_class,
            scheduler.delete_device_class,
        ),
        "devicetaintrules": _Sink(
            scheduler.device_taint_rule_relist,
            scheduler.upsert_device_taint_rule,
            scheduler.delete_device_taint_rule,
        ),
        "statefulsets": _Sink(
            lambda: _StatefulSetRelist(scheduler),
            lambda o: scheduler.set_statefulset(_key(o), _replicas(o)),
            lambda o: scheduler.set_statefulset(_key(o), None),
        ),
    }


def _frees_nothing() -> None:
    """The change hook of a resource whose events free no room (pod groups, classes, …)."""


def _key(obj: JSON) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace', 'default')}/{meta.get('name', '')}"


def _replicas(obj: JSON) -> int:
    replicas = (obj.get("spec") or {}).get("replicas", 1)
    return replicas if isinstance(replicas, int) and replicas >= 0 else 1


class _StatefulSetRelist:
    def __init__(self, scheduler: Scheduler) -> None:
        self._scheduler = scheduler
        self._replicas: dict[str, int] = {}

    def add(self, items: Iterable[JSON]) -> None:
        for item in items:
            self._replicas[_key(item)] = _replicas(item)

    def commit(self) -> None:
        self._scheduler.replace_statefulsets(self._replicas)


class ClusterSource:
    """Verbs are refused until every resource has been listed once, so that no decision is
    made on a partial inventory: restarts rebuild every GPU and address holding (pods'
    annotations, IPClaims) before the first bind."""

    def __init__(
        self,
        api: KubeApi,
        *,
        server: str,
        resources: Iterable[Resource] = RESOURCES,
        status_interval_s: float = 2.0,
        quota_status_interval_s: float = 10.0,
        claim_release_interval_s: float = 30.0,
        leader: LeaderSettings | None = None,
        fences: Fences | None = None,
    ) -> None:
        self._api = api
        self._fences = fences  # dra.fence: its pass runs beside the status writers
        self._leader_settings = leader
        self._elector: LeaderElector | None = None
        self._role: PodRoleLabel | None = None
        self._resources = tuple(resources)
        self._status_interval_s = status_interval_s
        self._quota_status_interval_s = quota_status_interval_s
        self._claim_release_interval_s = claim_release_interval_s
        self._tasks: list[asyncio.Task[None]] = []
        self.description = f"cluster at {server}"
        self.watches_pods = True

    async def start(self, service: Service) -> None:
        pending = {resource.name for resource in self._resources}
        service.readiness.set_not_ready(
            f"inventory not synced: {', '.join(sorted(pending))} not listed yet"
        )
        sinks = _sinks(service.scheduler, service.events)

        def listed_callback(name: str) -> Callable[[], None]:
            def listed() -> None:
                pending.discard(name)
                if pending:
                    service.readiness.set_not_ready(
                        f"inventory not synced: {', '.join(sorted(pending))} not listed yet"
                    )
                elif not service.readiness.synced:
                    service.readiness.set_ready()
                    service.settle()
                    log.info("inventory synced: every resource listed")

            return listed

        def change_callback(name: str) -> Callable[[], None]:
            if name not in _FREEING:
                return _frees_nothing

            def freed() -> None:
                if name == PODS.name:
                    service.victims.pods_changed()  # filters waiting for victims look again
                if name in _FENCED and self._fences is not None:
                    self._fences.kick()  # a GPU may have been let go: lift its fence soon
                # The event may have freed what pods filter turned away wait for (GPUs, a
                # share's room, a MIG device, an address, quota headroom), or a preemptor's
                # room (see extender.capacity_waits). An event that changed nothing schedext
                # keeps (most pod status updates, node heartbeats) freed nothing: not called.
                service.requeue_waiters()

            return freed

        for resource in self._resources:
            name = resource.name
            hooks = WatchHooks(
                on_listed=listed_callback(name),
                on_event=functools.partial(service.metrics.watch_progress, name),
                on_change=change_callback(name),
                on_restart=functools.partial(service.metrics.watch_restart, name),
            )
            watcher = watch_forever(self._api, resource, sinks[name], hooks=hooks)
            self._tasks.append(asyncio.create_task(watcher, name=f"watch-{resource.name}"))
        if self._leader_settings is not None:
            self._start_election(service, self._leader_settings)
        statuses = StatusWriter(self._api, service.scheduler, service.readiness).run_forever(
            interval_s=self._status_interval_s
        )
        quotas = QuotaStatusWriter(self._api, service.scheduler, service.readiness).run_forever(
            interval_s=self._quota_status_interval_s
        )
        releaser = ClaimReleaser(self._api, service.scheduler, service.readiness).run_forever(
            interval_s=self._claim_release_interval_s
        )
        self._tasks.append(asyncio.create_task(statuses, name="status-writer"))
        self._tasks.append(asyncio.create_task(quotas, name="quota-status-writer"))
        self._tasks.append(asyncio.create_task(releaser, name="claim-releaser"))
        records = HoldRecords(self._api, service.scheduler)
        service.on_holds_reviewed.append(records.kick)
        self._tasks.append(asyncio.create_task(records.run_forever(), name="hold-records"))
        if self._fences is not None:
            fence = self._fences.run_forever(
                service.scheduler, service.readiness, report=UnfencedReporter(service.events).check
            )
            self._tasks.append(asyncio.create_task(fence, name="fence"))

    def _start_election(self, service: Service, settings: LeaderSettings) -> None:
        """Standby replicas keep their informers warm; readiness (and so the verbs, the status
        writers and the claim releaser) follows the lease, and so does the label of this
        replica's pod, which the Service selects (app.kube.role)."""
        service.readiness.set_leading(False, "")
        own_pod = settings.own_pod()
        if own_pod is not None:
            namespace, pod = own_pod
            self._role = PodRoleLabel(
                self._api, namespace=namespace, pod=pod, resync_s=settings.label_resync_s
            )
            self._tasks.append(asyncio.create_task(self._role.run_forever(), name="pod-role"))
        else:
            log.warning(
                "leader election without POD_NAME: this replica's pod is not labelled "
                f"{ROLE_LABEL}={LEADER}, so a Service selecting that label never reaches it"
            )
        role = self._role

        def changed(leading: bool, holder: str) -> None:
            service.readiness.set_leading(leading, holder)
            if role is not None:
                role.set_leading(leading)

        self._elector = LeaderElector(
            self._api,
            namespace=settings.lease_namespace(),
            name=settings.lease_name,
            identity=settings.holder_identity(),
            lease_duration_s=settings.lease_duration_s,
            renew_deadline_s=settings.renew_deadline_s,
            retry_period_s=settings.retry_period_s,
            on_change=changed,
        )
        self.description += f" (leader election as {self._elector.identity})"
        self._tasks.append(asyncio.create_task(self._elector.run_forever(), name="leader"))

    async def stop(self) -> None:
        if self._elector is not None:
            await self._elector.release()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        if self._role is not None:
            # The lease first, then the label: the standby takes over at once, and a labelled
            # replica that does not lead only refuses verbs.
            await self._role.clear()
        await self._api.close()
