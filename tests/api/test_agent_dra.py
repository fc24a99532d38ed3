"""The node agent on a DRA node, over real gRPC on real unix sockets: the test plays the
kubelet (a real ``Registration`` server on ``kubelet.sock``, calls to the plugin's socket) and
a DRA driver's kubelet plugin (its registration socket, ``gpu.nvidia.com-reg.sock``, in a
plugin registry directory of the test's).

What it shows, with ``device_plugin`` auto: a driver registered at start, and the device
plugin never registers; a driver that registers later, and the plugin stops serving (the
kubelet's ListAndWatch stream ends, which is how its device manager learns of it) and removes
its socket; the driver gone, and the plugin registers again. And the whole agent, in each
mode, publishes the node's topology, health and live use all the same, while its plugins and
share capacity follow the decision."""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import socket
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import grpc
import httpx
import pytest

from app.agent.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc
from app.agent.dra_drivers import DevicePluginMode
from app.agent.gpu_allocator import GpuAllocator
from app.agent.memory import MemoryLedger, StaticDevices
from app.agent.plugin_switch import Plugins, PluginSwitch
from app.agent.replay import ReplayBackend
from app.agent.runner import Agent
from app.agent.servicer import DevicePluginServicer
from app.agent.settings import AgentSettings
from app.kube.api import KubeApi
from app.kube.config import ClusterConfig
from extender import names
from extender.devices import decode_topology, decode_use
from extender.devices.gpus import Gpu
from testbed.kubelet import WAIT_S, FakeKubelet, quick_endpoint
from testbed.waiting import until
from tests.handler_transport import HandlerTransport
from tests.unit.kube_fakes import page

T = TypeVar("T")
NVIDIA = "gpu.nvidia.com"
NODE = "gpu-node"
RECORDING = Path(__file__).resolve().parents[1] / "fixtures" / "nvml" / "hgx-8-nvlink.json"
QUADS = ((0, 1, 2, 3), (4, 5, 6, 7))
READS = 5  # registry reads that show a decision holding, not merely not yet taken


class Node:
    """One node's kubelet directories, in a short temporary directory (a unix socket's path
    must fit in 108 bytes): the device-plugin directory, with the kubelet's registration
    server in it, and the plugin registry, where a DRA driver's socket comes and goes."""

    def __init__(self, root: Path) -> None:
        self.plugins = root / "dp"
        self.registry = root / "reg"
        self.plugins.mkdir()
        self.registry.mkdir()
        self.kubelet = FakeKubelet(self.plugins)
        self.dra = self.registry / f"{NVIDIA}-reg.sock"

    def driver_registers(self) -> None:
        """What the DRA driver's kubelet plugin leaves: a bound unix socket."""
        listener = socket.socket(socket.AF_UNIX)
        listener.bind(str(self.dra))
        listener.close()

    def driver_goes(self) -> None:
        self.dra.unlink()


@pytest.fixture
def node() -> Iterator[Node]:
    root = Path(tempfile.mkdtemp(prefix="dra-"))
    yield Node(root)
    shutil.rmtree(root, ignore_errors=True)


def run(scenario: Callable[[], Awaitable[T]]) -> T:
    return asyncio.run(asyncio.wait_for(scenario(), 60))


@contextlib.asynccontextmanager
async def kubelet(node: Node) -> AsyncIterator[FakeKubelet]:
    """The kubelet's registration server for the block, stopped whatever happens."""
    await node.kubelet.start()
    try:
        yield node.kubelet
    finally:
        await node.kubelet.stop()


@contextlib.asynccontextmanager
async def running(task: Awaitable[None]) -> AsyncIterator[asyncio.Task[None]]:
    """``task`` runs for the block, then is cancelled and awaited (a failure is raised)."""
    started = asyncio.ensure_future(task)
    try:
        yield started
    finally:
        started.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(started, WAIT_S)


# --- the plugin switch, with the real plugin and registration ------------------------------------


def a_switch(node: Node, *, gone_s: float = 0.05) -> PluginSwitch:
    return PluginSwitch(
        "auto", registry=node.registry, drivers=[NVIDIA], poll_s=0.02, gone_s=gone_s
    )


def a_plugin(node: Node) -> Plugins:
    gpus = [Gpu(index=i, uuid=f"GPU-{i}") for i in range(8)]
    servicer = DevicePluginServicer(GpuAllocator(StaticDevices(gpus, QUADS)), MemoryLedger(()))
    return [(servicer, quick_endpoint(node.plugins))]


