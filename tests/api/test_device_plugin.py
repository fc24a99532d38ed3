"""The device plugin and its registration over real gRPC on real unix sockets: the test plays
the kubelet, with a real ``Registration`` server on ``kubelet.sock`` and calls to the plugin's
socket the way the kubelet's device manager makes them."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import socket
import stat
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import TypeVar

import grpc
import pytest

from app.agent.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc
from app.agent.gpu_allocator import GpuAllocator
from app.agent.memory import MemoryLedger, StaticDevices
from app.agent.registration import serve
from app.agent.servicer import DevicePluginServicer
from extender.devices.allocation import NodePod
from extender.devices.gpus import Gpu, GpuHealth
from testbed.kubelet import WAIT_S, FakeKubelet, quick_endpoint

T = TypeVar("T")
PAIRS = ((0, 1), (2, 3), (4, 5), (6, 7))
SICK = GpuHealth(healthy=False, reason="XID 79: GPU fell off the bus")


def uuid(index: int) -> str:
    return f"GPU-{index:08d}-0000-0000-0000-000000000000"


def node_gpus() -> list[Gpu]:
    return [Gpu(index=i, uuid=uuid(i), numa_node=i // 4) for i in range(8)]


def bound(name: str, ids: Sequence[int], *, at: float, allocated: Sequence[int] = ()) -> NodePod:
    return NodePod(
        uid=f"uid-{name}",
        namespace="ml",
        name=name,
        gpus=len(ids),
        gpu_ids=tuple(ids),
        gpu_uuids=tuple(uuid(i) for i in ids),
        allocated=tuple(uuid(i) for i in allocated),
        bound_at=at,
    )


def unbound(name: str, gpus: int, *, at: float) -> NodePod:
    return NodePod(uid=f"uid-{name}", namespace="ml", name=name, gpus=gpus, bound_at=at)


class Harness:
    """A plugin served on a temporary device-plugin directory, and the kubelet's client."""

    def __init__(self, directory: Path, devices: StaticDevices, ledger: MemoryLedger) -> None:
        self.directory = directory
        self.devices = devices
        self.ledger = ledger
        self.kubelet = FakeKubelet(directory)
        self.endpoint = quick_endpoint(directory)
        self.plugin = DevicePluginServicer(GpuAllocator(devices), ledger, wait_s=0.2)

    @contextlib.asynccontextmanager
    async def stub(self) -> AsyncIterator[api_pb2_grpc.DevicePluginStub]:
        async with grpc.aio.insecure_channel(f"unix://{self.endpoint.socket}") as channel:
            yield api_pb2_grpc.DevicePluginStub(channel)

    async def allocate(self, *requested: int) -> tuple[str, ...]:
        async with self.stub() as stub:
            answer = await stub.Allocate(
                api_pb2.AllocateRequest(
                    container_requests=[
                        api_pb2.ContainerAllocateRequest(devices_ids=[uuid(i) for i in requested])
                    ]
                ),
                timeout=WAIT_S,
            )
        (container,) = answer.container_responses
        return tuple(container.envs["NVIDIA_VISIBLE_DEVICES"].split(","))


