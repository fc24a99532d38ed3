"""The application factory: assembles settings, the core, a binder and an inventory source."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import orjson
from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import Receive, Scope, Send

from app import __version__
from app.kube.api import KubeApi
from app.kube.binder import ApiBinder
from app.kube.binding import Binder, InMemoryBinder
from app.kube.config import ClusterConfig, in_cluster_available, load_cluster_config
from app.kube.events import ApiEventRecorder, EventRecorder, LogEventRecorder
from app.kube.fence import Fences, fence_problem
from app.kube.readiness import Readiness
from app.service import openapi
from app.service.assembly import Service
from app.service.cluster import ClusterSource
from app.service.dra_problems import DraProblemReporter
from app.service.gang_holds import HoldReporter
from app.service.gangs import GangWaiters
from app.service.metrics import Metrics
from app.service.node_problems import (
    GangTopologyReporter,
    MixedNodeReporter,
    NodeProblemReporter,
)
from app.service.routes import explain, health, inventory, ui
from app.service.routes.verbs import VerbEndpoints
from app.service.settings import Settings
from app.service.snapshot import demo_snapshot, read_snapshot
from app.service.sources import InventorySource, SnapshotSource
from app.service.victims import VictimWaits
from extender.gang.hold_keeper import HoldTimes
from extender.preemption import GangVictims
from extender.scheduler import Scheduler

__all__ = ["create_app", "default_parts", "live_cluster_configured"]

log = logging.getLogger("schedext")


def live_cluster_configured(settings: Settings) -> bool:
    return settings.snapshot is None and (settings.kubeconfig is not None or in_cluster_available())


def default_parts(settings: Settings) -> tuple[InventorySource, Binder, EventRecorder]:
    """A snapshot file, the live cluster (kubeconfig or in-cluster), or the embedded demo."""
    if settings.snapshot is not None:
        return (
            SnapshotSource(read_snapshot(settings.snapshot)),
            InMemoryBinder(),
            LogEventRecorder(),
        )
    if live_cluster_configured(settings):
        cluster = load_cluster_config(settings.kubeconfig)
        api = KubeApi(cluster)
        fences = _fences(cluster, api) if settings.dra.fence else None
        binder = ApiBinder(
            api,
            attempts=settings.bind.api_attempts,
            deadline_s=settings.bind.api_deadline_s,
            fences=fences,
        )
        source = ClusterSource(
            api,
            server=cluster.server,
            status_interval_s=settings.gang.status_interval_s,
            quota_status_interval_s=settings.quota.status_interval_s,
            claim_release_interval_s=settings.ip.claim_release_interval_s,
            leader=settings.leader if settings.leader.enabled else None,
            fences=fences,
        )
        return source, binder, ApiEventRecorder(api)
    return SnapshotSource(demo_snapshot()), InMemoryBinder(), LogEventRecorder()


def _fences(cluster: ClusterConfig, api: KubeApi) -> Fences:
    """dra.fence's writer; raises ValueError (schedext refuses to start) when the cluster
    cannot take the fence: a fence that cannot be published would let DRA hand out the GPUs
    schedext binds. Asked once, with a client of its own (its event loop ends here)."""

    async def ask() -> str:
        probe = KubeApi(cluster)
        try:
            return await fence_problem(probe)
        finally:
            await probe.close()

    problem = asyncio.run(ask())
    if problem:
        raise ValueError(problem)
    return Fences(api)


def create_app(
    settings: Settings,
    *,
    source: InventorySource | None = None,
    binder: Binder | None = None,
    events: EventRecorder | None = None,
) -> FastAPI:
    scheduler = Scheduler(
        settings.policy_config(),
        pending_capacity=settings.bind.pending_capacity,
        reservation_ttl=settings.bind.reservation_ttl_s,
        gang_timeout_s=settings.gang.default_timeout_s,
        gang_max_wait_s=settings.gang.max_wait_s,
        gang_victims=GangVictims(settings.preemption.gang_victims),
        victim_memory_s=settings.preemption.victim_memory_s,
        gang_holds=HoldTimes(settings.gang.hold_after_s, settings.gang.hold_max_s),
    )
    readiness = Readiness()
    metrics = Metrics(lambda: scheduler, readiness)
    if source is None:
        source, default_binder, default_events = default_parts(settings)
        binder = binder or default_binder
        events = events or default_events
    events = events or LogEventRecorder()
    service = Service(
        settings=settings,
        scheduler=scheduler,
        readiness=readiness,
        binder=binder or InMemoryBinder(),
        metrics=metrics,
        gangs=GangWaiters(metrics, events),
        # Waiting for victims to go needs a pod watch to show them going: without one (the
        # demo, a snapshot) every wait would run to its bound for nothing.
        victims=VictimWaits(
            metrics,
            bound_s=settings.preemption.victim_wait_s if source.watches_pods else 0.0,
            clock=time.monotonic,
        ),
        events=events,
        description=source.description,
    )
    app = _SchedextApp(
        title="schedext",
        version=__version__,
        summary="Kubernetes scheduler extender: GPU topology, IP pools and gangs",
        lifespan=_lifespan,
        docs_url=None,  # the interactive docs pull assets from a CDN
        redoc_url=None,
    )
    app.state.service = service
    app.state.source = source
    app.include_router(health.router)
    app.include_router(inventory.router)
    app.include_router(ui.router)
    app.include_router(explain.router)
    app.add_exception_handler(RequestValidationError, _bad_request)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(Exception, _internal_error)
    return app


class _SchedextApp(FastAPI):
    """FastAPI behind :class:`VerbEndpoints`, the bare ASGI layer that answers the verbs."""

    _front: Any = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # The verbs are answered before FastAPI's own __call__ (its scope set-up, telemetry
        # check and middleware stack): a tenth of the CPU of each call kube-scheduler makes.
        if self._front is None:
            service: Service = self.state.service
            server = service.settings.server
            # Outermost: a replica that may not answer the verbs closes every connection, so
            # that kube-scheduler's kept-alive ones move to the ready replica.
            self._front = health.CloseWhenNotReady(
                VerbEndpoints(
                    health.HeadAsGet(super().__call__),
                    service,
                    prefix=server.path_prefix,
                    bench=server.bench_endpoints,
                ),
                service.readiness,
            )
        await self._front(scope, receive, send)

    def openapi(self) -> dict[str, Any]:
        if self.openapi_schema is None:
            schema = super().openapi()
            service: Service = self.state.service
            schema.setdefault("paths", {}).update(
                openapi.verb_paths(service.settings.server.path_prefix)
            )
        assert self.openapi_schema is not None
        return self.openapi_schema


@contextlib.asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    service: Service = app.state.service
    source: InventorySource = app.state.source
    await service.events.start()
    # Collect young objects less often: tail latency is mostly GC pauses.
    gc.set_threshold(50_000, 20, 100)
    service.pause_collector()  # until the inventory is synced (settle)
    await source.start(service)  # a snapshot is loaded here, a cluster listed in the background
    if service.readiness.synced:
        service.settle()
    expiry = asyncio.create_task(_expire_reservations(service), name="reservation-expiry")
    # No "ready" line here: the port is not bound yet (app.service.stopping says "listening"
    # once it is), and a cluster may not be listed yet (its source says "inventory synced").
    try:
        yield
    finally:
        expiry.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await expiry
        await source.stop()
        await service.events.stop()


async def _expire_reservations(service: Service) -> None:
    """Run :func:`chores` every second or so, and DRA's problem check beside them."""
    period = min(1.0, service.settings.bind.reservation_ttl_s / 2)
    expire = chores(service)
    dra_problems = DraProblemReporter(service.events, service.metrics.dra_problems)
    while True:
        await asyncio.sleep(period)
        service.core(expire)
        dra_problems.check(service.scheduler, service.readiness, service.clock())


