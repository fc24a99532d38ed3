"""The fault soak's invariant checker (loadtests.soak.checker), its fault schedule and its
workload: each rule on a table of cluster states, built from pod and node builders."""

from __future__ import annotations

import datetime as dt
from collections import Counter
from dataclasses import replace
from typing import Any

import pytest

from loadtests.soak.checker import Checker, Claim, Group, Limits, Node, Pod, Snapshot
from loadtests.soak.faults import FaultKind, parse_kinds, schedule
from loadtests.soak.reading import pod_of
from loadtests.soak.workload import UnitKind, Workload, parse_mix

NODES = {"n1": Node("n1", 8, 81_920), "n2": Node("n2", 8, 81_920)}


def whole(name: str, node: str | None = "n1", gpus: tuple[int, ...] = (0,), **more: Any) -> Pod:
    return Pod(f"ns/{name}", f"uid-{name}", node, gpus if node else None, len(gpus), **more)


def share(name: str, gpu: int, mib: int, cores: int = 0, node: str = "n1") -> Pod:
    return Pod(f"ns/{name}", f"uid-{name}", node, (gpu,), share_mib=mib, share_cores=cores)


def at(t: float, *pods: Pod, **more: Any) -> Snapshot:
    return Snapshot(t, pods, NODES, **more)


INSTANT_CASES = [
    ("two pods on their own GPUs", at(0, whole("a", gpus=(0, 1)), whole("b", gpus=(2,))), []),
    ("one GPU held whole twice", at(0, whole("a", gpus=(0, 1)), whole("b", gpus=(1,))),
     ["gpu-twice"]),
    ("the same index on two nodes", at(0, whole("a"), whole("b", node="n2")), []),
    ("a share on a GPU held whole", at(0, whole("a", gpus=(3,)), share("s", 3, 1024)),
     ["gpu-twice"]),
    ("shares within the memory", at(0, share("s", 2, 40_960), share("t", 2, 40_960)), []),
    ("shares over the memory", at(0, share("s", 2, 40_960), share("t", 2, 40_961)),
     ["share-over"]),
    ("shares over the cores", at(0, share("s", 2, 1, 60), share("t", 2, 1, 41)),
     ["share-over"]),
    ("a GPU pod bound without its indices", at(0, replace(whole("a"), gpus=None)),
     ["gpu-unrecorded"]),
    ("an index the node has not", at(0, whole("a", gpus=(8,))), ["gpu-unrecorded"]),
    ("fewer indices than asked", at(0, replace(whole("a", gpus=(0,)), asked_gpus=2)),
     ["gpu-unrecorded"]),
    ("a pending pod holds nothing", at(0, whole("a", node=None)), []),
    ("one address, two pods",
     at(0, whole("a", ip="10.0.0.1"), whole("b", gpus=(1,), ip="10.0.0.1")), ["address-twice"]),
    ("two addresses", at(0, whole("a", ip="10.0.0.1"), whole("b", gpus=(1,), ip="10.0.0.2")), []),
    ("a sticky pod on its claimed address",
     at(0, whole("s-0", ip="10.0.0.5", identity="sts/ns/s/0"),
        claims=(Claim("p.10-0-0-5", "10.0.0.5", "sts/ns/s/0", "uid-s-0"),),
        statefulsets={"ns/s": 1}), []),
    ("a sticky pod moved off its claimed address",
     at(0, whole("s-0", ip="10.0.0.6", identity="sts/ns/s/0"),
        claims=(Claim("p.10-0-0-5", "10.0.0.5", "sts/ns/s/0", "uid-s-0"),),
        statefulsets={"ns/s": 1}), ["sticky-moved"]),
]  # fmt: skip


@pytest.mark.parametrize(
    ("snapshot", "expected"), [c[1:] for c in INSTANT_CASES], ids=[c[0] for c in INSTANT_CASES]
)
def test_instant_invariants(snapshot: Snapshot, expected: list[str]) -> None:
    assert [v.check for v in Checker().check(snapshot)] == expected


def test_a_double_allocation_names_both_pods_and_the_gpu() -> None:
    (violation,) = Checker().check(at(0, whole("a", gpus=(4,)), whole("b", gpus=(4,))))
    assert violation.resource == "n1/gpu4"
    assert "ns/a" in violation.subject
    assert "ns/b" in violation.subject


def test_a_violation_is_reported_once_however_many_readings_show_it() -> None:
    checker = Checker()
    twice = (whole("a", gpus=(4,)), whole("b", gpus=(4,)))
    assert len(checker.check(at(0, *twice))) == 1
    assert checker.check(at(1, *twice)) == []
    assert len(checker.check(at(2, *twice, whole("c", gpus=(4,)), whole("d", gpus=(5,))))) == 1


