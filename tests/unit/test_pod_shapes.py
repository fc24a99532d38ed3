"""Every pod shape the kubelet admits gets exactly its devices: the kubelet's own sequence of
GetPreferredAllocation and Allocate calls (tests/device_manager.py) played against the core's
decisions for whole GPUs, shares and MIG devices, one row per shape.

For each row: each container gets what the kubelet's reuse rules give it (an init
container's devices again, a sidecar's and an app container's apart); the pod gets exactly the
devices schedext chose; the kubelet's books name what each container really got (so its
accounting of free devices stays true); the next pod gets none of them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import pytest

from extender import names
from extender.devices.allocation import NodePod, grant, preferred
from extender.devices.containers import (
    ContainerAsk,
    ContainerGrant,
    Role,
    format_grants,
    granted_devices,
    next_container,
    parse_grants,
    reusable,
)
from extender.devices.gpus import Gpu, MigSlice
from extender.devices.mig_allocation import grant_mig, preferred_mig
from extender.devices.share_allocation import grant_share, preferred_share
from extender.devices.share_handle import ShareHandle, slot_gpu
from extender.node_pods import node_pod
from testbed.builders import make_pod, share_pod, with_containers
from tests.device_manager import Container, DeviceManager

GPU = names.GPU_RESOURCE
SHARES = names.SHARE_COUNT_RESOURCE
P1 = "1g.10gb"
MIG = f"{names.MIG_RESOURCE_PREFIX}{P1}"
PAIRS = ((0, 1), (2, 3), (4, 5), (6, 7))


def uuid(index: int) -> str:
    return f"GPU-{index}"


def mig(index: int) -> str:
    return f"MIG-{index}"


class Node:
    """The pods on one node as the agent's ledger holds them, and the core's decisions for one
    resource, as a device plugin's two calls (tests.device_manager.Plugin)."""

    def __init__(self, resource: str, gpus: Sequence[Gpu]) -> None:
        self.resource, self.gpus = resource, tuple(gpus)
        self.pods: dict[str, NodePod] = {}
        self.handle = ShareHandle(SHARES, None, 4)

    def add(self, pod: dict[str, Any]) -> None:
        seen = node_pod(pod)
        assert seen is not None
        self.pods[seen.uid] = seen

    def preferred(self, available: Sequence[str], must: Sequence[str], size: int) -> list[str]:
        pods, ask = list(self.pods.values()), {"available": available, "must_include": must}
        if self.resource == SHARES:
            return list(preferred_share(pods, self.gpus, self.handle, **ask, size=size))
        if self.resource == MIG:
            return list(preferred_mig(pods, self.gpus, P1, **ask, size=size))
        return list(preferred(pods, self.gpus, PAIRS, **ask, size=size, resource=GPU))

    def allocate(self, ids: Sequence[str]) -> tuple[str, ...]:
        pods = list(self.pods.values())
        if self.resource == SHARES:
            shared = grant_share(pods, self.gpus, self.handle, ids)
            pod, uuids, container = shared.pod, shared.uuids, shared.container
        else:
            granted = (
                grant_mig(pods, self.gpus, P1, ids)
                if self.resource == MIG
                else grant(pods, self.gpus, PAIRS, ids, resource=GPU)
            )
            assert granted.pod is not None
            pod, uuids, container = granted.pod, granted.uuids, granted.container
        # As the ledger records it: on the pod's annotation, read back by a restarted agent.
        grants = parse_grants(format_grants((*pod.recorded(), ContainerGrant(container, uuids))))
        self.pods[pod.uid] = replace(pod, grants=grants, allocated=granted_devices(grants))
        return uuids

    def listed(self) -> list[str]:
        if self.resource == SHARES:
            return [i for gpu in self.gpus for i in self.handle.device_ids(gpu)]
        if self.resource == MIG:
            return [m.uuid for gpu in self.gpus for m in gpu.migs]
        return [gpu.uuid for gpu in self.gpus]


@dataclass
class Shape:
    name: str
    containers: list[tuple[str, str, int]]  # (name, role, devices)
    chosen: list[int]
    expected: dict[str, tuple[int, ...]]


SHAPES = [
    Shape("one container", [("main", "app", 2)], [2, 3], {"main": (2, 3)}),
    Shape(
        "init + app: the app container reuses the init container's GPU",
        [("setup", "init", 1), ("main", "app", 1)],
        [3],
        {"setup": (3,), "main": (3,)},
    ),
    Shape(
        "two GPU containers",
        [("a", "app", 1), ("b", "app", 1)],
        [1, 2],
        {"a": (1,), "b": (2,)},
    ),
    Shape(
        "a sidecar holds its GPU beside the app container",
        [("side", "sidecar", 1), ("main", "app", 1)],
        [4, 5],
        {"side": (4,), "main": (5,)},
    ),
    Shape(
        "an init container bigger than the app container",
        [("setup", "init", 2), ("main", "app", 1)],
        [6, 7],
        {"setup": (6, 7), "main": (6,)},
    ),
    Shape(
        "a sidecar takes the init container's GPU, the app a fresh one",
        [("setup", "init", 1), ("side", "sidecar", 1), ("main", "app", 1)],
        [0, 1],
        {"setup": (0,), "side": (0,), "main": (1,)},
    ),
    Shape(
        "a sidecar declared before a bigger init container",
        [("side", "sidecar", 1), ("setup", "init", 2), ("main", "app", 1)],
        [2, 3, 4],
        {"side": (2,), "setup": (3, 4), "main": (3,)},
    ),
    Shape(
        "a container without GPUs between two with",
        [("a", "app", 1), ("log", "app", 0), ("b", "app", 2)],
        [0, 2, 3],
        {"a": (0,), "b": (2, 3)},
    ),
]


