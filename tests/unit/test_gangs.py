"""The gang state machine: quorum, whole-group fit, the bind barrier, timeouts, release, and
competing groups, with an injected clock."""

from __future__ import annotations

import asyncio
import itertools
import random
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from app.service.gangs import GangWaiters
from app.service.metrics import Metrics
from extender import names
from extender.config import SHARE_PRESETS
from extender.errors import BindRefusedError
from extender.gang import FitCache, GangEventKind, fits_all, member_nodes, min_resources_gap
from extender.gang.packing import _exact_fit
from extender.model import BindPlan, GpuShare, PodRequest
from extender.policy import PolicyConfig
from extender.scheduler import Scheduler
from testbed.builders import (
    A100,
    H100,
    gang_pod,
    make_node,
    make_pod,
    make_pod_group,
    name_of,
    share_pod,
    uid_of,
)
from tests.recorded_events import RecordedEvents

OLD = "2026-01-01T00:00:00Z"
NEW = "2026-01-02T00:00:00Z"


def cluster(
    *nodes: dict[str, Any],
    groups: list[dict[str, Any]],
    pods: list[dict[str, Any]] = (),
    **kwargs: Any,
) -> Scheduler:  # type: ignore[assignment]
    scheduler = Scheduler(**kwargs)
    for node in nodes:
        scheduler.upsert_node(node)
    for group in groups:
        scheduler.upsert_pod_group(group)
    for pod in pods:
        scheduler.upsert_pod(pod)  # the informer sees every member
    return scheduler


def bind(scheduler: Scheduler, pod: dict[str, Any], node: str, now: float = 0.0) -> BindPlan:
    return scheduler.plan_bind(
        uid=uid_of(pod), namespace="default", name=name_of(pod), node=node, now=now
    )


def kinds(scheduler: Scheduler) -> list[tuple[GangEventKind, str, tuple[str, ...]]]:
    return [(e.kind, e.group, e.uids) for e in scheduler.take_gang_events()]


def gpus_held(scheduler: Scheduler, node: str) -> int:
    view = scheduler.inventory.node(node)
    assert view is not None
    return sum(1 for holder in view.holders if holder is not None)


# ---------------------------------------------------------------------------- filter


def test_members_are_unresolvable_until_min_member_pods_exist() -> None:
    members = [gang_pod(f"m{i}", "train") for i in range(2)]
    scheduler = cluster(
        make_node("g", gpus=8), groups=[make_pod_group("train", min_member=3)], pods=members
    )
    verdict = scheduler.filter(members[0], ["g"])
    assert verdict.passed == []
    assert verdict.unresolvable == {
        "g": "schedext: waiting for 1 more members of group default/train"
    }


def quorum_events(scheduler: Scheduler) -> list[tuple[str, tuple[tuple[str, str], ...]]]:
    return [
        (e.group, e.pods) for e in scheduler.take_gang_events() if e.kind is GangEventKind.QUORUM
    ]


M0, M1, M2 = (gang_pod(f"m{i}", "train", uid=f"u{i}") for i in range(3))
FULL = (("default/m0", "u0"), ("default/m1", "u1"))  # both turned away, both retried


@pytest.mark.parametrize(
    ("name", "then", "expected"),
    [
        ("the last member arrives", lambda s: s.upsert_pod(M2), [("default/train", FULL)]),
        (
            "the last member is first seen by its own filter",
            lambda s: s.filter(M2, ["g"]),
            [("default/train", FULL)],
        ),
        (
            "a turned-away member is deleted before the last arrives",
            lambda s: (s.delete_pod("u0"), s.upsert_pod(M2)),
            [],  # two members: still short of the quorum, nothing to retry
        ),
        (
            "the group's minMember is lowered",
            lambda s: s.upsert_pod_group(make_pod_group("train", min_member=2)),
            [("default/train", FULL)],
        ),
        (
            "a relist finds the last member",
            lambda s: s.replace_pods([M0, M1, M2]),
            [("default/train", FULL)],
        ),
        ("nothing new", lambda s: s.upsert_pod(M1), []),
    ],
)
def test_members_turned_away_for_missing_ones_are_retried_once_the_quorum_exists(
    name: str, then: Any, expected: list[Any]
) -> None:
    """kube-scheduler retries a pod an extender rejected only on a cluster event about it: the
    core says which members to send back (QUORUM), the shell touches them."""
    scheduler = cluster(
        make_node("g", gpus=8), groups=[make_pod_group("train", min_member=3)], pods=[M0, M1]
    )
    for member in (M0, M1):
        assert scheduler.filter(member, ["g"]).passed == []
    then(scheduler)
    assert quorum_events(scheduler) == expected
    then(scheduler)
    assert quorum_events(scheduler) == []  # each turned-away member is sent back once


def test_a_member_filter_let_through_is_not_retried() -> None:
    scheduler = cluster(
        make_node("g", gpus=8), groups=[make_pod_group("train", min_member=2)], pods=[M0]
    )
    assert scheduler.filter(M0, ["g"]).passed == []
    scheduler.upsert_pod(M1)
    assert quorum_events(scheduler) == [("default/train", (("default/m0", "u0"),))]
    assert scheduler.filter(M1, ["g"]).passed == ["g"]
    scheduler.upsert_pod(M2)
    assert quorum_events(scheduler) == []


def test_the_shell_asks_kube_scheduler_to_retry_the_members() -> None:
    recorded = RecordedEvents()
    waiters = GangWaiters(Metrics(lambda: None), recorded)
    scheduler = cluster(
        make_node("g", gpus=8), groups=[make_pod_group("train", min_member=3)], pods=[M0, M1]
    )
    for member in (M0, M1):
        scheduler.filter(member, ["g"])
    scheduler.upsert_pod(M2)
    waiters.dispatch(scheduler.take_gang_events(), scheduler)
    assert recorded.requeued == [("default/m0", "u0"), ("default/m1", "u1")]
    assert recorded.events == []


def test_bound_members_count_toward_the_quorum() -> None:
    bound = gang_pod("m0", "train", node="g", gpu_ids=[0, 1])
    pending = [gang_pod(f"m{i}", "train") for i in (1, 2)]
    scheduler = cluster(
        make_node("g", gpus=8),
        groups=[make_pod_group("train", min_member=3)],
        pods=[bound, *pending],
    )
    assert scheduler.filter(pending[0], ["g"]).passed == ["g"]


