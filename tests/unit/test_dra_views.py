"""What the views read of DRA (extender.shell_reads, extender.explain): the problems the shell
reports (the ledger's own, and held devices that cannot be mapped to a GPU on a node whose
GPUs schedext counts), and explain's sentences per node (the owner, which claims hold which
devices)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from extender.dra import Ownership, Problem, decode_slice
from extender.explain import DRA_LINES, dra_lines
from extender.scheduler import Scheduler
from testbed.builders import agent_annotations, make_node, make_pod
from testbed.dra_builders import dra_pod, gpu, resource_claim, resource_slice, result

Obj = dict[str, Any]
Step = Callable[[Scheduler], object]
NO_UUIDS = "the node agent publishes no GPU UUIDs"


def agent_node(gpus: int = 4) -> Obj:
    """A node with schedext's agent: its UUIDs are the DRA devices' (GPU-n1-<index>)."""
    return make_node("n1", gpus=gpus, annotations=agent_annotations(gpus, uuid_prefix="GPU-n1"))


def dra_slice(gpus: int = 4, **kwargs: Any) -> Obj:
    return resource_slice("n1", [gpu(i, **kwargs) for i in range(gpus)])


def claim(name: str, *devices: str, **kwargs: Any) -> Obj:
    return resource_claim(
        name, namespace="ml", results=[result("n1", d, **kwargs) for d in devices], node="n1"
    )


def fed(*steps: Step) -> Scheduler:
    scheduler = Scheduler()
    for step in steps:
        step(scheduler)
    return scheduler


def unmapped(claim_key: str, device: str, why: str) -> Problem:
    return Problem(
        "ResourceClaim",
        claim_key,
        f"holds gpu.nvidia.com/n1/{device} on node n1, which schedext cannot map to a GPU "
        f"({why}): not counted in use",
    )


UNREADABLE = resource_slice("n1", [gpu(0)], api_version="resource.k8s.io/v9")
UNREADABLE_WHY = getattr(decode_slice(UNREADABLE), "problem", "")


@dataclass(frozen=True)
class ProblemCase:
    id: str
    steps: tuple[Step, ...]
    problems: tuple[Problem, ...]


PROBLEM_CASES = [
    ProblemCase(
        "a claim on devices the agent maps: none",
        (
            lambda s: s.upsert_node(agent_node()),
            lambda s: s.upsert_resource_slice(dra_slice()),
            lambda s: s.upsert_resource_claim(claim("train", "gpu-1")),
        ),
        (),
    ),
    ProblemCase(
        "a claim naming a device no slice has: the ledger's problem, once",
        (
            lambda s: s.upsert_node(agent_node()),
            lambda s: s.upsert_resource_slice(dra_slice()),
            lambda s: s.upsert_resource_claim(claim("ghost", "gpu-9")),
        ),
        (Problem("ResourceClaim", "ml/ghost", "gpu.nvidia.com/n1/gpu-9 is in no ResourceSlice"),),
    ),
    ProblemCase(
        "device-plugin GPUs without the agent's UUIDs: each claim's held device is a problem",
        (
            lambda s: s.upsert_node(make_node("n1", gpus=4)),
            lambda s: s.upsert_resource_slice(dra_slice()),
            lambda s: s.upsert_resource_claim(claim("a", "gpu-0")),
            lambda s: s.upsert_resource_claim(claim("b", "gpu-2", "gpu-3")),
        ),
        (
            unmapped("ml/a", "gpu-0", NO_UUIDS),
            unmapped("ml/b", "gpu-2", NO_UUIDS),
            unmapped("ml/b", "gpu-3", NO_UUIDS),
        ),
    ),
    ProblemCase(
        "a UUID the agent does not list",
        (
            lambda s: s.upsert_node(agent_node()),
            lambda s: s.upsert_resource_slice(resource_slice("n1", [gpu(0, uuid="GPU-other")])),
            lambda s: s.upsert_resource_claim(claim("a", "gpu-0")),
        ),
        (unmapped("ml/a", "gpu-0", "UUID GPU-other is none of the node agent's GPUs"),),
    ),
    ProblemCase(
        "a DRA-only node (no GPUs schedext counts): nothing to hand out twice, no problem",
        (
            lambda s: s.upsert_node(make_node("n1")),
            lambda s: s.upsert_resource_slice(dra_slice()),
            lambda s: s.upsert_resource_claim(claim("a", "gpu-0")),
        ),
        (),
    ),
    ProblemCase(
        "an unreadable slice: the decoder's reason",
        (lambda s: s.upsert_resource_slice(UNREADABLE),),
        (Problem("ResourceSlice", "n1-gpu.nvidia.com-1", UNREADABLE_WHY),),
    ),
]


@pytest.mark.parametrize("case", PROBLEM_CASES, ids=lambda c: c.id)
def test_dra_problems_are_the_ledgers_and_the_held_devices_no_gpu_maps(case: ProblemCase) -> None:
    assert fed(*case.steps).dra_problems() == case.problems


def keys(uid: str) -> str:
    return {"u1": "ml/pod-u1"}.get(uid, "")


@dataclass(frozen=True)
class LinesCase:
    id: str
    steps: tuple[Step, ...]
    lines: tuple[str, ...]


LINE_CASES = [
    LinesCase("a node DRA does not know: nothing", (lambda s: s.upsert_node(agent_node()),), ()),
    LinesCase(
        "device plugin and DRA: the owner is mixed; a held GPU by index, its claim and pod",
        (
            lambda s: s.upsert_node(agent_node()),
            lambda s: s.upsert_resource_slice(dra_slice()),
            lambda s: s.upsert_resource_claim(claim("train", "gpu-1", "gpu-2")),
            lambda s: s.upsert_pod(dra_pod("u1", namespace="ml", claims={"gpu": "train"})),
        ),
        (
            "owner mixed: both the device plugin and DRA advertise its GPUs",
            "gpu.nvidia.com/n1/gpu-1 (GPU 1) held by claim ml/train for pod ml/pod-u1",
            "gpu.nvidia.com/n1/gpu-2 (GPU 2) held by claim ml/train for pod ml/pod-u1",
        ),
    ),
    LinesCase(
        "DRA alone, no agent: the owner, and held devices not counted, with why",
        (
            lambda s: s.upsert_node(make_node("n1")),
            lambda s: s.upsert_resource_slice(dra_slice(shared=True)),
            lambda s: s.upsert_resource_claim(
                claim("a", "gpu-0", share_id="s1", consumed_memory="10Gi")
            ),
            lambda s: s.upsert_resource_claim(
                claim("b", "gpu-0", share_id="s2", consumed_memory="20Gi")
            ),
        ),
        (
            "owner dra: DRA hands out its GPUs (ResourceSlices), not the device plugin",
            f"gpu.nvidia.com/n1/gpu-0 (not counted: {NO_UUIDS}) held by claims ml/a, ml/b "
            "(shares of 30720 MiB)",
        ),
    ),
    LinesCase(
        "a device no slice has",
        (
            lambda s: s.upsert_node(agent_node()),
            lambda s: s.upsert_resource_claim(claim("ghost", "gpu-9")),
        ),
        (
            "gpu.nvidia.com/n1/gpu-9 (not counted: gpu.nvidia.com/n1/gpu-9 is in no "
            "ResourceSlice) held by claim ml/ghost",
        ),
    ),
]


@pytest.mark.parametrize("case", LINE_CASES, ids=lambda c: c.id)
def test_explain_says_who_owns_the_gpus_and_which_claims_hold_which_devices(
    case: LinesCase,
) -> None:
    scheduler = fed(*case.steps)
    spec = scheduler.inventory.spec("n1")
    uuids = spec.gpu_uuids if spec is not None else ()
    lines = dra_lines(scheduler.gpu_owner("n1"), scheduler.dra_node("n1"), uuids, keys)
    assert lines == case.lines


def test_explain_lists_the_first_held_devices_and_counts_the_rest() -> None:
    count = DRA_LINES + 3
    scheduler = fed(
        lambda s: s.upsert_resource_slice(dra_slice(count)),
        lambda s: s.upsert_resource_claim(claim("big", *(f"gpu-{i}" for i in range(count)))),
    )
    lines = dra_lines(Ownership.DRA, scheduler.dra_node("n1"), (), keys)
    assert len(lines) == 1 + DRA_LINES + 1
    assert lines[-1] == "and 3 more devices held by claims"


def test_a_pending_pods_explanation_carries_each_nodes_dra_lines() -> None:
    scheduler = fed(
        lambda s: s.upsert_node(agent_node(2)),
        lambda s: s.upsert_node(make_node("plain", gpus=2)),
        lambda s: s.upsert_resource_slice(dra_slice(2)),
        lambda s: s.upsert_resource_claim(claim("train", "gpu-0", "gpu-1")),
    )
    pod = make_pod("wants", namespace="ml", gpus=1)
    scheduler.filter(pod, ["n1", "plain"])
    explanation = scheduler.explain("ml", "wants")
    assert explanation is not None
    nodes = {n.node: n for n in explanation.nodes}
    assert nodes["plain"].dra == ()
    assert nodes["n1"].dra == (
        "owner mixed: both the device plugin and DRA advertise its GPUs",
        "gpu.nvidia.com/n1/gpu-0 (GPU 0) held by claim ml/train",
        "gpu.nvidia.com/n1/gpu-1 (GPU 1) held by claim ml/train",
    )
    assert not nodes["n1"].fits