async def reads_pass(switch: PluginSwitch, count: int = READS) -> None:
    """Until the switch has read the registry ``count`` more times."""
    target = switch.reads + count
    await until(lambda: switch.reads >= target, message="the switch stopped reading")


def test_a_driver_registered_at_start_keeps_the_plugin_from_registering(node: Node) -> None:
    async def scenario() -> None:
        node.driver_registers()
        switch, plugins = a_switch(node), a_plugin(node)
        endpoint = plugins[0][1]
        async with kubelet(node), running(switch.run(plugins)):
            await reads_pass(switch)
            assert switch.decision is not None
            assert not switch.decision.register
            assert node.kubelet.requests == []
            assert not endpoint.socket.exists()
            # The driver uninstalled: the plugin registers, once the grace is out.
            node.driver_goes()
            request = await node.kubelet.registered()
            assert request.resource_name == "nvidia.com/gpu"
            assert endpoint.socket.exists()

    run(scenario)


def test_a_driver_that_registers_later_stops_the_plugin_and_one_that_goes_restarts_it(
    node: Node, caplog: pytest.LogCaptureFixture
) -> None:
    async def scenario() -> None:
        switch, plugins = a_switch(node), a_plugin(node)
        endpoint = plugins[0][1]
        with caplog.at_level("INFO", logger="schedext.agent"):
            async with kubelet(node), running(switch.run(plugins)):
                await node.kubelet.registered()
                async with grpc.aio.insecure_channel(f"unix://{endpoint.socket}") as channel:
                    stream = api_pb2_grpc.DevicePluginStub(channel).ListAndWatch(api_pb2.Empty())
                    first = await asyncio.wait_for(stream.read(), WAIT_S)
                    assert isinstance(first, api_pb2.ListAndWatchResponse)
                    assert len(first.devices) == 8
                    # The DRA driver is installed: the kubelet's stream ends (its device
                    # manager then marks the resource's devices unhealthy), and the socket
                    # goes.
                    node.driver_registers()
                    assert await stream_ends(stream)
                await until(lambda: not endpoint.socket.exists(), message="the socket stayed")
                assert len(node.kubelet.requests) == 1
                # The driver removed: registered again, on a fresh socket.
                node.driver_goes()
                await node.kubelet.registered(2)
                assert endpoint.socket.exists()
        lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("device")]
        assert lines == [
            "device plugin on: no DRA GPU driver is registered with the kubelet",
            "device plugin off: DRA driver gpu.nvidia.com is registered with the kubelet "
            f"({node.registry.name}/{NVIDIA}-reg.sock)",
            "device plugin on: no DRA GPU driver is registered with the kubelet",
        ]

    run(scenario)


async def stream_ends(stream: Any) -> bool:
    """Whether ListAndWatch ends (an end or an error, as the kubelet's client sees it)."""
    try:
        async with asyncio.timeout(WAIT_S):
            while await stream.read() is not grpc.aio.EOF:
                pass
    except grpc.aio.AioRpcError:
        pass
    return True


def test_a_driver_restarting_within_the_grace_never_lets_the_plugin_in(node: Node) -> None:
    async def scenario() -> None:
        node.driver_registers()
        switch = a_switch(node, gone_s=60.0)
        async with kubelet(node), running(switch.run(a_plugin(node))):
            await reads_pass(switch)
            node.driver_goes()  # its pod restarts ...
            await reads_pass(switch)
            node.driver_registers()  # ... and is back
            await reads_pass(switch)
            assert node.kubelet.requests == []

    run(scenario)


# --- the whole agent: what it publishes in every mode ---------------------------------------------


