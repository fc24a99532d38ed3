"""Reconciliation with the kubelet, end to end in one process pair: the node agent's reader over
real gRPC on a unix socket (a stand-in for the kubelet's PodResources socket,
tests/pod_resources.py), its drift written on the Node through the Kubernetes client, and
schedext, over real HTTP, taking that Node from one watch event.

The kubelet reports one GPU in use by a pod nobody knows (GPU 3) and does not list a pod whose
allocation record names GPU 2. The agent publishes both; schedext stops offering GPU 3 with
the next node event and explains both; after the grace period (an injected clock, no sleep)
the agent releases the stale record. A missing or slow socket is one log line and a metric."""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from prometheus_client import generate_latest

from app.agent.memory import MemoryLedger
from app.agent.pod_resources import KubeletPodResources, PodResources
from app.agent.probes import AgentState, metrics_registry
from app.agent.reconciliation import DriftPublisher, ReconciledLedger, Reconciler
from app.kube.api import KubeApi
from app.kube.config import ClusterConfig
from app.kube.events import NodeEvent
from extender import names
from extender.devices.allocation import NodePod
from extender.devices.drift import SETTLE_S, DriftResources, KubeletDevices
from extender.devices.gpus import Gpu
from testbed.builders import agent_annotations, make_node, make_pod
from testbed.pod_resources import PodResourcesThread
from testbed.waiting import wait_for
from tests.api.conftest import Serve
from tests.api.server import RunningServer
from tests.api.watched_api import WatchedApi
from tests.handler_transport import HandlerTransport
from tests.recorded_events import RecordedEvents
from tests.unit.kube_fakes import event

NODE = "g"
GPU = "nvidia.com/gpu"
GRACE_S = 60.0
T0 = 1_764_000_000.0
GPUS = tuple(Gpu(index=i, uuid=f"GPU-n-{i}") for i in range(4))
GHOST = "GPU 3 in use by a container schedext did not place (kubelet: ml/ghost/main)"


def uuid(index: int) -> str:
    return f"GPU-n-{index}"


def bound(name: str, index: int) -> tuple[dict[str, Any], NodePod]:
    """A pod schedext bound to GPU ``index``, which the agent granted: as the API server has
    it, and as the agent's ledger has it."""
    pod = make_pod(
        name,
        namespace="ml",
        uid=f"uid-{name}",
        gpus=1,
        node=NODE,
        gpu_ids=[index],
        annotations={names.GPU_UUIDS: uuid(index), names.GPU_ALLOCATED: uuid(index)},
    )
    ledger = NodePod(
        uid=f"uid-{name}",
        namespace="ml",
        name=name,
        gpus=1,
        gpu_ids=(index,),
        gpu_uuids=(uuid(index),),
        allocated=(uuid(index),),
    )
    return pod, ledger


RUNNING, RUNNING_LEDGER = bound("a", 0)
GONE, GONE_LEDGER = bound("gone", 2)
KUBELET = [
    KubeletDevices("ml", "a", "main", GPU, (uuid(0),)),
    KubeletDevices("ml", "ghost", "main", GPU, (uuid(3),)),
]


class Clock:
    """The agent's wall clock, moved by the test."""

    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


class AgentNodeApi:
    """The API server as the agent sees it: its own Node, read and merge-patched."""

    def __init__(self) -> None:
        self.node = make_node(NODE, gpus=4, annotations=agent_annotations(4))
        self.patches = 0

    def handle(self, request: httpx.Request) -> httpx.Response:
        assert request.url.path == f"/api/v1/nodes/{NODE}", request.url
        if request.method == "PATCH":
            self.patches += 1
            patch = json.loads(request.content)["metadata"]["annotations"]
            annotations = self.node["metadata"]["annotations"]
            for key, value in patch.items():
                if value is None:
                    annotations.pop(key, None)
                else:
                    annotations[key] = value
        return httpx.Response(200, json=self.node)

    def api(self) -> KubeApi:
        config = ClusterConfig(server="https://api.test", ssl_context=False, token="t0ken")
        return KubeApi(config, transport=HandlerTransport(self.handle))

    @property
    def drift(self) -> dict[str, Any] | None:
        raw = self.node["metadata"]["annotations"].get(names.GPU_DRIFT)
        return None if raw is None else json.loads(raw)


