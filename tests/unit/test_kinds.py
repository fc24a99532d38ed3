"""The resource kinds as one seam (extender.kinds): each kind in KINDS answers the same
questions coherently, so that the verbs can loop over them. One table, one row per kind: a
pod that asks for it, a node with room for exactly one such pod, and what bind writes."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from extender import names
from extender.kinds import KINDS, Kind, asked
from extender.kinds.mig import MIG
from extender.kinds.share import SHARE
from extender.kinds.whole_gpu import WHOLE_GPU
from extender.model import Reason
from extender.requests import pod_request
from extender.scheduler import Scheduler
from testbed.builders import make_node, make_pod, share_pod
from tests.mig_builders import mig_node, mig_pod

GIB = 1024
NOW = 1000.0

Builder = Callable[[str], dict[str, Any]]


@dataclass(frozen=True)
class KindCase:
    id: str
    kind: Kind[Any]
    pod: Builder  # a pod asking for the kind, by name
    node: Callable[[], dict[str, Any]]  # node "n": room for exactly one such pod
    annotation: str  # what bind writes for it
    unit_size: object  # the size of one unit of the pod, in a gang's whole-group fit


CASES = [
    KindCase(
        "whole GPUs",
        WHOLE_GPU,
        pod=lambda name: make_pod(name, gpus=2),
        node=lambda: make_node("n", gpus=2, groups=[[0, 1]]),
        annotation=names.GPU_IDS,
        unit_size=1,
    ),
    KindCase(
        "a share",
        SHARE,
        pod=lambda name: share_pod(name, memory_mib=50 * GIB, cores=60, shares=2),
        node=lambda: make_node("n", gpus=2),
        annotation=names.GPU_SHARE_MEMORY,
        unit_size=(1, 50 * GIB, 60),
    ),
    KindCase(
        "MIG devices",
        MIG,
        pod=lambda name: mig_pod(name, {"1g.10gb": 2, "2g.20gb": 1}),
        node=lambda: mig_node("n", migs={0: ["1g.10gb", "1g.10gb", "2g.20gb"]}),
        annotation=names.MIG_UUIDS,
        unit_size=(("1g.10gb", 1), ("2g.20gb", 1)),
    ),
]
IDS = [case.id for case in CASES]


def placed_once(case: KindCase) -> Scheduler:
    """Node "n" with the first pod of the kind bound through filter and bind."""
    scheduler = Scheduler()
    scheduler.upsert_node(case.node())
    first = case.pod("first")
    assert scheduler.filter(first, ["n"]).passed == ["n"]
    meta = first["metadata"]
    plan = scheduler.plan_bind(
        uid=meta["uid"], namespace=meta["namespace"], name=meta["name"], node="n", now=NOW
    )
    assert case.annotation in plan.annotations
    scheduler.confirm_bind(plan)
    return scheduler


def test_every_kind_is_in_kinds_once() -> None:
    assert sorted(kind.name for kind in KINDS) == sorted({case.kind.name for case in CASES})


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_a_pod_asks_for_its_own_kind_only(case: KindCase) -> None:
    assert asked(pod_request(case.pod("p"))) == (case.kind,)


def test_a_pod_without_gpus_asks_for_no_kind() -> None:
    assert asked(pod_request(make_pod("cpu"))) == ()


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_the_second_pod_is_turned_away_in_the_kinds_own_words(case: KindCase) -> None:
    scheduler = placed_once(case)
    second = case.pod("second")
    verdict = scheduler.filter(second, ["n"])
    assert verdict.passed == []
    (rejection,) = verdict.rejections
    request = pod_request(second)
    assert rejection.message == case.kind.messages(request)[rejection.reason]
    assert rejection.resolvable  # a pod leaving frees it
    assert scheduler.prioritize(second, ["n"]).tolist() == [0]  # the kind's score gate


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_every_reason_a_kind_raises_has_its_message(case: KindCase) -> None:
    scheduler = placed_once(case)
    inventory = scheduler.inventory
    request = pod_request(case.pod("second"))
    kind = case.kind
    raised = kind.spec_conditions(inventory, kind.spec_key(request))
    raised += kind.held_conditions(inventory, request, lambda column: column)
    messages = kind.messages(request)
    reasons = {reason for _, reason in raised}
    assert reasons
    assert Reason.FITS not in reasons
    assert {
        reason: messages[reason].startswith("schedext: ") for reason in reasons
    } == dict.fromkeys(reasons, True)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_evicting_the_first_pod_is_what_the_second_needs(case: KindCase) -> None:
    scheduler = placed_once(case)
    view = scheduler.inventory.node("n")
    assert view is not None
    (first,) = view.holdings
    check = case.kind.victims_check(view, pod_request(case.pod("second")))
    assert (check([]), check([first])) == (False, True)
    assert case.kind.freed(view, first) >= 0


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_what_the_first_pod_frees_is_what_the_second_waits_for(case: KindCase) -> None:
    scheduler = placed_once(case)
    view = scheduler.inventory.node("n")
    assert view is not None
    (first,) = view.holdings
    waits = case.kind.waits(scheduler.inventory, pod_request(case.pod("second")))
    freed = {key for key, count in case.kind.departure_frees(first, view.spec) if count > 0}
    assert waits & freed


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_a_gang_member_reduced_to_one_unit_asks_one_of_its_kind(case: KindCase) -> None:
    unit = case.kind.unit(pod_request(case.pod("p")))
    assert asked(unit) == (case.kind,)
    assert case.kind.size(unit) == case.unit_size


@pytest.mark.parametrize("case", CASES[:2], ids=IDS[:2])
def test_explain_names_what_the_pod_asks_of_its_kind(case: KindCase) -> None:
    described = case.kind.describe(pod_request(case.pod("p")))
    assert described
    assert all(described.values())


def test_the_score_gate_of_a_kind_reads_only_the_candidates() -> None:
    case = CASES[0]
    scheduler = placed_once(case)
    scheduler.upsert_node(make_node("m", gpus=2))
    inventory = scheduler.inventory
    request = pod_request(case.pod("second"))
    ids = inventory.ids(["m", "n"])
    assert WHOLE_GPU.score_gate(inventory, request, ids).tolist() == [True, False]
    assert WHOLE_GPU.score_gate(inventory, request, ids[1:]).tolist() == [False]


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_the_reasons_a_freeing_lifts_are_reasons_the_kind_raises(case: KindCase) -> None:
    kind = case.kind
    request = pod_request(case.pod("second"))
    own = set(kind.messages(request))  # every reason the kind raises has its message
    assert kind.freed_by_departure
    assert kind.freed_by_departure <= own
    assert kind.freed_by_node <= own