class NodeApi:
    """The API server as the agent uses it: its Node (annotations and status as patched), no
    pods on it (a watch that stays quiet), and events taken."""

    def __init__(self) -> None:
        self.annotations: dict[str, str] = {}
        self.capacity: dict[str, str] = {}

    def api(self) -> KubeApi:
        config = ClusterConfig(server="https://api.test", ssl_context=False, token="t0ken")
        return KubeApi(config, transport=HandlerTransport(self.handle))

    def node(self) -> dict[str, Any]:
        status = {"capacity": self.capacity, "allocatable": self.capacity}
        return {"metadata": {"name": NODE, "annotations": self.annotations}, "status": status}

    def handle(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path in (f"/api/v1/nodes/{NODE}", f"/api/v1/nodes/{NODE}/status"):
            return self._node(request)
        if path == "/api/v1/pods":
            watch = request.url.params.get("watch") == "1"
            return httpx.Response(200, stream=_Quiet()) if watch else page([], "1")
        if request.method == "POST" and path.endswith("/events"):
            return httpx.Response(201, json={})
        return httpx.Response(404, json={"kind": "Status", "code": 404, "reason": "NotFound"})

    def _node(self, request: httpx.Request) -> httpx.Response:
        if request.method == "PATCH":
            body = json.loads(request.content)
            if request.url.path.endswith("/status"):
                self.capacity.update(body["status"]["capacity"])
            else:
                self.annotations.update(body["metadata"]["annotations"])
        return httpx.Response(200, json=self.node())

    def topology_unhealthy(self) -> list[int]:
        raw = self.annotations.get(names.GPU_TOPOLOGY)
        if raw is None:
            return []
        return [i for i, _ in decode_topology(raw, 8).unhealthy()]


class _Quiet(httpx.AsyncByteStream):
    async def __aiter__(self) -> AsyncIterator[bytes]:
        await asyncio.Event().wait()
        yield b""  # never reached


def agent_settings(node: Node, mode: DevicePluginMode) -> AgentSettings:
    return AgentSettings(
        node_name=NODE,
        device_plugin=mode,
        device_plugin_dir=node.plugins,
        plugins_registry_dir=node.registry,
        dra_poll_s=0.02,
        dra_gone_s=0.05,
        poll_s=0.05,
        use_interval_s=0.05,
        use_threshold=1,
        use_refresh_s=0.05,
        reconcile=False,
    )


@pytest.mark.parametrize(
    ("mode", "driver", "serves"),
    [("on", True, True), ("off", False, False), ("auto", True, False), ("auto", False, True)],
    ids=["on, beside a DRA driver", "off", "auto on a DRA node", "auto, no DRA driver"],
)
def test_the_agent_publishes_topology_health_and_use_in_every_mode(
    node: Node, mode: DevicePluginMode, driver: bool, serves: bool
) -> None:
    async def scenario() -> None:
        if driver:
            node.driver_registers()
        api, nvml = NodeApi(), ReplayBackend(RECORDING)
        agent = Agent(agent_settings(node, mode), nvml, api.api())
        async with kubelet(node), running(agent.run()):
            await until(agent.ready, message="the agent never got ready")
            topology = decode_topology(api.annotations[names.GPU_TOPOLOGY], 8)
            assert topology.groups == QUADS
            assert all(g.uuid.startswith("GPU-") for g in topology.gpus)
            # Health: an XID reaches the Node whether the plugin serves or not.
            nvml.queue_xid(3, 79)
            await until(lambda: api.topology_unhealthy() == [3], message="no XID published")
            # Live use, likewise.
            nvml.set_use(5, 97, 4096)
            await until(lambda: (5, 97) in used(api), message="live use never reached the Node")
            gpu, shares = agent.endpoint.socket, agent.settings.share_socket_name
            memory = api.capacity.get(names.SHARE_MEMORY_RESOURCE)
            if serves:
                await node.kubelet.registered(2)  # the whole GPUs and the share handle
                assert gpu.exists()
                assert (node.plugins / shares).exists()
                assert memory not in (None, "0")
            else:
                assert node.kubelet.requests == []
                assert not gpu.exists()
                assert memory == "0"  # no share can be given without the handle's plugin
            decision = agent.switch.decision
            assert decision is not None
            assert decision.register == serves
        nvml.close()

    run(scenario)


def used(api: NodeApi) -> list[tuple[int, int]]:
    raw = api.annotations.get(names.GPU_USE)
    if raw is None:
        return []
    return [(u.index, u.utilisation) for u in decode_use(raw, 8).gpus]


def test_the_agent_hands_a_node_back_to_its_plugins_when_the_driver_goes(node: Node) -> None:
    async def scenario() -> None:
        node.driver_registers()
        api, nvml = NodeApi(), ReplayBackend(RECORDING)
        agent = Agent(agent_settings(node, "auto"), nvml, api.api())
        async with kubelet(node), running(agent.run()):
            await until(agent.ready, message="the agent never got ready")
            assert api.capacity.get(names.SHARE_MEMORY_RESOURCE) == "0"
            node.driver_goes()
            await node.kubelet.registered(2)
            await until(
                lambda: api.capacity.get(names.SHARE_MEMORY_RESOURCE) not in (None, "0"),
                message="share capacity never came back",
            )
            await until(agent.ready, message="not ready once the plugins serve")
        nvml.close()

    run(scenario)