@pytest.fixture
def directory() -> Iterator[Path]:
    # Short: a unix socket's path must fit in 108 bytes, which pytest's tmp_path may not.
    path = Path(tempfile.mkdtemp(prefix="dp-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def run(
    directory: Path,
    scenario: Callable[[Harness], Awaitable[T]],
    *,
    pods: Sequence[NodePod] = (),
    kubelet_first: bool = True,
) -> T:
    """Serve a plugin over node_gpus() and ``pods``, register it, play ``scenario``."""

    async def main() -> T:
        harness = Harness(directory, StaticDevices(node_gpus(), PAIRS), MemoryLedger(pods))
        if kubelet_first:
            await harness.kubelet.start()
        task = asyncio.create_task(serve(harness.plugin, harness.endpoint))
        try:
            if kubelet_first:
                await harness.kubelet.registered()
            return await scenario(harness)
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait_for(task, WAIT_S)
            await harness.kubelet.stop()

    return asyncio.run(asyncio.wait_for(main(), 30))


def ids(*indices: int) -> tuple[str, ...]:
    return tuple(uuid(i) for i in indices)


def test_registers_and_lists_every_gpu_healthy(directory: Path) -> None:
    async def scenario(h: Harness) -> None:
        request = h.kubelet.requests[0]
        assert request.version == "v1beta1"
        assert request.endpoint == "schedext-gpu.sock"
        assert request.resource_name == "nvidia.com/gpu"
        assert request.options.get_preferred_allocation_available
        assert stat.S_IMODE(h.endpoint.socket.stat().st_mode) == 0o600
        async with h.stub() as stub:
            options = await stub.GetDevicePluginOptions(api_pb2.Empty(), timeout=WAIT_S)
            assert options.get_preferred_allocation_available
            assert not options.pre_start_required
            stream = stub.ListAndWatch(api_pb2.Empty())
            first = await asyncio.wait_for(stream.read(), WAIT_S)
            stream.cancel()
            assert isinstance(first, api_pb2.ListAndWatchResponse)
            assert [(d.ID, d.health) for d in first.devices] == [
                (uuid(i), "Healthy") for i in range(8)
            ]
            assert [d.topology.nodes[0].ID for d in first.devices] == [0] * 4 + [1] * 4
            started = await stub.PreStartContainer(
                api_pb2.PreStartContainerRequest(devices_ids=ids(0)), timeout=WAIT_S
            )
            assert started == api_pb2.PreStartContainerResponse()

    run(directory, scenario)


def test_a_bound_pod_gets_exactly_its_nvlink_pair(directory: Path) -> None:
    async def scenario(h: Harness) -> None:
        async with h.stub() as stub:
            hint = await stub.GetPreferredAllocation(
                api_pb2.PreferredAllocationRequest(
                    container_requests=[
                        api_pb2.ContainerPreferredAllocationRequest(
                            available_deviceIDs=ids(*range(8)), allocation_size=2
                        )
                    ]
                ),
                timeout=WAIT_S,
            )
            assert tuple(hint.container_responses[0].deviceIDs) == ids(4, 5)
            answer = await stub.Allocate(
                api_pb2.AllocateRequest(
                    container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=ids(0, 1))]
                ),
                timeout=WAIT_S,
            )
        (container,) = answer.container_responses
        assert container.envs["NVIDIA_VISIBLE_DEVICES"] == ",".join(ids(4, 5))
        assert [(d.host_path, d.permissions) for d in container.devices] == [
            ("/dev/nvidia4", "rw"),
            ("/dev/nvidia5", "rw"),
            ("/dev/nvidiactl", "rw"),
            ("/dev/nvidia-uvm", "rw"),
            ("/dev/nvidia-uvm-tools", "rw"),
        ]
        pod = h.ledger.get("uid-a")
        assert pod is not None
        assert pod.allocated == ids(4, 5)

    run(directory, scenario, pods=[bound("a", [4, 5], at=1)])


def test_pods_bound_together_get_disjoint_gpus_in_bind_order(directory: Path) -> None:
    pods = [bound("b", [2, 3], at=2), bound("a", [0, 1], at=1), bound("c", [6, 7], at=3)]

    async def scenario(h: Harness) -> None:
        assert await h.allocate(6, 7) == ids(0, 1)  # a was bound first
        # b and c at once: the lock serializes them, so each gets its own pair.
        both = await asyncio.gather(h.allocate(0, 1), h.allocate(0, 1))
        assert sorted(both) == [ids(2, 3), ids(6, 7)]
        assert [p.allocated for p in sorted(h.ledger.pods(), key=lambda p: p.name)] == [
            ids(0, 1),
            ids(2, 3),
            ids(6, 7),
        ]

    run(directory, scenario, pods=pods)


def test_an_unbound_pod_gets_a_free_nvlink_pair(directory: Path) -> None:
    pods = [
        bound("done", [0, 1], at=1, allocated=[0, 1]),
        bound("pending", [2, 3, 4], at=2),
        unbound("other", 2, at=3),
    ]

    async def scenario(h: Harness) -> None:
        # 5, 6, 7 are free: the pair 6-7, not 5 and 6 across a link.
        assert await h.allocate(0, 1) == ids(6, 7)
        assert await h.allocate(0, 1, 2) == ids(2, 3, 4)  # the pending pod still gets its own

    run(directory, scenario, pods=pods)


def test_an_unhealthy_gpu_is_streamed_and_never_handed_out(directory: Path) -> None:
    pods = [bound("a", [4, 5], at=1), unbound("u", 2, at=2)]

    async def scenario(h: Harness) -> None:
        async with h.stub() as stub:
            stream = stub.ListAndWatch(api_pb2.Empty())
            await asyncio.wait_for(stream.read(), WAIT_S)
            h.devices.set_health(5, SICK)
            update = await asyncio.wait_for(stream.read(), WAIT_S)
            stream.cancel()
        assert isinstance(update, api_pb2.ListAndWatchResponse)
        assert {d.ID: d.health for d in update.devices}[uuid(5)] == "Unhealthy"
        assert sum(d.health == "Healthy" for d in update.devices) == 7
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await h.allocate(4, 5)
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "ml/a" in str(refused.value.details())
        assert "unhealthy" in str(refused.value.details())
        # The kubelet naming the sick GPU itself for a pod nobody saw: refused as well.
        with pytest.raises(grpc.aio.AioRpcError, match="not all healthy"):
            await h.allocate(5, 6, 7)

    run(directory, scenario, pods=pods)