def test_a_member_of_an_unknown_group_gets_a_clear_reason() -> None:
    pod = gang_pod("m0", "nope")
    scheduler = cluster(make_node("g", gpus=8), groups=[], pods=[pod])
    assert scheduler.filter(pod, ["g"]).unresolvable == {
        "g": "schedext: pod group default/nope not found"
    }


def test_a_group_that_cannot_fit_as_a_whole_is_rejected_and_preemption_may_help() -> None:
    members = [gang_pod(f"m{i}", "train", gpus=2) for i in range(4)]  # 8 GPUs, 6 exist
    scheduler = cluster(
        make_node("a", gpus=4),
        make_node("b", gpus=2),
        groups=[make_pod_group("train", min_member=4)],
        pods=members,
    )
    verdict = scheduler.filter(members[0], ["a", "b"])
    assert verdict.failed == dict.fromkeys(
        ["a", "b"], "schedext: not enough free GPUs for all of group default/train"
    )
    assert verdict.unresolvable == {}


def test_whole_group_fit_respects_the_gpu_model_of_each_member() -> None:
    members = [gang_pod(f"m{i}", "train", gpus=4, model="H100") for i in range(2)]
    scheduler = cluster(
        make_node("h", gpus=4, model="NVIDIA-H100-80GB-HBM3"),
        make_node("a", gpus=4, model="NVIDIA-A100-SXM4-40GB"),
        groups=[make_pod_group("train", min_member=2)],
        pods=members,
    )
    assert scheduler.filter(members[0], ["h", "a"]).passed == []


def test_members_beyond_min_member_do_not_block_the_group() -> None:
    members = [gang_pod(f"m{i}", "train", gpus=4) for i in range(3)]
    scheduler = cluster(
        make_node("a", gpus=8), groups=[make_pod_group("train", min_member=2)], pods=members
    )
    assert scheduler.filter(members[0], ["a"]).passed == ["a"]


# ------------------------------------------------------------------ whole-group fit


def need(gpus: int, model: str | None = None, memory_mib: int | None = None) -> PodRequest:
    return PodRequest(
        uid=f"r{gpus}", namespace="default", name="r", gpus=gpus, gpu_model=model,
        gpu_memory_mib=memory_mib,
    )  # fmt: skip


def free_gpus(*nodes: tuple[int, str]) -> Scheduler:
    """Nodes whose GPUs are all free: (count, model) each."""
    return cluster(
        *(make_node(f"n{i}", gpus=n, model=m) for i, (n, m) in enumerate(nodes)), groups=[]
    )


FIT_CASES = [
    # (id, free GPUs per node with their model, requests, fits)
    ("3+2 | 2+2 on 5 and 4 free", [(5, H100), (4, H100)], [need(3), need(2), need(2), need(2)],
     True),
    ("3+3+3 on 5 and 4 free", [(5, H100), (4, H100)], [need(3), need(3), need(3)], False),
    ("one node holds everything", [(8, H100)], [need(4), need(2), need(2)], True),
    ("more than exists", [(4, H100), (2, H100)], [need(2)] * 4, False),
    ("nothing to place", [(1, H100)], [], True),
    ("members without GPUs need none", [(1, H100)], [need(0), need(1), need(0)], True),
    ("a model keeps members off other nodes", [(4, H100), (4, A100)], [need(4, "H100")] * 2, False),
    ("the larger node must go to the model-free member", [(4, H100), (6, A100)],
     [need(4), need(2, "H100")], True),
    ("6+4 | 5+3 with models", [(10, H100), (8, A100)],
     [need(6, "H100"), need(5), need(4, "H100"), need(3)], True),
    ("GPU memory excludes small GPUs", [(8, A100), (2, H100)], [need(2, memory_mib=80_000)] * 2,
     False),
    ("GPU memory allows large GPUs", [(2, A100), (4, H100)], [need(2, memory_mib=80_000)] * 2,
     True),
]  # fmt: skip


@pytest.mark.parametrize(
    ("nodes", "requests", "fits"), [c[1:] for c in FIT_CASES], ids=[c[0] for c in FIT_CASES]
)
def test_whole_group_fit_is_exact(
    nodes: list[tuple[int, str]], requests: list[PodRequest], fits: bool
) -> None:
    scheduler = free_gpus(*nodes)
    assert fits_all(scheduler.inventory, requests, PolicyConfig()) is fits


def test_freed_gpus_count_toward_the_fit() -> None:
    scheduler = free_gpus((4, H100), (4, H100))
    busy = make_pod("busy", uid="busy", gpus=3, node="n1", gpu_ids=[0, 1, 2])
    scheduler.upsert_pod(busy)
    requests = [need(3), need(2), need(2), need(1)]  # 8 GPUs: 5 free, 8 once n1's are freed
    assert not fits_all(scheduler.inventory, requests, PolicyConfig())
    slot = int(scheduler.inventory.ids(["n1"])[0])
    assert fits_all(scheduler.inventory, requests, PolicyConfig(), free_delta={slot: 3})


@pytest.mark.parametrize(
    ("requests", "fits"),
    [([need(3), need(2), need(2), need(2)], False), ([need(4), need(4), need(1)], True)],
    ids=["greedy misses it: rejected", "greedy finds it: accepted"],
)
def test_an_exhausted_search_budget_falls_back_to_greedy(
    requests: list[PodRequest], fits: bool
) -> None:
    scheduler = free_gpus((5, H100), (4, H100))
    assert fits_all(scheduler.inventory, requests, PolicyConfig(), budget=0) is fits


STRANDED = "schedext: the rest of group default/train would not fit with this member here"


@pytest.mark.parametrize(
    ("gpus", "passed", "stranded"),
    [(3, ["a"], ["b"]), (2, ["a", "b"], [])],
    ids=["the 3 must take the 5", "a 2 may go either way"],
)
def test_filter_keeps_a_member_off_nodes_that_would_strand_the_rest_of_its_group(
    gpus: int, passed: list[str], stranded: list[str]
) -> None:
    members = [gang_pod(f"m{i}", "train", gpus=g) for i, g in enumerate([3, 2, 2, 2])]
    scheduler = cluster(
        make_node("a", gpus=5),
        make_node("b", gpus=4),
        groups=[make_pod_group("train", min_member=4)],
        pods=members,
    )
    verdict = scheduler.filter(members[0 if gpus == 3 else 1], ["a", "b"])
    assert verdict.passed == passed
    assert verdict.failed == dict.fromkeys(stranded, STRANDED)
    assert verdict.unresolvable == {}