def chores(service: Service) -> Callable[[Scheduler], None]:
    """The periodic chores: give back GPUs of binds that never completed (the bind call died
    mid-way), end the waits of gangs past their timeout (their waiting binds also notice on
    their own), stop trusting stale live-use samples; and on the leader only (Warning events
    come from one replica), report node annotations that could not be read, mixed GPU
    owners and ignored gang topology, and keep the gangs' holds."""
    problems = NodeProblemReporter(service.events)
    mixed = MixedNodeReporter(service.events, fence=service.settings.dra.fence)
    topologies = GangTopologyReporter(service.events)
    holds = HoldReporter(service.events, service.metrics.holds)

    def expire(scheduler: Scheduler) -> None:
        # Logged inside the call, so that these lines come before the gang effects' own.
        for holding in scheduler.expire(service.clock()):
            log.warning(
                "reservation expired",
                extra={"pod": holding.key, "node": holding.node, "gpus": holding.gpu_ids},
            )
        scheduler.age_live_use(time.time())
        if not service.readiness.ready:
            return  # a standby (or before sync): the leader alone tells, and keeps the holds
        problems.check(scheduler.inventory.problems)
        mixed.check(scheduler.dra_owners())
        topologies.check(scheduler.gang_topology_problems())
        service.holds_current()
        holds.review(scheduler)
        service.holds_reviewed()

    return expire


async def _bad_request(_request: Request, error: Exception) -> Response:
    return Response(
        orjson.dumps({"Error": f"bad request: {error}"}),
        status_code=400,
        media_type="application/json",
    )


async def _http_error(request: Request, error: Exception) -> Response:
    """A path no route serves, a method it does not take: ``{"Error": ...}`` as every other
    answer says what went wrong, never the framework's ``{"detail": "Not Found"}``."""
    assert isinstance(error, StarletteHTTPException)
    what = "no such path" if error.status_code == 404 else str(error.detail).lower()
    return Response(
        orjson.dumps({"Error": f"{what}: {request.method} {request.url.path}"}),
        status_code=error.status_code,
        headers=error.headers,
        media_type="application/json",
    )


async def _internal_error(_request: Request, error: Exception) -> Response:
    log.error("unhandled error: %s: %s", type(error).__name__, error)
    return Response(
        orjson.dumps({"Error": f"schedext internal error ({type(error).__name__})"}),
        status_code=500,
        media_type="application/json",
    )
