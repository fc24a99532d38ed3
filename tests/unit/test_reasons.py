"""Reason precedence: when several reasons apply to a node, the earliest in PRECEDENCE wins, so
what no eviction can change is reported before what preemption might fix."""

from __future__ import annotations

from typing import Any

import pytest

from extender.model import PRECEDENCE, Reason
from testbed.builders import A100, T4, ip_pod, make_ip_pool, make_node, make_pod
from tests.unit.helpers import scheduler_with


def test_every_reason_but_fits_has_exactly_one_place() -> None:
    assert sorted(PRECEDENCE) == sorted(r for r in Reason if r is not Reason.FITS)
    assert len(set(PRECEDENCE)) == len(PRECEDENCE)


def test_what_preemption_cannot_help_comes_before_what_it_can() -> None:
    first_resolvable = min(i for i, r in enumerate(PRECEDENCE) if r.resolvable)
    unresolvable_per_node = [
        r for r in PRECEDENCE[first_resolvable:] if not r.resolvable and "GANG" not in r.name
    ]
    assert unresolvable_per_node == []  # gang reasons are whole-pod: never combined per node


FULL_T4 = [make_pod("b", gpus=2, node="n", gpu_ids=[0, 1])]

CASES = [
    # (id, node, pods bound there, pod, winning reason)
    ("another model, and too few GPUs free", make_node("n", gpus=2, model=T4), FULL_T4,
     make_pod(gpus=1, model="A100"), Reason.GPU_MODEL),
    ("too few GPUs at all, and none free", make_node("n", gpus=2, model=A100), FULL_T4,
     make_pod(gpus=4), Reason.GPU_TOTAL),
    ("too little memory per GPU, and none free", make_node("n", gpus=2, model=T4), FULL_T4,
     make_pod(gpus=1, gpu_memory_mib=40000), Reason.GPU_MEMORY),
    ("a small node for CPU-intensive work, and too little CPU free",
     make_node("n", cpu="1"), [make_pod("c", cpu="900m", node="n")],
     make_pod(workload="CPU-intensive", cpu="500m"), Reason.CPU_THRESHOLD),
    ("no pool selects the node, and no GPU free", make_node("n", gpus=2, model=T4), FULL_T4,
     ip_pod("p", pool="p0", gpus=1), Reason.IP_NOT_IN_POOL),
    ("no GPU free, and no CPU free for CPU-intensive work",
     make_node("n", gpus=2, cpu="4"), [make_pod("b", gpus=2, cpu="3", node="n", gpu_ids=[0, 1])],
     make_pod(gpus=1, workload="CPU-intensive", cpu="2"), Reason.GPU_FREE),
]  # fmt: skip


@pytest.mark.parametrize(
    ("node", "bound", "pod", "reason"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_the_earliest_reason_wins(
    node: dict[str, Any], bound: list[dict[str, Any]], pod: dict[str, Any], reason: Reason
) -> None:
    scheduler = scheduler_with([node], bound)
    scheduler.upsert_ip_pool(make_ip_pool("p0", cidr="10.0.0.0/29", rack="elsewhere"))
    verdict = scheduler.filter(pod, ["n"])
    assert [r.reason for r in verdict.rejections] == [reason]
