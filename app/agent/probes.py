"""The agent's read-only HTTP endpoints, for the kubelet's probes and Prometheus: ``/healthz``
(the process answers), ``/readyz`` (GPUs published, pods listed, plugin listening) and
``/metrics``. Nothing here changes anything, so it may listen on the pod's address."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from extender.devices import Gpu

__all__ = ["AgentState", "metrics_registry", "probe_app"]


class AgentState:
    """What the probes read: readiness, the GPUs, and the Node writes so far."""

    def __init__(
        self,
        ready: Callable[[], bool],
        gpus: Callable[[], tuple[Gpu, ...]],
        writes: Callable[[], int],
    ) -> None:
        self.ready, self.gpus, self.writes = ready, gpus, writes


class _Collector(Collector):
    def __init__(self, state: AgentState) -> None:
        self._state = state

    def collect(self) -> Iterator[GaugeMetricFamily]:
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


def metrics_registry(state: AgentState) -> CollectorRegistry:
    """What ``/metrics`` serves (and what the shipped alerts and dashboard may name)."""
    registry = CollectorRegistry(auto_describe=True)
    registry.register(_Collector(state))
    return registry


def probe_app(state: AgentState) -> web.Application:
    registry = metrics_registry(state)

    async def healthz(_: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def readyz(_: web.Request) -> web.Response:
        ready = state.ready()
        return web.json_response(
            {"status": "ready" if ready else "not ready"}, status=200 if ready else 503
        )

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=generate_latest(registry), content_type="text/plain")

    app = web.Application(client_max_size=1024)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    return app
