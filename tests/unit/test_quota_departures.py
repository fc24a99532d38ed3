"""Reclaim while schedext's watch lags: victims preempt approved count as leaving their
namespace, on the node kube-scheduler is taking them from, each once, so that a second round
of preemption does not take a team below its min (extender.quotas.departures)."""

from __future__ import annotations

from typing import Any

import pytest

from extender import names
from extender.model import Holding, Victim
from extender.quotas import Departures
from extender.scheduler import Scheduler
from extender.tally import Amounts
from testbed.builders import elastic_quota, make_node, make_pod

GPU = names.GPU_RESOURCE


def victim(uid: str, namespace: str = "team-a", gpus: int = 1) -> Holding:
    return Holding(uid=uid, namespace=namespace, name=uid, node="-", gpus=gpus)


# a0..a3 of team-a (one GPU each), a big one of team-a (2 GPUs), f0 of another namespace.
HELD = {h.uid: h for h in [*(victim(f"a{i}") for i in range(4)), victim("big", gpus=2),
                           victim("f0", namespace="free")]}  # fmt: skip

Approval = dict[str, list[str]]  # node -> victim uids
Chosen = dict[str, set[str]]

CASES: list[tuple[str, list[Approval], set[str], float, dict[str, Amounts]]] = [
    # (id, approvals in order, uids no longer held, now, what is leaving per namespace)
    ("nothing approved, nothing leaving", [], set(), 1.0, {}),
    ("before any victim goes, the node that takes the most of a namespace counts",
     [{"x": ["a0"], "y": ["a1", "a2"]}], set(), 1.0, {"team-a": Amounts(gpus=2)}),
    ("each namespace is counted on its own worst node",
     [{"x": ["a0", "f0"], "y": ["big"]}], set(), 1.0,
     {"team-a": Amounts(gpus=2), "free": Amounts(gpus=1)}),
    ("once a victim is seen gone, its node is the one chosen; the others' victims stay",
     [{"x": ["a0", "a3"], "y": ["a1", "a2", "big"]}], {"a0"}, 1.0, {"team-a": Amounts(gpus=1)}),
    ("before its node is known, each approval counts its worst case, even of the same victims",
     [{"x": ["a0", "a1"], "y": ["a2"]}, {"x": ["a0", "a1"], "y": ["a3"]}], set(), 1.0,
     {"team-a": Amounts(gpus=4)}),
    ("once the node is known, a victim approved twice counts once",
     [{"x": ["a0", "a1", "a3"]}, {"x": ["a0", "a1", "a3"]}], {"a3"}, 1.0,
     {"team-a": Amounts(gpus=2)}),
    ("approvals for different victims add up",
     [{"x": ["a0", "a1"]}, {"y": ["a2", "a3"]}], set(), 1.0, {"team-a": Amounts(gpus=4)}),
    ("an approval whose victims all went is settled", [{"x": ["a0"]}], {"a0"}, 1.0, {}),
    ("an approval past its time is forgotten", [{"x": ["a0"]}], set(), 11.0, {}),
]  # fmt: skip


