"""Probes, readiness gating, metrics, the path prefix and settings."""

from __future__ import annotations

import asyncio
import gc
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import orjson
import pytest

from app.kube.api import KubeApi
from app.kube.config import ClusterConfig
from app.service.assembly import Service
from app.service.cluster import ClusterSource
from app.service.settings import load_settings
from testbed.builders import A100, make_node, make_pod
from testbed.waiting import wait_for
from tests.api.conftest import Serve, fixture
from tests.api.server import RunningServer
from tests.handler_transport import HandlerTransport
from tests.unit.kube_fakes import page

FILTER = orjson.dumps(fixture("filter_request_nodecache_true.json"))


class NeverSyncedSource:
    """An inventory source whose informers have not listed yet."""

    description = "a cluster still listing"
    watches_pods = True

    async def start(self, service: Service) -> None:
        service.readiness.set_not_ready("inventory not synced: nodes and pods not listed yet")

    async def stop(self) -> None:
        return None


def test_verbs_refuse_until_the_inventory_is_synced(serve: Serve) -> None:
    server = serve(source=NeverSyncedSource())
    with server.client() as client:
        assert client.get("/healthz").status_code == 200
        ready = client.get("/readyz")
        assert ready.status_code == 503
        assert "inventory not synced" in ready.text
        filtered = client.post("/filter", content=FILTER).json()
        assert filtered["Error"] == "inventory not synced: nodes and pods not listed yet"
        assert filtered["NodeNames"] is None
        assert client.post("/prioritize", content=FILTER).status_code == 503
        assert (
            "inventory not synced"
            in client.post("/bind", content=orjson.dumps(fixture("bind_request.json"))).json()[
                "Error"
            ]
        )


class _OpenWatch(httpx.AsyncByteStream):
    """A watch that stays open with no events until the client goes away."""

    async def __aiter__(self) -> AsyncIterator[bytes]:
        await asyncio.Event().wait()
        yield b""  # never reached


class HeldBackPodsApi:
    """An API server (a HandlerTransport) that lists nodes at once and pods only when the
    test releases them; the custom resources' CRDs are not installed (404)."""

    def __init__(self) -> None:
        self.pods_released = threading.Event()
        self.pods_requested = threading.Event()
        node = make_node("gpu-node-a", gpus=4, model=A100)
        node["metadata"]["resourceVersion"] = "10"
        holder = make_pod("resident", gpus=3, node="gpu-node-a", gpu_ids=[0, 1, 2])
        self.nodes, self.pods = [node], [holder]

    async def handle(self, request: httpx.Request) -> httpx.Response:
        path, params = request.url.path, request.url.params
        if request.method == "GET" and params.get("watch") == "1":
            return httpx.Response(200, stream=_OpenWatch())
        if request.method == "GET" and path == "/api/v1/nodes":
            return page(self.nodes, "10")
        if request.method == "GET" and path == "/api/v1/pods":
            self.pods_requested.set()
            while not self.pods_released.is_set():  # held back until the test says so
                await asyncio.sleep(0.01)
            return page(self.pods, "11")
        if request.method == "GET" and path == "/apis/apps/v1/statefulsets":
            return page([], "12")
        return httpx.Response(404, json={"kind": "Status", "code": 404, "reason": "NotFound"})

    def source(self) -> ClusterSource:
        config = ClusterConfig(server="https://api.test", ssl_context=False, token="t0ken")
        api = KubeApi(config, transport=HandlerTransport(self.handle))
        return ClusterSource(api, server=config.server)


def test_the_cluster_source_refuses_verbs_until_nodes_and_pods_are_listed(serve: Serve) -> None:
    fake = HeldBackPodsApi()
    server = serve(source=fake.source())
    bind_body = orjson.dumps(fixture("bind_request.json"))
    try:
        with server.client() as client:
            # Everything but the pods has been listed: still not ready.
            wait_for(
                lambda: (
                    client.get("/readyz").text
                    == "not ready: inventory not synced: pods not listed yet"
                ),
                timeout=10,
                message="the cluster source did not list nodes and the rest",
            )
            assert fake.pods_requested.is_set()
            # No cyclic collections while the first lists are decoded (they traversed the
            # growing inventory again and again); back on once it is synced.
            assert not gc.isenabled()
            ready = client.get("/readyz")
            assert ready.status_code == 503
            filtered = client.post("/filter", content=FILTER).json()
            assert filtered["Error"] == "inventory not synced: pods not listed yet"
            assert filtered["NodeNames"] is None
            for verb, body in (("prioritize", FILTER), ("preempt", _PREEMPT)):
                refused = client.post(f"/{verb}", content=body)
                assert refused.status_code == 503
                assert "inventory not synced" in refused.json()["Error"]
            bound = client.post("/bind", content=bind_body).json()
            assert "inventory not synced" in bound["Error"]
            assert client.get("/").json()["ready"] is False

            fake.pods_released.set()
            wait_for(
                lambda: client.get("/readyz").status_code == 200,
                timeout=10,
                message="not ready after the pods were listed",
            )
            # The first answer already counts the listed pod's 3 GPUs.
            filtered = client.post("/filter", content=FILTER).json()
            assert filtered["Error"] == ""
            assert filtered["FailedNodes"]["gpu-node-a"] == "schedext: fewer than 2 free GPUs"
            assert client.post("/prioritize", content=FILTER).status_code == 200
            assert gc.isenabled()
    finally:
        fake.pods_released.set()
        gc.enable()