def test_members_placed_where_kube_scheduler_would_put_them_complete_the_group() -> None:
    """kube-scheduler's loop, in creation order: filter, the best score wins, bind. Bin
    packing prefers the fuller node b for the member of 3, which would strand the rest."""
    members = [gang_pod(f"m{i}", "train", gpus=g) for i, g in enumerate([3, 2, 2, 2])]
    scheduler = cluster(
        make_node("a", gpus=5),
        make_node("b", gpus=4),
        groups=[make_pod_group("train", min_member=4)],
        pods=members,
    )
    for pod in members:
        passed = scheduler.filter(pod, ["a", "b"]).passed
        scores = scheduler.prioritize(pod, passed).tolist()
        bind(scheduler, pod, passed[scores.index(max(scores))])
    assert [k for k, _, _ in kinds(scheduler)] == [GangEventKind.COMPLETE]


def test_the_exact_search_agrees_with_brute_force_on_small_clusters() -> None:
    rng = random.Random(20261122)

    def brute(free: list[int], masks: list[list[bool]], sizes: list[int], kinds: list[int]) -> bool:
        def place(i: int) -> bool:
            if i == len(sizes):
                return True
            for node, room in enumerate(free):
                if masks[kinds[i]][node] and room >= sizes[i]:
                    free[node] -= sizes[i]
                    placed = place(i + 1)
                    free[node] += sizes[i]
                    if placed:
                        return True
            return False

        return place(0)

    for _ in range(500):
        free = [rng.randint(0, 8) for _ in range(rng.randint(1, 6))]
        masks = [[rng.random() < 0.7 for _ in free] for _ in range(rng.randint(1, 3))]
        members = sorted(
            ((rng.randint(1, 6), rng.randrange(len(masks))) for _ in range(rng.randint(1, 7))),
            key=lambda m: (-m[0], m[1]),
        )
        sizes, kinds = [m[0] for m in members], [m[1] for m in members]
        exact = _exact_fit(
            np.array(free, dtype=np.int64), [np.array(m) for m in masks], sizes, kinds, 10**9
        )
        assert exact is brute(free, masks, sizes, kinds), (free, masks, members)


def test_cached_answers_follow_the_inventory() -> None:
    scheduler = free_gpus((4, H100))
    cache = FitCache()
    requests = [need(2), need(2)]
    assert fits_all(scheduler.inventory, requests, PolicyConfig(), cache=cache)
    scheduler.upsert_pod(make_pod("busy", uid="busy", gpus=1, node="n0", gpu_ids=[0]))
    assert not fits_all(scheduler.inventory, requests, PolicyConfig(), cache=cache)
    assert fits_all(scheduler.inventory, [need(3)], PolicyConfig(), cache=cache)


def test_filter_passes_a_group_that_fits_only_when_packed_well() -> None:
    members = [gang_pod(f"m{i}", "train", gpus=g) for i, g in enumerate([3, 2, 2, 2])]
    scheduler = cluster(
        make_node("a", gpus=5),
        make_node("b", gpus=4),
        groups=[make_pod_group("train", min_member=4)],
        pods=members,
    )
    assert scheduler.filter(members[1], ["a", "b"]).passed == ["a", "b"]
    # The bind barrier checks the same way: placing the 3 on a and a 2 on b keeps the group.
    bind(scheduler, members[0], "a")
    bind(scheduler, members[1], "b")
    assert kinds(scheduler) == []
    bind(scheduler, members[2], "b")
    bind(scheduler, members[3], "a")
    assert [k for k, _, _ in kinds(scheduler)] == [GangEventKind.COMPLETE]


GPU = "nvidia.com/gpu"

MIN_RESOURCES_CASES = [
    # (id, spec.minResources, the reason every node gets, or None when the member passes)
    ("GPUs short", {GPU: 20}, f"{GPU} 20 wanted, 14 free"),
    ("CPU short", {"cpu": "100"}, "cpu 100 wanted, 63.9 free"),
    ("memory short", {"memory": "300Gi"}, "memory 300Gi wanted, 255.9Gi free"),
    ("two short", {GPU: "15", "cpu": "64"}, f"cpu 64 wanted, 63.9 free; {GPU} 15 wanted, 14 free"),
    ("all covered", {GPU: 4, "cpu": "500m", "memory": "1Gi"}, None),
    ("resources schedext does not track are not checked", {"example.com/fpga": 4}, None),
    ("the group's own reservations count as free", {GPU: 14}, None),  # 12 + 2 of m2
    # Python's int() refuses over 4300 digits: an unreadable entry, ignored as such
    ("a quantity of 5000 digits is no quantity", {GPU: "1" * 5000}, None),
    ("a quantity over 2^63-1 is no quantity", {"cpu": "1e30"}, None),
]  # fmt: skip


@pytest.mark.parametrize(
    ("min_resources", "reason"),
    [c[1:] for c in MIN_RESOURCES_CASES],
    ids=[c[0] for c in MIN_RESOURCES_CASES],
)
def test_min_resources_of_the_group_must_be_free_in_the_cluster(
    min_resources: dict[str, object], reason: str | None
) -> None:
    members = [gang_pod(f"m{i}", "train", gpus=2) for i in range(3)]
    group = make_pod_group("train", min_member=2)
    group["spec"]["minResources"] = min_resources
    other = make_pod("other", uid="other", gpus=2, node="b", gpu_ids=[0, 1])
    scheduler = cluster(
        make_node("a", gpus=8, cpu="32", memory="128Gi"),
        make_node("b", gpus=8, cpu="32", memory="128Gi"),
        groups=[group],
        pods=[*members, other],
    )
    bind(scheduler, members[2], "a")  # a member already reserved: its share counts as free
    verdict = scheduler.filter(members[0], ["a", "b"])
    if reason is None:
        assert verdict.passed == ["a", "b"]
        return
    message = "schedext: not enough free resources for minResources of group default/train: "
    assert verdict.failed == dict.fromkeys(["a", "b"], message + reason)
    assert verdict.unresolvable == {}  # preemption may help


