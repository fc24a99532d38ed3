"""Reclaim through preemption: a preemptor within its min takes back borrowed GPUs, from the
borrowers first, lowest priority first, never from a namespace within its min; without
quotas, preemption is what it was."""

from __future__ import annotations

from typing import Any

import pytest

from extender import names
from extender.model import Victim
from extender.scheduler import Scheduler
from testbed.builders import elastic_quota, make_node, make_pod

GPU = names.GPU_RESOURCE
HIGH = 100

# One 8-GPU node, full. team-a borrows (min 2), team-b is at its min (4), team-c (min 4) is
# empty: its preemptor reclaims.
QUOTAS = [
    elastic_quota("team-a", min={GPU: 2}),
    elastic_quota("team-b", min={GPU: 4}),
    elastic_quota("team-c", min={GPU: 4}),
]


def held(name: str, namespace: str, gpu: int, priority: int) -> dict[str, Any]:
    return make_pod(
        name, uid=name, namespace=namespace, gpus=1, node="n", gpu_ids=[gpu], priority=priority
    )


def preempt(
    pods: list[dict[str, Any]], preemptor: dict[str, Any], quotas: list[dict[str, Any]]
) -> list[str] | None:
    scheduler = Scheduler()
    scheduler.upsert_node(make_node("n", gpus=8))
    for quota in quotas:
        scheduler.upsert_quota(quota)
    for pod in pods:
        scheduler.upsert_pod(pod)
    # kube-scheduler proposes every lower-priority pod of the node; schedext narrows.
    proposed = [Victim(p["metadata"]["uid"]) for p in pods]
    chosen = scheduler.preempt(preemptor, {"n": proposed})
    return chosen["n"].uids if "n" in chosen else None


# team-a: 4 GPUs (borrowing 2) at priorities 50, 40, 30, 20; team-b: 4 at priority 1.
BORROWED = [held(f"a{p}", "team-a", i, p) for i, p in enumerate((50, 40, 30, 20))]
AT_MIN = [held(f"b{i}", "team-b", 4 + i, 1) for i in range(4)]
NO_QUOTA = [held(f"free{i}", "free", 4 + i, 1) for i in range(4)]


def preemptor(namespace: str, gpus: int) -> dict[str, Any]:
    return make_pod("p", namespace=namespace, gpus=gpus, priority=HIGH)


CASES = [
    # (id, pods on the node, preemptor, quotas, victims)
    ("reclaim takes from the borrower, lowest priority first, never the namespace at its min",
     BORROWED + AT_MIN, preemptor("team-c", 2), QUOTAS, ["a30", "a20"]),
    ("reclaim takes borrowers before lower-priority pods of no quota",
     BORROWED + NO_QUOTA, preemptor("team-c", 2), QUOTAS, ["a30", "a20"]),
    ("reclaim goes beyond the borrowers only when what they borrowed is not enough",
     BORROWED + NO_QUOTA, preemptor("team-c", 6), [*QUOTAS[:2], elastic_quota(
         "team-c", min={GPU: 6})], ["a30", "a20", "free0", "free1", "free2", "free3"]),
    ("a namespace within its min is never a victim, even when nothing else frees enough",
     AT_MIN + [held(f"a{i}", "team-a", i, 5) for i in range(2)] + [
         held(f"x{i}", "free", 2 + i, 5) for i in range(2)],
     preemptor("team-c", 4), QUOTAS, None),
    ("a preemptor that would borrow takes by priority, but not from within a min",
     BORROWED + NO_QUOTA, preemptor("team-a", 2), QUOTAS, ["free0", "free1"]),
    ("a pod of no quota takes by priority, but not from within a min",
     BORROWED + AT_MIN, preemptor("free", 2), QUOTAS, ["a30", "a20"]),
    ("a borrower gives back at most what it holds over its min, the rest from others",
     BORROWED + NO_QUOTA, preemptor("team-c", 3), QUOTAS, ["a30", "a20", "free0"]),
    ("no victims when only a borrower's own min would make up the rest",
     BORROWED + AT_MIN, preemptor("team-c", 3), QUOTAS, None),
    ("a preemptor of no quota may not take a borrower below its min either",
     BORROWED + AT_MIN, preemptor("free", 3), QUOTAS, None),
    ("without quotas, priority alone decides, as always",
     BORROWED + AT_MIN, preemptor("team-c", 2), [], ["b0", "b1"]),
]  # fmt: skip


@pytest.mark.parametrize(
    ("pods", "pod", "quotas", "victims"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_reclaim_victims(
    pods: list[dict[str, Any]],
    pod: dict[str, Any],
    quotas: list[dict[str, Any]],
    victims: list[str] | None,
) -> None:
    assert preempt(pods, pod, quotas) == victims