def test_a_restarted_plugin_never_allocates_twice(directory: Path) -> None:
    pods = [bound("a", [0, 1], at=1, allocated=[0, 1]), unbound("u", 2, at=2)]

    async def scenario(h: Harness) -> None:
        # The kubelet retrying a's devices after our restart: a is done, u gets its own pair.
        assert await h.allocate(0, 1) == ids(2, 3)
        # Now nobody waits for two: the named GPUs are a's, so no fallback either.
        with pytest.raises(grpc.aio.AioRpcError, match="no pod on this node awaits 2 GPUs"):
            await h.allocate(0, 1)

    run(directory, scenario, pods=pods)


def test_a_failed_record_fails_the_allocation(directory: Path) -> None:
    async def scenario(h: Harness) -> None:
        h.ledger.fail_next = True
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            await h.allocate(4, 5)
        assert failed.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "could not record GPUs on pod ml/a" in str(failed.value.details())
        pod = h.ledger.get("uid-a")
        assert pod is not None
        assert pod.allocated == ()
        assert await h.allocate(4, 5) == ids(4, 5)  # the kubelet's retry

    run(directory, scenario, pods=[bound("a", [4, 5], at=1)])


def test_a_size_nobody_needs_is_refused_clearly(directory: Path) -> None:
    async def scenario(h: Harness) -> None:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await h.allocate(0, 1, 2)
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert str(refused.value.details()) == (
            f"no pod on this node awaits 3 GPUs, and the requested devices "
            f"{list(ids(0, 1, 2))} are not all healthy and free"
        )

    run(directory, scenario, pods=[bound("a", [0, 1], at=1)])


class LaggingLedger(MemoryLedger):
    """A pod watch that shows ``late`` only after the plugin first looked, as when the kubelet
    admits a pod a moment before the agent's watch shows it bound."""

    def __init__(self, late: NodePod, pods: Sequence[NodePod]) -> None:
        super().__init__(pods)
        self._late: NodePod | None = late

    def pods(self) -> Sequence[NodePod]:
        seen = super().pods()
        if self._late is not None:
            self.add(self._late)
            self._late = None
        return seen


def test_an_allocate_before_the_watch_shows_the_pod_waits_for_it(directory: Path) -> None:
    """Without the wait, the kubelet's own pick (GPUs 0 and 1, free) would be given to a pod
    schedext bound to GPUs 4 and 5, and recorded nowhere."""
    late = bound("late", [4, 5], at=2)

    async def main() -> None:
        harness = Harness(directory, StaticDevices(node_gpus(), PAIRS), LaggingLedger(late, []))
        harness.plugin = DevicePluginServicer(
            GpuAllocator(harness.devices), harness.ledger, wait_s=WAIT_S
        )
        await harness.kubelet.start()
        task = asyncio.create_task(serve(harness.plugin, harness.endpoint))
        try:
            await harness.kubelet.registered()
            assert await harness.allocate(0, 1) == ids(4, 5)
            held = harness.ledger.get("uid-late")
            assert held is not None
            assert held.allocated == ids(4, 5)
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait_for(task, WAIT_S)
            await harness.kubelet.stop()

    asyncio.run(asyncio.wait_for(main(), 30))


def test_registers_again_when_the_kubelet_restarts(directory: Path) -> None:
    async def scenario(h: Harness) -> None:
        await h.kubelet.stop()
        for path in directory.iterdir():  # what a starting kubelet does to the directory
            path.unlink()
        h.kubelet = FakeKubelet(directory)
        await h.kubelet.start()
        request = await h.kubelet.registered()
        assert request.endpoint == "schedext-gpu.sock"
        assert await h.allocate(0) == ids(0)  # served on the new socket

    run(directory, scenario, pods=[bound("a", [0], at=1)])


def test_registers_once_the_kubelet_appears(
    directory: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # A dead kubelet's socket file: connecting fails until a live kubelet replaces it.
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(directory / "kubelet.sock"))
    stale.close()

    async def scenario(h: Harness) -> None:
        async with asyncio.timeout(WAIT_S):
            while sum(r.message == "kubelet registration failed" for r in caplog.records) < 2:
                await asyncio.sleep(0.01)
        assert h.kubelet.requests == []
        h.kubelet.socket.unlink()
        await h.kubelet.start()
        request = await h.kubelet.registered()
        assert request.resource_name == "nvidia.com/gpu"

    run(directory, scenario, kubelet_first=False)


def test_registers_again_when_only_the_kubelet_socket_is_new(directory: Path) -> None:
    async def scenario(h: Harness) -> None:
        # A kubelet that restarted without sweeping the directory: its socket is a new file.
        # Moved aside, not deleted (gRPC's stop would), so that the new socket cannot reuse its
        # inode number within the clock tick that stamps change times (the plugin checks both).
        h.kubelet.socket.rename(directory / "old-kubelet.sock")
        await h.kubelet.stop()
        h.kubelet = FakeKubelet(directory)
        await h.kubelet.start()
        await h.kubelet.registered()
        assert h.endpoint.socket.exists()

    run(directory, scenario)
