"""Pods filter turned away for GPUs, a share's room, a MIG device or quota headroom are sent
back to kube-scheduler once schedext's own books see that freed: kube-scheduler's own retry,
on the deletion it sees, can reach filter before schedext's watch has given the room back
(extender.wakeups, extender.capacity_waits). Addresses: tests/unit/test_address_waits.py."""

from __future__ import annotations

import asyncio
import copy
import itertools
from collections.abc import Callable
from typing import Any

import pytest

from app.service.assembly import Service
from app.service.main import create_app
from app.service.settings import load_settings
from extender.capacity_waits import WaitKind
from extender.scheduler import Scheduler
from testbed.builders import A100, elastic_quota, make_node, make_pod, share_pod
from tests.mig_builders import mig_node, mig_pod, mig_uuid
from tests.recorded_events import RecordedEvents

GPU, SHARE, MIG, QUOTA = WaitKind.GPU, WaitKind.SHARE, WaitKind.MIG, WaitKind.QUOTA
NVIDIA_GPU = "nvidia.com/gpu"
NODES = ["h1", "a1", "s1", "m1"]
GIB = 1024


def cluster(scheduler: Scheduler | None = None) -> Scheduler:
    """Every node full for one more pod of its kind:
    h1, 4 H100s, and a1, 4 A100s: a 1-GPU pod on each GPU (h-0..h-3, a-0..a-3);
    s1, 2 H100s: 60 GiB shares on each (s-0, s-1);
    m1, an H100 in MIG mode: two 1g.10gb and one 2g.20gb MIG device, each held;
    team-a's quota: max 4 GPUs, all held (h-0..h-3 are team-a's)."""
    scheduler = scheduler or Scheduler()
    scheduler.upsert_node(make_node("h1", gpus=4))
    scheduler.upsert_node(make_node("a1", gpus=4, model=A100))
    scheduler.upsert_node(make_node("s1", gpus=2))
    scheduler.upsert_node(mig_node("m1", migs={0: ["1g.10gb", "1g.10gb", "2g.20gb"]}))
    scheduler.upsert_quota(elastic_quota("team-a", max={NVIDIA_GPU: 4}))
    for i in range(4):
        scheduler.upsert_pod(holder(f"h-{i}", namespace="team-a", node="h1", gpu_ids=[i]))
        scheduler.upsert_pod(holder(f"a-{i}", node="a1", gpu_ids=[i]))
    for i in range(2):
        scheduler.upsert_pod(
            share_pod(f"s-{i}", uid=f"s-{i}", memory_mib=60 * GIB, node="s1", gpu_ids=[i])
        )
    for m, profile in enumerate(["1g.10gb", "1g.10gb", "2g.20gb"]):
        scheduler.upsert_pod(
            mig_pod(f"m-{m}", {profile: 1}, uid=f"m-{m}", node="m1",
                    mig_uuids=[mig_uuid("m1", 0, m)])
        )  # fmt: skip
    return scheduler


def holder(name: str, **kwargs: Any) -> dict[str, Any]:
    return make_pod(name, uid=name, gpus=1, **kwargs)


WAITERS: dict[str, dict[str, Any]] = {
    "whole": make_pod("w", uid="w", gpus=1),
    "whole H100": make_pod("w", uid="w", gpus=1, model="H100"),
    "share": share_pod("w", uid="w", memory_mib=40 * GIB),
    "mig": mig_pod("w", {"1g.10gb": 1}, uid="w"),
    "team-a": make_pod("w", uid="w", gpus=1, namespace="team-a"),
}

_clock = itertools.count(step=10)  # seconds apart: never within a pod's one nudge a second


def requeued(scheduler: Scheduler) -> list[tuple[str, WaitKind]]:
    return [(n.pod, n.kind) for n in scheduler.take_capacity_requeues(float(next(_clock)))]


def turned_away(scheduler: Scheduler, waiter: str) -> None:
    pod = WAITERS[waiter]
    scheduler.upsert_pod(pod)  # the watch sees it pending
    assert scheduler.filter(pod, NODES).passed == []
    assert requeued(scheduler) == []  # nothing freed since


def delete(uid: str) -> Callable[[Scheduler], object]:
    return lambda s: s.delete_pod(uid)


def finish(pod: dict[str, Any]) -> Callable[[Scheduler], object]:
    """The watch shows ``pod`` Succeeded."""
    done = copy.deepcopy(pod)
    done["status"]["phase"] = "Succeeded"
    return lambda s: s.upsert_pod(done)


