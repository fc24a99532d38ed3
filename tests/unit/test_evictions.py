"""What filter waits for after preempt approved victims: the approved victims on the nodes
now offered to the preemptor that the inventory still holds (extender.evictions)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from extender.evictions import EvictionBook
from extender.model import Victim
from extender.scheduler import Scheduler
from testbed.builders import make_node, make_pod

HIGH, LOW = 100, 10
TTL = 120.0


def held(name: str, node: str, ids: list[int]) -> dict[str, Any]:
    return make_pod(name, uid=name, gpus=len(ids), node=node, gpu_ids=ids, priority=LOW)


def cluster() -> Scheduler:
    """n1: four 1-GPU pods; n2: two 2-GPU pods; every GPU taken, every pod low priority."""
    scheduler = Scheduler(victim_memory_s=TTL)
    for node in ("n1", "n2"):
        scheduler.upsert_node(make_node(node, gpus=4))
    for i in range(4):
        scheduler.upsert_pod(held(f"small-{i}", "n1", [i]))
    for i in range(2):
        scheduler.upsert_pod(held(f"pair-{i}", "n2", [2 * i, 2 * i + 1]))
    return scheduler


URGENT = make_pod("urgent", uid="urgent", gpus=4, priority=HIGH)
OTHER = make_pod("other", uid="other", gpus=4, priority=HIGH)


def approve(scheduler: Scheduler, now: float = 0.0) -> None:
    """kube-scheduler's proposal for both nodes, which preempt approves as it is."""
    proposed = {
        "n1": [Victim(f"small-{i}") for i in range(4)],
        "n2": [Victim("pair-0"), Victim("pair-1")],
    }
    chosen = scheduler.preempt(URGENT, proposed, now=now)
    assert {n: sorted(v.uids) for n, v in chosen.items()} == {
        "n1": [f"small-{i}" for i in range(4)],
        "n2": ["pair-0", "pair-1"],
    }


def delete(*uids: str) -> Callable[[Scheduler], None]:
    def act(scheduler: Scheduler) -> None:
        for uid in uids:
            scheduler.delete_pod(uid)

    return act


def nothing(_scheduler: Scheduler) -> None:
    return None


@dataclass
class Case:
    name: str
    then: Callable[[Scheduler], None]  # what happens after preempt approved
    pod: dict[str, Any]
    offered: list[str]
    at: float
    expected: tuple[str, ...]


