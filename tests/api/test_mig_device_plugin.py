"""MIG device plugins over real gRPC on real unix sockets: the node of the MIG fixture (GPU 0
in MIG mode with 1g.10gb x3 and 2g.20gb, GPU 1 whole), read by the agent's NVML reader from
the replay, served as the agent serves it: the whole-GPU plugin and one plugin per profile,
each registered with a real ``Registration`` server and called as the kubelet's device
manager calls them."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import TypeVar

import grpc
import pytest

from app.agent.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc
from app.agent.discovery import read_node
from app.agent.gpu_allocator import GpuAllocator, WholeGpus
from app.agent.memory import MemoryLedger, StaticDevices
from app.agent.mig_allocator import mig_allocators, mig_endpoint, read_mig_minors
from app.agent.registration import serve
from app.agent.replay import ReplayBackend
from app.agent.servicer import DevicePluginServicer
from extender.devices.allocation import NodePod
from extender.devices.gpus import GpuHealth
from testbed.kubelet import WAIT_S, FakeKubelet, quick_endpoint
from tests.nvml_builders import H100_MIG, MIG_MINORS, mig_uuid

T = TypeVar("T")
P1, P2 = "1g.10gb", "2g.20gb"
M = [mig_uuid(0, i) for i in range(4)]  # 1g.10gb x3, then 2g.20gb
WHOLE = "GPU-5e1ec7ed-0000-4000-8000-000000000001"  # GPU 1


def mig_bound(
    name: str, mig: dict[str, int], chosen: Sequence[str] | None, *, at: float
) -> NodePod:
    return NodePod(
        uid=f"uid-{name}",
        namespace="ml",
        name=name,
        gpus=0,
        bound_at=at,
        mig=tuple(sorted(mig.items())),
        mig_uuids=tuple(chosen) if chosen is not None else None,
    )


class Node:
    """The fixture node's plugins on a temporary device-plugin directory, and the kubelet."""

    def __init__(self, directory: Path, pods: Sequence[NodePod]) -> None:
        _, gpus = read_node(ReplayBackend(H100_MIG))
        self.devices = StaticDevices(gpus)
        self.ledger = MemoryLedger(pods)
        self.kubelet = FakeKubelet(directory)
        self.endpoint = quick_endpoint(directory)
        self.servers = [
            (
                DevicePluginServicer(
                    GpuAllocator(WholeGpus(self.devices)), self.ledger, wait_s=0.2
                ),
                self.endpoint,
            ),
            *(
                (
                    DevicePluginServicer(m, self.ledger, wait_s=0.2),
                    mig_endpoint(self.endpoint, m.profile),
                )
                for m in mig_allocators(self.devices, caps=read_mig_minors(MIG_MINORS))
            ),
        ]

    def socket(self, resource: str) -> Path:
        return next(e.socket for _, e in self.servers if e.resource_name == resource)

    @contextlib.asynccontextmanager
    async def stub(self, resource: str) -> AsyncIterator[api_pb2_grpc.DevicePluginStub]:
        async with grpc.aio.insecure_channel(f"unix://{self.socket(resource)}") as channel:
            yield api_pb2_grpc.DevicePluginStub(channel)

    async def listed(self, resource: str) -> dict[str, str]:
        async with self.stub(resource) as stub:
            stream = stub.ListAndWatch(api_pb2.Empty())
            first = await asyncio.wait_for(stream.read(), WAIT_S)
            stream.cancel()
        assert isinstance(first, api_pb2.ListAndWatchResponse)
        return {d.ID: d.health for d in first.devices}

    async def allocate(self, resource: str, *requested: str) -> api_pb2.ContainerAllocateResponse:
        async with self.stub(resource) as stub:
            answer = await stub.Allocate(
                api_pb2.AllocateRequest(
                    container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=requested)]
                ),
                timeout=WAIT_S,
            )
        (container,) = answer.container_responses
        return container


@pytest.fixture
def directory() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="mig-"))  # short: a socket path fits in 108 bytes
    yield path
    shutil.rmtree(path, ignore_errors=True)


def run(
    directory: Path, scenario: Callable[[Node], Awaitable[T]], pods: Sequence[NodePod] = ()
) -> T:
    async def main() -> T:
        node = Node(directory, pods)
        await node.kubelet.start()
        tasks = [asyncio.create_task(serve(plugin, e)) for plugin, e in node.servers]
        try:
            await node.kubelet.registered(len(tasks))
            return await scenario(node)
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.wait_for(task, WAIT_S)
            await node.kubelet.stop()

    return asyncio.run(asyncio.wait_for(main(), 30))