_PREEMPT = orjson.dumps(fixture("preempt_request_nodecache_true.json"))


def test_ready_service_answers_readyz(demo: RunningServer) -> None:
    with demo.client() as client:
        assert client.get("/readyz").text == "ok"
        root = client.get("/").json()
    assert root["ready"] is True
    assert root["inventory"] == "embedded demo inventory"


def test_verbs_are_also_served_under_the_configured_prefix(serve: Serve) -> None:
    server = serve(settings={"server": {"path_prefix": "scheduler/"}})
    with server.client() as client:
        prefixed = client.post("/scheduler/filter", content=FILTER).json()
        plain = client.post("/filter", content=FILTER).json()
        assert prefixed == plain
        assert prefixed["NodeNames"] == ["gpu-node-a"]
        assert client.get("/").json()["verbs"][0] == "/scheduler/filter"


def test_metrics_count_latency_decisions_and_inventory(demo: RunningServer) -> None:
    with demo.client() as client:
        client.post("/filter", content=FILTER)
        client.post("/filter", content=b"{broken")
        text = client.get("/metrics").text
    assert 'schedext_request_duration_seconds_count{verb="filter"} 2.0' in text
    assert 'schedext_decisions_total{outcome="feasible",verb="filter"} 1.0' in text
    assert 'schedext_decisions_total{outcome="rejected",verb="filter"} 1.0' in text
    assert 'schedext_filter_nodes_total{outcome="unresolvable"} 1.0' in text
    assert 'schedext_filter_rejections_total{reason="gpu_model"} 1.0' in text
    assert 'schedext_filter_rejections_total{reason="gpu_free"} 1.0' in text
    assert 'schedext_inventory_gpus{model="NVIDIA-H100-80GB-HBM3"} 36.0' in text
    # 32 H100s of the four h100 nodes (14 held whole, and GPU 0 of h100-node-3 shared by two
    # pods) and h100-mig-1's 4 whole ones (its other 4 are in MIG mode: MIG devices instead).
    assert 'schedext_inventory_gpus_free{model="NVIDIA-H100-80GB-HBM3"} 21.0' in text
    assert 'schedext_gpu_shared_devices{model="NVIDIA-H100-80GB-HBM3"} 1.0' in text
    assert (
        'schedext_gpu_share_memory_mib{model="NVIDIA-H100-80GB-HBM3",state="held"} 40960.0' in text
    )
    assert "schedext_inventory_nodes 11.0" in text


def test_bench_endpoint_is_off_unless_asked_for(serve: Serve) -> None:
    with serve().client() as client:
        assert client.post("/bench/constant", content=FILTER).status_code == 404
    with serve(settings={"server": {"bench_endpoints": True}}).client() as client:
        assert client.post("/bench/constant", content=FILTER).json()["Error"] == ""


def test_settings_come_from_file_then_environment_then_flags(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "schedext.yaml"
    config.write_text("server:\n  port: 9000\n  host: 0.0.0.0\npolicy:\n  gpu_scoring: spread\n")
    monkeypatch.setenv("SCHEDEXT_SERVER__PORT", "9100")
    settings = load_settings(config, server={"host": "127.0.0.2"})
    assert (settings.server.host, settings.server.port) == ("127.0.0.2", 9100)
    assert settings.policy.gpu_scoring == "spread"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"policy": {"cpu_intensive_min_cpu": "lots"}}, "not a CPU quantity"),
        (
            {"policy": {"allocation_weight": -1}},
            r"^policy.allocation_weight: must be at least 0 \(got -1, from a command-line flag\)$",
        ),
        ({"server": {"max_body_bytes": 10}}, "server.max_body_bytes: must be at least 1024"),
        ({"server": {"no_such_setting": 1}}, "server.no_such_setting: is not a setting"),
    ],
)
def test_invalid_settings_are_refused_with_a_reason(
    overrides: dict[str, object], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        load_settings(**overrides)
