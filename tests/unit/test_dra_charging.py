"""The GPUs DRA's claims hold are in use for schedext (extender.claimed, through the intake):
never handed to a pod of schedext's, named in filter's message, freed when the claim lets
them go, whatever order the objects arrive in; and a pod whose nvidia.com/gpu a claim serves
(KEP-5004) is counted on the claimed GPUs once.

The node here is mixed (the device plugin and DRA both offer its GPUs): schedext serves such
a node only with the fence on (dra.fence), which these tests turn on; without it filter
refuses the node (tests/unit/test_dra_placement.py)."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from extender.config import DraConfig, PolicyConfig
from extender.model import Reason
from extender.scheduler import Scheduler
from testbed.builders import agent_annotations, make_node, make_pod
from testbed.dra_builders import dra_pod, gpu, resource_claim, resource_slice, result

Obj = dict[str, Any]
NOW = 1000.0


def node(gpus: int = 4) -> Obj:
    return make_node("n1", gpus=gpus, annotations=agent_annotations(gpus, uuid_prefix="GPU-n1"))


def dra_slice(gpus: int = 4) -> Obj:
    return resource_slice("n1", [gpu(i) for i in range(gpus)])


def claim(name: str, devices: tuple[int, ...], **kwargs: Any) -> Obj:
    results = [result("n1", f"gpu-{i}", **kwargs) for i in devices]
    return resource_claim(name, results=results, node="n1")


def free(scheduler: Scheduler) -> tuple[int, ...]:
    view = scheduler.inventory.node("n1")
    assert view is not None
    return view.free_gpu_ids


def fed(*steps: Callable[[Scheduler], object]) -> Scheduler:
    scheduler = Scheduler(PolicyConfig(dra=DraConfig(fence=True)))
    for step in steps:
        step(scheduler)
    return scheduler


@dataclass(frozen=True)
class Case:
    id: str
    steps: tuple[Callable[[Scheduler], object], ...]
    free: tuple[int, ...]


CASES = [
    Case("no claim: every GPU free", (lambda s: s.upsert_node(node()),), (0, 1, 2, 3)),
    Case(
        "a claim holds GPUs 1 and 2",
        (
            lambda s: s.upsert_node(node()),
            lambda s: s.upsert_resource_slice(dra_slice()),
            lambda s: s.upsert_resource_claim(claim("train", (1, 2))),
        ),
        (0, 3),
    ),
    Case(
        "the claim deallocated frees them",
        (
            lambda s: s.upsert_node(node()),
            lambda s: s.upsert_resource_slice(dra_slice()),
            lambda s: s.upsert_resource_claim(claim("train", (1, 2))),
            lambda s: s.upsert_resource_claim(resource_claim("train")),
        ),
        (0, 1, 2, 3),
    ),
    Case(
        "the claim deleted frees them",
        (
            lambda s: s.upsert_node(node()),
            lambda s: s.upsert_resource_slice(dra_slice()),
            lambda s: s.upsert_resource_claim(claim("train", (1, 2))),
            lambda s: s.delete_resource_claim(resource_claim("train")),
        ),
        (0, 1, 2, 3),
    ),
    Case(
        "an adminAccess result holds nothing",
        (
            lambda s: s.upsert_node(node()),
            lambda s: s.upsert_resource_slice(dra_slice()),
            lambda s: s.upsert_resource_claim(claim("monitor", (1,), admin=True)),
        ),
        (0, 1, 2, 3),
    ),
    Case(
        "a share by consumable capacity holds its GPU",
        (
            lambda s: s.upsert_node(node()),
            lambda s: s.upsert_resource_slice(resource_slice("n1", [gpu(0, shared=True)])),
            lambda s: s.upsert_resource_claim(
                claim("infer", (0,), share_id="a", consumed_memory="10Gi")
            ),
        ),
        (1, 2, 3),
    ),
    Case(
        "a GPU the node agent does not list is not guessed at",
        (
            lambda s: s.upsert_node(make_node("n1", gpus=4)),  # no agent: no UUIDs
            lambda s: s.upsert_resource_slice(dra_slice()),
            lambda s: s.upsert_resource_claim(claim("train", (1, 2))),
        ),
        (0, 1, 2, 3),
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_claimed_gpus_are_never_free(case: Case) -> None:
    assert free(fed(*case.steps)) == case.free


def test_the_order_the_objects_arrive_in_does_not_matter() -> None:
    steps = (
        lambda s: s.upsert_node(node()),
        lambda s: s.upsert_resource_slice(dra_slice()),
        lambda s: s.upsert_resource_claim(claim("train", (1, 2))),
    )
    for order in itertools.permutations(steps):
        assert free(fed(*order)) == (0, 3)


def test_filter_names_the_claim_and_bind_gives_the_other_gpus() -> None:
    scheduler = fed(
        lambda s: s.upsert_node(node()),
        lambda s: s.upsert_resource_slice(dra_slice()),
        lambda s: s.upsert_resource_claim(claim("train", (1, 2))),
    )
    three = make_pod("three", gpus=3)
    verdict = scheduler.filter(three, ["n1"])
    (rejection,) = verdict.rejections
    assert rejection.reason is Reason.GPU_IN_USE
    assert "allocated by DRA to claim default/train" in rejection.message
    two = make_pod("two", gpus=2)
    assert scheduler.filter(two, ["n1"]).passed == ["n1"]
    meta = two["metadata"]
    plan = scheduler.plan_bind(uid=meta["uid"], namespace="default", name="two", node="n1", now=NOW)
    assert plan.gpu_ids == (0, 3)


def test_a_pod_whose_gpu_a_claim_serves_is_counted_once() -> None:
    pod = dra_pod("u1", node="n1", extended_claim="ext")
    scheduler = fed(
        lambda s: s.upsert_node(node()),
        lambda s: s.upsert_resource_slice(dra_slice()),
        lambda s: s.upsert_resource_claim(
            resource_claim("ext", results=[result("n1", "gpu-2")], node="n1", reserved_for=["u1"])
        ),
        lambda s: s.upsert_pod(pod),
    )
    assert free(scheduler) == (0, 1, 3)  # its nvidia.com/gpu: 1 is GPU 2, not one more
    view = scheduler.inventory.node("n1")
    assert view is not None
    assert view.holders[2] == "u1"


def test_a_node_seen_after_its_claims_counts_them() -> None:
    scheduler = fed(
        lambda s: s.upsert_resource_slice(dra_slice()),
        lambda s: s.upsert_resource_claim(claim("train", (0,))),
    )
    assert scheduler.inventory.node("n1") is None
    scheduler.upsert_node(node())
    assert free(scheduler) == (1, 2, 3)


def test_a_relist_without_the_claim_frees_its_gpus_and_keeps_the_others() -> None:
    scheduler = fed(
        lambda s: s.upsert_node(node()),
        lambda s: s.upsert_resource_slice(dra_slice()),
        lambda s: s.upsert_resource_claim(claim("gone", (0,))),
        lambda s: s.upsert_resource_claim(claim("kept", (3,))),
    )
    assert free(scheduler) == (1, 2)
    relist = scheduler.resource_claim_relist()
    relist.add([claim("kept", (3,))])
    assert free(scheduler) == (1, 2)  # nothing changes before the commit
    relist.commit()
    assert free(scheduler) == (0, 1, 2)


def test_a_pod_turned_away_for_claimed_gpus_is_sent_back_when_the_claim_lets_go() -> None:
    scheduler = fed(
        lambda s: s.upsert_node(node()),
        lambda s: s.upsert_resource_slice(dra_slice()),
        lambda s: s.upsert_resource_claim(claim("train", (0, 1, 2, 3))),
    )
    waiting = make_pod("waiting", gpus=1)
    assert scheduler.filter(waiting, ["n1"]).passed == []
    assert scheduler.take_capacity_requeues(NOW) == []
    scheduler.upsert_resource_claim(resource_claim("train"))  # deallocated
    assert [n.pod for n in scheduler.take_capacity_requeues(NOW)] == ["default/waiting"]


OWNER_CASES = [
    ("no slices: the device plugin's", (lambda s: s.upsert_node(node()),), "device-plugin"),
    (
        "slices and nvidia.com/gpu allocatable: mixed",
        (lambda s: s.upsert_node(node()), lambda s: s.upsert_resource_slice(dra_slice())),
        "mixed",
    ),
    (
        "slices and no nvidia.com/gpu allocatable: DRA's",
        (lambda s: s.upsert_node(make_node("n1")), lambda s: s.upsert_resource_slice(dra_slice())),
        "dra",
    ),
    (
        "the slices gone: the device plugin's again",
        (
            lambda s: s.upsert_node(node()),
            lambda s: s.upsert_resource_slice(dra_slice()),
            lambda s: s.delete_resource_slice(dra_slice()),
        ),
        "device-plugin",
    ),
]


@pytest.mark.parametrize(
    ("steps", "owner"), [c[1:] for c in OWNER_CASES], ids=[c[0] for c in OWNER_CASES]
)
def test_who_hands_out_a_nodes_gpus(
    steps: tuple[Callable[[Scheduler], object], ...], owner: str
) -> None:
    assert fed(*steps).gpu_owner("n1").value == owner


def test_a_pod_relist_tells_the_ledger_whom_bound_pods_claims_serve() -> None:
    pod = dra_pod("u1", node="n1", extended_claim="ext")
    scheduler = fed(
        lambda s: s.upsert_node(node()),
        lambda s: s.upsert_resource_slice(dra_slice()),
        lambda s: s.upsert_resource_claim(
            resource_claim("ext", results=[result("n1", "gpu-2")], node="n1", reserved_for=["u1"])
        ),
    )
    relist = scheduler.pod_relist()
    relist.add([pod])
    relist.commit()
    assert free(scheduler) == (0, 1, 3)  # its nvidia.com/gpu: 1 is GPU 2, counted once
    assert scheduler.dra_pod_key("u1") == "default/pod-u1"
    gone = scheduler.pod_relist()
    gone.add([])
    gone.commit()
    assert scheduler.dra_pod_key("u1") == ""
