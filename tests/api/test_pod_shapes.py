"""Every pod shape, over real gRPC on real unix sockets: the agent's plugins served for a node
read by its NVML reader from a replay whose device node minors are not the GPUs' indices, and
the test playing the kubelet v1.36 (tests/device_manager.py: its GetPreferredAllocation and
Allocate sequence and its books).

For each shape: every container gets exactly its devices, with the device nodes of those
GPUs (by minor); the pod gets exactly what schedext chose; the kubelet's books name the same
devices; and an agent restarted between two containers' calls, with only the pod's allocation
record (its annotation) to go on, carries on where the last one stopped."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from app.agent.discovery import read_node
from app.agent.gpu_allocator import GpuAllocator, WholeGpus
from app.agent.memory import MemoryLedger, StaticDevices
from app.agent.mig_allocator import mig_allocators, mig_endpoint, read_mig_minors
from app.agent.registration import Endpoint
from app.agent.replay import ReplayBackend
from app.agent.servicer import DevicePluginServicer
from app.agent.share_allocator import ShareAllocator
from extender import names
from extender.devices.containers import format_grants
from extender.devices.gpus import Gpu
from extender.devices.links import nvlink_groups
from extender.devices.share_handle import ShareHandle, slot_gpu
from extender.node_pods import node_pod
from testbed.builders import make_pod, share_pod, with_containers
from testbed.kubelet import KubeletClient, ServedPlugins, quick_endpoint
from tests.device_manager import Container, DeviceManager
from tests.nvml_builders import H100_MIG, HGX_8_MINORS, HGX_MINORS, MIG_MINORS, mig_uuid

GPU = names.GPU_RESOURCE
SHARES = names.SHARE_COUNT_RESOURCE
HANDLE = ShareHandle(SHARES, None, 4)
P1 = "1g.10gb"
MIG = f"{names.MIG_RESOURCE_PREFIX}{P1}"


def gpu_uuid(index: int) -> str:
    return f"GPU-5e1ec7ed-0000-4000-8000-{index:012x}"


class Agent:
    """The agent's plugins for one node, over one ledger, served until :meth:`stop`."""

    def __init__(self, directory: Path, fixture: Path, ledger: MemoryLedger) -> None:
        _, self.gpus = read_node(ReplayBackend(fixture))
        devices = StaticDevices(self.gpus, nvlink_groups(self.gpus))
        endpoint = quick_endpoint(directory)
        self.sockets = {GPU: endpoint.socket}
        plugins: list[tuple[Any, Endpoint]] = [
            (DevicePluginServicer(GpuAllocator(WholeGpus(devices)), ledger, wait_s=0.2), endpoint)
        ]
        if any(g.mig_enabled for g in self.gpus):
            caps = read_mig_minors(MIG_MINORS)
            plugins += [
                (DevicePluginServicer(m, ledger, wait_s=0.2), mig_endpoint(endpoint, m.profile))
                for m in mig_allocators(devices, caps=caps)
            ]
            self.sockets[MIG] = mig_endpoint(endpoint, P1).socket
        else:
            shares = replace(endpoint, socket_name="shares.sock", resource_name=SHARES)
            plugins.append(
                (DevicePluginServicer(ShareAllocator(devices, HANDLE), ledger, wait_s=0.2), shares)
            )
            self.sockets[SHARES] = shares.socket
        self._served = ServedPlugins(directory, plugins)

    def client(self, resource: str) -> KubeletClient:
        return KubeletClient(self.sockets[resource])

    def stop(self) -> None:
        self._served.stop()


@pytest.fixture
def directory() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="ps-"))  # short: a socket path fits in 108 bytes
    yield path
    shutil.rmtree(path, ignore_errors=True)


@dataclass
class Shape:
    name: str
    containers: list[tuple[str, str, int]]  # (name, role, devices)
    chosen: list[int]
    expected: dict[str, tuple[int, ...]]


SHAPES = [
    Shape(
        "init + app container",
        [("setup", "init", 1), ("main", "app", 1)],
        [3],
        {"setup": (3,), "main": (3,)},
    ),
    Shape("two GPU containers", [("a", "app", 1), ("b", "app", 1)], [1, 2], {"a": (1,), "b": (2,)}),
    Shape(
        "a sidecar with a GPU and an app container",
        [("side", "sidecar", 1), ("main", "app", 1)],
        [4, 5],
        {"side": (4,), "main": (5,)},
    ),
    Shape(
        "an init container bigger than the app containers",
        [("setup", "init", 2), ("a", "app", 1), ("b", "app", 1)],
        [6, 7],
        {"setup": (6, 7), "a": (6,), "b": (7,)},
    ),
]


