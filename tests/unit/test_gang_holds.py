"""Holds against starvation (issue 32): a gang that waited past ``after_s`` and would fit if the
pods of no higher priority outside gangs finished gets a hold on the nodes where the fewest
GPUs must still free; filter then keeps other pods of no higher priority off what the gang
needs there, so freed GPUs accumulate; the hold ends when the gang is placed, deleted, or at
its maximum age, and a new leader adopts it from the PodGroup's record."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import pytest

from extender import names
from extender.gang.hold_keeper import RETRY_S, HoldTimes
from extender.gang.holds import HoldEventKind, hold_record, read_hold_record
from extender.model import Reason
from extender.scheduler import Scheduler
from testbed.builders import (
    gang_pod,
    make_node,
    make_pod,
    make_pod_group,
    name_of,
    share_pod,
    uid_of,
)

Obj = dict[str, Any]
RACK = names.RACK_LABEL
T0 = 1_800_000_000.0  # Unix seconds
TIMES = HoldTimes(after_s=60, max_s=600)


def node(name: str, gpus: int = 8, rack: str | None = None) -> Obj:
    return make_node(name, gpus=gpus, labels={RACK: rack} if rack else {})


def small(name: str, on: str, gpus: int = 1, priority: int = 0) -> Obj:
    """A running pod in no gang."""
    return make_pod(name, gpus=gpus, node=on, phase="Running", priority=priority)


def gang(members: int, gpus: int, priority: int = 0, **annotations: str) -> list[Obj]:
    group = make_pod_group("g", min_member=members, annotations=annotations)
    return [group, *(gang_pod(f"m{i}", "g", gpus=gpus, priority=priority) for i in range(members))]


def scheduler_of(objs: Sequence[Obj], times: HoldTimes = TIMES) -> Scheduler:
    scheduler = Scheduler(gang_holds=times)
    for obj in objs:
        if obj.get("kind") == "PodGroup":
            scheduler.upsert_pod_group(obj)
        elif "containers" in obj.get("spec", {}):
            scheduler.upsert_pod(obj)
        else:
            scheduler.upsert_node(obj)
    return scheduler


def waited(scheduler: Scheduler, seconds: float) -> list[Any]:
    """Reviews at T0 and T0 + seconds: the events of both."""
    return scheduler.review_holds(T0) + scheduler.review_holds(T0 + seconds)


def share_member() -> Obj:
    pod = share_pod("m0", memory_mib=1024)
    pod["metadata"].setdefault("labels", {})[names.POD_GROUP_LABEL] = "g"
    return pod


# Three nodes of 8: n1 has 6 taken by small pods, n2 has 2, n3 has 7 by a pod of higher
# priority. A gang of 2 x 8 fits nowhere now.
BUSY = [
    node("n1"),
    node("n2"),
    node("n3"),
    *(small(f"s1-{i}", "n1") for i in range(6)),
    *(small(f"s2-{i}", "n2") for i in range(2)),
    small("vip", "n3", gpus=7, priority=100),
]


@dataclass(frozen=True)
class Choice:
    id: str
    objs: Sequence[Obj]
    need: dict[str, int]  # the hold's nodes; {} for no hold
    why_not: str = ""
    seconds: float = 61
    times: HoldTimes = field(default_factory=lambda: TIMES)


CHOICES = [
    Choice("waits past after_s: held where the fewest GPUs must free", [*BUSY, *gang(2, 8)],
           {"n2": 8, "n1": 8}),
    Choice("not yet waited long enough: none", [*BUSY, *gang(2, 8)], {}, seconds=30),
    Choice("holds off: none", [*BUSY, *gang(2, 8)], {},
           times=HoldTimes(after_s=0, max_s=600)),
    Choice(
        "it fits now: no hold needed",
        [node("n1"), node("n2"), *gang(2, 8)],
        {},
    ),
    Choice(
        "a pod of higher priority is not waited for: it cannot hold 3 x 8",
        [*BUSY, *gang(3, 8)],
        {},
        why_not="the cluster could hold it even if the pods of no higher priority outside "
        "gangs finished",
    ),
    Choice(
        "a gang of higher priority than the pod waits for it too",
        [*BUSY, *gang(3, 8, priority=200)],
        {"n1": 8, "n2": 8, "n3": 8},
    ),
    Choice(
        "required rack: the rack that holds it, though another frees sooner",
        [
            node("a1", rack="a"), node("a2", rack="a"), node("b1", rack="b"),
            *(small(f"a-{i}", "a1") for i in range(3)),
            *(small(f"b-{i}", "b1", gpus=1) for i in range(1)),
            *gang(2, 8, **{names.TOPOLOGY_REQUIRED: RACK}),
        ],
        {"a1": 8, "a2": 8},
    ),
    Choice(
        "required rack: the rack where the fewest must free",
        [
            node("a1", rack="a"), node("a2", rack="a"),
            node("b1", rack="b"), node("b2", rack="b"),
            *(small(f"a-{i}", "a1") for i in range(3)),
            *(small(f"b-{i}", "b1", gpus=1) for i in range(1)),
            *(small(f"c-{i}", "b2", gpus=1) for i in range(1)),
            *gang(2, 8, **{names.TOPOLOGY_REQUIRED: RACK}),
        ],
        {"b1": 8, "b2": 8},
    ),
    Choice(
        "nodes of a wrong model are never held",
        [
            make_node("h1", gpus=8, model="NVIDIA-H100-80GB-HBM3"),
            make_node("a1", gpus=8, model="NVIDIA-A100-SXM4-80GB"),
            small("s", "h1"),
            make_pod_group("g", min_member=1),
            gang_pod("m0", "g", gpus=8, model="H100"),
        ],
        {"h1": 8},
    ),
    Choice(
        "members asking shares get no hold",
        [node("n1"), *(small(f"s{i}", "n1") for i in range(8)),
         make_pod_group("g", min_member=1), share_member()],
        {},
        why_not="a hold keeps whole GPUs, and some members ask shares",
    ),
]  # fmt: skip


@pytest.mark.parametrize("case", CHOICES, ids=lambda c: c.id)
def test_hold_choice(case: Choice) -> None:
    scheduler = scheduler_of(case.objs, case.times)
    waited(scheduler, case.seconds)
    holds = scheduler.gang_holds()
    assert {n: g for h in holds for n, g in h.need} == case.need
    hold, why_not = scheduler.gang_hold("default/g")
    if case.why_not:
        assert hold is None
        assert case.why_not in why_not


def test_held_gpus_keep_small_pods_off_and_accumulate() -> None:
    scheduler = scheduler_of([*BUSY, *gang(2, 8)])
    waited(scheduler, 61)
    nodes = ["n1", "n2", "n3"]
    newcomer = make_pod("new", gpus=1, priority=0)
    verdict = scheduler.filter(newcomer, nodes)
    assert verdict.passed == ["n3"]  # n3 has 1 free GPU, and no hold; n1 and n2 are held
    held = {n for r in verdict.rejections if r.reason is Reason.GANG_HOLD for n in r.nodes}
    assert held == {"n1", "n2"}
    assert "held for gang default/g" in verdict.failed["n1"]
    assert "n1" in verdict.unresolvable  # preemption cannot lift a hold
    # A pod of higher priority than the gang is not kept off; a member of the gang is not.
    assert scheduler.filter(make_pod("vip2", gpus=1, priority=5), nodes).passed == nodes
    # Small pods finishing free GPUs that stay free: the gang fits, and its members pass.
    for pod in BUSY[3:11]:
        scheduler.delete_pod(uid_of(pod))
    assert scheduler.filter(make_pod("new", gpus=1), nodes).passed == ["n3"]
    member = gang(2, 8)[1]
    assert scheduler.filter(member, nodes).passed == ["n1", "n2"]


def test_a_node_with_more_free_than_held_takes_small_pods() -> None:
    # The gang needs 8 on n1 (of 8) and 4... on n2: a 1-GPU pod still fits where the free
    # GPUs less its one cover what the hold needs.
    busy = [small(f"t{i}", "n2", gpus=4) for i in range(3)]
    objs = [node("n1"), node("n2", gpus=16), *(small(f"s{i}", "n1") for i in range(4)), *busy,
            *gang(2, 8)]  # fmt: skip
    scheduler = scheduler_of(objs)
    waited(scheduler, 61)
    assert dict(scheduler.gang_holds()[0].need) == {"n1": 8, "n2": 8}
    # n2 has 4 free of the 8 it needs: kept off. n1 has 4 free of 8: kept off.
    assert scheduler.filter(make_pod("new", gpus=1), ["n1", "n2"]).passed == []
    for pod in busy:
        scheduler.delete_pod(uid_of(pod))
    assert scheduler.filter(make_pod("new", gpus=1), ["n1", "n2"]).passed == ["n2"]


@dataclass(frozen=True)
class Release:
    id: str
    change: str  # what happens after the hold started
    kind: HoldEventKind
    reason: str


RELEASES = [
    Release("the gang is placed", "place", HoldEventKind.ENDED, "its members are placed"),
    Release("its PodGroup is deleted", "delete", HoldEventKind.ENDED, "its PodGroup is gone"),
    Release("a held node is gone", "node", HoldEventKind.ENDED, "node n1 is gone"),
    Release("its maximum age", "age", HoldEventKind.EXPIRED, "maximum age (600s)"),
]


@pytest.mark.parametrize("case", RELEASES, ids=lambda c: c.id)
def test_hold_release(case: Release) -> None:
    objs = [*BUSY, *gang(2, 8)]
    scheduler = scheduler_of(objs)
    (started,) = waited(scheduler, 61)
    assert started.kind is HoldEventKind.STARTED
    assert "waited 61s for 16 GPUs" in started.reason
    now = T0 + 62
    if case.change == "place":
        for obj in objs[3:11]:
            scheduler.delete_pod(uid_of(obj))
        for i, on in enumerate(["n1", "n2"]):
            scheduler.upsert_pod(gang_pod(f"m{i}", "g", gpus=8, node=on, phase="Running"))
    elif case.change == "delete":
        scheduler.delete_pod_group(make_pod_group("g", min_member=2))
    elif case.change == "node":
        scheduler.delete_node("n1")
    else:
        now = T0 + 61 + 600
    (ended,) = scheduler.review_holds(now)
    assert ended.kind is case.kind
    assert case.reason in ended.reason
    assert scheduler.gang_holds() == []
    verdict = scheduler.filter(make_pod("new", gpus=1), ["n1", "n2"])
    assert all(r.reason is not Reason.GANG_HOLD for r in verdict.rejections)
    if case.change == "age":  # it waits afresh: no new hold before after_s more
        assert scheduler.review_holds(now + 30) == []
        assert [e.kind for e in scheduler.review_holds(now + 61)] == [HoldEventKind.STARTED]


def test_a_new_leader_adopts_the_hold_from_the_podgroup() -> None:
    first = scheduler_of([*BUSY, *gang(2, 8)])
    (started,) = waited(first, 61)
    record = hold_record(started.hold)
    group, *members = gang(2, 8, **{names.GANG_HOLD: record})
    # The new leader: nodes have freed meanwhile (n3's pod gone), so a fresh choice could
    # differ; the adopted hold keeps its nodes, its start and its expiry.
    objs = [o for o in BUSY if name_of(o) != "vip"]
    second = scheduler_of([*objs, group, *members])
    (adopted,) = second.review_holds(T0 + 70)
    assert adopted.kind is HoldEventKind.STARTED
    assert adopted.reason == "adopted from its PodGroup"
    assert adopted.hold == started.hold
    assert second.filter(make_pod("new", gpus=1), ["n1", "n2"]).passed == []
    (expired,) = second.review_holds(T0 + 61 + 600)
    assert expired.kind is HoldEventKind.EXPIRED


@pytest.mark.parametrize(
    "text",
    ["", "{", "[]", '{"nodes": {"n1": 8}}', '{"nodes": [], "started": "x", "expires": "y"}',
     '{"nodes": {"n1": "8"}, "started": "2027-01-01T00:00:00Z", "expires": "2027-01-01T01:00Z"}'],
)  # fmt: skip
def test_an_unreadable_record_is_ignored(text: str) -> None:
    assert read_hold_record("default/g", text) is None


def test_the_hold_record_round_trips() -> None:
    scheduler = scheduler_of([*BUSY, *gang(2, 8)])
    (started,) = waited(scheduler, 61)
    assert read_hold_record("default/g", hold_record(started.hold)) == started.hold


def test_idle_gpu_seconds_are_the_free_gpus_kept() -> None:
    scheduler = scheduler_of([*BUSY, *gang(2, 8)])
    waited(scheduler, 61)
    # n1 has 2 free, n2 has 6: 8 kept idle, for 10 s.
    scheduler.review_holds(T0 + 71)
    assert scheduler.hold_idle() == 8
    assert scheduler.hold_idle("default/g") == pytest.approx(80)


def test_a_gang_that_cannot_have_a_hold_is_looked_at_again_later() -> None:
    # 3 x 8 cannot fit even if the small pods finished (n3's pod outranks it): no hold, and
    # the choice (a pass over every pod's holding) is not made again for RETRY_S.
    scheduler = scheduler_of([*BUSY, *gang(3, 8)])
    waited(scheduler, 61)
    assert "no hold" in scheduler.gang_hold("default/g")[1]
    vip = next(o for o in BUSY if name_of(o) == "vip")
    scheduler.delete_pod(uid_of(vip))  # now it would fit once the small pods finish
    assert scheduler.review_holds(T0 + 62) == []
    (started,) = scheduler.review_holds(T0 + 61 + RETRY_S)
    assert started.kind is HoldEventKind.STARTED


def test_a_hold_ends_when_the_gang_loses_a_member() -> None:
    objs = [*BUSY, *gang(2, 8)]
    scheduler = scheduler_of(objs)
    waited(scheduler, 61)
    scheduler.delete_pod(uid_of(objs[-1]))
    (ended,) = scheduler.review_holds(T0 + 62)
    assert ended.kind is HoldEventKind.ENDED
    assert "fewer than minMember (2) pods" in ended.reason


def test_a_replica_that_takes_over_keeps_the_recorded_hold_before_its_first_review() -> None:
    # The shell takes over when the replica becomes ready (elected, or synced), before its
    # first verb: filter must not wait for the first review (up to a second) to honour the
    # hold, or the small pods waiting in kube-scheduler take the GPUs that freed for the gang.
    first = scheduler_of([*BUSY, *gang(2, 8)])
    (started,) = waited(first, 61)
    group, *members = gang(2, 8, **{names.GANG_HOLD: hold_record(started.hold)})
    second = scheduler_of([*BUSY, group, *members])
    second.take_over_holds(T0 + 70)
    newcomer = make_pod("new", gpus=1)
    assert second.filter(newcomer, ["n1", "n2"]).passed == []
    (adopted,) = second.review_holds(T0 + 71)  # its event, at the review
    assert adopted.reason == "adopted from its PodGroup"
    assert adopted.hold == started.hold
    assert second.review_holds(T0 + 72) == []


def test_a_replica_that_leads_again_forgets_the_holds_of_its_earlier_term() -> None:
    # It held n1 and n2, then lost the lease; the next leader let that hold expire and chose
    # n2 and n3 (the record says so). Leading again, it keeps the record's hold, not its own.
    scheduler = scheduler_of([*BUSY, *gang(2, 8)])
    (started,) = waited(scheduler, 61)
    now = T0 + 61 + 700
    theirs = replace(started.hold, need=(("n2", 8), ("n3", 8)), started=now - 10)
    annotations = {names.GANG_HOLD: hold_record(theirs)}
    scheduler.upsert_pod_group(make_pod_group("g", min_member=2, annotations=annotations))
    scheduler.take_over_holds(now)
    assert scheduler.gang_holds() == [theirs]
    assert scheduler.filter(make_pod("new", gpus=1), ["n1", "n2", "n3"]).passed == ["n1"]
    # With no record (that hold ended meanwhile), it keeps none.
    scheduler.upsert_pod_group(make_pod_group("g", min_member=2))
    scheduler.take_over_holds(now + 1)
    assert scheduler.gang_holds() == []
