"""Shortlist mode: filter keeps the best few feasible nodes by schedext's scorers, and bind
tells whether kube-scheduler took the one schedext rated best (the choice book)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

from extender.choices import Choice, ChoiceBook
from extender.model import FilterVerdict
from extender.packed import PackedNames
from extender.policy import PolicyConfig
from extender.scheduler import Scheduler
from extender.shortlist import cut
from testbed.builders import make_node, make_pod, name_of, uid_of
from tests.unit.helpers import scheduler_with


def cluster(shortlist: int) -> Scheduler:
    """Four 8-GPU nodes: held 6, 4, 0 and 8 of 8. Bin-packing rates them in that order; the
    full one fits no GPU pod."""
    held = {"busy6": 6, "busy4": 4, "idle": 0, "full": 8}
    nodes = [make_node(name, gpus=8) for name in held]
    pods = [
        make_pod(f"{name}-tenant", gpus=count, node=name, gpu_ids=list(range(count)))
        for name, count in held.items()
        if count
    ]
    return scheduler_with(nodes, pods, PolicyConfig(shortlist=shortlist))


ORDER = ["idle", "full", "busy4", "busy6"]  # kube-scheduler's order for this call


@dataclass(frozen=True)
class Case:
    name: str
    shortlist: int
    gpus: int
    passed: list[str]
    feasible: int
    rejected: set[str]  # nodes the verdict still names (for metrics and explain)


CASES = [
    Case("full mode answers every feasible node", 0, 1, ["idle", "busy4", "busy6"], 3, {"full"}),
    Case("size 1 is schedext's choice alone", 1, 1, ["busy6"], 3, {"full"}),
    Case("size 2 keeps the two best, best first", 2, 1, ["busy6", "busy4"], 3, {"full"}),
    Case(
        "a size over the feasible count keeps them all",
        5,
        1,
        ["idle", "busy4", "busy6"],
        3,
        {"full"},
    ),
    Case("as many fit as the size: kept as listed", 2, 4, ["idle", "busy4"], 2, {"busy6", "full"}),
    Case(
        "a pod that fits nowhere gets every reason", 2, 9, [], 0, {"idle", "full", "busy4", "busy6"}
    ),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
@pytest.mark.parametrize("packed", [False, True], ids=["strings", "packed"])
def test_filter_shortlists_the_best_feasible_nodes(case: Case, packed: bool) -> None:
    scheduler = cluster(case.shortlist)
    names: Any = PackedNames.of(ORDER) if packed else ORDER
    verdict = scheduler.filter(make_pod("p", gpus=case.gpus), names)
    assert list(verdict.passed) == case.passed
    assert verdict.feasible == case.feasible
    assert verdict.shortlisted_from == (case.feasible if case.shortlist and case.passed else 0)
    assert set(verdict.failed) == case.rejected


def test_ties_at_the_cut_go_to_the_nodes_listed_first() -> None:
    scheduler = scheduler_with(
        [make_node(n, gpus=8) for n in "abcd"], (), PolicyConfig(shortlist=2)
    )
    pod = make_pod("p", gpus=1)
    assert list(scheduler.filter(pod, ["c", "a", "d", "b"]).passed) == ["c", "a"]
    assert list(scheduler.filter(pod, ["d", "b", "c", "a"]).passed) == ["d", "b"]


@pytest.mark.parametrize(
    ("held", "ties", "passed"),
    [
        ({"a": 0, "b": 0, "c": 0, "d": 0}, 8, ["c", "a", "d", "b"]),  # all alike: all four
        ({"a": 0, "b": 0, "c": 0, "d": 0}, 3, ["c", "a", "d"]),  # no more than the bound
        ({"a": 0, "b": 0, "c": 0, "d": 0}, 0, ["c"]),  # no tie kept without a bound
        ({"a": 6, "b": 0, "c": 0, "d": 0}, 8, ["a"]),  # one best: alone
        ({"a": 4, "b": 4, "c": 0, "d": 6}, 8, ["d"]),
        ({"a": 4, "b": 4, "c": 0, "d": 0}, 8, ["a", "b"]),  # the two best, alike
    ],
)
def test_nodes_rated_alike_with_the_last_kept_stay_up_to_the_bound(
    held: dict[str, int], ties: int, passed: list[str]
) -> None:
    nodes = [make_node(name, gpus=8) for name in held]
    pods = [
        make_pod(f"{n}-t", gpus=c, node=n, gpu_ids=list(range(c))) for n, c in held.items() if c
    ]
    config = PolicyConfig(shortlist=1, shortlist_preferred=ties)
    scheduler = scheduler_with(nodes, pods, config)
    assert list(scheduler.filter(make_pod("p", gpus=1), ["c", "a", "d", "b"]).passed) == passed


def test_cut_refuses_a_size_below_one() -> None:
    with pytest.raises(ValueError, match="must be >= 1"):
        cut(FilterVerdict(passed=["a"]), np.array([1]), np.array([5]), 0)


def test_a_negative_shortlist_is_refused() -> None:
    with pytest.raises(ValueError, match="shortlist must be >= 0"):
        PolicyConfig(shortlist=-1)


# ---------------------------------------------------------------- choices at bind


def bind_choice(scheduler: Scheduler, pod: dict[str, Any], node: str) -> Choice:
    plan = scheduler.plan_bind(uid=uid_of(pod), namespace="default", name=name_of(pod), node=node,
                               now=0.0)  # fmt: skip
    return plan.choice


@dataclass(frozen=True)
class ChoiceCase:
    name: str
    shortlist: int
    prioritize: bool  # kube-scheduler calls prioritize after filter (full mode)
    node: str
    choice: Choice


CHOICES = [
    ChoiceCase("shortlist, kube-scheduler takes the best", 2, False, "busy6", Choice.BEST),
    ChoiceCase("shortlist, kube-scheduler takes the second", 2, False, "busy4", Choice.LOWER),
    ChoiceCase("full mode, prioritize rated it best", 0, True, "busy6", Choice.BEST),
    ChoiceCase("full mode, kube-scheduler's own scores won", 0, True, "idle", Choice.LOWER),
    ChoiceCase("full mode without prioritize: nothing rated", 0, False, "busy6", Choice.UNSCORED),
]


@pytest.mark.parametrize("case", CHOICES, ids=lambda c: c.name)
def test_bind_says_whether_the_chosen_node_was_rated_best(case: ChoiceCase) -> None:
    scheduler = cluster(case.shortlist)
    pod = make_pod("p", gpus=1)
    passed = scheduler.filter(pod, ORDER).passed
    if case.prioritize:
        scheduler.prioritize(pod, passed)
    assert bind_choice(scheduler, pod, case.node) is case.choice


def test_an_offer_is_taken_once() -> None:
    book = ChoiceBook()
    book.offer("u", np.array([3, 4]), np.array([7, 9]), layout=1)
    assert book.take("u", 4, layout=1) is Choice.BEST
    assert book.take("u", 4, layout=1) is Choice.UNSCORED


@pytest.mark.parametrize(
    ("node_id", "layout", "choice"),
    [
        (4, 1, Choice.BEST),
        (5, 1, Choice.BEST),  # tied at the best score
        (3, 1, Choice.LOWER),
        (9, 1, Choice.LOWER),  # not offered at all
        (4, 2, Choice.UNSCORED),  # the ids belong to another layout
        (None, 1, Choice.UNSCORED),  # a node the inventory does not know
    ],
)
def test_choice_book_compares_with_the_best_rated(
    node_id: int | None, layout: int, choice: Choice
) -> None:
    book = ChoiceBook()
    book.offer("u", np.array([3, 4, 5]), np.array([7, 9, 9]), layout=1)
    assert book.take("u", node_id, layout=layout) is choice


def test_choice_book_forgets_the_oldest_offers_beyond_its_capacity() -> None:
    book = ChoiceBook(capacity=2)
    for uid in ("a", "b", "c"):
        book.offer(uid, np.array([1]), np.array([5]), layout=0)
    book.offer("b", np.array([1]), np.array([5]), layout=0)  # renewed: now the newest
    book.offer("d", np.array([1]), np.array([5]), layout=0)
    assert len(book) == 2
    assert [book.take(uid, 1, 0) for uid in "abcd"] == [
        Choice.UNSCORED, Choice.BEST, Choice.UNSCORED, Choice.BEST,
    ]  # fmt: skip


# ------------------------------------------------- pods with soft preferences

PREFERRED_TERM = {"weight": 10, "preference": {"matchExpressions": []}}
POD_TERM = {"weight": 10, "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname"}}
HARD_TERM = {"nodeSelectorTerms": [{"matchExpressions": []}]}


def spread(when: str) -> dict[str, Any]:
    return {"topologySpreadConstraints": [
        {"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": when}
    ]}  # fmt: skip


PREFERENCES = [
    ("no affinity at all", {}, False),
    (
        "a required node affinity only",
        {
            "affinity": {
                "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": HARD_TERM}
            }
        },
        False,
    ),
    (
        "a preferred node affinity",
        {
            "affinity": {
                "nodeAffinity": {
                    "preferredDuringSchedulingIgnoredDuringExecution": [PREFERRED_TERM]
                }
            }
        },
        True,
    ),
    (
        "a preferred pod affinity",
        {
            "affinity": {
                "podAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [POD_TERM]}
            }
        },
        True,
    ),
    (
        "a preferred pod anti-affinity",
        {
            "affinity": {
                "podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [POD_TERM]}
            }
        },
        True,
    ),
    (
        "an empty preferred list",
        {"affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}}},
        False,
    ),
    ("a spread it may break", spread("ScheduleAnyway"), True),
    ("a spread it must keep (a filter, not a preference)", spread("DoNotSchedule"), False),
]


@pytest.mark.parametrize(
    ("spec", "size"),
    [(spec, 3 if soft else 1) for _, spec, soft in PREFERENCES],
    ids=[name for name, _, _ in PREFERENCES],
)
def test_a_pod_with_soft_preferences_gets_the_longer_shortlist(
    spec: dict[str, Any], size: int
) -> None:
    held = {"busy6": 6, "busy4": 4, "idle": 0}
    scheduler = scheduler_with(
        [make_node(name, gpus=8) for name in held],
        [make_pod(f"{n}-t", gpus=c, node=n, gpu_ids=list(range(c))) for n, c in held.items() if c],
        PolicyConfig(shortlist=1, shortlist_preferred=3),
    )
    pod = make_pod("p", gpus=1)
    pod["spec"].update(spec)
    assert len(scheduler.filter(pod, list(held)).passed) == size


@pytest.mark.parametrize(
    ("shortlist", "preferred", "sizes"),
    [
        (0, 0, (0, 0)),
        (0, 8, (0, 0)),
        (1, 0, (1, 1)),
        (1, 8, (1, 8)),
        (4, 4, (4, 4)),
        (16, 8, (16, 16)),
    ],
)
def test_shortlist_sizes(shortlist: int, preferred: int, sizes: tuple[int, int]) -> None:
    config = PolicyConfig(shortlist=shortlist, shortlist_preferred=preferred)
    assert (
        config.shortlist_size(soft_preferences=False),
        config.shortlist_size(soft_preferences=True),
    ) == sizes
