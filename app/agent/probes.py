"""The agent's read-only HTTP endpoints, for the kubelet's probes and Prometheus: ``/healthz``
(the process answers), ``/readyz`` (GPUs published, pods listed, plugin listening or off by
decision) and ``/metrics``. Both probes also say whether the device plugin is registered or
off, and why (a DRA node). Nothing here changes anything, so it may listen on the pod's
address."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from app.agent.dra_drivers import Decision
from app.agent.reconciliation import DriftStats
from extender.devices import Gpu

__all__ = ["AgentState", "metrics_registry", "probe_app"]


class AgentState:
    """What the probes read: readiness, the GPUs, the Node writes so far, reconciliation
    with the kubelet (None: off), and whether the device plugin serves (None: not decided
    yet)."""

    def __init__(
        self,
        ready: Callable[[], bool],
        gpus: Callable[[], tuple[Gpu, ...]],
        writes: Callable[[], int],
        drift: Callable[[], DriftStats | None] = lambda: None,
        device_plugin: Callable[[], Decision | None] = lambda: None,
    ) -> None:
        self.ready, self.gpus, self.writes, self.drift = ready, gpus, writes, drift
        self.device_plugin = device_plugin

    def answer(self, status: str) -> dict[str, str]:
        """A probe's JSON body: its status, and the device plugin's (``registered: why`` or
        ``off: why``) once decided."""
        decision = self.device_plugin()
        return {"status": status} | ({} if decision is None else {"device_plugin": str(decision)})


class _Collector(Collector):
    def __init__(self, state: AgentState) -> None:
        self._state = state

    def collect(self) -> Iterator[Metric]:
        gpus = GaugeMetricFamily(
            "schedext_agent_gpus", "GPUs on this node, by health.", labels=["health"]
        )
        current = self._state.gpus()
        healthy = sum(1 for g in current if g.health.healthy)
        gpus.add_metric(["healthy"], healthy)
        gpus.add_metric(["unhealthy"], len(current) - healthy)
        yield gpus
        writes = GaugeMetricFamily(
            "schedext_agent_node_writes", "Node annotation patches sent since the agent started."
        )
        writes.add_metric([], self._state.writes())
        yield writes
        plugin = GaugeMetricFamily(
            "schedext_agent_device_plugin_registered",
            "Whether the agent serves its device plugins (1) or keeps them off (0: device_plugin "
            "off, or a DRA GPU driver registered with the kubelet); no sample before it decides.",
        )
        if (decision := self._state.device_plugin()) is not None:
            plugin.add_metric([], 1 if decision.register else 0)
        yield plugin
        yield from _drift(self._state.drift())


def _drift(stats: DriftStats | None) -> Iterator[Metric]:
    """Reconciliation with the kubelet's PodResources (families without samples when off)."""
    up = GaugeMetricFamily(
        "schedext_agent_podresources_up",
        "Whether the kubelet's PodResources answered the last read (1) or not (0).",
    )
    reads = CounterMetricFamily(
        "schedext_agent_podresources_reads", "Reads of the kubelet's PodResources that answered."
    )
    failures = CounterMetricFamily(
        "schedext_agent_podresources_failures",
        "Reads of the kubelet's PodResources that failed (no socket, no answer in time).",
    )
    drift = GaugeMetricFamily(
        "schedext_agent_gpu_drift",
        "Devices in use that schedext does not account for, by cause (unknown-pod, "
        "not-given, not-placed), and records of pods the kubelet no longer lists (stale, "
        "released), as last read.",
        labels=["kind"],
    )
    writes = GaugeMetricFamily(
        "schedext_agent_drift_writes", "Drift annotation patches sent since the agent started."
    )
    allocatable = GaugeMetricFamily(
        "schedext_agent_kubelet_allocatable_devices",
        "Devices of the agent's resources the kubelet may allocate, as its PodResources last "
        "said (0 for a resource the agent serves: the kubelet has not taken that plugin).",
        labels=["resource"],
    )
    if stats is not None:
        if stats.up is not None:
            up.add_metric([], 1 if stats.up else 0)
        reads.add_metric([], stats.reads)
        failures.add_metric([], stats.failures)
        for kind, count in stats.kinds:
            drift.add_metric([kind], count)
        writes.add_metric([], stats.writes)
        for resource, count in stats.allocatable:
            allocatable.add_metric([resource], count)
    yield from (up, reads, failures, drift, writes, allocatable)


def metrics_registry(state: AgentState) -> CollectorRegistry:
    """What ``/metrics`` serves (and what the shipped alerts and dashboard may name)."""
    registry = CollectorRegistry(auto_describe=True)
    registry.register(_Collector(state))
    return registry


def probe_app(state: AgentState) -> web.Application:
    registry = metrics_registry(state)

    async def healthz(_: web.Request) -> web.Response:
        return web.json_response(state.answer("ok"))

    async def readyz(_: web.Request) -> web.Response:
        ready = state.ready()
        return web.json_response(
            state.answer("ready" if ready else "not ready"), status=200 if ready else 503
        )

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=generate_latest(registry), content_type="text/plain")

    app = web.Application(client_max_size=1024)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    return app