def test_min_resources_are_checked_once_the_quorum_exists() -> None:
    pod = gang_pod("m0", "train")
    group = make_pod_group("train", min_member=2)
    group["spec"]["minResources"] = {GPU: 100}
    scheduler = cluster(make_node("a", gpus=8), groups=[group], pods=[pod])
    assert scheduler.filter(pod, ["a"]).unresolvable == {
        "a": "schedext: waiting for 1 more members of group default/train"
    }


# --------------------------------------------------------------------------- barrier


def test_bind_waits_until_min_member_are_placed_then_releases_all() -> None:
    members = [gang_pod(f"m{i}", "train", gpus=2) for i in range(3)]
    scheduler = cluster(
        make_node("a", gpus=4),
        make_node("b", gpus=4),
        groups=[make_pod_group("train", min_member=3, timeout_s=10)],
        pods=members,
    )
    first = bind(scheduler, members[0], "a", now=100.0)
    assert scheduler.gang_deadline("default/train") == 110.0
    bind(scheduler, members[1], "a", now=101.0)
    assert kinds(scheduler) == []
    assert gpus_held(scheduler, "a") == 4  # reservations are visible to every later filter
    bind(scheduler, members[2], "b", now=102.0)
    events = kinds(scheduler)
    assert [(k, g) for k, g, _ in events] == [(GangEventKind.COMPLETE, "default/train")]
    assert set(events[0][2]) == {uid_of(members[0]), uid_of(members[1])}
    assert scheduler.gang_deadline("default/train") is None
    assert first.group == "default/train"


def test_a_group_that_does_not_reach_quorum_in_time_releases_every_reservation() -> None:
    members = [gang_pod(f"m{i}", "train", gpus=2) for i in range(3)]
    scheduler = cluster(
        make_node("a", gpus=6),
        groups=[make_pod_group("train", min_member=3, timeout_s=5)],
        pods=members,
    )
    bind(scheduler, members[0], "a", now=0.0)
    bind(scheduler, members[1], "a", now=1.0)
    scheduler.expire(4.9)
    assert kinds(scheduler) == []
    scheduler.expire(5.0)
    events = kinds(scheduler)
    assert [(k, g) for k, g, _ in events] == [(GangEventKind.TIMED_OUT, "default/train")]
    assert set(events[0][2]) == {uid_of(members[0]), uid_of(members[1])}
    assert gpus_held(scheduler, "a") == 0
    assert scheduler.filter(make_pod("solo", gpus=6), ["a"]).passed == [
        "a"
    ]  # a non-gang pod can use them


def test_a_group_that_timed_out_says_how_until_it_completes() -> None:
    members = [gang_pod(f"m{i}", "train", gpus=2) for i in range(3)]
    scheduler = cluster(
        make_node("a", gpus=6),
        groups=[make_pod_group("train", min_member=3, timeout_s=5)],
        pods=members,
    )
    assert scheduler.gang_failure("default/train") is None  # never waited
    bind(scheduler, members[0], "a", now=0.0)
    scheduler.expire(5.0)
    failure = scheduler.gang_failure("default/train")
    assert failure is not None
    assert failure.kind is GangEventKind.TIMED_OUT
    assert failure.reason == "schedext: group default/train did not reach minMember 3 within 5s"
    bind(scheduler, members[0], "a", now=10.0)  # kube-scheduler retries: waiting again
    assert scheduler.gang_failure("default/train") is failure  # the last end still stands
    bind(scheduler, members[1], "a", now=11.0)
    bind(scheduler, members[2], "a", now=12.0)
    assert scheduler.gang_failure("default/train") is None  # completed


def test_a_deleted_group_forgets_how_it_failed() -> None:
    members = [gang_pod(f"m{i}", "train", gpus=2) for i in range(2)]
    scheduler = cluster(
        make_node("a", gpus=6),
        groups=[make_pod_group("train", min_member=2, timeout_s=5)],
        pods=members,
    )
    bind(scheduler, members[0], "a", now=0.0)
    scheduler.expire(5.0)
    scheduler.delete_pod_group(make_pod_group("train", min_member=2))
    assert scheduler.gang_failure("default/train") is None


def test_the_wait_is_capped_below_the_extender_timeout() -> None:
    members = [gang_pod(f"m{i}", "train", gpus=1) for i in range(2)]
    scheduler = cluster(
        make_node("a", gpus=4),
        groups=[make_pod_group("train", min_member=2, timeout_s=3600)],
        pods=members,
        gang_max_wait_s=20,
    )
    bind(scheduler, members[0], "a", now=0.0)
    assert scheduler.gang_deadline("default/train") == 20.0


def test_a_member_deleted_while_waiting_no_longer_counts() -> None:
    members = [gang_pod(f"m{i}", "train", gpus=1) for i in range(3)]
    scheduler = cluster(
        make_node("a", gpus=4), groups=[make_pod_group("train", min_member=2)], pods=members
    )
    bind(scheduler, members[0], "a")
    scheduler.delete_pod(uid_of(members[0]))
    bind(scheduler, members[1], "a")
    assert kinds(scheduler) == []  # still waiting: the deleted member no longer counts
    bind(scheduler, members[2], "a")
    assert [k for k, _, _ in kinds(scheduler)] == [GangEventKind.COMPLETE]


def test_a_member_whose_binding_fails_after_the_barrier_is_retried_alone() -> None:
    """Bindings cannot be undone: the others stay bound, the failed member's GPUs are given
    back, the status counts only what is bound, and the retried member needs no new quorum."""
    members = [gang_pod(f"m{i}", "train", gpus=2) for i in range(3)]
    scheduler = cluster(
        make_node("a", gpus=8), groups=[make_pod_group("train", min_member=3)], pods=members
    )
    plans = [bind(scheduler, pod, "a") for pod in members]
    assert [k for k, _, _ in kinds(scheduler)] == [GangEventKind.COMPLETE]
    scheduler.confirm_bind(plans[0])
    scheduler.abort_bind(plans[1])  # its Binding failed
    scheduler.confirm_bind(plans[2])
    assert gpus_held(scheduler, "a") == 4
    status = scheduler.group_status("default/train")
    assert status is not None
    assert (status.phase, status.scheduled, status.waiting) == ("Scheduling", 2, 0)
    assert scheduler.filter(members[1], ["a"]).passed == ["a"]
    retried = bind(scheduler, members[1], "a", now=50.0)
    assert scheduler.gang_deadline("default/train") is None  # no wait at the barrier
    scheduler.confirm_bind(retried)
    status = scheduler.group_status("default/train")
    assert status is not None
    assert (status.phase, status.scheduled) == ("Scheduled", 3)