@pytest.mark.parametrize(
    ("approvals", "gone", "now", "leaving"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_what_is_leaving(
    approvals: list[Approval], gone: set[str], now: float, leaving: dict[str, Amounts]
) -> None:
    book = Departures(ttl_s=10.0)
    for index, approval in enumerate(approvals):
        book.record(f"b-{index}", approval, now=0.0)
    assert book.going(lambda uid: None if uid in gone else HELD.get(uid), now) == leaving


def test_settled_and_expired_approvals_are_dropped_and_the_book_is_bounded() -> None:
    book = Departures(ttl_s=10.0, capacity=2)
    for uid in ("a0", "a1", "a2"):
        book.record("b-0", {"x": [uid]}, now=0.0)
    book.record("b-1", {"x": []}, now=0.0)  # nothing approved: nothing kept
    assert len(book) == 2  # the oldest went
    book.going(lambda uid: None if uid == "a1" else HELD[uid], 1.0)
    assert len(book) == 1
    book.going(HELD.get, 10.0)
    assert len(book) == 0


def test_a_placed_preemptor_s_approvals_are_forgotten_at_once() -> None:
    """kube-scheduler deletes a preemptor's victims before it binds the preemptor, and the
    pod watch brings events in order: once schedext sees it bound, victims deleted for it
    are already seen gone, and those still held were never going. Found with the lagging
    reclaim test: approvals never acted on held team-b back until their time ran out."""
    book = Departures(ttl_s=100.0)
    book.record("b-0", {"x": ["a0"], "y": ["a1"]}, now=0.0)
    book.record("b-0", {"x": ["a2"]}, now=0.0)  # asked again: which one was acted on?
    book.record("b-1", {"y": ["a3"]}, now=0.0)
    assert book.going(HELD.get, 1.0) == {"team-a": Amounts(gpus=3)}
    assert book.placed("b-0")
    assert book.forgotten == 2
    assert book.going(HELD.get, 1.0) == {"team-a": Amounts(gpus=1)}  # b-1's alone
    assert not book.placed("b-0")


# ---------------------------------------------------------------- the race, through the verbs
# Nodes x and y, 4 GPUs each, all held by team-a (min 4: it borrows 4). team-b (min 4) is
# empty and reclaims with 2-GPU pods of high priority.
def _team_a(node: str, first: int) -> list[dict[str, Any]]:
    return [
        make_pod(f"a{i}", uid=f"a{i}", namespace="team-a", gpus=1, node=node, gpu_ids=[i - first],
                 priority=i)
        for i in range(first, first + 4)
    ]  # fmt: skip


def _scheduler() -> Scheduler:
    scheduler = Scheduler()
    for node in ("x", "y"):
        scheduler.upsert_node(make_node(node, gpus=4))
    scheduler.upsert_quota(elastic_quota("team-a", min={GPU: 4}))
    scheduler.upsert_quota(elastic_quota("team-b", min={GPU: 4}))
    for pod in _team_a("x", 0) + _team_a("y", 4):
        scheduler.upsert_pod(pod)
    return scheduler


def _preempt(scheduler: Scheduler, preemptor: str, candidates: Approval) -> Chosen:
    pod = make_pod(preemptor, uid=preemptor, namespace="team-b", gpus=2, priority=100)
    proposed = {node: [Victim(uid) for uid in uids] for node, uids in candidates.items()}
    return {n: set(v.uids) for n, v in scheduler.preempt(pod, proposed, now=1.0).items()}


X, Y = [f"a{i}" for i in range(4)], [f"a{i}" for i in range(4, 8)]


def test_a_reclaim_stops_at_the_min_while_the_watch_lags() -> None:
    """The race the end-to-end test saw: kube-scheduler nominated b-0 and b-1 on x. b-0
    preempts there twice (schedext saw the first victims go), then b-1 moves to y. Its view
    runs ahead of schedext's, which still sees b-0's second victims on x: team-a is at its
    min once they are gone, so nothing more may be taken from it."""
    scheduler = _scheduler()
    assert _preempt(scheduler, "b-0", {"x": X}) == {"x": {"a0", "a1"}}
    for uid in ("a0", "a1"):
        scheduler.delete_pod(uid)
    assert _preempt(scheduler, "b-0", {"x": X[2:]}) == {"x": {"a2", "a3"}}  # team-a holds 6
    assert _preempt(scheduler, "b-1", {"y": Y}) == {}


def test_victims_on_a_node_kube_scheduler_did_not_choose_are_not_counted_as_leaving() -> None:
    """b-0 is offered victims on x and on y; schedext sees x's go, so y's stay, and team-a
    (holding 6) may give 2 more to b-1 on y."""
    scheduler = _scheduler()
    assert _preempt(scheduler, "b-0", {"x": X, "y": Y}) == {"x": {"a0", "a1"}, "y": {"a4", "a5"}}
    for uid in ("a0", "a1"):
        scheduler.delete_pod(uid)
    assert _preempt(scheduler, "b-1", {"y": Y}) == {"y": {"a4", "a5"}}


def test_a_preemptor_turned_away_while_victims_leave_is_sent_back_when_they_go() -> None:
    """b-1 finds no victims while b-0's are leaving (team-a is at its min once they are
    gone); when schedext sees them go, b-1 is sent back to kube-scheduler, since nothing
    else may wake it."""
    scheduler = _scheduler()
    waiting = make_pod("b-1", uid="b-1", namespace="team-b", gpus=2, priority=100)
    scheduler.upsert_pod(waiting)
    _preempt(scheduler, "b-0", {"x": X})
    for uid in ("a0", "a1"):
        scheduler.delete_pod(uid)
    _preempt(scheduler, "b-0", {"x": X[2:]})
    scheduler.take_preemptor_requeues()  # what the watch's events have freed so far
    assert _preempt(scheduler, "b-1", {"y": Y}) == {}
    assert scheduler.take_preemptor_requeues() == []  # nothing freed since
    scheduler.delete_pod("a2")
    assert scheduler.take_preemptor_requeues() == [("team-b/b-1", "b-1")]


def test_a_preemptor_turned_away_is_sent_back_when_the_approvals_holding_it_back_end() -> None:
    """b-0 was offered victims on x and on y, and kube-scheduler, with a fresher view than
    schedext's, placed it on x without taking y's. Until schedext saw b-0 bound, y's victims
    counted as leaving and b-1 was turned away; once it does, b-1 is sent back, and finds
    its victims on y."""
    scheduler = _scheduler()
    waiting = make_pod("b-1", uid="b-1", namespace="team-b", gpus=2, priority=100)
    scheduler.upsert_pod(waiting)
    _preempt(scheduler, "b-0", {"x": X, "y": Y})
    _preempt(scheduler, "b-0", {"x": X[2:]})  # kube-scheduler asked again, took x's
    scheduler.take_preemptor_requeues()
    assert _preempt(scheduler, "b-1", {"y": Y}) == {}  # team-a looks at its min
    for uid in ("a2", "a3"):
        scheduler.delete_pod(uid)
    scheduler.take_preemptor_requeues()
    bound = make_pod("b-0", uid="b-0", namespace="team-b", gpus=2, priority=100, node="x",
                     gpu_ids=[2, 3])  # fmt: skip
    scheduler.upsert_pod(bound)
    assert ("team-b/b-1", "b-1") in scheduler.take_preemptor_requeues()
    assert _preempt(scheduler, "b-1", {"y": Y}) == {"y": {"a4", "a5"}}


def _preempt_one(scheduler: Scheduler, preemptor: str, candidates: Approval) -> Chosen:
    pod = make_pod(preemptor, uid=preemptor, namespace="team-b", gpus=1, priority=100)
    proposed = {node: [Victim(uid) for uid in uids] for node, uids in candidates.items()}
    return {n: set(v.uids) for n, v in scheduler.preempt(pod, proposed, now=1.0).items()}


def test_preemptors_get_distinct_victims_while_the_watch_lags() -> None:
    """The lagging reclaim test under load: four 1-GPU preemptors of team-b, one after the
    other on y, before schedext has seen any victim go. A victim approved for one is not
    offered to the next (it makes room once), so each gets its own, and team-a ends at its
    min: the fifth gets none."""
    scheduler = _scheduler()
    answers = [_preempt_one(scheduler, f"b-{i}", {"y": Y}) for i in range(5)]
    victims = [uid for answer in answers[:4] for uid in answer["y"]]
    assert sorted(victims) == sorted(Y)  # four distinct victims, all of y's
    assert answers[4] == {}


def test_a_preemptor_asked_again_may_get_its_own_victims_again() -> None:
    scheduler = _scheduler()
    first = _preempt_one(scheduler, "b-0", {"y": Y})
    assert _preempt_one(scheduler, "b-0", {"y": Y}) == first