def _pod(name: str, resource: str, shape: Shape, agent: Agent) -> dict[str, Any]:
    containers = [(n, role, {resource: count}) for n, role, count in shape.containers]
    if resource == MIG:
        pod = make_pod(name, node="n")
        pod["metadata"]["annotations"][names.MIG_UUIDS] = ",".join(
            mig_uuid(0, i) for i in shape.chosen
        )
        return with_containers(pod, containers)
    if resource == SHARES:
        pod = with_containers(
            share_pod(name, memory_mib=10240, node="n", gpu_ids=shape.chosen), containers
        )
        for c in [*pod["spec"]["containers"], *pod["spec"].get("initContainers", [])]:
            c["resources"]["limits"][names.SHARE_MEMORY_RESOURCE] = "10240"
        return pod
    return with_containers(make_pod(name, node="n", gpu_ids=shape.chosen), containers)


def _device(resource: str, index: int) -> str:
    return mig_uuid(0, index) if resource == MIG else gpu_uuid(index)


def _listed(resource: str, gpus: Sequence[Gpu]) -> list[str]:
    if resource == MIG:
        return [m.uuid for g in gpus for m in g.migs if m.profile == P1]
    if resource == SHARES:
        return [i for g in gpus for i in HANDLE.device_ids(g)]
    return [g.uuid for g in gpus if not g.mig_enabled]


@pytest.mark.parametrize("restart", [False, True], ids=["one agent", "restarted midway"])
@pytest.mark.parametrize("resource", [GPU, SHARES, MIG], ids=["whole GPUs", "shares", "MIG"])
@pytest.mark.parametrize("shape", SHAPES, ids=[s.name for s in SHAPES])
def test_the_kubelet_s_sequence_gives_each_container_its_devices(
    directory: Path, shape: Shape, resource: str, restart: bool
) -> None:
    if resource == MIG and max(shape.chosen) > 2:
        shape = Shape(
            shape.name,
            shape.containers,
            list(range(len(shape.chosen))),
            {
                c: tuple(sorted(shape.chosen).index(i) for i in ids)
                for c, ids in shape.expected.items()
            },
        )
    fixture = H100_MIG if resource == MIG else HGX_8_MINORS
    ledger = MemoryLedger()
    agent = Agent(directory, fixture, ledger)
    pod = _pod("p", resource, shape, agent)
    seen = node_pod(pod)
    assert seen is not None
    ledger.add(seen)
    containers = [Container(n, count, role) for n, role, count in shape.containers]
    client = agent.client(resource)
    kubelet = DeviceManager(_listed(resource, agent.gpus), client)
    given = client.answers
    try:
        answers = kubelet.admit("p", containers, after=1 if restart else None)
        if restart:
            # The agent goes; a new one knows only what the pod's annotation says.
            record = format_grants(ledger.pods()[0].recorded())
            agent.stop()
            client.close()
            pod["metadata"]["annotations"][names.GPU_ALLOCATED] = record
            reread = node_pod(pod)
            assert reread is not None
            ledger = MemoryLedger([reread])
            agent = Agent(directory, fixture, ledger)
            client = agent.client(resource)
            client.answers = given
            kubelet.plugin = client
            answers |= kubelet.admit("p", containers)
    finally:
        client.close()
        agent.stop()
    assert answers == {
        c: tuple(_device(resource, i) for i in ids) for c, ids in shape.expected.items()
    }
    # The kubelet's books name what each container got.
    for container, got in answers.items():
        assert tuple(dict.fromkeys(map(slot_gpu, kubelet.books["p", container]))) == got
    # The device nodes are those of the GPUs' minors, not their indices.
    if resource != MIG:
        for answer in given:
            visible = answer.envs["NVIDIA_VISIBLE_DEVICES"].split(",")
            minors = [HGX_MINORS[int(u[-12:], 16)] for u in visible]
            assert [d.host_path for d in answer.devices][: len(minors)] == [
                f"/dev/nvidia{m}" for m in minors
            ]