def gang(count: int, *, bound: int, min_member: int = 4) -> tuple[Pod, ...]:
    return tuple(
        whole(f"g-{i}", node="n1" if i < bound else None, gpus=(i,), group="ns/g")
        for i in range(count)
    )


@pytest.mark.parametrize(
    ("bound", "seconds", "violations"),
    [
        (0, 100, 0),  # none placed: waiting, not partial
        (4, 100, 0),  # whole
        (2, 30, 0),  # partial, within timeout (20) and grace (30)
        (2, 51, 1),  # partial for longer than both
    ],
)
def test_a_gang_partly_bound_past_its_timeout(bound: int, seconds: float, violations: int) -> None:
    checker = Checker(Limits(gang_grace_s=30))
    groups = {"ns/g": Group("ns/g", 4, 20)}
    found = []
    for t in range(0, int(seconds) + 1):
        found += checker.check(at(t, *gang(4, bound=bound), groups=groups))
    assert [v.check for v in found] == ["gang-partial"] * violations


def test_a_partial_gang_that_completes_in_between_starts_again() -> None:
    checker = Checker(Limits(gang_grace_s=5))
    groups = {"ns/g": Group("ns/g", 4, 5)}
    found = []
    for t in range(0, 30):
        bound = 4 if t % 9 == 8 else 2  # whole for a moment every 9 s: never 10 s partial
        found += checker.check(at(t, *gang(4, bound=bound), groups=groups))
    assert found == []


@pytest.mark.parametrize(
    ("statefulsets", "owner", "violations"),
    [
        ({"ns/s": 2}, "sts/ns/s/1", 0),  # the identity exists
        ({"ns/s": 1}, "sts/ns/s/1", 1),  # scaled below its ordinal
        ({}, "sts/ns/s/0", 1),  # its StatefulSet is gone
    ],
)
def test_a_claim_kept_after_its_identity_went(
    statefulsets: dict[str, int], owner: str, violations: int
) -> None:
    checker = Checker(Limits(claim_grace_s=10))
    claim = Claim("p.10-0-0-5", "10.0.0.5", owner, None)
    found = []
    for t in range(0, 12):
        found += checker.check(at(t, claims=(claim,), statefulsets=statefulsets))
    assert [v.check for v in found] == ["claim-left"] * violations


def test_a_pending_pod_needs_a_reason_in_two_readings_of_the_events() -> None:
    checker = Checker(Limits(reason_grace_s=30))
    pod = replace(whole("p", node=None), created=0.0)
    assert checker.check(at(20, pod, reasons=frozenset())) == []  # too young to judge
    assert checker.check(at(40, pod, reasons=frozenset())) == []  # silent once
    assert checker.check(at(45, pod)) == []  # events not read this time
    assert [v.check for v in checker.check(at(55, pod, reasons=frozenset()))] == ["no-reason"]
    assert checker.check(at(65, pod, reasons=frozenset())) == []  # reported once
    other = replace(whole("q", node=None), created=0.0)
    assert checker.check(at(70, other, reasons=frozenset({"ns/q"}))) == []  # it has one


def inventory(
    *gpus: tuple[str, int, str, bool], pools: tuple[tuple[str, str], ...] = ()
) -> dict[str, Any]:
    """(node, index, holder, reserved) per held GPU, and (address, pod) per held address."""
    nodes: dict[str, list[dict[str, Any]]] = {}
    for node, index, holder, reserved in gpus:
        nodes.setdefault(node, []).append({"index": index, "holder": holder, "reserved": reserved})
    return {
        "nodes": [{"name": name, "gpus": held} for name, held in nodes.items()],
        "pools": [{"holders": [{"address": a, "pod": p} for a, p in pools]}],
    }


INVENTORY_CASES = [
    ("the same", at(0, whole("a", ip="10.0.0.1")),
     inventory(("n1", 0, "ns/a", False), pools=(("10.0.0.1", "ns/a"),)), []),
    ("a reservation of a pod still pending", at(0, whole("a", node=None)),
     inventory(("n1", 0, "ns/a", True)), []),
    ("a GPU schedext forgot", at(0, whole("a")), inventory(), ["inventory"]),
    ("a GPU held for a pod that is gone", at(0), inventory(("n1", 0, "ns/a", False)),
     ["inventory"]),
    ("a reservation for a pod that is gone", at(0), inventory(("n1", 0, "ns/a", True)),
     ["inventory"]),
    ("the wrong holder", at(0, whole("a")), inventory(("n1", 0, "ns/b", False)), ["inventory"]),
    ("an address schedext forgot", at(0, whole("a", ip="10.0.0.1")),
     inventory(("n1", 0, "ns/a", False)), ["inventory"]),
]  # fmt: skip