def test_a_waiting_bind_whose_timer_fires_first_still_releases_the_whole_group() -> None:
    """The wait's timer runs on the event loop, the core's deadline on the injected clock: when
    the timer fires before the core agrees the group is overdue, the group is released anyway
    (not left holding GPUs until the reservation TTL)."""
    members = [gang_pod(f"m{i}", "train", gpus=2) for i in range(3)]
    scheduler = cluster(
        make_node("a", gpus=8),
        groups=[make_pod_group("train", min_member=3)],
        pods=members,
        gang_max_wait_s=0.05,
    )
    frozen = 100.0  # the injected clock never reaches the deadline (100.05)
    plans = [bind(scheduler, pod, "a", now=frozen) for pod in members[:2]]
    recorded = RecordedEvents()
    waiters = GangWaiters(Metrics(lambda: scheduler), recorded)

    async def wait_both() -> list[str | None]:
        return list(
            await asyncio.gather(*(waiters.wait(plan, scheduler, lambda: frozen) for plan in plans))
        )

    failures = asyncio.run(wait_both())
    assert all(f is not None and "did not reach minMember 3" in f for f in failures)
    assert gpus_held(scheduler, "a") == 0
    assert scheduler.reservation_count == 0
    assert scheduler.waiting_groups() == []
    assert sorted((e.pod, e.reason) for e in recorded.events) == [
        ("default/m0", "GangTimedOut"),
        ("default/m1", "GangTimedOut"),
    ]


# ------------------------------------------------------------------- competing groups

WHOLE_CLUSTER = (make_node("a", gpus=4), make_node("b", gpus=4))


def competing() -> tuple[Scheduler, list[dict[str, Any]], list[dict[str, Any]]]:
    old = [gang_pod(f"old{i}", "old", gpus=2) for i in range(4)]
    new = [gang_pod(f"new{i}", "new", gpus=2) for i in range(4)]
    groups = [
        make_pod_group("old", min_member=4, created=OLD),
        make_pod_group("new", min_member=4, created=NEW),
    ]
    return cluster(*WHOLE_CLUSTER, groups=groups, pods=old + new), old, new


def test_when_two_groups_need_the_same_gpus_the_younger_yields() -> None:
    scheduler, old, new = competing()
    bind(scheduler, old[0], "a")
    with pytest.raises(BindRefusedError, match="group default/new cannot complete now"):
        bind(scheduler, new[0], "b")
    assert kinds(scheduler) == [(GangEventKind.RELEASED, "default/new", ())]
    for pod, node in zip(old[1:], ["a", "b", "b"], strict=True):
        bind(scheduler, pod, node)
    assert [k for k, _, _ in kinds(scheduler)] == [GangEventKind.COMPLETE]
    assert all(scheduler.inventory.holding(uid_of(p)) is None for p in new)


def test_the_older_group_takes_back_gpus_reserved_by_a_younger_one() -> None:
    scheduler, old, new = competing()
    bind(scheduler, new[0], "a")
    bind(scheduler, new[1], "a")  # the younger group got there first
    bind(scheduler, old[0], "b")
    released = kinds(scheduler)
    assert [(k, g) for k, g, _ in released] == [(GangEventKind.RELEASED, "default/new")]
    assert set(released[0][2]) == {uid_of(new[0]), uid_of(new[1])}
    assert gpus_held(scheduler, "a") == 0
    for pod, node in zip(old[1:], ["b", "a", "a"], strict=True):
        bind(scheduler, pod, node)
    assert [k for k, _, _ in kinds(scheduler)] == [GangEventKind.COMPLETE]
    with pytest.raises(BindRefusedError, match="no longer fits node a"):
        bind(scheduler, new[2], "a")  # and the younger group cannot come back in between


def test_a_group_that_can_no_longer_complete_releases_itself() -> None:
    members = [gang_pod(f"m{i}", "trio", gpus=2) for i in range(3)]
    scheduler = cluster(*WHOLE_CLUSTER, groups=[make_pod_group("trio", min_member=3)], pods=members)
    bind(scheduler, members[0], "a")
    # Meanwhile another scheduler's pod takes node b: the third member has nowhere to go.
    scheduler.upsert_pod(
        make_pod("squatter", uid="squatter", gpus=4, node="b", gpu_ids=[0, 1, 2, 3])
    )
    with pytest.raises(BindRefusedError, match="group default/trio cannot complete now"):
        bind(scheduler, members[1], "a")
    events = kinds(scheduler)
    assert events == [(GangEventKind.RELEASED, "default/trio", (uid_of(members[0]),))]
    assert gpus_held(scheduler, "a") == 0


# -------------------------------------------------------------------- rack affinity


def racked(name: str, rack: str, **kwargs: Any) -> dict[str, Any]:
    return make_node(
        name,
        labels={"topology.kubernetes.io/rack": rack, "topology.kubernetes.io/zone": "z1"},
        **kwargs,
    )


def test_members_prefer_the_rack_of_members_already_placed() -> None:
    members = [gang_pod(f"m{i}", "train", gpus=2) for i in range(3)]
    nodes = [
        racked("r1-a", "r1", gpus=4),
        racked("r1-b", "r1", gpus=4),
        racked("r2-a", "r2", gpus=4),
    ]
    scheduler = cluster(*nodes, groups=[make_pod_group("train", min_member=3)], pods=members)
    bind(scheduler, members[0], "r1-a")
    scores = dict(
        zip(
            ["r1-b", "r2-a"],
            scheduler.prioritize(members[1], ["r1-b", "r2-a"]).tolist(),
            strict=True,
        )
    )
    assert scores["r1-b"] > scores["r2-a"]


RACK, ZONE = "topology.kubernetes.io/rack", "topology.kubernetes.io/zone"
MY_RACK, MY_ZONE = "example.com/rack", "example.com/zone"

