"""The node agent's share decisions (extender.devices.share_handle, share_allocation): which
handle the kubelet is offered, what the Node advertises, which share pod an Allocate is for,
which GPU it gets and under which limits."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import pytest

from extender import names
from extender.config import SHARE_PRESETS, ShareResources
from extender.devices.allocation import AllocationError, NodePod, in_use
from extender.devices.containers import ContainerGrant, PodContainer, Role
from extender.devices.gpus import Gpu, GpuHealth
from extender.devices.share_allocation import (
    NoShareWaitingError,
    ShareGrant,
    grant_share,
    match_share,
    preferred_share,
    share_envs,
)
from extender.devices.share_handle import (
    ShareHandle,
    ShareHandleError,
    node_capacity,
    share_handle,
    slot_gpu,
)
from extender.node_pods import node_pod
from testbed.builders import make_pod, share_pod

H100_MIB = 81559
SICK = GpuHealth(healthy=False, reason="XID 79: GPU fell off the bus")
SLOTS = ShareHandle(names.SHARE_COUNT_RESOURCE, None, 4)
GIB = ShareHandle("aliyun.com/gpu-mem", 1024, 4)


def uuid(index: int) -> str:
    return f"GPU-{index}"


def gpus(count: int = 4, *, sick: Sequence[int] = (), mig: Sequence[int] = ()) -> tuple[Gpu, ...]:
    return tuple(
        Gpu(
            index=i,
            uuid=uuid(i),
            memory_mib=H100_MIB,
            health=SICK if i in sick else GpuHealth(),
            mig_enabled=i in mig,
        )
        for i in range(count)
    )


def share(
    name: str,
    ids: Sequence[int] | None,
    *,
    memory: int = 10240,
    cores: int = 0,
    at: float = 0.0,
    allocated: Sequence[int] = (),
    shares: int | None = None,
) -> NodePod:
    """A share pod: placed by schedext on GPU ``ids`` (None: not placed)."""
    return NodePod(
        uid=f"uid-{name}",
        namespace="ml",
        name=name,
        gpus=0,
        gpu_ids=None if ids is None else tuple(ids),
        gpu_uuids=None if ids is None else tuple(uuid(i) for i in ids),
        allocated=tuple(uuid(i) for i in allocated),
        bound_at=at,
        shares=len(ids or ()) if shares is None else shares,
        share_memory_mib=memory,
        share_cores=cores,
    )


def two_containers(pod: NodePod, *, given: int) -> NodePod:
    """``pod`` as two containers of one share each, the first given GPU ``given``."""
    asks = ((names.SHARE_COUNT_RESOURCE, 1),)
    return replace(
        pod,
        containers=(PodContainer("c1", Role.APP, asks), PodContainer("c2", Role.APP, asks)),
        grants=(ContainerGrant("c1", (uuid(given),)),),
        allocated=(uuid(given),),
    )


def whole(name: str, ids: Sequence[int], *, allocated: Sequence[int] = ()) -> NodePod:
    return NodePod(
        uid=f"uid-{name}",
        namespace="ml",
        name=name,
        gpus=len(ids),
        gpu_ids=tuple(ids),
        gpu_uuids=tuple(uuid(i) for i in ids),
        allocated=tuple(uuid(i) for i in allocated),
    )


def slots(*pairs: tuple[int, int]) -> list[str]:
    return [f"{uuid(g)}::{k}" for g, k in pairs]


# ------------------------------------------------------------------ pods as the agent reads them


@dataclass
class PodCase:
    name: str
    pod: dict[str, Any]
    expected: dict[str, Any] | None
    shares: ShareResources = SHARE_PRESETS["schedext"]


POD_CASES = [
    PodCase("no GPU, no share", make_pod("p", node="n"), None),
    PodCase("a pending share is nobody's yet", share_pod("s", memory_mib=10240), None),
    PodCase(
        "a share placed by schedext",
        share_pod("s", memory_mib=10240, cores=30, node="n", gpu_ids=[2]),
        {"gpus": 0, "shares": 1, "share_memory_mib": 10240, "share_cores": 30, "gpu_ids": (2,)},
    ),
    PodCase(
        "a share bound by someone else: read from its resources",
        share_pod("s", memory_mib=4096, shares=2, node="n"),
        {"gpus": 0, "shares": 2, "share_memory_mib": 4096, "share_cores": 0, "gpu_ids": None},
    ),
    PodCase(
        "whole GPUs stay whole",
        make_pod("w", gpus=2, node="n", gpu_ids=[0, 1]),
        {"gpus": 2, "shares": 0, "share_memory_mib": 0, "share_cores": 0, "gpu_ids": (0, 1)},
    ),
    PodCase(
        "gpushare's GiB, with the bind's MiB",
        make_pod(
            "g",
            node="n",
            gpu_ids=[1],
            gpu_resource="aliyun.com/gpu-mem",
            gpus=10,
            annotations={names.GPU_SHARE_MEMORY: "10240"},
        ),
        {"gpus": 0, "shares": 1, "share_memory_mib": 10240, "share_cores": 0, "gpu_ids": (1,)},
        SHARE_PRESETS["gpushare"],
    ),
]


@pytest.mark.parametrize("case", POD_CASES, ids=[c.name for c in POD_CASES])
def test_node_pod_reads_shares(case: PodCase) -> None:
    pod = node_pod(case.pod, shares=case.shares)
    if case.expected is None:
        assert pod is None
        return
    assert pod is not None
    assert {key: getattr(pod, key) for key in case.expected} == case.expected


def test_node_pod_reads_the_allocation_record_of_a_share() -> None:
    raw = share_pod("s", memory_mib=1024, node="n", gpu_ids=[3])
    raw["metadata"]["annotations"][names.GPU_ALLOCATED] = "GPU-x"
    pod = node_pod(raw)
    assert pod is not None
    assert pod.allocated == ("GPU-x",)


# ------------------------------------------------------------------ the handle and the Node


@pytest.mark.parametrize(
    ("resources", "expected"),
    [
        (ShareResources(), ShareHandle(names.SHARE_COUNT_RESOURCE, None, 32)),
        (SHARE_PRESETS["gpushare"], ShareHandle("aliyun.com/gpu-mem", 1024, 32)),
        (
            replace(SHARE_PRESETS["gpushare"], count="example.com/shares"),
            ShareHandle("example.com/shares", None, 32),
        ),
    ],
    ids=["schedext: the count", "gpushare: GiB of memory", "a count wins over GiB"],
)
def test_share_handle(resources: ShareResources, expected: ShareHandle) -> None:
    assert share_handle(resources, names.GPU_RESOURCE) == expected


@pytest.mark.parametrize(
    ("resources", "slots_per_gpu", "message"),
    [
        (SHARE_PRESETS["hami"], 32, "nvidia.com/gpu, which the agent serves as whole GPUs"),
        (replace(ShareResources(), count=None), 32, "counts MiB and no share count resource"),
        (ShareResources(), 0, "at least 1"),
    ],
    ids=["count is the whole-GPU resource", "MiB without a count", "no slots"],
)
def test_share_handle_refuses(resources: ShareResources, slots_per_gpu: int, message: str) -> None:
    with pytest.raises(ShareHandleError, match=message):
        share_handle(resources, names.GPU_RESOURCE, slots=slots_per_gpu)


def test_handle_device_ids_per_gpu() -> None:
    gpu = gpus(1)[0]
    assert SLOTS.device_ids(gpu) == ("GPU-0::0", "GPU-0::1", "GPU-0::2", "GPU-0::3")
    by_gib = GIB.device_ids(gpu)
    assert len(by_gib) == H100_MIB // 1024 == 79
    assert {slot_gpu(i) for i in by_gib} == {"GPU-0"}
    assert slot_gpu("not-a-slot") == "not-a-slot"


@pytest.mark.parametrize(
    ("resources", "handle", "expected"),
    [
        (
            ShareResources(),
            SLOTS,
            {names.SHARE_MEMORY_RESOURCE: str(2 * H100_MIB), names.SHARE_CORES_RESOURCE: "200"},
        ),
        (
            replace(ShareResources(), cores=None),
            SLOTS,
            {names.SHARE_MEMORY_RESOURCE: str(2 * H100_MIB)},
        ),
        (
            replace(ShareResources(), memory_unit_mib=1024),
            SLOTS,
            {names.SHARE_MEMORY_RESOURCE: "158", names.SHARE_CORES_RESOURCE: "200"},
        ),
        (SHARE_PRESETS["gpushare"], GIB, {}),  # the handle is the memory: the kubelet counts it
    ],
    ids=["MiB and cores", "no cores resource", "GiB, whole units per GPU", "memory is the handle"],
)
def test_node_capacity_counts_healthy_whole_gpus(
    resources: ShareResources, handle: ShareHandle, expected: dict[str, str]
) -> None:
    # GPU 1 is sick and GPU 2 is in MIG mode: neither takes shares.
    assert node_capacity(gpus(sick=[1], mig=[2]), resources, handle) == expected


# ------------------------------------------------------------------ matching and granting


@dataclass
class MatchCase:
    name: str
    pods: list[NodePod]
    size: int
    expected: str | None
    handle: ShareHandle = SLOTS


MATCH_CASES = [
    MatchCase("nobody", [], 1, None),
    MatchCase("the placed share of that size", [share("a", [0])], 1, "a"),
    MatchCase("not another size", [share("a", [0, 1])], 1, None),
    MatchCase("oldest bind first", [share("b", [1], at=2), share("a", [0], at=1)], 1, "a"),
    MatchCase("a given share is done", [share("a", [0], allocated=[0]), share("b", [1])], 1, "b"),
    MatchCase("the next container's share", [two_containers(share("a", [0, 1]), given=0)], 1, "a"),
    MatchCase(
        "placed before unplaced, even younger",
        [share("old", None, shares=1, at=0), share("young", [2], at=5)],
        1,
        "young",
    ),
    MatchCase("an unplaced one, to be refused", [share("u", None, shares=1)], 1, "u"),
    MatchCase("whole-GPU pods are not shares", [whole("w", [0])], 1, None),
    MatchCase("GiB: the memory in IDs", [share("g", [0], memory=10240)], 10, "g", GIB),
    MatchCase("GiB: rounded up", [share("g", [0], memory=1500)], 2, "g", GIB),
]


@pytest.mark.parametrize("case", MATCH_CASES, ids=[c.name for c in MATCH_CASES])
def test_match_share(case: MatchCase) -> None:
    pod = match_share(case.pods, case.handle, case.size)
    assert (pod.name if pod else None) == case.expected


@dataclass
class GrantCase:
    name: str
    pods: list[NodePod]
    requested: list[str]
    expected: tuple[int, ...]
    pod: str
    handle: ShareHandle = SLOTS


GRANT_CASES = [
    GrantCase("schedext's GPU, not the slot's", [share("a", [3])], slots((0, 0)), (3,), "a"),
    GrantCase(
        "two GPUs for a share of two", [share("a", [1, 2])], slots((0, 0), (0, 1)), (1, 2), "a"
    ),
    GrantCase(
        "the next container gets the rest",
        [two_containers(share("a", [1, 2]), given=1)],
        slots((0, 0)),
        (2,),
        "a",
    ),
    GrantCase(
        "beside other shares on the GPU",
        [share("b", [3], allocated=[3]), share("a", [3], at=1)],
        slots((3, 0)),
        (3,),
        "a",
    ),
    GrantCase("GiB handle", [share("g", [2], memory=2048)], slots((0, 0), (0, 1)), (2,), "g", GIB),
]


@pytest.mark.parametrize("case", GRANT_CASES, ids=[c.name for c in GRANT_CASES])
def test_grant_share(case: GrantCase) -> None:
    granted = grant_share(case.pods, gpus(), case.handle, case.requested)
    assert granted.uuids == tuple(uuid(i) for i in case.expected)
    assert granted.pod.name == case.pod
    assert granted.memory_mib == granted.pod.share_memory_mib


@pytest.mark.parametrize(
    ("pods", "requested", "message"),
    [
        ([], slots((0, 0)), "no GPU share on this node awaits 1 schedext.io/gpu-shares"),
        ([share("u", None, shares=1)], slots((0, 0)), "schedext did not place it"),
        ([share("a", [1])], slots((0, 0)), "unhealthy"),
        ([share("a", [2])], slots((0, 0)), "MIG mode"),
        ([share("a", [7])], slots((0, 0)), r"not on this node: \['GPU-7'\]"),
        ([replace(share("a", [7]), gpu_uuids=None)], slots((0, 0)), "this node does not have"),
        ([share("a", [0]), whole("w", [0], allocated=[0])], slots((0, 0)), r"held whole.*ml/w"),
        ([share("a", [0])], [], "no devices"),
    ],
    ids=[
        "nobody waits",
        "not placed",
        "sick",
        "MIG",
        "unknown UUID",
        "unknown index",
        "held whole",
        "empty",
    ],
)
def test_grant_share_refuses(pods: list[NodePod], requested: list[str], message: str) -> None:
    with pytest.raises(AllocationError, match=message):
        grant_share(pods, gpus(sick=[1], mig=[2]), SLOTS, requested)


def test_nobody_waiting_is_its_own_error_so_the_plugin_may_wait() -> None:
    with pytest.raises(NoShareWaitingError):
        grant_share([whole("w", [0])], gpus(), SLOTS, slots((0, 0)))
    with pytest.raises(AllocationError) as refused:
        grant_share([share("u", None, shares=1)], gpus(), SLOTS, slots((0, 0)))
    assert not isinstance(refused.value, NoShareWaitingError)


def test_under_mps_one_container_reaches_one_gpu() -> None:
    pods = [share("a", [0, 3])]
    with pytest.raises(AllocationError, match="one share per container"):
        grant_share(pods, gpus(), SLOTS, slots((0, 0), (0, 1)), one_gpu=True)
    assert grant_share(pods, gpus(), SLOTS, slots((0, 0), (0, 1))).uuids == (uuid(0), uuid(3))


def test_a_gpu_with_a_share_is_in_use_for_whole_gpu_picks() -> None:
    by_index = {g.index: g.uuid for g in gpus()}
    # Placed and not given yet, or given: either way nobody's whole GPU.
    assert in_use([share("a", [1]), share("b", [2], allocated=[2])], by_index) == {
        uuid(1),
        uuid(2),
    }


@dataclass
class PreferredCase:
    name: str
    pods: list[NodePod]
    available: list[str]
    must: list[str]
    size: int
    expected: list[str]
    handle: ShareHandle = SLOTS


ALL_SLOTS = slots(*((g, k) for g in range(4) for k in range(4)))
PREFERRED_CASES = [
    PreferredCase("a slot of the chosen GPU", [share("a", [2])], ALL_SLOTS, [], 1, slots((2, 0))),
    PreferredCase(
        "one slot per chosen GPU",
        [share("a", [1, 3])],
        ALL_SLOTS,
        [],
        2,
        slots((1, 0), (3, 0)),
    ),
    PreferredCase(
        "a free slot when others are taken",
        [share("a", [2])],
        slots((0, 0), (2, 3)),
        [],
        1,
        slots((2, 3)),
    ),
    PreferredCase(
        "GiB: as many IDs of the chosen GPU",
        [share("g", [1], memory=2048)],
        [f"{uuid(g)}::{k}" for g in range(2) for k in range(3)],
        [],
        2,
        [f"{uuid(1)}::0", f"{uuid(1)}::1"],
        GIB,
    ),
    PreferredCase("nobody: the first ones", [], ALL_SLOTS, [], 2, slots((0, 0), (0, 1))),
    PreferredCase(
        "must include elsewhere: honoured",
        [share("a", [2])],
        ALL_SLOTS,
        slots((0, 3)),
        1,
        slots((0, 3)),
    ),
    PreferredCase(
        "none of the chosen GPU left", [share("a", [2])], slots((0, 0)), [], 1, slots((0, 0))
    ),
]


@pytest.mark.parametrize("case", PREFERRED_CASES, ids=[c.name for c in PREFERRED_CASES])
def test_preferred_share(case: PreferredCase) -> None:
    answer = preferred_share(
        case.pods,
        gpus(),
        case.handle,
        available=case.available,
        must_include=case.must,
        size=case.size,
    )
    assert list(answer) == case.expected


@pytest.mark.parametrize(
    ("uuids", "memory", "cores", "pipe", "expected"),
    [
        (("GPU-a",), 10240, 0, None, {"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=10240M"}),
        (
            ("GPU-a", "GPU-b"),
            4096,
            30,
            None,
            {
                "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=4096M,1=4096M",
                "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "30",
            },
        ),
        (
            ("GPU-a",),
            512,
            0,
            "/tmp/nvidia-mps",
            {
                "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=512M",
                "CUDA_MPS_PIPE_DIRECTORY": "/tmp/nvidia-mps",
            },
        ),
    ],
    ids=["memory", "two GPUs and cores", "under MPS"],
)
def test_share_envs(
    uuids: tuple[str, ...], memory: int, cores: int, pipe: str | None, expected: dict[str, str]
) -> None:
    grant = ShareGrant(share("a", [0]), uuids, memory, cores)
    assert share_envs(grant, pipe_directory=pipe) == expected