def test_one_registration_per_profile_and_the_whole_gpus_apart(directory: Path) -> None:
    async def scenario(node: Node) -> None:
        registered = {(r.resource_name, r.endpoint) for r in node.kubelet.requests}
        assert registered == {
            ("nvidia.com/gpu", "schedext-gpu.sock"),
            ("nvidia.com/mig-1g.10gb", "schedext-mig-1g.10gb.sock"),
            ("nvidia.com/mig-2g.20gb", "schedext-mig-2g.20gb.sock"),
        }
        assert all(r.options.get_preferred_allocation_available for r in node.kubelet.requests)
        # The GPU in MIG mode is never a whole GPU (NVIDIA's mixed strategy).
        assert await node.listed("nvidia.com/gpu") == {WHOLE: "Healthy"}
        assert await node.listed("nvidia.com/mig-1g.10gb") == dict.fromkeys(M[:3], "Healthy")
        assert await node.listed("nvidia.com/mig-2g.20gb") == {M[3]: "Healthy"}

    run(directory, scenario)


def test_a_bound_pod_gets_the_mig_devices_schedext_chose_and_they_are_recorded(
    directory: Path,
) -> None:
    pods = [mig_bound("a", {P1: 2, P2: 1}, [M[2], M[1], M[3]], at=1)]

    async def scenario(node: Node) -> None:
        async with node.stub("nvidia.com/mig-1g.10gb") as stub:
            hint = await stub.GetPreferredAllocation(
                api_pb2.PreferredAllocationRequest(
                    container_requests=[
                        api_pb2.ContainerPreferredAllocationRequest(
                            available_deviceIDs=M[:3], allocation_size=2
                        )
                    ]
                ),
                timeout=WAIT_S,
            )
        assert tuple(hint.container_responses[0].deviceIDs) == (M[2], M[1])
        small, big = await asyncio.gather(
            node.allocate("nvidia.com/mig-1g.10gb", M[0], M[1]),
            node.allocate("nvidia.com/mig-2g.20gb", M[3]),
        )
        assert small.envs["NVIDIA_VISIBLE_DEVICES"] == f"{M[2]},{M[1]}"
        assert big.envs["NVIDIA_VISIBLE_DEVICES"] == M[3]
        assert [d.host_path for d in small.devices] == [
            # The GPU the MIG devices are on: GPU 0, whose device node is nvidia1 (its minor).
            "/dev/nvidia1",
            # Their capability nodes: GPU instances 3 and 2 (MIG device indices 2 and 1),
            # compute instance 0 of each, numbered as the recorded driver's mig-minors says.
            "/dev/nvidia-caps/nvidia-cap165",
            "/dev/nvidia-caps/nvidia-cap166",
            "/dev/nvidia-caps/nvidia-cap156",
            "/dev/nvidia-caps/nvidia-cap157",
            "/dev/nvidiactl",
            "/dev/nvidia-uvm",
            "/dev/nvidia-uvm-tools",
        ]
        held = node.ledger.get("uid-a")
        assert held is not None
        assert sorted(held.allocated) == sorted([M[1], M[2], M[3]])  # both profiles' records

    run(directory, scenario, pods)


def test_an_unbound_pod_gets_the_device_nobody_awaits_and_a_sick_gpus_are_refused(
    directory: Path,
) -> None:
    pods = [
        mig_bound("a", {P1: 1}, [M[0]], at=1),
        mig_bound("u", {P1: 1}, None, at=2),
        mig_bound("late", {P1: 1}, [M[2]], at=3),
        mig_bound("b", {P2: 1}, [M[3]], at=4),
    ]

    async def scenario(node: Node) -> None:
        got = [
            (await node.allocate("nvidia.com/mig-1g.10gb", M[2])).envs["NVIDIA_VISIBLE_DEVICES"]
            for _ in range(3)
        ]
        # Pods schedext bound first, oldest first; then u (not bound by schedext) gets the
        # one device nobody holds or awaits.
        assert got == [M[0], M[2], M[1]]
        async with node.stub("nvidia.com/mig-2g.20gb") as stub:
            stream = stub.ListAndWatch(api_pb2.Empty())
            await asyncio.wait_for(stream.read(), WAIT_S)
            node.devices.set_health(0, GpuHealth(False, "XID 79"))
            update = await asyncio.wait_for(stream.read(), WAIT_S)
            stream.cancel()
        assert isinstance(update, api_pb2.ListAndWatchResponse)
        assert [(d.ID, d.health) for d in update.devices] == [(M[3], "Unhealthy")]  # its GPU's
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await node.allocate("nvidia.com/mig-2g.20gb", M[3])
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "ml/b" in str(refused.value.details())
        assert "unhealthy" in str(refused.value.details())

    run(directory, scenario, pods)


def test_a_record_that_cannot_be_written_refuses_the_allocation(directory: Path) -> None:
    async def scenario(node: Node) -> None:
        node.ledger.fail_next = True
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await node.allocate("nvidia.com/mig-2g.20gb", M[3])
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        held = node.ledger.get("uid-a")
        assert held is not None
        assert held.allocated == ()
        again = await node.allocate("nvidia.com/mig-2g.20gb", M[3])  # the kubelet retries
        assert again.envs["NVIDIA_VISIBLE_DEVICES"] == M[3]

    run(directory, scenario, [mig_bound("a", {P2: 1}, [M[3]], at=1)])