@pytest.mark.parametrize(
    ("snapshot", "body", "expected"),
    [c[1:] for c in INVENTORY_CASES],
    ids=[c[0] for c in INVENTORY_CASES],
)
def test_the_inventory_against_the_bound_pods(
    snapshot: Snapshot, body: dict[str, Any], expected: list[str]
) -> None:
    lenient = Checker(Limits(inventory_grace_s=20))
    assert lenient.check(snapshot, body) == []  # a difference may be a watch behind
    later = replace(snapshot, at=snapshot.at + 21)
    assert [v.check for v in lenient.check(later, body)] == expected
    assert [v.check for v in Checker().check(snapshot, body, strict=True)] == expected


def test_a_reservation_that_never_ends_is_a_violation() -> None:
    checker = Checker(reservation_grace_s=60)
    body = inventory(("n1", 0, "ns/a", True))
    pending = whole("a", node=None)
    assert checker.check(at(0, pending), body) == []
    assert [v.check for v in checker.check(at(61, pending), body)] == ["inventory"]


def test_a_pod_object_is_read_as_the_checks_need() -> None:
    obj = {
        "metadata": {
            "name": "s-1", "namespace": "ns", "uid": "u1",
            "creationTimestamp": "2026-11-27T10:00:00Z",
            "annotations": {"schedext.io/gpu-ids": "2", "schedext.io/gpu-share-memory-mib": "10240",
                            "schedext.io/ip": "10.0.0.3", "schedext.io/ip-policy": "sticky"},
            "labels": {"scheduling.x-k8s.io/pod-group": "g"},
            "ownerReferences": [{"kind": "StatefulSet", "name": "s"}],
        },
        "spec": {"nodeName": "n1", "containers": [{"resources": {"requests": {
            "schedext.io/gpu-memory": "10240", "schedext.io/ip": "1"}}}]},
    }  # fmt: skip
    pod = pod_of(obj)
    assert (pod.key, pod.node, pod.gpus, pod.share_mib) == ("ns/s-1", "n1", (2,), 10240)
    assert (pod.ip, pod.identity, pod.group) == ("10.0.0.3", "sts/ns/s/1", "ns/g")
    assert pod.asks_address
    assert pod.created == dt.datetime(2026, 11, 27, 10, tzinfo=dt.UTC).timestamp()


def test_every_fault_kind_comes_equally_often_in_a_seeded_order() -> None:
    plan = schedule(7, tuple(FaultKind), interval_s=10, duration_s=1000)
    assert plan == schedule(7, tuple(FaultKind), interval_s=10, duration_s=1000)
    assert plan != schedule(8, tuple(FaultKind), interval_s=10, duration_s=1000)
    decks = len(plan) // len(FaultKind)
    counts = Counter(kind for _, kind in plan[: decks * len(FaultKind)])
    assert set(counts.values()) == {decks}
    times = [t for t, _ in plan]
    assert times == sorted(times)
    assert times[0] >= 7.5
    assert times[-1] <= 990


@pytest.mark.parametrize(
    ("text", "kinds"),
    [("all", tuple(FaultKind)), ("none", ()),
     ("watch-cut, slow-api", (FaultKind.WATCH_CUT, FaultKind.SLOW_API))],
)  # fmt: skip
def test_fault_kinds_from_the_command_line(text: str, kinds: tuple[FaultKind, ...]) -> None:
    assert parse_kinds(text) == kinds


def test_an_unknown_fault_or_mix_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="unknown fault 'kill'"):
        parse_kinds("kill")
    with pytest.raises(ValueError, match="bad mix entry 'gpu=1'"):
        parse_mix("gpu=1")
    with pytest.raises(ValueError, match="every kind a weight of 0"):
        parse_mix("whole=0")


def test_a_seed_gives_the_same_units() -> None:
    def shapes(seed: int) -> list[tuple[str, str, int, float]]:
        workload = Workload(seed)
        units = [workload.next_unit() for _ in range(200)]
        return [(u.kind.value, u.namespace, len(u.pods), u.lifetime_s) for u in units]

    assert shapes(3) == shapes(3)
    assert shapes(3) != shapes(4)
    kinds = Counter(kind for kind, *_ in shapes(3))
    assert set(kinds) == {k.value for k in UnitKind}  # the default mix makes every kind


def test_gangs_and_statefulsets_come_with_their_objects() -> None:
    workload = Workload(5, {UnitKind.GANG: 1, UnitKind.STICKY: 1})
    for _ in range(50):
        unit = workload.next_unit()
        if unit.kind is UnitKind.GANG:
            assert unit.group is not None
            assert 2 <= unit.group["spec"]["minMember"] == len(unit.pods) <= 8
        else:
            assert unit.statefulset is not None
            assert unit.statefulset["spec"]["replicas"] == len(unit.pods)
            assert unit.restarts >= 1