AFFINITY_CASES = [
    # (id, config, labels per node, where the first member is, candidates best first)
    (
        "same rack, then same zone, then elsewhere",
        PolicyConfig(),
        {
            "a": {RACK: "r1", ZONE: "z1"},
            "b": {RACK: "r1", ZONE: "z1"},
            "c": {RACK: "r2", ZONE: "z1"},
            "d": {RACK: "r3", ZONE: "z2"},
        },
        "a",
        ["b", "c", "d"],
    ),
    (
        "a configured rack label, not the default one",
        PolicyConfig(rack_label=MY_RACK),
        {
            "a": {MY_RACK: "r1", RACK: "x"},
            "b": {MY_RACK: "r1", RACK: "y"},
            "c": {MY_RACK: "r2", RACK: "x"},  # the default label would put c with a
        },
        "a",
        ["b", "c"],
    ),
    (
        "a configured zone label, not the default one",
        PolicyConfig(zone_label=MY_ZONE),
        {
            "a": {MY_ZONE: "z1", ZONE: "q"},
            "b": {MY_ZONE: "z1", ZONE: "w"},
            "c": {MY_ZONE: "z2", ZONE: "q"},  # the default label would put c with a
        },
        "a",
        ["b", "c"],
    ),
]  # fmt: skip


@pytest.mark.parametrize(
    ("config", "labels", "placed", "ranking"),
    [c[1:] for c in AFFINITY_CASES],
    ids=[c[0] for c in AFFINITY_CASES],
)
def test_members_prefer_the_rack_then_the_zone_of_the_group(
    config: PolicyConfig, labels: dict[str, dict[str, str]], placed: str, ranking: list[str]
) -> None:
    members = [gang_pod(f"m{i}", "train", gpus=2) for i in range(3)]
    nodes = [make_node(name, gpus=4, labels=node_labels) for name, node_labels in labels.items()]
    scheduler = cluster(
        *nodes, groups=[make_pod_group("train", min_member=3)], pods=members, config=config
    )
    bind(scheduler, members[0], placed)
    scores = scheduler.prioritize(members[1], ranking).tolist()
    assert scores == sorted(scores, reverse=True)
    assert len(set(scores)) == len(scores), dict(zip(ranking, scores, strict=True))


def test_the_first_member_prefers_a_rack_that_can_hold_the_whole_group() -> None:
    members = [gang_pod(f"m{i}", "train", gpus=2) for i in range(4)]  # 8 GPUs
    busy = make_pod("other", uid="other", gpus=2, node="r1-a", gpu_ids=[0, 1])
    nodes = [
        racked("r1-a", "r1", gpus=4),
        racked("r1-b", "r1", gpus=4),
        racked("r2-a", "r2", gpus=4),
        racked("r2-b", "r2", gpus=4),
    ]
    scheduler = cluster(
        *nodes, groups=[make_pod_group("train", min_member=4)], pods=[*members, busy]
    )
    names = ["r1-a", "r1-b", "r2-a", "r2-b"]
    scores = dict(zip(names, scheduler.prioritize(members[0], names).tolist(), strict=True))
    # r1 has 6 free GPUs, r2 has 8: only r2 can hold the group, despite r1-a being fuller.
    assert min(scores["r2-a"], scores["r2-b"]) > max(scores["r1-a"], scores["r1-b"])


# ------------------------------------------------------------------------- status


def test_group_status_follows_the_phases_scheduler_plugins_uses() -> None:
    members = [gang_pod(f"m{i}", "train", gpus=1) for i in range(2)]
    scheduler = cluster(
        make_node("a", gpus=4), groups=[make_pod_group("train", min_member=2)], pods=members[:1]
    )
    status = scheduler.group_status("default/train")
    assert status is not None
    assert (status.phase, status.members) == ("Pending", 1)
    scheduler.upsert_pod(members[1])
    assert scheduler.group_status("default/train").phase == "PreScheduling"  # type: ignore[union-attr]
    bind(scheduler, members[0], "a")
    assert scheduler.group_status("default/train").phase == "Scheduling"  # type: ignore[union-attr]
    for pod in members:
        scheduler.upsert_pod(
            gang_pod(
                name_of(pod),
                "train",
                gpus=1,
                uid=uid_of(pod),
                node="a",
                gpu_ids=[members.index(pod)],
            )
        )
    status = scheduler.group_status("default/train")
    assert status is not None
    assert (status.phase, status.scheduled, status.running) == ("Running", 2, 2)
    assert scheduler.group_status("default/none") is None


# ------------------------------------------------------------------- GPU shares in gangs

MIB = 10_000  # the GPUs below have 10000 MiB each


def gang_share(
    name: str, group: str, *, memory_mib: int, shares: int = 1, **kwargs: Any
) -> dict[str, Any]:
    labels = {names.POD_GROUP_LABEL: group}
    return share_pod(name, memory_mib=memory_mib, shares=shares, labels=labels, **kwargs)


def share(memory_mib: int, shares: int = 1, cores: int = 0, model: str | None = None) -> PodRequest:
    return PodRequest(
        uid=f"s{memory_mib}", namespace="default", name="s",
        share=GpuShare(shares, memory_mib, cores), gpu_model=model,
    )  # fmt: skip


def devices(*nodes: tuple[str, int, str | None], bound: Sequence[dict[str, Any]] = ()) -> Scheduler:
    """Nodes of (name, GPUs of 10000 MiB, model), and pods bound there."""
    scheduler = cluster(
        *(make_node(n, gpus=g, model=m or H100, gpu_memory_mib=MIB) for n, g, m in nodes),
        groups=[],
    )
    for pod in bound:
        scheduler.upsert_pod(pod)
    return scheduler


SHARE_FIT_CASES = [
    # (id, nodes, pods bound there, requests, fits)
    ("4 shares on 2 GPUs when memory allows", [("a", 2, None)], [], [share(4000)] * 4, True),
    ("4 shares on 2 GPUs: one too many for the memory", [("a", 2, None)], [],
     [share(4000)] * 3 + [share(7000)], False),
    ("a share larger than every GPU", [("a", 2, None)], [], [share(1000), share(12_000)], False),
    ("the cores must fit as well", [("a", 2, None)], [], [share(100, cores=60)] * 3, False),
    ("cores that fit", [("a", 2, None)], [], [share(100, cores=50)] * 4, True),
    ("a share of 2 GPUs needs 2 devices of one node", [("a", 1, None), ("b", 1, None)], [],
     [share(1000, shares=2)], False),
    ("room left by shares already there counts",
     [("a", 2, None)], [share_pod("x", memory_mib=6000, node="a", gpu_ids=[0])],
     [share(4000), share(5000)], True),
    ("a device held whole takes no share",
     [("a", 2, None)], [make_pod("w", gpus=1, node="a", gpu_ids=[0])],
     [share(4000)] * 3, False),
    ("mixed: the shares fit beside the whole GPUs", [("a", 4, None)], [],
     [need(3), share(5000), share(5000)], True),
    ("mixed: shares on two devices leave too few whole", [("a", 4, None)], [],
     [need(3), share(6000), share(6000)], False),
    ("mixed: shares open the smaller node, the 4 takes the larger",
     [("a", 4, None), ("b", 2, None)], [], [need(4), share(1000)], True),
    ("mixed: the other guess, when the whole member may only use the smaller node",
     [("a", 4, H100), ("b", 2, A100)], [], [need(2, "A100"), share(1000, shares=2)], True),
    ("mixed: a share's model keeps it off the node the whole GPUs need",
     [("a", 2, H100), ("b", 2, A100)], [], [need(2, "A100"), share(1000, model="A100")], False),
]  # fmt: skip


