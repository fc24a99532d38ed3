"""The share handle's device plugin over real gRPC on real unix sockets, beside the whole-GPU
plugin: the test plays the kubelet (a real ``Registration`` server, and the device manager's
calls on each plugin's socket)."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TypeVar

import grpc
import pytest

from app.agent.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc
from app.agent.gpu_allocator import GpuAllocator
from app.agent.memory import MemoryLedger, StaticDevices
from app.agent.mps import MpsLayout
from app.agent.registration import Endpoint, serve
from app.agent.servicer import DevicePluginServicer
from app.agent.share_allocator import ShareAllocator
from extender import names
from extender.devices.allocation import NodePod
from extender.devices.gpus import Gpu, GpuHealth
from extender.devices.share_handle import ShareHandle
from testbed.kubelet import WAIT_S, FakeKubelet, quick_endpoint

T = TypeVar("T")
SLOTS = 4
HANDLE = ShareHandle(names.SHARE_COUNT_RESOURCE, None, SLOTS)
SICK = GpuHealth(healthy=False, reason="XID 79: GPU fell off the bus")
MPS_BASE = Path("/run/schedext/mps")


def uuid(index: int) -> str:
    return f"GPU-{index:08d}-0000-0000-0000-000000000000"


def slot(index: int, k: int = 0) -> str:
    return f"{uuid(index)}::{k}"


def node_gpus() -> list[Gpu]:
    # GPU 3 is in MIG mode: its slices are offered apart, never as shares.
    return [
        Gpu(index=i, uuid=uuid(i), memory_mib=81559, numa_node=i // 2, mig_enabled=i == 3)
        for i in range(4)
    ]


def share(
    name: str,
    ids: Sequence[int] | None,
    *,
    at: float,
    memory: int = 10240,
    cores: int = 0,
    allocated: Sequence[int] = (),
) -> NodePod:
    return NodePod(
        uid=f"uid-{name}",
        namespace="ml",
        name=name,
        gpus=0,
        gpu_ids=None if ids is None else tuple(ids),
        gpu_uuids=None if ids is None else tuple(uuid(i) for i in ids),
        allocated=tuple(uuid(i) for i in allocated),
        bound_at=at,
        shares=len(ids) if ids else 1,
        share_memory_mib=memory,
        share_cores=cores,
    )


class Harness:
    """Both plugins on one temporary device-plugin directory, one ledger, one GPU list."""

    def __init__(self, directory: Path, ledger: MemoryLedger, mps: MpsLayout | None) -> None:
        self.devices = StaticDevices(node_gpus(), ((0, 1), (2, 3)))
        self.ledger = ledger
        self.kubelet = FakeKubelet(directory)
        self.whole = quick_endpoint(directory)
        self.shares = replace(
            self.whole, socket_name="schedext-gpu-shares.sock", resource_name=HANDLE.resource
        )
        self.whole_plugin = DevicePluginServicer(GpuAllocator(self.devices), ledger, wait_s=0.2)
        self.share_plugin = DevicePluginServicer(
            ShareAllocator(self.devices, HANDLE, mps=mps), ledger, wait_s=0.5
        )

    @contextlib.asynccontextmanager
    async def stub(self, endpoint: Endpoint) -> AsyncIterator[api_pb2_grpc.DevicePluginStub]:
        async with grpc.aio.insecure_channel(f"unix://{endpoint.socket}") as channel:
            yield api_pb2_grpc.DevicePluginStub(channel)

    async def allocate(self, *device_ids: str) -> api_pb2.ContainerAllocateResponse:
        async with self.stub(self.shares) as stub:
            answer = await stub.Allocate(
                api_pb2.AllocateRequest(
                    container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=device_ids)]
                ),
                timeout=WAIT_S,
            )
        (container,) = answer.container_responses
        return container


@pytest.fixture
def directory() -> Iterator[Path]:
    # Short: a unix socket's path must fit in 108 bytes, which pytest's tmp_path may not.
    path = Path(tempfile.mkdtemp(prefix="sp-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def run(
    directory: Path,
    scenario: Callable[[Harness], Awaitable[T]],
    *,
    pods: Sequence[NodePod] = (),
    mps: MpsLayout | None = None,
) -> T:
    """Serve both plugins, wait for both registrations, play ``scenario``."""

    async def main() -> T:
        harness = Harness(directory, MemoryLedger(pods), mps)
        await harness.kubelet.start()
        tasks = [
            asyncio.create_task(serve(harness.whole_plugin, harness.whole)),
            asyncio.create_task(serve(harness.share_plugin, harness.shares)),
        ]
        try:
            await harness.kubelet.registered(2)
            return await scenario(harness)
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.wait_for(task, WAIT_S)
            await harness.kubelet.stop()

    return asyncio.run(asyncio.wait_for(main(), 30))


def test_registers_the_handle_and_lists_slots_that_follow_their_gpu(directory: Path) -> None:
    async def scenario(h: Harness) -> None:
        registered = {r.resource_name: r.endpoint for r in h.kubelet.requests}
        assert registered == {
            "nvidia.com/gpu": "schedext-gpu.sock",
            "schedext.io/gpu-shares": "schedext-gpu-shares.sock",
        }
        async with h.stub(h.shares) as stub:
            stream = stub.ListAndWatch(api_pb2.Empty())
            first = await asyncio.wait_for(stream.read(), WAIT_S)
            h.devices.set_health(1, SICK)
            update = await asyncio.wait_for(stream.read(), WAIT_S)
            stream.cancel()
        assert isinstance(first, api_pb2.ListAndWatchResponse)
        assert isinstance(update, api_pb2.ListAndWatchResponse)
        # Three GPUs (not the MIG one) of four slots each, on their GPU's NUMA node.
        assert [d.ID for d in first.devices] == [slot(g, k) for g in range(3) for k in range(4)]
        assert {d.health for d in first.devices} == {"Healthy"}
        assert [d.topology.nodes[0].ID for d in first.devices] == [0] * 8 + [1] * 4
        health = {d.ID: d.health for d in update.devices}
        assert [i for i, state in health.items() if state == "Unhealthy"] == [
            slot(1, k) for k in range(4)
        ]

    run(directory, scenario)


def test_a_share_gets_schedexts_gpu_and_its_limits_and_is_recorded(directory: Path) -> None:
    pods = [share("b", [2], at=2, memory=4096), share("a", [0], at=1, memory=20480, cores=30)]

    async def scenario(h: Harness) -> None:
        async with h.stub(h.shares) as stub:
            hint = await stub.GetPreferredAllocation(
                api_pb2.PreferredAllocationRequest(
                    container_requests=[
                        api_pb2.ContainerPreferredAllocationRequest(
                            available_deviceIDs=[slot(g, k) for g in range(3) for k in range(4)],
                            allocation_size=1,
                        )
                    ]
                ),
                timeout=WAIT_S,
            )
        assert list(hint.container_responses[0].deviceIDs) == [slot(0)]  # a, bound first
        first = await h.allocate(slot(1, 3))  # the kubelet's own pick, elsewhere
        assert dict(first.envs) == {
            "NVIDIA_VISIBLE_DEVICES": uuid(0),
            "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=20480M",
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "30",
        }
        assert [d.host_path for d in first.devices] == [
            "/dev/nvidia0",
            "/dev/nvidiactl",
            "/dev/nvidia-uvm",
            "/dev/nvidia-uvm-tools",
        ]
        assert list(first.mounts) == []  # no MPS: nothing to mount
        assert dict(first.annotations) == {"schedext.io/gpu-allocated": uuid(0)}
        second = await h.allocate(slot(1, 3))
        assert dict(second.envs) == {
            "NVIDIA_VISIBLE_DEVICES": uuid(2),
            "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=4096M",
        }
        assert {p.name: p.allocated for p in h.ledger.pods()} == {
            "a": (uuid(0),),
            "b": (uuid(2),),
        }

    run(directory, scenario, pods=pods)


def test_under_mps_the_container_gets_its_gpus_pipes(directory: Path) -> None:
    layout = MpsLayout(MPS_BASE)

    async def scenario(h: Harness) -> None:
        answer = await h.allocate(slot(0))
        assert answer.envs["CUDA_MPS_PIPE_DIRECTORY"] == "/tmp/nvidia-mps"
        assert answer.envs["NVIDIA_VISIBLE_DEVICES"] == uuid(1)
        assert [(m.container_path, m.host_path, m.read_only) for m in answer.mounts] == [
            ("/tmp/nvidia-mps", f"/run/schedext/mps/{uuid(1)}/pipe", False),
            ("/dev/shm", "/run/schedext/mps/shm", False),
        ]
        # A share of two GPUs in one container cannot reach two daemons: refused, not guessed.
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await h.allocate(slot(0), slot(0, 1))
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "ml/pair asks for shares of 2 GPUs in one container" in str(refused.value.details())

    run(directory, scenario, pods=[share("a", [1], at=1), share("pair", [0, 2], at=2)], mps=layout)


def test_a_share_schedext_did_not_place_is_refused_by_name(directory: Path) -> None:
    async def scenario(h: Harness) -> None:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await h.allocate(slot(0))
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert str(refused.value.details()).startswith(
            "pod ml/stray asks for a GPU share but schedext did not place it"
        )
        assert h.ledger.pods()[0].allocated == ()

    run(directory, scenario, pods=[share("stray", None, at=1)])


def test_the_plugin_waits_for_the_pod_watch_then_refuses(directory: Path) -> None:
    async def scenario(h: Harness) -> None:
        late = share("late", [2], at=1)
        allocation = asyncio.create_task(h.allocate(slot(0)))
        async with asyncio.timeout(WAIT_S):  # the plugin holds its lock while it waits
            while not h.share_plugin._lock.locked():
                await asyncio.sleep(0.005)
        h.ledger.add(late)  # the pod watch catches up
        answer = await allocation
        assert answer.envs["NVIDIA_VISIBLE_DEVICES"] == uuid(2)
        # Nobody else waits: refused once wait_s has passed, with what was asked.
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await h.allocate(slot(0))
        assert str(refused.value.details()).startswith(
            "no GPU share on this node awaits 1 schedext.io/gpu-shares"
        )

    run(directory, scenario)


def test_an_unhealthy_chosen_gpu_and_a_failed_record_refuse(directory: Path) -> None:
    async def scenario(h: Harness) -> None:
        h.devices.set_health(0, SICK)
        with pytest.raises(grpc.aio.AioRpcError, match="unhealthy"):
            await h.allocate(slot(1))
        h.devices.set_health(0, GpuHealth())
        h.ledger.fail_next = True
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            await h.allocate(slot(1))
        assert failed.value.code() == grpc.StatusCode.UNAVAILABLE
        assert await h.allocate(slot(1))  # the kubelet's retry

    run(directory, scenario, pods=[share("a", [0], at=1)])


def test_whole_gpus_beside_shares_keep_their_rules(directory: Path) -> None:
    # GPU 0 carries a share: the agent's own pick for a whole-GPU pod schedext did not bind
    # takes the NVLink pair without it (2-3), not 0-1.
    whole = NodePod(uid="uid-w", namespace="ml", name="w", gpus=2, bound_at=2)
    pods = [share("a", [0], at=1, allocated=[0]), whole]

    async def scenario(h: Harness) -> None:
        async with h.stub(h.whole) as stub:
            answer = await stub.Allocate(
                api_pb2.AllocateRequest(
                    container_requests=[
                        api_pb2.ContainerAllocateRequest(devices_ids=[uuid(0), uuid(1)])
                    ]
                ),
                timeout=WAIT_S,
            )
        (container,) = answer.container_responses
        assert container.envs["NVIDIA_VISIBLE_DEVICES"] == f"{uuid(2)},{uuid(3)}"
        assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT" not in container.envs
        recorded = h.ledger.get("uid-w")
        assert recorded is not None
        assert recorded.allocated == (uuid(2), uuid(3))

    run(directory, scenario, pods=pods)
