"""Gangs that require one topology domain (issue 32): the whole-group fit search runs per
domain of the level; a group goes only where one domain holds it all, follows its placed
members, and is refused with the level and the best domain's shortfall when none can; a node
without the level's label is a domain of its own; bad annotations are ignored, with why."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson
import pytest

from app.kube.events import ApiEventRecorder, PodGroupEvent
from app.service.node_problems import GangTopologyReporter
from extender import names
from extender.gang.topology import Topology, read_topology
from extender.model import Reason
from extender.scheduler import Scheduler
from testbed.builders import (
    gang_pod,
    ip_pod,
    make_ip_pool,
    make_node,
    make_pod_group,
    name_of,
    uid_of,
)
from tests.recorded_events import RecordedEvents
from tests.unit.kube_fakes import FakeApiServer

Obj = dict[str, Any]
RACK, CLIQUE, ZONE = names.RACK_LABEL, names.CLIQUE_LABEL, names.ZONE_LABEL
LEVELS = (CLIQUE, RACK, names.SPINE_LABEL, ZONE)


def node(name: str, gpus: int = 8, **labels: str) -> Obj:
    keys = {"rack": RACK, "clique": CLIQUE, "zone": ZONE}
    return make_node(name, gpus=gpus, labels={keys[k]: v for k, v in labels.items()})


def gang(members: int, gpus: int, **annotations: str) -> tuple[Obj, list[Obj]]:
    keys = {"required": names.TOPOLOGY_REQUIRED, "preferred": names.TOPOLOGY_PREFERRED}
    group = make_pod_group(
        "g", min_member=members, annotations={keys.get(k, k): v for k, v in annotations.items()}
    )
    return group, [gang_pod(f"m{i}", "g", gpus=gpus) for i in range(members)]


def scheduler_of(nodes: Sequence[Obj], group: Obj, pods: Sequence[Obj]) -> Scheduler:
    scheduler = Scheduler()
    for obj in nodes:
        scheduler.upsert_node(obj)
    scheduler.upsert_pod_group(group)
    for pod in pods:
        scheduler.upsert_pod(pod)
    return scheduler


# Rack a: 2 nodes of 8 free (16); rack b: 2 nodes of 4 free and one of 8 with no rack (16
# together across b and the unlabelled node, but never in one rack).
RACKS = [
    node("a1", rack="a"),
    node("a2", rack="a"),
    node("b1", gpus=4, rack="b"),
    node("b2", gpus=4, rack="b"),
    node("x1"),
]
ALL = [name_of(n) for n in RACKS]


@dataclass(frozen=True)
class Case:
    id: str
    members: int
    gpus: int
    annotations: dict[str, str]
    passed: tuple[str, ...]  # the first member's filter
    refusal: str = ""  # a part of the message every node gets, when refused
    nodes: Sequence[Obj] = field(default_factory=lambda: RACKS)


CASES = [
    Case("no topology: anywhere", 3, 4, {}, ("a1", "a2", "b1", "b2", "x1")),
    Case(
        "required rack: only the rack that holds it all, though the cluster has room elsewhere",
        3,
        4,
        {"required": RACK},
        ("a1", "a2"),
    ),
    Case(
        "no rack holds it: refused everywhere, naming the level and the best rack",
        3,
        8,
        {"required": RACK},
        (),
        refusal=f"no {RACK} can hold all of group default/g: the best, a, has 16 free GPUs "
        "of the 24 its unplaced members need",
    ),
    Case(
        "a node without the label is a domain of its own: x2 cannot lean on x1",
        2,
        4,
        {"required": RACK},
        ("x1",),
        nodes=[node("x1"), node("x2", gpus=4)],
    ),
    Case(
        "required clique",
        2,
        8,
        {"required": CLIQUE},
        ("c1", "c2"),
        nodes=[
            node("c1", clique="nvl-1", rack="a"),
            node("c2", clique="nvl-1", rack="a"),
            node("d1", clique="nvl-2", rack="a"),
            node("d2", gpus=4, clique="nvl-3", rack="a"),
        ],
    ),
    Case(
        "Kueue's annotation is read as schedext's",
        3,
        4,
        {"kueue.x-k8s.io/podset-required-topology": RACK},
        ("a1", "a2"),
    ),
    Case(
        "KAI's too",
        3,
        4,
        {"kai.scheduler/topology-required-placement": RACK},
        ("a1", "a2"),
    ),
    Case(
        "a level not configured is ignored: no requirement",
        3,
        4,
        {"required": "example.com/row"},
        ("a1", "a2", "b1", "b2", "x1"),
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_a_member_goes_where_one_domain_holds_its_whole_group(case: Case) -> None:
    group, pods = gang(case.members, case.gpus, **case.annotations)
    scheduler = scheduler_of(case.nodes, group, pods)
    names_ = [name_of(n) for n in case.nodes]
    verdict = scheduler.filter(pods[0], names_)
    assert tuple(verdict.passed) == case.passed
    if case.refusal:
        assert {r.reason for r in verdict.rejections} == {Reason.GANG_CAPACITY}
        assert all(case.refusal in r.message for r in verdict.rejections)


def test_the_rest_follow_the_first_member_into_its_domain() -> None:
    # Racks a and c can each hold the group; once m0 is reserved in c, m1 may go only there.
    nodes = [*RACKS, node("c1", rack="c"), node("c2", rack="c")]
    group, pods = gang(2, 8, required=RACK)
    scheduler = scheduler_of(nodes, group, pods)
    assert scheduler.filter(pods[0], ["c1"]).passed == ["c1"]
    scheduler.plan_bind(uid=uid_of(pods[0]), namespace="default", name="m0", node="c1", now=0.0)
    verdict = scheduler.filter(pods[1], [name_of(n) for n in nodes])
    assert verdict.passed == ["c2"]


def test_nothing_is_reserved_for_a_group_no_domain_holds() -> None:
    group, pods = gang(3, 8, required=RACK)
    scheduler = scheduler_of(RACKS, group, pods)
    for pod in pods:
        assert scheduler.filter(pod, ALL).passed == []
    assert scheduler.inventory.reservation_count == 0


@pytest.mark.parametrize(
    ("annotations", "expected"),
    [
        ({}, Topology()),
        ({names.TOPOLOGY_REQUIRED: RACK}, Topology(required=RACK)),
        ({names.TOPOLOGY_PREFERRED: f" {CLIQUE} "}, Topology(preferred=CLIQUE)),
        (
            {names.TOPOLOGY_REQUIRED: RACK, "kueue.x-k8s.io/podset-required-topology": RACK},
            Topology(required=RACK),
        ),
        (
            {names.TOPOLOGY_REQUIRED: RACK, "kai.scheduler/topology-required-placement": ZONE},
            Topology(
                problem="required topology ignored: the annotations disagree "
                f"({names.TOPOLOGY_REQUIRED}={RACK}, "
                f"kai.scheduler/topology-required-placement={ZONE})"
            ),
        ),
        (
            {names.TOPOLOGY_REQUIRED: "example.com/row"},
            Topology(
                problem=f"required topology ignored: {names.TOPOLOGY_REQUIRED}=example.com/row "
                f"is not a configured level (policy.topology_levels: {', '.join(LEVELS)})"
            ),
        ),
        (
            {names.TOPOLOGY_REQUIRED: CLIQUE, names.TOPOLOGY_PREFERRED: ZONE},
            Topology(
                required=CLIQUE,
                problem=f"preferred topology {ZONE} ignored: it is wider than the required "
                f"{CLIQUE}",
            ),
        ),
    ],
    ids=["none", "required", "preferred, trimmed", "alias agrees", "aliases disagree",
         "not configured", "preferred wider than required"],
)  # fmt: skip
def test_reading_a_gangs_topology(annotations: dict[str, str], expected: Topology) -> None:
    assert read_topology(annotations, LEVELS) == expected


# ------------------------------------------------------------------------- bad input


def test_a_bad_annotation_gets_one_warning_event_on_its_podgroup_and_the_gang_still_runs() -> None:
    group, pods = gang(2, 4, required="example.com/row")
    scheduler = scheduler_of(RACKS, group, pods)
    assert scheduler.filter(pods[0], ALL).passed == ALL  # no requirement: anywhere
    events = RecordedEvents()
    reporter = GangTopologyReporter(events)
    for _ in range(2):
        reporter.check(scheduler.gang_topology_problems())
    (event,) = events.events
    assert isinstance(event, PodGroupEvent)
    assert (event.group, event.reason, event.uid) == ("default/g", "TopologyIgnored", "pg-uid-g")
    assert "example.com/row is not a configured level" in event.message


def test_the_podgroup_event_names_the_podgroup() -> None:
    posted: list[httpx.Request] = []

    async def post() -> None:
        done = asyncio.Event()

        def answer(request: httpx.Request) -> httpx.Response:
            posted.append(request)
            done.set()
            return httpx.Response(201, json={})

        recorder = ApiEventRecorder(FakeApiServer(other=answer).api())
        await recorder.start()
        recorder.record(PodGroupEvent("ml/g", "TopologyIgnored", "why", uid="u"))
        await asyncio.wait_for(done.wait(), timeout=5)
        await recorder.stop()

    asyncio.run(post())
    (request,) = posted
    assert request.url.path == "/api/v1/namespaces/ml/events"
    assert orjson.loads(request.content)["involvedObject"] == {
        "apiVersion": "scheduling.x-k8s.io/v1alpha1",
        "kind": "PodGroup",
        "namespace": "ml",
        "name": "g",
        "uid": "u",
    }


# ------------------------------------------------------------------------- preferred


def scores(scheduler: Scheduler, pod: Obj, nodes: Sequence[str]) -> dict[str, int]:
    return dict(zip(nodes, (int(x) for x in scheduler.prioritize(pod, nodes)), strict=True))


def test_preferred_clique_first_member_goes_where_the_group_fits_the_rest_follow() -> None:
    # Rack r holds the group either way; only clique q1 holds it inside one NVLink domain.
    nodes = [
        node("q1a", clique="q1", rack="r"),
        node("q1b", clique="q1", rack="r"),
        node("q2a", clique="q2", rack="r"),
        node("far", clique="q3", rack="s"),
    ]
    group, pods = gang(2, 8, preferred=CLIQUE)
    scheduler = scheduler_of(nodes, group, pods)
    everywhere = [name_of(n) for n in nodes]
    first = scores(scheduler, pods[0], everywhere)
    assert first["q1a"] == first["q1b"] > first["q2a"] >= first["far"]
    scheduler.plan_bind(uid=uid_of(pods[0]), namespace="default", name="m0", node="q1b", now=0.0)
    second = scores(scheduler, pods[1], everywhere)
    assert second["q1a"] > second["q2a"] >= second["far"]


def test_preferred_falls_back_across_racks_when_no_rack_holds_the_group() -> None:
    nodes = [node("a1", rack="a"), node("b1", rack="b"), node("c1", rack="c")]
    group, pods = gang(3, 8, preferred=RACK)
    scheduler = scheduler_of(nodes, group, pods)
    everywhere = [name_of(n) for n in nodes]
    assert scheduler.filter(pods[0], everywhere).passed == everywhere  # never refused for it


def test_preferred_starts_in_the_roomiest_rack_when_none_holds_the_group() -> None:
    # 3 x 8: no rack holds it; p holds two members, q and r one each. Rated alike, the first
    # member could start in q and the second go to r: three racks where two do.
    nodes = [node("p1", rack="p"), node("p2", rack="p"), node("q1", rack="q"), node("r1", rack="r")]
    group, pods = gang(3, 8, preferred=RACK)
    scheduler = scheduler_of(nodes, group, pods)
    everywhere = [name_of(n) for n in nodes]
    first = scores(scheduler, pods[0], everywhere)
    assert first["p1"] == first["p2"] > first["q1"] == first["r1"]
    scheduler.plan_bind(uid=uid_of(pods[0]), namespace="default", name="m0", node="p1", now=0.0)
    second = scores(scheduler, pods[1], everywhere)
    assert second["p2"] > second["q1"] == second["r1"]


# ------------------------------------------------------------------------- addresses


def test_a_gang_with_addresses_avoids_the_rack_whose_pool_is_short() -> None:
    # Both racks hold the GPUs; rack a's pool has 1 free address for 2 members, b's has 4.
    nodes = [node("a1", rack="a"), node("a2", rack="a"), node("b1", rack="b"), node("b2", rack="b")]
    group, _ = gang(2, 8, required=RACK)
    members = [
        ip_pod(f"m{i}", pool="pa,pb", gpus=8, labels={names.POD_GROUP_LABEL: "g"}) for i in range(2)
    ]
    scheduler = scheduler_of(nodes, group, members)
    scheduler.upsert_ip_pool(make_ip_pool("pa", ranges=[("10.0.0.1", "10.0.0.1")], rack="a"))
    scheduler.upsert_ip_pool(make_ip_pool("pb", ranges=[("10.0.1.1", "10.0.1.4")], rack="b"))
    everywhere = [name_of(n) for n in nodes]
    assert scheduler.filter(members[0], everywhere).passed == ["b1", "b2"]
    scheduler.upsert_ip_pool(make_ip_pool("pb", ranges=[("10.0.1.1", "10.0.1.1")], rack="b"))
    verdict = scheduler.filter(members[0], everywhere)
    assert verdict.passed == []
    message = verdict.rejections[0].message
    assert "the members' addresses do not fit in any that has the GPUs" in message
    assert "has 1 free addresses for 2 members" in message


# ------------------------------------------------------------------- on the members


def test_kueues_annotation_on_the_members_is_followed_when_the_podgroup_names_none() -> None:
    group, _ = gang(3, 4)
    kueue = {"kueue.x-k8s.io/podset-required-topology": RACK}
    members = [gang_pod(f"m{i}", "g", gpus=4, annotations=kueue) for i in range(3)]
    scheduler = scheduler_of(RACKS, group, members)
    assert scheduler.filter(members[0], ALL).passed == ["a1", "a2"]


def test_the_podgroups_annotation_wins_over_the_members() -> None:
    group, _ = gang(3, 4, required=CLIQUE)  # no node has a clique: each is its own
    members = [
        gang_pod(f"m{i}", "g", gpus=4, annotations={names.TOPOLOGY_REQUIRED: RACK})
        for i in range(3)
    ]
    scheduler = scheduler_of(RACKS, group, members)
    assert scheduler.filter(members[0], ALL).passed == []  # no one node holds 12 GPUs


def test_members_that_disagree_are_ignored_with_a_warning() -> None:
    group, _ = gang(2, 4)
    members = [
        gang_pod("m0", "g", gpus=4, annotations={names.TOPOLOGY_REQUIRED: RACK}),
        gang_pod("m1", "g", gpus=4, annotations={names.TOPOLOGY_REQUIRED: ZONE}),
    ]
    scheduler = scheduler_of(RACKS, group, members)
    assert scheduler.filter(members[0], ALL).passed == ALL
    ((uid, problem),) = scheduler.gang_topology_problems().values()
    assert uid == "pg-uid-g"
    assert problem.startswith("topology ignored: the members disagree")