@pytest.mark.parametrize(
    ("nodes", "bound", "requests", "fits"),
    [c[1:] for c in SHARE_FIT_CASES],
    ids=[c[0] for c in SHARE_FIT_CASES],
)
def test_whole_group_fit_counts_shares_per_device(
    nodes: list[tuple[str, int, str | None]],
    bound: list[dict[str, Any]],
    requests: list[PodRequest],
    fits: bool,
) -> None:
    scheduler = devices(*nodes, bound=bound)
    assert fits_all(scheduler.inventory, requests, PolicyConfig()) is fits
    # The same answer from the cache, and with the members in another order.
    cache = FitCache()
    assert fits_all(scheduler.inventory, requests[::-1], PolicyConfig(), cache=cache) is fits
    assert fits_all(scheduler.inventory, requests, PolicyConfig(), cache=cache) is fits


def test_a_gang_of_shares_fits_one_node_and_completes_at_the_barrier() -> None:
    members = [gang_share(f"m{i}", "infer", memory_mib=4000) for i in range(4)]
    scheduler = cluster(
        make_node("a", gpus=2, gpu_memory_mib=MIB),
        groups=[make_pod_group("infer", min_member=4)],
        pods=members,
    )
    for pod in members:
        assert scheduler.filter(pod, ["a"]).passed == ["a"]
        bind(scheduler, pod, "a")
    assert [k for k, _, _ in kinds(scheduler)] == [GangEventKind.COMPLETE]
    view = scheduler.inventory.node("a")
    assert view is not None
    assert view.share_memory == (8000, 8000)


def test_a_gang_of_shares_that_cannot_all_fit_is_rejected_and_preemption_may_help() -> None:
    members = [gang_share(f"m{i}", "infer", memory_mib=4000) for i in range(3)]
    members.append(gang_share("big", "infer", memory_mib=7000))
    scheduler = cluster(
        make_node("a", gpus=2, gpu_memory_mib=MIB),
        groups=[make_pod_group("infer", min_member=4)],
        pods=members,
    )
    verdict = scheduler.filter(members[0], ["a"])
    message = "schedext: not enough free GPUs or room for GPU shares for all of group default/infer"
    assert verdict.failed == {"a": message}
    assert verdict.unresolvable == {}


def test_a_whole_member_is_kept_off_the_node_its_groups_shares_need() -> None:
    """The share of 3 GPUs fits only on a: the whole member of 2 must take b."""
    whole = gang_pod("whole", "mixed", gpus=2)
    sharing = gang_share("sharing", "mixed", memory_mib=1000, shares=3)
    scheduler = cluster(
        make_node("a", gpus=3, gpu_memory_mib=MIB),
        make_node("b", gpus=2, gpu_memory_mib=MIB),
        groups=[make_pod_group("mixed", min_member=2)],
        pods=[whole, sharing],
    )
    verdict = scheduler.filter(whole, ["a", "b"])
    assert verdict.passed == ["b"]
    assert verdict.failed == {"a": STRANDED.replace("train", "mixed")}
    bind(scheduler, whole, "b")
    assert scheduler.filter(sharing, ["a", "b"]).passed == ["a"]
    bind(scheduler, sharing, "a")
    assert [k for k, _, _ in kinds(scheduler)] == [GangEventKind.COMPLETE]


def test_a_whole_member_may_take_any_node_that_one_placement_of_the_shares_allows() -> None:
    """With the share on b, the 3 takes a; with the share on a, the 3 takes b."""
    whole = gang_pod("whole", "mixed", gpus=3)
    sharing = gang_share("sharing", "mixed", memory_mib=1000, shares=2)
    scheduler = cluster(
        make_node("a", gpus=4, gpu_memory_mib=MIB),
        make_node("b", gpus=3, gpu_memory_mib=MIB),
        groups=[make_pod_group("mixed", min_member=2)],
        pods=[whole, sharing],
    )
    assert scheduler.filter(whole, ["a", "b"]).passed == ["a", "b"]


SHARE_MEMORY = names.SHARE_MEMORY_RESOURCE
SHARE_CORES = names.SHARE_CORES_RESOURCE

SHARE_MIN_RESOURCES_CASES = [
    # (id, spec.minResources, the reason, or None when the member passes). Two nodes of
    # 2 x 10000 MiB: 6000 MiB and 30% of one device held by another pod, 1000 MiB of another
    # reserved by the group's own member: 34000 MiB and 370% free, own included.
    ("share memory short", {SHARE_MEMORY: "34001"}, f"{SHARE_MEMORY} 34001 wanted, 34000 free"),
    ("share memory covered, own reservation included", {SHARE_MEMORY: "34000"}, None),
    ("share cores short", {SHARE_CORES: "371"}, f"{SHARE_CORES} 371 wanted, 370 free"),
    ("share cores covered", {SHARE_CORES: "370"}, None),
]  # fmt: skip


@pytest.mark.parametrize(
    ("min_resources", "reason"),
    [c[1:] for c in SHARE_MIN_RESOURCES_CASES],
    ids=[c[0] for c in SHARE_MIN_RESOURCES_CASES],
)
def test_min_resources_may_name_the_share_resources(
    min_resources: dict[str, object], reason: str | None
) -> None:
    members = [gang_share(f"m{i}", "infer", memory_mib=1000) for i in range(2)]
    group = make_pod_group("infer", min_member=2)
    group["spec"]["minResources"] = min_resources
    other = share_pod("other", memory_mib=6000, cores=30, node="b", gpu_ids=[0])
    scheduler = cluster(
        make_node("a", gpus=2, gpu_memory_mib=MIB),
        make_node("b", gpus=2, gpu_memory_mib=MIB),
        groups=[group],
        pods=[*members, other],
    )
    bind(scheduler, members[1], "a")
    verdict = scheduler.filter(members[0], ["a", "b"])
    if reason is None:
        assert verdict.passed == ["a", "b"]
        return
    message = "schedext: not enough free resources for minResources of group default/infer: "
    assert verdict.failed == dict.fromkeys(["a", "b"], message + reason)