CASES = [
    Case(
        "kube-scheduler offers the node while schedext still holds one victim there",
        delete("pair-0"),
        URGENT,
        ["n2"],
        1.0,
        ("pair-1",),
    ),
    Case(
        "no victim seen gone yet: all of the offered node's victims are awaited",
        nothing,
        URGENT,
        ["n2"],
        1.0,
        ("pair-0", "pair-1"),
    ),
    Case(
        "every victim of the offered node already gone: nothing to wait for",
        delete("pair-0", "pair-1"),
        URGENT,
        ["n2"],
        1.0,
        (),
    ),
    Case(
        "only the offered nodes count",
        nothing,
        URGENT,
        ["n3", "n1"],
        1.0,
        ("small-0", "small-1", "small-2", "small-3"),
    ),
    Case("no approved node offered", nothing, URGENT, ["n3"], 1.0, ()),
    Case("another pod waits for nothing", nothing, OTHER, ["n1", "n2"], 1.0, ()),
    Case("the approval is forgotten after its time", nothing, URGENT, ["n2"], TTL, ()),
    Case(
        "the preemptor bound (the watch shows it) waits no more",
        lambda s: s.upsert_pod(make_pod("urgent", uid="urgent", gpus=4, node="n2", gpu_ids=[])),
        URGENT,
        ["n2"],
        1.0,
        (),
    ),
    Case("the preemptor deleted", delete("urgent"), URGENT, ["n2"], 1.0, ()),
    Case(
        "a wait that ended is not waited again",
        lambda s: s.victims_settled(URGENT),
        URGENT,
        ["n2"],
        1.0,
        (),
    ),
    Case(
        "a later answer replaces the earlier one",
        lambda s: s.preempt(URGENT, {"n1": [Victim("small-0")]}, now=0.5),
        URGENT,
        ["n1", "n2"],
        1.0,
        ("small-0", "small-1", "small-2", "small-3"),
    ),
    Case(
        "a later answer with no candidate leaves nothing to wait for",
        lambda s: s.preempt(URGENT, {"n1": []}, now=0.5),
        URGENT,
        ["n1", "n2"],
        1.0,
        (),
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_victims_awaited_after_preempt(case: Case) -> None:
    scheduler = cluster()
    approve(scheduler)
    case.then(scheduler)
    assert scheduler.awaited_victims(case.pod, case.offered, case.at) == case.expected


def test_preempt_without_a_time_remembers_nothing() -> None:
    scheduler = cluster()
    scheduler.preempt(URGENT, {"n2": [Victim("pair-0"), Victim("pair-1")]})
    assert scheduler.awaited_victims(URGENT, ["n2"], 1.0) == ()


def test_the_book_keeps_only_the_newest_approvals() -> None:
    book = EvictionBook(ttl_s=TTL, capacity=2)
    for preemptor in ("a", "b", "c"):
        book.record(preemptor, {"n": [f"victim-of-{preemptor}"]}, now=0.0)
    assert len(book) == 2

    def awaited(preemptor: str) -> tuple[str, ...]:
        return book.awaited(preemptor, ["n"], lambda _uid: True, 1.0)

    assert [awaited(p) for p in ("a", "b", "c")] == [(), ("victim-of-b",), ("victim-of-c",)]


@pytest.mark.parametrize(("ttl", "capacity"), [(0.0, 1), (-1.0, 1), (1.0, 0)])
def test_the_book_refuses_meaningless_bounds(ttl: float, capacity: int) -> None:
    with pytest.raises(ValueError, match="ttl_s must be > 0"):
        EvictionBook(ttl_s=ttl, capacity=capacity)


PENDING_URGENT = [("default/urgent", "urgent")]

REQUEUE_CASES = [
    # (id, what happens after the approval, the preemptors to nudge)
    ("nothing gone yet: no nudge", [], []),
    ("some of a node's victims gone: no nudge yet", [delete("small-0", "small-1")], []),
    ("every victim of one node gone: the preemptor is nudged",
     [delete("pair-0", "pair-1")], PENDING_URGENT),
    ("nudged once, then again only when something is freed",
     [delete("pair-0", "pair-1"), lambda s: s.take_preemptor_requeues()], []),
    ("nudged again when another pod is seen gone",
     [delete("pair-0", "pair-1"), lambda s: s.take_preemptor_requeues(), delete("small-0")],
     PENDING_URGENT),
    ("a few times at most",
     [delete("pair-0", "pair-1"), lambda s: s.take_preemptor_requeues(),
      *[step for i in range(3) for step in (delete(f"small-{i}"),
                                            lambda s: s.take_preemptor_requeues())],
      delete("small-3")], []),
    ("placed meanwhile: nothing to nudge",
     [lambda s: s.upsert_pod(make_pod("urgent", uid="urgent", gpus=4, node="n3")),
      delete("pair-0", "pair-1")], []),
]  # fmt: skip


@pytest.mark.parametrize(
    ("steps", "nudged"), [c[1:] for c in REQUEUE_CASES], ids=[c[0] for c in REQUEUE_CASES]
)
def test_a_preemptor_is_nudged_once_its_victims_on_a_node_are_gone(
    steps: list[Callable[[Scheduler], object]], nudged: list[tuple[str, str]]
) -> None:
    """kube-scheduler may not retry a preemptor whose room another took first (two nominated
    on one node); once schedext sees one node's victims all gone, it has the preemptor
    retried, if it is still pending."""
    scheduler = cluster()
    scheduler.upsert_pod(URGENT)  # pending
    approve(scheduler)
    for step in steps:
        step(scheduler)
    assert scheduler.take_preemptor_requeues() == nudged