def then_node(before: dict[str, Any], after: dict[str, Any]) -> Callable[[Scheduler], object]:
    """A node added (its nudges taken), then changed."""
    return lambda s: (s.upsert_node(before), requeued(s), s.upsert_node(after))


W = "default/w"
CASES: list[tuple[str, str, Callable[[Scheduler], object], list[tuple[str, WaitKind]]]] = [
    ("a whole GPU's holder is deleted", "whole", delete("h-0"), [(W, GPU)]),
    ("a whole GPU's holder finishes", "whole",
     finish(holder("a-1", node="a1", gpu_ids=[1])), [(W, GPU)]),
    ("a share's holder is deleted: the whole GPU under it is free", "whole", delete("s-0"),
     [(W, GPU)]),
    ("an A100 is freed for a pod that asks for H100s", "whole H100", delete("a-0"), []),
    ("an H100 is freed for a pod that asks for H100s", "whole H100", delete("h-2"), [(W, GPU)]),
    ("a node is added", "whole", lambda s: s.upsert_node(make_node("h2", gpus=4)), [(W, GPU)]),
    ("a node without GPUs is added", "whole", lambda s: s.upsert_node(make_node("c1")), []),
    ("a node without GPUs changes", "whole", then_node(make_node("c1"), make_node("c1", cpu="64")),
     []),
    ("a node that had no GPU gets some", "whole H100",
     then_node(make_node("c1"), make_node("c1", gpus=2)), [(W, GPU)]),
    ("a node gets more GPUs", "whole H100", lambda s: s.upsert_node(make_node("h1", gpus=8)),
     [(W, GPU)]),
    ("a node of another model gets more GPUs", "whole H100",
     lambda s: s.upsert_node(make_node("a1", gpus=8, model=A100)), []),
    ("a node's labels change, nothing else", "whole H100",
     lambda s: s.upsert_node(make_node("h1", gpus=4, labels={"team": "x"})), [(W, GPU)]),
    ("a pod holding no GPU is deleted", "whole",
     lambda s: (s.upsert_pod(make_pod("cpu", uid="cpu", node="h1")), s.delete_pod("cpu")), []),
    ("a share's holder is deleted", "share", delete("s-1"), [(W, SHARE)]),
    ("a whole GPU's holder is deleted: a share fits there", "share", delete("h-3"),
     [(W, SHARE)]),
    ("a MIG device of the profile is freed", "mig", delete("m-1"), [(W, MIG)]),
    ("a MIG device of another profile is freed", "mig", delete("m-2"), []),
    ("a whole GPU is freed for a pod waiting for a MIG device", "mig", delete("h-0"), []),
    ("a pod of the team over its max is deleted", "team-a", delete("h-1"), [("team-a/w", QUOTA)]),
    ("the team's quota is raised", "team-a",
     lambda s: s.upsert_quota(elastic_quota("team-a", max={NVIDIA_GPU: 8})),
     [("team-a/w", QUOTA)]),
    ("the team's quota is deleted", "team-a",
     lambda s: s.delete_quota(elastic_quota("team-a")), [("team-a/w", QUOTA)]),
    ("a pod of another team is deleted", "team-a", delete("a-2"), []),
    ("the waiting pod is deleted first", "whole",
     lambda s: (s.delete_pod("w"), s.delete_pod("h-0")), []),
    ("the waiting pod is bound meanwhile", "whole",
     lambda s: (s.upsert_pod(make_pod("w", uid="w", gpus=1, node="h2")), s.delete_pod("h-0")), []),
]  # fmt: skip


@pytest.mark.parametrize(("name", "waiter", "then", "expected"), CASES, ids=[c[0] for c in CASES])
def test_a_pod_turned_away_is_sent_back_when_schedext_sees_what_it_waits_for_freed(
    name: str,
    waiter: str,
    then: Callable[[Scheduler], object],
    expected: list[tuple[str, WaitKind]],
) -> None:
    scheduler = cluster()
    turned_away(scheduler, waiter)
    then(scheduler)
    assert requeued(scheduler) == expected
    assert requeued(scheduler) == []  # sent back once


def test_a_pod_turned_away_again_after_its_nudge_waits_again() -> None:
    scheduler = cluster()
    turned_away(scheduler, "whole")
    scheduler.delete_pod("h-0")
    assert requeued(scheduler) == [(W, GPU)]
    scheduler.upsert_pod(holder("taker", node="h1", gpu_ids=[0]))  # another pod was first
    turned_away(scheduler, "whole")
    scheduler.delete_pod("taker")
    assert requeued(scheduler) == [(W, GPU)]


