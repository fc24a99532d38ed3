"""Victim selection: minimal sets, GPU topology, addresses, gangs and priority rules."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from extender.model import Victim
from extender.preemption import GangVictims, select_victims
from extender.requests import pod_request
from extender.scheduler import Scheduler
from testbed.builders import (
    A100,
    H100,
    bound_ip_pod,
    gang_pod,
    ip_pod,
    make_ip_claim,
    make_ip_pool,
    make_node,
    make_pod,
    make_pod_group,
    share_pod,
)

HIGH = 100
LOW = 10
NVLINK_2X4 = [[0, 1, 2, 3], [4, 5, 6, 7]]


def held(
    name: str, node: str, ids: list[int], *, priority: int = LOW, cpu: str = "100m", **kwargs: Any
) -> dict[str, Any]:
    return make_pod(
        name, uid=name, gpus=len(ids), node=node, gpu_ids=ids, priority=priority, cpu=cpu, **kwargs
    )


def scheduler_for(
    nodes: list[dict[str, Any]],
    pods: list[dict[str, Any]],
    *,
    gang_victims: GangVictims = GangVictims.PROTECT,
    groups: list[dict[str, Any]] = (),  # type: ignore[assignment]
    pools: list[dict[str, Any]] = (),  # type: ignore[assignment]
    claims: list[dict[str, Any]] = (),  # type: ignore[assignment]
) -> Scheduler:
    scheduler = Scheduler(gang_victims=gang_victims)
    for group in groups:
        scheduler.upsert_pod_group(group)
    for pool in pools:
        scheduler.upsert_ip_pool(pool)
    for claim in claims:
        scheduler.upsert_ip_claim(claim)
    for node in nodes:
        scheduler.upsert_node(node)
    for pod in pods:
        scheduler.upsert_pod(pod)
    return scheduler


def preempt(
    nodes: list[dict[str, Any]],
    pods: list[dict[str, Any]],
    preemptor: dict[str, Any],
    proposed: dict[str, list[str]],
    **kwargs: Any,
) -> dict[str, list[str]]:
    scheduler = scheduler_for(nodes, pods, **kwargs)
    chosen = scheduler.preempt(
        preemptor, {n: [Victim(u) for u in uids] for n, uids in proposed.items()}
    )
    return {node: victims.uids for node, victims in chosen.items()}


@dataclass
class Case:
    name: str
    nodes: list[dict[str, Any]]
    pods: list[dict[str, Any]]
    preemptor: dict[str, Any]
    proposed: dict[str, list[str]]
    expected: dict[str, list[str]]
    kwargs: dict[str, Any] = field(default_factory=dict)


CASES = [
    Case(
        "the fewest victims that free enough GPUs",
        [make_node("g", gpus=4)],
        [held("a", "g", [0]), held("b", "g", [1]), held("big", "g", [2, 3])],
        make_pod("p", gpus=2, priority=HIGH),
        {"g": ["a", "b"]},
        {"g": ["big"]},
    ),
    Case(
        "freeing 2 GPUs inside one NVLink group beats two scattered ones",
        [make_node("g", gpus=8, groups=NVLINK_2X4)],
        [
            held("a", "g", [0]),
            held("b", "g", [4]),
            held("c", "g", [1]),
            held("rest0", "g", [2, 3]),
            held("rest1", "g", [5, 6, 7]),
        ],
        make_pod("p", gpus=2, priority=HIGH),
        {"g": ["a", "b"]},  # kube-scheduler's count-only pick: two GPUs in two groups
        {"g": ["rest0"]},  # one victim, two GPUs of one group, nothing freed for nothing
    ),
    Case(
        "when only one group can be freed, its holder is the victim",
        [make_node("g", gpus=8, groups=NVLINK_2X4)],
        [
            held("a", "g", [0]),
            held("b", "g", [4]),
            held("rest0", "g", [1, 2, 3]),
            held("rest1", "g", [5, 6, 7], priority=HIGH),
        ],
        make_pod("p", gpus=2, priority=HIGH),
        {"g": ["a", "b"]},
        {"g": ["rest0"]},
    ),
    Case(
        "lower priority victims are preferred at equal count",
        [make_node("g", gpus=2)],
        [held("cheap", "g", [0], priority=1), held("dear", "g", [1], priority=50)],
        make_pod("p", gpus=1, priority=HIGH),
        {"g": ["dear"]},
        {"g": ["cheap"]},
    ),
    Case(
        "victims are added by UID when the proposed ones free CPU but not GPUs",
        [make_node("g", gpus=2, cpu="4")],
        [
            held("gpu", "g", [0, 1]),
            make_pod("cpu-hog", uid="cpu-hog", cpu="3", node="g", priority=LOW),
        ],
        make_pod("p", gpus=2, cpu="2", priority=HIGH),
        {"g": ["cpu-hog"]},
        {"g": ["gpu", "cpu-hog"]},
    ),
    Case(
        "a node where only CPU would be freed is dropped",
        [make_node("g", gpus=2)],
        [
            held("vip", "g", [0, 1], priority=HIGH),
            make_pod("cpu-job", uid="cpu-job", node="g", priority=LOW),
        ],
        make_pod("p", gpus=2, priority=HIGH),
        {"g": ["cpu-job"]},
        {},
    ),
    Case(
        "equal and higher priority pods are never victims",
        [make_node("g", gpus=2)],
        [held("peer", "g", [0], priority=HIGH), held("boss", "g", [1], priority=HIGH + 1)],
        make_pod("p", gpus=1, priority=HIGH),
        {"g": ["peer"]},
        {},
    ),
    Case(
        "preemptionPolicy Never preempts nothing",
        [make_node("g", gpus=1)],
        [held("a", "g", [0])],
        make_pod("p", gpus=1, priority=HIGH, preemption_policy="Never"),
        {"g": ["a"]},
        {},
    ),
    Case(
        "the wrong GPU model is dropped even with victims",
        [make_node("a100", gpus=2, model=A100), make_node("h100", gpus=2, model=H100)],
        [held("x", "a100", [0, 1]), held("y", "h100", [0, 1])],
        make_pod("p", gpus=2, priority=HIGH, model="H100"),
        {"a100": ["x"], "h100": ["y"]},
        {"h100": ["y"]},
    ),
    Case(
        "victims come highest priority first",
        [make_node("g", gpus=2)],
        [held("low", "g", [0], priority=1), held("mid", "g", [1], priority=50)],
        make_pod("p", gpus=2, priority=HIGH),
        {"g": ["low", "mid"]},
        {"g": ["mid", "low"]},
    ),
    Case(
        "a pod that holds nothing schedext tracks keeps kube-scheduler's list",
        [make_node("g", gpus=4)],
        [make_pod("filler", uid="filler", node="g", priority=LOW)],
        make_pod("p", gpus=1, priority=HIGH),
        {"g": ["filler"]},
        {"g": ["filler"]},
    ),
    # kube-scheduler's list when schedext's own needs are already met (the pod fits without
    # evicting anything schedext tracks): it stands for kube-scheduler's own reasons, so it is
    # kept whole when every pod in it may be a victim, and the node is dropped otherwise.
    Case(
        "an already-fitting pod keeps kube-scheduler's list, highest priority first",
        [make_node("g", gpus=4)],
        [
            make_pod("low", uid="low", node="g", priority=1),
            make_pod("mid", uid="mid", node="g", priority=50),
        ],
        make_pod("p", gpus=1, priority=HIGH),
        {"g": ["low", "mid"]},
        {"g": ["mid", "low"]},
    ),
    Case(
        "an already-fitting pod never gets a protected gang member",
        [make_node("g", gpus=4)],
        [gang_pod("m0", "team", gpus=1, uid="m0", node="g", gpu_ids=[0], priority=LOW)],
        make_pod("p", gpus=1, priority=HIGH),
        {"g": ["m0"]},
        {},
    ),
    Case(
        "an already-fitting pod never gets a proposed pod of higher priority",
        [make_node("g", gpus=4)],
        [
            make_pod("filler", uid="filler", node="g", priority=LOW),
            make_pod("boss", uid="boss", node="g", priority=HIGH + 1),
        ],
        make_pod("p", gpus=1, priority=HIGH),
        {"g": ["filler", "boss"]},
        {},
    ),
    Case(
        "an already-fitting pod never gets a proposed pod of equal priority",
        [make_node("g", gpus=4)],
        [make_pod("peer", uid="peer", node="g", priority=HIGH)],
        make_pod("p", gpus=1, priority=HIGH),
        {"g": ["peer"]},
        {},
    ),
    Case(
        "an already-fitting pod never gets a pod schedext cannot check",
        [make_node("g", gpus=4)],
        [make_pod("filler", uid="filler", node="g", priority=LOW)],
        make_pod("p", gpus=1, priority=HIGH),
        {"g": ["filler", "ghost"]},
        {},
    ),
    Case(
        "an already-fitting pod with preemptionPolicy Never preempts nothing",
        [make_node("g", gpus=4)],
        [make_pod("filler", uid="filler", node="g", priority=LOW)],
        make_pod("p", gpus=1, priority=HIGH, preemption_policy="Never"),
        {"g": ["filler"]},
        {},
    ),
    Case(
        "whole-group: an already-fitting pod takes the proposed member's gang whole",
        [make_node("g", gpus=4)],
        [
            gang_pod("m0", "team", gpus=1, uid="m0", node="g", gpu_ids=[0], priority=1),
            gang_pod("m1", "team", gpus=1, uid="m1", node="g", gpu_ids=[1], priority=2),
        ],
        make_pod("p", gpus=1, priority=HIGH),
        {"g": ["m0"]},
        {"g": ["m1", "m0"]},
        {"gang_victims": GangVictims.WHOLE_GROUP},
    ),
    Case(
        "whole-group: a gang with a member of higher priority on the node is never split",
        [make_node("g", gpus=2)],
        [
            gang_pod("m0", "team", gpus=1, uid="m0", node="g", gpu_ids=[0], priority=LOW),
            gang_pod("m1", "team", gpus=1, uid="m1", node="g", gpu_ids=[1], priority=HIGH),
        ],
        make_pod("p", gpus=1, priority=HIGH),
        {"g": ["m0"]},
        {},
        {"gang_victims": GangVictims.WHOLE_GROUP},
    ),
    Case(
        "a node with an empty proposal is never returned",
        [make_node("g", gpus=1)],
        [held("a", "g", [0])],
        make_pod("p", gpus=1, priority=HIGH),
        {"g": []},
        {},
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_victim_selection(case: Case) -> None:
    assert (
        preempt(case.nodes, case.pods, case.preemptor, case.proposed, **case.kwargs)
        == case.expected
    )


# ------------------------------------------------------------------------- GPU shares

GIB = 1024
GPU_80G = 80 * GIB


def shared(
    name: str,
    node: str,
    ids: list[int],
    *,
    gib: int = 10,
    cores: int | None = None,
    priority: int = LOW,
) -> dict[str, Any]:
    """A bound pod holding a ``gib`` GiB share (and ``cores`` percent) of each GPU in ``ids``."""
    return share_pod(
        name, uid=name, memory_mib=gib * GIB, cores=cores, shares=len(ids), node=node,
        gpu_ids=ids, priority=priority,
    )  # fmt: skip


def share_node(name: str = "g", gpus: int = 1) -> dict[str, Any]:
    return make_node(name, gpus=gpus, gpu_memory_mib=GPU_80G)


def full_gpu(
    node: str, index: int, prefix: str, *, priorities: list[int] | None = None
) -> list[dict[str, Any]]:
    """GPU ``index`` of ``node`` full of eight 10 GiB shares, ``prefix``0 to ``prefix``7."""
    return [
        shared(f"{prefix}{i}", node, [index], priority=(priorities or [LOW] * 8)[i])
        for i in range(8)
    ]


SHARE_CASES = [
    Case(
        "a 10 GiB share on a GPU full of 10 GiB shares evicts exactly one",
        [share_node()],
        full_gpu("g", 0, "s", priorities=[LOW, LOW, LOW, 3, LOW, LOW, LOW, LOW]),
        share_pod("p", memory_mib=10 * GIB, priority=HIGH),
        {"g": ["s0", "s1"]},
        {"g": ["s3"]},  # one is enough; the lowest priority of them
    ),
    Case(
        "a 40 GiB share evicts four shares of one GPU, not shares spread over GPUs",
        [share_node(gpus=2)],
        [
            *full_gpu("g", 0, "a", priorities=[1, 2, 3, 4, 5, 6, 7, 8]),
            *full_gpu("g", 1, "b", priorities=[5] * 8),
        ],
        share_pod("p", memory_mib=40 * GIB, priority=HIGH),
        {"g": ["a0", "a1", "b0", "b1"]},  # a count-only pick: 40 GiB freed, 20 GiB per GPU
        {"g": ["a3", "a2", "a1", "a0"]},
    ),
    Case(
        "a 30 GiB share on four GPUs with 10 GiB free each evicts two shares of one GPU",
        [share_node(gpus=4)],
        [
            shared(f"d{gpu}-{i}", "g", [gpu], priority=LOW if gpu != 2 else 5)
            for gpu in range(4)
            for i in range(7)
        ],
        share_pod("p", memory_mib=30 * GIB, priority=HIGH),
        {"g": ["d0-0", "d1-0", "d3-0"]},  # 30 GiB on the node, 10 on each GPU
        {"g": ["d2-0", "d2-1"]},
    ),
    Case(
        "a share never evicts shares of equal or higher priority",
        [share_node()],
        full_gpu("g", 0, "s", priorities=[HIGH, HIGH + 1] * 4),
        share_pod("p", memory_mib=10 * GIB, priority=HIGH),
        {"g": ["s0"]},
        {},
    ),
    Case(
        "cores limit: the victim that frees cores, not the one with the lowest priority",
        [share_node()],
        [
            shared("big-memory", "g", [0], gib=50, cores=10, priority=1),
            shared("busy0", "g", [0], gib=5, cores=45, priority=5),
            shared("busy1", "g", [0], gib=5, cores=45, priority=6),
        ],
        share_pod("p", memory_mib=10 * GIB, cores=40, priority=HIGH),
        {"g": ["big-memory"]},  # 20 GiB are free already; the cores are not
        {"g": ["busy0"]},
    ),
    Case(
        "a share evicts a small share rather than a large one (fewer MiB freed for nothing)",
        [share_node(gpus=2)],
        [
            shared("large0", "g", [0], gib=40),
            shared("large1", "g", [0], gib=40),
            *full_gpu("g", 1, "small"),
        ],
        share_pod("p", memory_mib=10 * GIB, priority=HIGH),
        {"g": ["large0"]},
        {"g": ["small0"]},
    ),
    Case(
        "a share evicts a share rather than a whole-GPU pod",
        [share_node(gpus=2)],
        [held("whole", "g", [0]), *full_gpu("g", 1, "s")],
        share_pod("p", memory_mib=10 * GIB, priority=HIGH),
        {"g": ["whole"]},
        {"g": ["s0"]},
    ),
    Case(
        "a share on two GPUs frees room on two distinct devices",
        [share_node(gpus=2)],
        [*full_gpu("g", 0, "a"), *full_gpu("g", 1, "b")],
        share_pod("p", memory_mib=10 * GIB, shares=2, priority=HIGH),
        {"g": ["a0", "a1"]},  # both on GPU 0: room on one device only
        {"g": ["a0", "b0"]},
    ),
    Case(
        "a whole-GPU pod on shared GPUs evicts every share of the GPU with the fewest",
        [share_node(gpus=2)],
        [
            shared("a0", "g", [0], gib=10),
            shared("a1", "g", [0], gib=10),
            shared("a2", "g", [0], gib=10),
            shared("b0", "g", [1], gib=20),
            shared("b1", "g", [1], gib=20),
        ],
        make_pod("p", gpus=1, priority=HIGH),
        {"g": ["a0"]},  # one share: its GPU stays shared
        {"g": ["b0", "b1"]},
    ),
    Case(
        "a whole-GPU pod is not given a GPU whose higher-priority share stays",
        [share_node()],
        [shared("low", "g", [0]), shared("vip", "g", [0], priority=HIGH)],
        make_pod("p", gpus=1, priority=HIGH),
        {"g": ["low"]},
        {},
    ),
]


@pytest.mark.parametrize("case", SHARE_CASES, ids=[c.name for c in SHARE_CASES])
def test_share_victim_selection(case: Case) -> None:
    assert (
        preempt(case.nodes, case.pods, case.preemptor, case.proposed, **case.kwargs)
        == case.expected
    )


def test_a_gang_preemptor_is_told_the_whole_gpus_a_shared_device_frees() -> None:
    """select_victims tells a gang preemptor's check whole GPUs: a device whose every share
    goes counts as one, shares freed elsewhere count as none."""
    nodes = [share_node(gpus=2)]
    pods = [shared("a0", "g", [0]), shared("a1", "g", [0]), shared("b0", "g", [1], gib=20)]
    scheduler = scheduler_for(nodes, pods)
    told: list[tuple[str, int]] = []

    def group_can_fit(node: str, freed: int) -> bool:
        told.append((node, freed))
        return True

    request = pod_request(make_pod("p", gpus=1, priority=HIGH))
    chosen = select_victims(
        scheduler.inventory, request, {"g": [Victim("a0")]}, scheduler.config,
        group_can_fit=group_can_fit,
    )  # fmt: skip
    assert {n: v.uids for n, v in chosen.items()} == {"g": ["b0"]}
    assert told == [("g", 1)]


# -------------------------------------------------------------------------- addresses

RACK_A = make_node("a1", cpu="4", labels={"topology.kubernetes.io/rack": "a"})
POOL = make_ip_pool("rack-a", ranges=[("10.20.1.15", "10.20.1.16")], rack="a")


def test_the_holder_of_an_address_is_evicted_only_when_the_preemptor_needs_that_address() -> None:
    holder = bound_ip_pod(
        "holder", uid="holder", node="a1", ip="10.20.1.15", pool="rack-a", priority=LOW, cpu="1"
    )
    filler = make_pod("filler", uid="filler", node="a1", cpu="2", priority=LOW)
    wants_it = ip_pod("p", ip="10.20.1.15", cpu="2", priority=HIGH)
    assert preempt([RACK_A], [holder, filler], wants_it, {"a1": ["filler"]}, pools=[POOL]) == {
        "a1": ["holder"]
    }
    any_address = ip_pod("q", pool="rack-a", cpu="2", priority=HIGH)
    assert preempt([RACK_A], [holder, filler], any_address, {"a1": ["filler"]}, pools=[POOL]) == {
        "a1": ["filler"]
    }
    lower = ip_pod("r", ip="10.20.1.15", cpu="2", priority=LOW)
    assert preempt([RACK_A], [holder, filler], lower, {"a1": ["filler"]}, pools=[POOL]) == {}


RACK_B = make_node("b1", cpu="4", labels={"topology.kubernetes.io/rack": "b"})
POOL_B = make_ip_pool("rack-b", ranges=[("10.20.2.15", "10.20.2.15")], rack="b")


def sticky(
    ordinal: int, ip: str, *, node: str = "a1", pool: str = "rack-a"
) -> list[dict[str, Any]]:
    """A StatefulSet pod holding ``ip`` under the IPClaim of its identity (pod, claim)."""
    uid = f"web-{ordinal}"
    pod = ip_pod(uid, uid=uid, ip=ip, pool=pool, policy="sticky", statefulset="web", node=node,
                 priority=LOW, cpu="1")  # fmt: skip
    return [pod, make_ip_claim(pool, ip, f"sts/default/web/{ordinal}", holder_uid=uid)]


def plain(name: str, ip: str, *, node: str = "a1", pool: str = "rack-a") -> list[dict[str, Any]]:
    return [bound_ip_pod(name, uid=name, node=node, ip=ip, pool=pool, priority=LOW, cpu="1")]


def filler(node: str = "a1") -> list[dict[str, Any]]:
    return [make_pod("filler", uid="filler", node=node, cpu="2", priority=LOW)]


@dataclass
class AddressCase:
    name: str
    objects: list[dict[str, Any]]  # pods and IPClaims
    preemptor: dict[str, Any]
    proposed: dict[str, list[str]]
    # The filter verdict on the proposed node: its reason, and whether it is unresolvable.
    verdict: tuple[str, bool]
    expected: dict[str, list[str]]


KEPT = "schedext: address 10.20.1.15 of pool rack-a held by default/web-0, kept by the claim of "
KEPT += "sts/default/web/0: preemption cannot free it"

ADDRESS_CASES = [
    AddressCase(
        "exhausted pool whose addresses are all kept by claims: no victim frees one",
        [*sticky(0, "10.20.1.15"), *sticky(1, "10.20.1.16")],
        ip_pod("p", pool="rack-a", priority=HIGH),
        {"a1": ["web-0"]},
        ("schedext: IP pool rack-a exhausted", True),
        {},
    ),
    AddressCase(
        "exhausted pool: the holder without a claim is the victim, never the sticky one",
        [*sticky(0, "10.20.1.15"), *plain("plain", "10.20.1.16")],
        ip_pod("p", pool="rack-a", priority=HIGH),
        {"a1": ["web-0"]},
        ("schedext: IP pool rack-a exhausted", False),
        {"a1": ["plain"]},
    ),
    AddressCase(
        "an address kept by a claim: its holder is never evicted for it",
        [*sticky(0, "10.20.1.15"), *filler()],
        ip_pod("p", ip="10.20.1.15", cpu="2", priority=HIGH),
        {"a1": ["filler"]},
        (KEPT, True),
        {},
    ),
    AddressCase(
        "an address held without a claim: its lower-priority holder is the victim",
        [*plain("plain", "10.20.1.15"), *filler()],
        ip_pod("p", ip="10.20.1.15", cpu="2", priority=HIGH),
        {"a1": ["filler"]},
        ("schedext: address 10.20.1.15 of pool rack-a held by default/plain", False),
        {"a1": ["plain"]},
    ),
    AddressCase(
        "an address held without a claim, by a pod of equal priority: no victim",
        [*plain("plain", "10.20.1.15"), *filler()],
        ip_pod("p", ip="10.20.1.15", cpu="2", priority=LOW),
        {"a1": ["filler"]},
        ("schedext: address 10.20.1.15 of pool rack-a held by default/plain", True),
        {},
    ),
    AddressCase(
        "the claim of the pod's own identity does not keep its address from it",
        [
            *plain("squatter", "10.20.1.15"),
            make_ip_claim("rack-a", "10.20.1.15", "sts/default/web/0"),
        ],
        ip_pod("web-0", policy="sticky", pool="rack-a", statefulset="web", priority=HIGH),
        {"a1": ["squatter"]},
        ("schedext: address 10.20.1.15 of pool rack-a held by default/squatter", False),
        {"a1": ["squatter"]},
    ),
    AddressCase(
        "several pools: only a pool selecting the node can give the address there",
        [*plain("hb", "10.20.2.15", node="b1", pool="rack-b"), *filler("b1")],
        ip_pod("p", pool="rack-a,rack-b", cpu="2", priority=HIGH),
        {"b1": ["filler"]},
        ("schedext: IP pool rack-b exhausted", False),
        {"b1": ["hb"]},
    ),
    AddressCase(
        "several pools: the node's only pool is exhausted and kept by a claim",
        [*sticky(0, "10.20.2.15", node="b1", pool="rack-b"), *filler("b1")],
        ip_pod("p", pool="rack-a,rack-b", cpu="2", priority=HIGH),
        {"b1": ["filler"]},
        ("schedext: IP pool rack-b exhausted", True),
        {},
    ),
]


@pytest.mark.parametrize("case", ADDRESS_CASES, ids=[c.name for c in ADDRESS_CASES])
def test_address_victims(case: AddressCase) -> None:
    pods = [o for o in case.objects if o.get("kind") != "IPClaim"]
    claims = [o for o in case.objects if o.get("kind") == "IPClaim"]
    world = {"pools": [POOL, POOL_B], "claims": claims}
    scheduler = scheduler_for([RACK_A, RACK_B], pods, **world)
    (node,) = case.proposed
    verdict = scheduler.filter(case.preemptor, [node])
    assert (verdict.failed.get(node), node in verdict.unresolvable) == case.verdict
    victims = preempt([RACK_A, RACK_B], pods, case.preemptor, case.proposed, **world)
    assert victims == case.expected


def test_an_exhausted_pool_needs_one_of_its_holders_on_the_node_evicted() -> None:
    holders = [
        bound_ip_pod(
            f"h{i}", uid=f"h{i}", node="a1", ip=f"10.20.1.{15 + i}", pool="rack-a", priority=LOW
        )
        for i in range(2)
    ]
    pod = ip_pod("p", pool="rack-a", priority=HIGH)
    assert preempt([RACK_A], holders, pod, {"a1": ["h0"]}, pools=[POOL]) == {"a1": ["h0"]}


# ------------------------------------------------------------------------------ gangs


def gang_on(node: str, ids: list[list[int]], *, priority: int = LOW) -> list[dict[str, Any]]:
    return [
        gang_pod(
            f"member{i}",
            "team",
            gpus=len(g),
            uid=f"member{i}",
            node=node,
            gpu_ids=g,
            priority=priority,
        )
        for i, g in enumerate(ids)
    ]


def test_protect_keeps_gangs_out_of_victim_lists() -> None:
    nodes = [make_node("gang-node", gpus=4), make_node("other", gpus=4)]
    pods = [
        *gang_on("gang-node", [[0, 1], [2, 3]]),
        held("solo0", "other", [0, 1]),
        held("solo1", "other", [2, 3]),
    ]
    result = preempt(
        nodes,
        pods,
        make_pod("p", gpus=4, priority=HIGH),
        {"gang-node": ["member0", "member1"], "other": ["solo0", "solo1"]},
    )
    assert result == {"other": ["solo0", "solo1"]}


def test_whole_group_evicts_a_gang_whole_and_counts_members_elsewhere() -> None:
    nodes = [make_node("n1", gpus=4), make_node("n2", gpus=4)]
    members = [
        gang_pod("m0", "team", gpus=2, uid="m0", node="n1", gpu_ids=[0, 1], priority=LOW),
        gang_pod("m1", "team", gpus=2, uid="m1", node="n1", gpu_ids=[2, 3], priority=LOW),
        gang_pod("m2", "team", gpus=2, uid="m2", node="n2", gpu_ids=[0, 1], priority=LOW),
    ]
    scheduler = Scheduler(gang_victims=GangVictims.WHOLE_GROUP)
    for node in nodes:
        scheduler.upsert_node(node)
    for pod in members:
        scheduler.upsert_pod(pod)
    chosen = scheduler.preempt(make_pod("p", gpus=2, priority=HIGH), {"n1": [Victim("m0")]})
    assert sorted(chosen["n1"].uids) == ["m0", "m1"]  # the gang goes whole on this node
    assert chosen["n1"].extra_pdb_violations == 1  # m2 on n2 is broken too


def test_a_gang_preemptor_preempts_only_where_its_whole_group_then_fits() -> None:
    nodes = [make_node("n1", gpus=4), make_node("n2", gpus=4)]
    victims = [held("v0", "n1", [0, 1, 2, 3]), held("v1", "n2", [0, 1, 2, 3], priority=HIGH + 1)]
    members = [gang_pod(f"g{i}", "big", gpus=4, priority=HIGH) for i in range(2)]  # 8 GPUs together
    group = make_pod_group("big", min_member=2)
    result = preempt(nodes, [*victims, *members], members[0], {"n1": ["v0"]}, groups=[group])
    assert result == {}  # n1 alone cannot make room for the second member
    small = [gang_pod(f"s{i}", "small", gpus=2, priority=HIGH) for i in range(2)]
    ok = preempt(
        nodes,
        [*victims, *small],
        small[0],
        {"n1": ["v0"]},
        groups=[make_pod_group("small", min_member=2)],
    )
    assert ok == {"n1": ["v0"]}