def _pod(name: str, shape: Shape, resource: str, chosen: list[int]) -> dict[str, Any]:
    containers = [
        (n, role, {resource: count} if count else {}) for n, role, count in shape.containers
    ]
    if resource == SHARES:
        base = share_pod(name, memory_mib=10240, node="n", gpu_ids=chosen)
        shaped = with_containers(base, containers)
        for container in [*shaped["spec"]["containers"], *shaped["spec"].get("initContainers", [])]:
            if container["resources"]["limits"]:
                container["resources"]["limits"][names.SHARE_MEMORY_RESOURCE] = "10240"
        shaped["metadata"]["annotations"][names.GPU_UUIDS] = ",".join(uuid(i) for i in chosen)
        return shaped
    if resource == MIG:
        base = make_pod(name, node="n")
        base["metadata"]["annotations"][names.MIG_UUIDS] = ",".join(mig(i) for i in chosen)
        return with_containers(base, containers)
    base = make_pod(name, node="n", gpu_ids=chosen)
    base["metadata"]["annotations"][names.GPU_UUIDS] = ",".join(uuid(i) for i in chosen)
    return with_containers(base, containers)


def _devices(resource: str, indices: Sequence[int]) -> tuple[str, ...]:
    return tuple(mig(i) if resource == MIG else uuid(i) for i in indices)


def _gpus(resource: str) -> list[Gpu]:
    if resource == MIG:
        migs = tuple(MigSlice(P1, mig(i)) for i in range(8))
        return [Gpu(0, uuid(0), mig_enabled=True, migs=migs)]
    return [Gpu(i, uuid(i), memory_mib=81920) for i in range(8)]


@pytest.mark.parametrize("resource", [GPU, SHARES, MIG], ids=["whole GPUs", "shares", "MIG"])
@pytest.mark.parametrize("shape", SHAPES, ids=[s.name for s in SHAPES])
def test_each_container_gets_exactly_its_devices(shape: Shape, resource: str) -> None:
    node = Node(resource, _gpus(resource))
    kubelet = DeviceManager(node.listed(), node)
    node.add(_pod("first", shape, resource, shape.chosen))
    containers = [Container(n, count, role) for n, role, count in shape.containers if count]
    answers = kubelet.admit("first", containers)
    assert answers == {c: _devices(resource, ids) for c, ids in shape.expected.items()}
    # The pod holds exactly what schedext chose.
    held = {d for got in answers.values() for d in got}
    assert held == set(_devices(resource, shape.chosen))
    # The kubelet's books name what each container got (for shares: a slot of that GPU).
    for container, got in answers.items():
        booked = kubelet.books["first", container]
        assert tuple(dict.fromkeys(map(slot_gpu, booked))) == got, container
    # Every container is done: a repeated admission asks for nothing more.
    assert kubelet.admit("first", containers) == {}
    # The next pod, bound to the GPUs left, gets none of these.
    left = [i for i in range(8) if _devices(resource, [i])[0] not in held][:1]
    node.add(_pod("second", Shape("one", [("main", "app", 1)], left, {}), resource, left))
    second = kubelet.admit("second", [Container("main", 1)])
    assert second == {"main": _devices(resource, left)}


def test_a_share_in_one_container_and_none_in_the_other() -> None:
    node = Node(SHARES, _gpus(SHARES))
    pod = share_pod("s", memory_mib=10240, node="n", gpu_ids=[5])
    with_containers(pod, [("main", "app", {SHARES: 1}), ("log", "app", {})])
    pod["spec"]["containers"][0]["resources"]["limits"][names.SHARE_MEMORY_RESOURCE] = "10240"
    node.add(pod)
    kubelet = DeviceManager(node.listed(), node)
    assert kubelet.admit("s", [Container("main", 1)]) == {"main": (uuid(5),)}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("main:GPU-1,GPU-2;setup:GPU-1", (("main", ("GPU-1", "GPU-2")), ("setup", ("GPU-1",)))),
        ("GPU-1,GPU-2", (("", ("GPU-1", "GPU-2")),)),  # written before containers were named
        ("main:", ()),
        ("", ()),
        (None, ()),
        ("x" * 70000, ()),
        ("main:GPU-1,,GPU-1 ; :GPU-2", (("main", ("GPU-1",)), ("", ("GPU-2",)))),
    ],
    ids=["by container", "older record", "empty grant", "empty", "absent", "too long", "sloppy"],
)
def test_the_allocation_record_reads_back(text: str | None, expected: object) -> None:
    grants = parse_grants(text)
    assert tuple((g.container, g.uuids) for g in grants) == expected
    assert parse_grants(format_grants(grants)) == grants


def test_an_older_record_covers_the_containers_in_order() -> None:
    asks = (ContainerAsk("a", Role.INIT, 1), ContainerAsk("b", Role.APP, 2))
    older = (ContainerGrant("", ("GPU-1",)),)
    step = next_container(asks, older)
    assert step is not None
    assert (step.ask.name, step.reused, step.fresh) == ("b", ("GPU-1",), 1)
    assert reusable(asks, older) == ("GPU-1",)