def test_a_bind_given_up_gives_its_gpus_back_to_those_waiting() -> None:
    scheduler = cluster()
    scheduler.delete_pod("h-0")
    taker = make_pod("taker", uid="taker", gpus=1)
    assert scheduler.filter(taker, NODES).passed == ["h1"]
    plan = scheduler.plan_bind(uid="taker", namespace="default", name="taker", node="h1", now=0)
    turned_away(scheduler, "whole")
    scheduler.abort_bind(plan)
    assert requeued(scheduler) == [(W, GPU)]


def test_a_pod_no_longer_turned_away_for_room_waits_no_more() -> None:
    scheduler = cluster()
    turned_away(scheduler, "whole")
    scheduler.upsert_node(make_node("big", gpus=8))
    requeued(scheduler)  # the new node's nudge
    assert scheduler.filter(WAITERS["whole"], [*NODES, "big"]).passed == ["big"]
    turned_away(scheduler, "whole")  # offered the full nodes only: waits again
    scheduler.delete_pod("h-0")
    assert requeued(scheduler) == [(W, GPU)]


def test_a_borrower_held_back_is_sent_back_when_a_pending_pod_of_another_team_goes() -> None:
    scheduler = Scheduler()
    scheduler.upsert_node(make_node("n1", gpus=8))
    for team in ("team-a", "team-b"):
        scheduler.upsert_quota(elastic_quota(team, min={NVIDIA_GPU: 4}, max={NVIDIA_GPU: 8}))
    for i in range(4):
        scheduler.upsert_pod(make_pod(f"b-{i}", uid=f"b-{i}", gpus=1, namespace="team-b",
                                      node="n1", gpu_ids=[i]))  # fmt: skip
    scheduler.upsert_pod(make_pod("b-wants", uid="b-wants", gpus=4, namespace="team-b"))
    borrower = make_pod("a-big", uid="a-big", gpus=5, namespace="team-a")
    scheduler.upsert_pod(borrower)
    assert scheduler.filter(borrower, ["n1"]).passed == []
    scheduler.delete_pod("b-wants")  # a pending pod: no GPU freed, but less wanted
    assert requeued(scheduler) == [("team-a/a-big", QUOTA)]


def test_the_shell_sends_a_nudge_held_back_when_its_second_has_passed() -> None:
    recorded = RecordedEvents()
    service: Service = create_app(load_settings(), events=recorded).state.service
    now = [100.0]
    service.clock = lambda: now[0]
    scheduler, waiter = cluster(service.scheduler), WAITERS["whole"]
    scheduler.upsert_pod(waiter)
    scheduler.filter(waiter, NODES)
    scheduler.delete_pod("h-0")
    service.requeue_waiters()
    assert recorded.requeued == [(W, "w")]
    scheduler.upsert_pod(holder("taker", node="h1", gpu_ids=[0]))  # another pod was first
    assert scheduler.filter(waiter, NODES).passed == []
    scheduler.delete_pod("taker")  # and went at once
    now[0] += 0.5
    service.requeue_waiters()
    assert recorded.requeued == [(W, "w")]  # not twice within a second
    assert service.scheduler.next_requeue_at() == 101.0
    now[0] = 101.0
    service.requeue_waiters()
    assert recorded.requeued == [(W, "w")] * 2
    metrics = service.metrics.render().decode()
    assert 'schedext_requeues_total{kind="gpu"} 2.0' in metrics


def test_a_nudge_held_back_is_sent_by_the_shells_timer_with_no_event_after_it() -> None:
    async def scenario() -> list[tuple[str, str]]:
        recorded = RecordedEvents()
        service: Service = create_app(load_settings(), events=recorded).state.service
        scheduler, waiter = cluster(service.scheduler), WAITERS["whole"]
        scheduler.upsert_pod(waiter)
        scheduler.filter(waiter, NODES)
        service.core(lambda s: s.delete_pod("h-0"))  # nudged at once
        scheduler.upsert_pod(holder("taker", node="h1", gpu_ids=[0]))
        scheduler.filter(waiter, NODES)
        service.core(lambda s: s.delete_pod("taker"))  # within the second: held back
        assert recorded.requeued == [(W, "w")]
        await asyncio.sleep(1.2)  # nothing else happens: the timer sends it
        return recorded.requeued

    assert asyncio.run(scenario()) == [(W, "w")] * 2