def node_watch_api(node: dict[str, Any]) -> WatchedApi:
    """The API server as schedext sees it: the node and its two pods listed; the node watch
    sends what the test gives."""
    return WatchedApi("/api/v1/nodes", nodes=[node], pods=[RUNNING, GONE])


@pytest.fixture
def socket_dir() -> Iterator[Path]:
    # Short: a unix socket's path must fit in 108 bytes, which pytest's tmp_path may not.
    path = Path(tempfile.mkdtemp(prefix="pr-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def kubelet(socket_dir: Path) -> Iterator[PodResourcesThread]:
    thread = PodResourcesThread(socket_dir / "kubelet.sock")
    yield thread
    thread.stop()


@pytest.fixture
def loop() -> Iterator[asyncio.Runner]:
    """One event loop for the agent's side across the test's steps (its gRPC channel is
    bound to the loop it was opened on)."""
    with asyncio.Runner() as runner:
        yield runner


class AgentSide:
    """The agent's reconciliation as the runner wires it, on a fake Node API."""

    def __init__(
        self, socket: Path, *, deadline_s: float = 2.0, source: PodResources | None = None
    ) -> None:
        self.clock = Clock()
        self.node_api = AgentNodeApi()
        self.ledger = MemoryLedger([RUNNING_LEDGER, GONE_LEDGER])
        self.events = RecordedEvents()
        self.publisher = DriftPublisher(self.node_api.api(), NODE)
        self.reconciler = Reconciler(
            source or KubeletPodResources(socket, deadline_s=deadline_s),
            self.ledger,
            lambda: GPUS,
            self.publisher,
            self.events,
            node=NODE,
            resources=DriftResources(gpu=GPU, share=None),
            interval_s=30.0,
            grace_s=GRACE_S,
            wall=self.clock,
        )
        self.allocations = ReconciledLedger(self.ledger, self.reconciler)

    def metrics(self) -> str:
        state = AgentState(
            ready=lambda: True, gpus=lambda: GPUS, writes=lambda: 0, drift=self.reconciler.stats
        )
        return generate_latest(metrics_registry(state)).decode()


def ready(serve: Serve, fake: WatchedApi) -> RunningServer:
    server = serve(source=fake.source())
    with server.client() as client:
        wait_for(lambda: client.get("/readyz").status_code == 200, timeout=10, message="ready")
    return server


def filter_two(client: httpx.Client) -> dict[str, Any]:
    body = {"Pod": make_pod("p", namespace="ml", uid="uid-p", gpus=2), "NodeNames": [NODE]}
    answer: dict[str, Any] = client.post("/filter", content=orjson.dumps(body)).json()
    return answer


def test_the_agent_publishes_the_drift_and_schedext_holds_what_the_kubelet_says_is_used(
    serve: Serve, kubelet: PodResourcesThread, loop: asyncio.Runner
) -> None:
    kubelet.set(KUBELET)
    agent = AgentSide(kubelet.kubelet.socket)
    loop.run(agent.reconciler.start())

    # First read: GPU 3 in use by a pod nobody knows, published at once; gone's record is
    # missing, but only for now: it is not reported while it settles.
    loop.run(agent.reconciler.reconcile_now())
    published = agent.node_api.drift
    assert published is not None
    assert [(u["uuid"], u["pod"], u["cause"]) for u in published["inUse"]] == [
        (uuid(3), "ml/ghost", "unknown-pod")
    ]
    assert published["stale"] == []
    assert [e.reason for e in agent.events.events] == ["GpuDrift"]

    # Past the settling time: the stale record is published too (not yet released).
    agent.clock.now = T0 + SETTLE_S
    loop.run(agent.reconciler.reconcile_now())
    published = agent.node_api.drift
    assert published is not None
    assert published["stale"] == [
        {"pod": "ml/gone", "uid": "uid-gone", "uuids": [uuid(2)], "since": int(T0),
         "released": False}
    ]  # fmt: skip
    writes = agent.publisher.writes
    loop.run(agent.reconciler.reconcile_now())  # nothing new: nothing written
    assert agent.publisher.writes == writes == agent.node_api.patches == 2

    # schedext, from its node watch: GPUs 0 and 2 are its pods', 1 and 3 are free until the
    # node event carrying the drift arrives; then 3 is held, and a 2-GPU pod no longer fits.
    before = make_node(NODE, gpus=4, annotations=agent_annotations(4))
    before["metadata"]["resourceVersion"] = "10"
    fake = node_watch_api(before)
    server = ready(serve, fake)
    with server.client() as client:
        assert filter_two(client)["NodeNames"] == [NODE]
        after = json.loads(json.dumps(agent.node_api.node))
        after["metadata"]["resourceVersion"] = "13"
        fake.send(event("MODIFIED", after))
        wait_for(
            lambda: client.get("/inventory").json()["nodes"][0]["gpus"][3]["inUse"] is not None,
            timeout=10,
            message="schedext did not take the drift from the node event",
        )
        answer = filter_two(client)
        assert answer["NodeNames"] == []
        assert answer["FailedNodes"] == {NODE: f"schedext: {GHOST} (1 free, pod needs 2)"}
        explained = client.get("/explain/ml/p").json()
        (node,) = explained["nodes"]
        assert node["drift"] == [
            GHOST,
            "stale record: ml/gone holds GPU 2 but the kubelet no longer lists it "
            "(not yet released)",
        ]
        metrics = client.get("/metrics").text
        assert 'schedext_inventory_gpus_in_use_outside{model="NVIDIA-H100-80GB-HBM3"} 1.0' in (
            metrics
        )

    # The agent allocates around the ghost's GPU, and still counts gone's record ...
    assert [p.name for p in agent.allocations.pods()] == ["a", "gone", "ghost"]
    # ... until the grace period has passed since the kubelet stopped listing gone.
    agent.clock.now = T0 + GRACE_S
    loop.run(agent.reconciler.reconcile_now())
    published = agent.node_api.drift
    assert published is not None
    assert published["stale"][0]["released"] is True
    assert [p.name for p in agent.allocations.pods()] == ["a", "ghost"]
    assert "(released)" in agent.events.events[-1].message
    text = agent.metrics()
    assert 'schedext_agent_gpu_drift{kind="unknown-pod"} 1.0' in text
    assert 'schedext_agent_gpu_drift{kind="released"} 1.0' in text
    assert "schedext_agent_podresources_up 1.0" in text

    # Everything settles: the kubelet lists no ghost and the record is gone: no annotation.
    kubelet.set(KUBELET[:1])
    agent.ledger.remove(GONE_LEDGER.uid)
    loop.run(agent.reconciler.reconcile_now())
    assert agent.node_api.drift is None
    loop.run(agent.reconciler.close())


def test_a_restarted_agent_takes_up_the_published_drift_and_writes_nothing_new(
    kubelet: PodResourcesThread, loop: asyncio.Runner
) -> None:
    kubelet.set(KUBELET)
    first = AgentSide(kubelet.kubelet.socket)
    loop.run(first.reconciler.start())
    loop.run(first.reconciler.reconcile_now())
    first.clock.now = T0 + SETTLE_S
    loop.run(first.reconciler.reconcile_now())
    loop.run(first.reconciler.close())

    second = AgentSide(kubelet.kubelet.socket)
    second.node_api.node = first.node_api.node
    second.clock.now = T0 + 30
    loop.run(second.reconciler.start())
    loop.run(second.reconciler.reconcile_now())
    assert second.publisher.writes == 0  # the Node already says so
    assert second.events.events == []  # and it was told
    second.clock.now = T0 + GRACE_S  # the grace counts from the first agent's read
    loop.run(second.reconciler.reconcile_now())
    assert second.reconciler.drift.released() == {"uid-gone"}
    loop.run(second.reconciler.close())


def failing_reads(
    agent: AgentSide, loop: asyncio.Runner, caplog: pytest.LogCaptureFixture, reads: int
) -> list[logging.LogRecord]:
    with caplog.at_level(logging.INFO, logger="schedext.agent.drift"):
        for _ in range(reads):
            loop.run(agent.reconciler.reconcile_now())
    return [r for r in caplog.records if r.name == "schedext.agent.drift"]


def test_a_missing_socket_is_one_log_line_and_a_metric_and_nothing_published(
    socket_dir: Path, loop: asyncio.Runner, caplog: pytest.LogCaptureFixture
) -> None:
    agent = AgentSide(socket_dir / "absent.sock")
    loop.run(agent.reconciler.start())
    records = failing_reads(agent, loop, caplog, reads=3)
    assert [r.getMessage() for r in records] == [
        "cannot read the kubelet's PodResources: GPUs are not reconciled with the kubelet "
        "until it answers"
    ]
    assert "no PodResources socket at" in records[0].__dict__["error"]
    assert "Traceback" not in caplog.text
    text = agent.metrics()
    assert "schedext_agent_podresources_up 0.0" in text
    assert "schedext_agent_podresources_failures_total 3.0" in text
    assert agent.node_api.patches == 0
    assert not agent.reconciler.drift
    assert [p.name for p in agent.allocations.pods()] == ["a", "gone"]  # as before


def test_a_slow_socket_is_a_failed_read_and_its_return_is_logged_once(
    kubelet: PodResourcesThread, loop: asyncio.Runner, caplog: pytest.LogCaptureFixture
) -> None:
    kubelet.set(KUBELET)
    kubelet.kubelet.delay_s = 1.0
    agent = AgentSide(kubelet.kubelet.socket, deadline_s=0.2)
    loop.run(agent.reconciler.start())
    records = failing_reads(agent, loop, caplog, reads=2)
    assert len(records) == 1
    assert records[0].__dict__["error"] == "the kubelet did not answer List in time"
    kubelet.kubelet.delay_s = 0.0
    caplog.clear()
    records = failing_reads(agent, loop, caplog, reads=2)
    messages = [r.getMessage() for r in records]
    assert messages[0] == "the kubelet's PodResources answers again"
    assert messages.count("the kubelet's PodResources answers again") == 1
    assert "schedext_agent_podresources_up 1.0" in agent.metrics()
    loop.run(agent.reconciler.close())


def test_the_drift_event_names_the_node_and_what_is_new(
    kubelet: PodResourcesThread, loop: asyncio.Runner
) -> None:
    kubelet.set(KUBELET)
    agent = AgentSide(kubelet.kubelet.socket)
    loop.run(agent.reconciler.start())
    loop.run(agent.reconciler.reconcile_now())
    loop.run(agent.reconciler.reconcile_now())
    assert agent.events.events == [NodeEvent(NODE, "GpuDrift", GHOST)]
    loop.run(agent.reconciler.close())


def test_allocatable_devices_are_read_by_resource_and_exported_for_the_agents_own(
    kubelet: PodResourcesThread, loop: asyncio.Runner
) -> None:
    kubelet.kubelet.allocatable = {GPU: [uuid(i) for i in range(4)], "example.com/nic": ["x"]}
    reader = KubeletPodResources(kubelet.kubelet.socket)
    assert loop.run(reader.allocatable()) == {GPU: 4, "example.com/nic": 1}
    loop.run(reader.close())
    agent = AgentSide(kubelet.kubelet.socket)
    loop.run(agent.reconciler.reconcile_now())
    text = agent.metrics()
    assert f'schedext_agent_kubelet_allocatable_devices{{resource="{GPU}"}} 4.0' in text
    assert "example.com/nic" not in text
    loop.run(agent.reconciler.close())


class _Broken:
    """A reader failing as no PodResources reader should: with an error it does not know."""

    async def list(self) -> tuple[KubeletDevices, ...]:
        raise RuntimeError("a bug")

    async def allocatable(self) -> dict[str, int]:
        return {}

    async def close(self) -> None:
        return None


def test_an_unexpected_failure_never_stops_the_agent(
    loop: asyncio.Runner, socket_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    agent = AgentSide(socket_dir / "absent.sock", source=_Broken())

    async def two_rounds() -> None:
        task = asyncio.create_task(agent.reconciler.run())
        await asyncio.sleep(0)
        agent.reconciler.nudge()
        for _ in range(100):
            await asyncio.sleep(0.01)
        assert not task.done()
        task.cancel()

    with caplog.at_level(logging.WARNING, logger="schedext.agent.drift"):
        loop.run(two_rounds())
    failures = [r for r in caplog.records if r.getMessage().startswith("reconciliation")]
    assert failures
    assert failures[0].__dict__["error"] == "RuntimeError: a bug"
    assert "Traceback" not in caplog.text