def test_min_resources_count_share_memory_in_the_presets_unit() -> None:
    """gpushare counts GiB: 2 x 10000 MiB free is 19 whole GiB."""
    config = PolicyConfig(shares=SHARE_PRESETS["gpushare"])
    group = make_pod_group("g", min_member=1)
    group["spec"]["minResources"] = {"aliyun.com/gpu-mem": "20"}
    scheduler = cluster(make_node("a", gpus=2, gpu_memory_mib=MIB), groups=[group], config=config)
    spec = scheduler.pod_groups()[0]
    assert min_resources_gap(scheduler.inventory, spec, config) == [
        "aliyun.com/gpu-mem 20 wanted, 19 free"
    ]


def brute_fits(
    scheduler: Scheduler, requests: Sequence[PodRequest], first_on: str | None = None
) -> bool:
    """Every placement of every member, device by device (small clusters only); with
    ``first_on``, the first member on that node."""
    inventory = scheduler.inventory
    nodes = []
    for name in inventory.node_names():
        view = inventory.node(name)
        assert view is not None
        free = set(view.free_gpu_ids)
        # Per device: (free whole, MiB free, cores free); a device with no room is left out.
        nodes.append(
            (
                name,
                view.spec.gpu_model or "",
                [
                    [i in free, memory, cores]
                    for i, (memory, cores) in enumerate(view.share_room)
                    if memory >= 0
                ],
            )
        )

    def after(r: PodRequest, device: list[Any]) -> list[Any] | None:
        """The device once ``r`` takes it (whole, or its share), None when it cannot."""
        if r.gpus:
            return [False, -1, -1] if device[0] else None
        memory, cores = device[1] - r.share.memory_mib, device[2] - r.share.cores
        return [False, memory, cores] if memory >= 0 and cores >= 0 else None

    def place(i: int) -> bool:
        if i == len(requests):
            return True
        r = requests[i]
        for name, model, devices in nodes:
            if r.gpu_model is not None and r.gpu_model.casefold() not in model.casefold():
                continue
            if i == 0 and first_on not in (None, name):
                continue
            for chosen in itertools.combinations(devices, r.devices):
                taken = [after(r, d) for d in chosen]
                if any(t is None for t in taken):
                    continue
                saved = [list(d) for d in chosen]
                for d, t in zip(chosen, taken, strict=True):
                    d[:] = t
                placed = place(i + 1)
                for d, old in zip(chosen, saved, strict=True):
                    d[:] = old
                if placed:
                    return True
        return False

    return place(0)


def test_share_packing_is_sound_and_rarely_misses_a_fit() -> None:
    """Against every placement on small random clusters: a True answer always has one, and
    the greedy placement of shares misses few."""
    rng = random.Random(20261125)
    agreed = missed = found = narrowed = 0
    for trial in range(1000):
        nodes = [
            (f"n{i}", rng.randint(1, 3), rng.choice((H100, A100))) for i in range(rng.randint(1, 3))
        ]
        bound = []
        for name, gpus, _ in nodes:
            for index in range(gpus):
                roll = rng.random()
                if roll < 0.2:
                    bound.append(make_pod(f"w-{name}-{index}", gpus=1, node=name, gpu_ids=[index]))
                elif roll < 0.5:
                    memory = rng.choice((2000, 5000, 8000))
                    bound.append(
                        share_pod(
                            f"s-{name}-{index}", memory_mib=memory, node=name, gpu_ids=[index]
                        )
                    )
        requests = []
        for _ in range(rng.randint(1, 4)):
            model = rng.choice((None, None, "H100", "A100"))
            if rng.random() < 0.3:
                requests.append(need(rng.randint(1, 2), model))
            else:
                memory, cores = rng.choice((1000, 3000, 5000, 7000)), rng.choice((0, 0, 40, 70))
                requests.append(share(memory, rng.choice((1, 1, 2)), cores, model))
        scheduler = devices(*nodes, bound=bound)
        fits = fits_all(scheduler.inventory, requests, PolicyConfig())
        exists = brute_fits(scheduler, requests)
        assert exists or not fits, (trial, nodes, requests)
        agreed += fits == exists
        missed += exists and not fits
        found += exists
        # A whole-GPU member may take only nodes after which the rest has a placement.
        first = next((r for r in requests if r.gpus), None)
        if first is not None:
            rest = [r for r in requests if r is not first]
            allowed = member_nodes(scheduler.inventory, first, rest, PolicyConfig())
            assert allowed is not None
            for name, *_ in nodes:
                if allowed[int(scheduler.inventory.ids([name])[0])]:
                    narrowed += 1
                    assert brute_fits(scheduler, [first, *rest], first_on=name), (trial, name)
    # Measured: no miss in these 1000, 3 to 4 in 3000 with other seeds (groups whose shares
    # must be packed onto devices better than first-fit decreasing packs them).
    assert missed <= 5, (agreed, missed)
    assert found >= 300  # the walk is not all misfits
    assert narrowed >= 100, narrowed


@pytest.mark.parametrize(("wanted", "fits"), [(20_000, True), (20_001, False)])
def test_a_whole_gpu_the_group_holds_counts_as_room_for_its_shares(wanted: int, fits: bool) -> None:
    whole = gang_pod("whole", "mixed", gpus=1)
    sharing = gang_share("sharing", "mixed", memory_mib=1000)
    group = make_pod_group("mixed", min_member=2)
    group["spec"]["minResources"] = {SHARE_MEMORY: str(wanted)}
    scheduler = cluster(
        make_node("a", gpus=2, gpu_memory_mib=MIB), groups=[group], pods=[whole, sharing]
    )
    bind(scheduler, whole, "a")  # 10000 MiB of room left, and the 10000 of its own GPU
    verdict = scheduler.filter(sharing, ["a"])
    assert verdict.passed == (["a"] if fits else [])
    if not fits:
        assert verdict.failed["a"].endswith(f"{SHARE_MEMORY} 20001 wanted, 20000 free")
