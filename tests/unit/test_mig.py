"""MIG devices in the core: what a pod asks for, what a node offers (and how that stands
beside allocatable under the mixed strategy), the topology document's MIG devices, who holds
which device, the filter's reasons, bind's packed choice, and preemption freeing them."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

import pytest

from extender import names
from extender.devices import Gpu, MigSlice, Topology, decode_topology, encode_topology
from extender.devices.document import MAX_MIGS, DocumentError
from extender.devices.mig_slices import pick_slices, profile_from_name
from extender.inventory import InventoryConflictError
from extender.mig import choose_mig, node_gpus
from extender.model import Holding, HoldingKind, MigSlot, Reason, Victim
from extender.nodes import node_spec
from extender.requests import PodRequestError, holding_from_pod, pod_request
from extender.shares import room_after
from testbed.builders import make_node, make_pod, share_pod, uid_of
from tests.mig_builders import mig_node, mig_pod, mig_topology, mig_uuid
from tests.unit.helpers import scheduler_with

P1, P2 = "1g.10gb", "2g.20gb"
MIG = names.MIG_RESOURCE_PREFIX

# --------------------------------------------------------------------------- requests


def plus_mig(pod: dict[str, Any], profile: str, count: str) -> dict[str, Any]:
    block = pod["spec"]["containers"][0]["resources"]
    block["limits"][MIG + profile] = block["requests"][MIG + profile] = count
    return pod


REQUEST_CASES = [
    # (id, pod, MIG devices asked, or a fragment of the error)
    ("one profile", mig_pod("p", {P1: 1}), ((P1, 1),), None),
    ("two profiles, sorted", mig_pod("p", {P2: 1, P1: 3}), ((P1, 3), (P2, 1)), None),
    ("a profile with +me", mig_pod("p", {"1g.10gb+me": 1}), (("1g.10gb+me", 1),), None),
    ("zero is nothing asked", mig_pod("p", {P1: 0}), (), None),
    ("a fraction", mig_pod("p", {P1: "500m"}), None, "whole number"),
    ("too many", mig_pod("p", {P1: 65}), None, "at most 64"),
    ("not a profile name", mig_pod("p", {"1G.10GB": 1}), None, "no profile"),
    (
        "beside whole GPUs",
        mig_pod("p", {P1: 1}, gpus=1),
        None,
        "MIG devices (nvidia.com/mig-*) or whole GPUs (nvidia.com/gpu), not both",
    ),
    ("beside a share", plus_mig(share_pod("s", memory_mib=1024), P1, "1"), None, "or GPU shares"),
    ("nine profiles", mig_pod("p", {f"{i}g.{i}0gb": 1 for i in range(1, 10)}), None, "at most 8"),
]


@pytest.mark.parametrize(
    ("pod", "asked", "error"), [c[1:] for c in REQUEST_CASES], ids=[c[0] for c in REQUEST_CASES]
)
def test_a_pods_mig_resources_decode_per_profile(
    pod: dict[str, Any], asked: tuple[tuple[str, int], ...] | None, error: str | None
) -> None:
    if error is not None:
        with pytest.raises(PodRequestError, match=re.escape(error)):
            pod_request(pod)
        return
    request = pod_request(pod)
    assert request.mig == asked
    assert (request.gpus, request.share.devices) == (0, 0)
    assert request.needs_gpu_node is bool(asked)


def test_mig_resources_of_init_containers_follow_the_effective_request() -> None:
    init = {
        "name": "init",
        "resources": {"limits": {MIG + P1: "2"}, "requests": {MIG + P1: "2"}},
    }
    pod = mig_pod("p", {P1: 1}, init_containers=[init])
    assert pod_request(pod).mig == ((P1, 2),)  # the max of the init container and the rest


def test_a_bound_pod_holds_the_mig_devices_its_record_names_and_is_read_leniently() -> None:
    uuids = [mig_uuid("n", 0, 1)]
    held = holding_from_pod(mig_pod("p", {P1: "500m"}, node="n", mig_uuids=uuids))
    assert held is not None
    assert (held.mig, held.mig_uuids) == (((P1, 1),), tuple(uuids))
    # A pod mixing MIG and GPUs (not bound by schedext) is a fact: both are counted.
    both = holding_from_pod(mig_pod("q", {P1: 1}, gpus=1, node="n"))
    assert both is not None
    assert (both.gpus, both.mig, both.mig_uuids) == (1, ((P1, 1),), None)


# ------------------------------------------------------------------------------ nodes


def topology(whole: int, migs: dict[int, list[str]]) -> Topology:
    return decode_topology(mig_topology("n", migs, whole + len(migs)), whole + len(migs))


@dataclass
class ShapeCase:
    id: str
    allocatable: int
    whole: int  # GPUs the document lists not in MIG mode
    migs: dict[int, list[str]]
    gpu_count: int
    gpu_mig: tuple[int, ...]
    uuids: bool  # whether the UUIDs are kept
    slices: int


SHAPE_CASES = [
    ShapeCase("no MIG: as before", 4, 4, {}, 4, (), True, 0),
    ShapeCase("no MIG, the document lists fewer: no UUIDs", 5, 4, {}, 5, (), False, 0),
    ShapeCase("mixed strategy: allocatable leaves MIG GPUs out",
              1, 1, {0: [P1, P2]}, 1, (0,), True, 2),
    ShapeCase("every GPU in MIG mode", 0, 0, {0: [P1], 1: [P1]}, 0, (0, 1), True, 2),
    ShapeCase("a plugin counting MIG GPUs whole", 2, 1, {1: [P1]}, 1, (1,), True, 1),
    ShapeCase("MIG mode without MIG devices", 1, 1, {1: []}, 1, (1,), True, 0),
]  # fmt: skip


@pytest.mark.parametrize("case", SHAPE_CASES, ids=lambda c: c.id)
def test_a_nodes_whole_gpus_and_mig_devices_beside_allocatable(case: ShapeCase) -> None:
    shape = node_gpus(case.allocatable, topology(case.whole, case.migs))
    assert (shape.gpu_count, shape.gpu_mig) == (case.gpu_count, case.gpu_mig)
    assert bool(shape.gpu_uuids) is case.uuids
    assert len(shape.mig_slices) == case.slices


def test_a_document_that_fits_no_reading_of_mig_is_read_as_before_mig() -> None:
    # Three GPUs listed, one in MIG mode, allocatable 4: neither 3 nor 3 - 1 whole GPUs.
    shape = node_gpus(4, topology(2, {2: [P1]}))
    assert shape == (4, (), (), ())


def test_node_spec_reads_mig_slices_and_a_use_sample_of_every_gpu() -> None:
    node = mig_node("n", whole=1, migs={0: [P1, P1, P2]})
    use = {"version": 1, "at": 5, "gpus": [[0, 0, 512], [1, 30, 1024]]}
    node["metadata"]["annotations"][names.GPU_USE] = json.dumps(use)
    spec = node_spec(node)
    assert (spec.gpu_count, spec.gpu_mig, spec.gpu_indices) == (1, (0,), 2)
    assert spec.mig_slices == (
        MigSlot(0, P1, mig_uuid("n", 0, 0)),
        MigSlot(0, P1, mig_uuid("n", 0, 1)),
        MigSlot(0, P2, mig_uuid("n", 0, 2)),
    )
    assert (spec.topology_problem, spec.use_problem) == (None, None)
    assert spec.gpu_use is not None
    assert len(spec.gpu_use.gpus) == 2


def test_an_unhealthy_mig_gpu_does_not_count_against_the_whole_gpus() -> None:
    node = mig_node("n", whole=2, migs={2: [P1]}, unhealthy={2: "XID 79"})
    spec = node_spec(node)
    assert (spec.gpu_count, spec.gpu_healthy) == (2, 2)


# -------------------------------------------------------------------------- documents


def test_mig_devices_read_back_as_written_and_a_node_without_mig_writes_no_migs_key() -> None:
    gpus = (
        Gpu(0, "GPU-a", mig_enabled=True, migs=(MigSlice(P1, "MIG-a"), MigSlice(P2, "MIG-b"))),
        Gpu(1, "GPU-b"),
    )
    written = Topology(gpus=gpus)
    assert decode_topology(encode_topology(written), 1) == written  # 1 whole GPU + 1 MIG GPU
    plain = encode_topology(Topology(gpus=(Gpu(0, "GPU-a"), Gpu(1, "GPU-b", mig_enabled=True))))
    assert "migs" not in plain  # byte for byte what an agent before MIG devices wrote


def gpu_entry(**entry: object) -> dict[str, object]:
    return {"index": 0, "uuid": "GPU-a", "mig": True, **entry}


MIG_DOCS = [
    ("a GPU in MIG mode without migs (an older agent)", [gpu_entry()], 0, None),
    ("migs is not a list", [gpu_entry(migs={"a": 1})], 0, "migs is not a list"),
    (
        "too many",
        [gpu_entry(migs=[{"profile": P1, "uuid": f"MIG-{i}"} for i in range(MAX_MIGS + 1)])],
        0,
        f"at most {MAX_MIGS}",
    ),
    ("an entry not an object", [gpu_entry(migs=["MIG-a"])], 0, "not an object"),
    ("no profile", [gpu_entry(migs=[{"uuid": "MIG-a"}])], 0, "profile"),
    ("a profile that is no name",
     [gpu_entry(migs=[{"profile": "a b", "uuid": "M"}])], 0, "profile"),
    ("an empty UUID", [gpu_entry(migs=[{"profile": P1, "uuid": ""}])], 0, "UUID"),
    ("MIG devices on a GPU not in MIG mode",
     [gpu_entry(mig=False, migs=[{"profile": P1, "uuid": "M"}])], 1, "not in MIG mode"),
    ("one MIG device twice",
     [gpu_entry(migs=[{"profile": P1, "uuid": "M"}]),
      gpu_entry(index=1, migs=[{"profile": P1, "uuid": "M"}])], 0, "listed twice"),
    ("an index past the whole GPUs and the MIG GPUs",
     [gpu_entry(), {"index": 2, "uuid": "GPU-c"}], 1, "outside 0..1"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("gpus", "whole", "error"), [c[1:] for c in MIG_DOCS], ids=[c[0] for c in MIG_DOCS]
)
def test_mig_entries_of_the_topology_document(
    gpus: list[dict[str, object]], whole: int, error: str | None
) -> None:
    raw = json.dumps({"version": 2, "groups": [], "gpus": gpus})
    if error is None:
        assert decode_topology(raw, whole).gpus[0].migs == ()
        return
    with pytest.raises(DocumentError, match=error):
        decode_topology(raw, whole)


def test_profiles_come_from_the_mig_devices_nvml_name() -> None:
    assert profile_from_name("NVIDIA H100 80GB HBM3 MIG 1g.10gb") == P1
    assert profile_from_name("NVIDIA A100-SXM4-40GB MIG 1c.3g.20gb") == "1c.3g.20gb"
    assert profile_from_name("NVIDIA H100 80GB HBM3 MIG 1g.10gb+me") == "1g.10gb+me"
    assert profile_from_name("NVIDIA H100 80GB HBM3") is None
    assert profile_from_name("NVIDIA H100 MIG ") is None


# ------------------------------------------------------------------------- accounting

TWO_MIG_GPUS = mig_node("n", whole=1, migs={0: [P1, P1, P2], 1: [P1, P1]})


def test_a_mig_gpu_is_never_free_for_whole_gpus_or_shares() -> None:
    scheduler = scheduler_with([TWO_MIG_GPUS])
    view = scheduler.inventory.node("n")
    assert view is not None
    assert view.free_gpu_ids == (2,)  # GPU 2 is the one whole GPU
    assert [m for m, _ in view.share_room] == [-1, -1, 81559]
    columns = scheduler.inventory.arrays
    slot = scheduler.inventory.ids(["n"])[0]
    assert (columns.gpu_total[slot], columns.gpu_free[slot], columns.gpu_mig[slot]) == (1, 1, 2)


def test_a_whole_gpu_or_a_share_recorded_on_a_mig_gpu_counts_as_anonymous() -> None:
    # Indices written by something else that named the MIG GPU: the pods still count.
    whole = make_pod("w", gpus=1, node="n", gpu_ids=[0])
    share = share_pod("s", memory_mib=1024, node="n", gpu_ids=[0])
    scheduler = scheduler_with([mig_node("n", whole=2, migs={0: [P1]})], [whole, share])
    view = scheduler.inventory.node("n")
    assert view is not None
    assert (view.holders, view.anonymous_gpus, view.free_gpu_ids) == ((None,) * 3, 2, ())
    assert view.share_memory == (0, 0, 0)


def test_evicting_pods_never_makes_a_mig_gpu_room_for_a_share() -> None:
    scheduler = scheduler_with([mig_node("n", whole=1, migs={0: [P1]})])
    view = scheduler.inventory.node("n")
    assert view is not None
    assert [m for m, _ in room_after(view, [])] == [-1, 81559]


@dataclass
class HoldCase:
    id: str
    bound: list[dict[str, Any]]
    holders: tuple[str | None, ...]  # per MIG device: the pod name holding it
    anonymous: tuple[tuple[str, int], ...] = ()
    free: dict[str, int] = field(default_factory=dict)  # per profile


HOLD_CASES = [
    HoldCase("nothing held", [], (None,) * 5, (), {P1: 4, P2: 1}),
    HoldCase(
        "by their record",
        [
            mig_pod(
                "a", {P1: 1, P2: 1}, node="n", mig_uuids=[mig_uuid("n", 0, 1), mig_uuid("n", 0, 2)]
            )
        ],
        (None, "a", "a", None, None),
        (),
        {P1: 3, P2: 0},
    ),
    HoldCase(
        "without a record: anonymous, on the devices bind takes last",
        [mig_pod("a", {P1: 1}, node="n")],
        (None,) * 5,
        ((P1, 1),),
        {P1: 3, P2: 1},
    ),
    HoldCase(
        "a record naming a device the node lacks: anonymous",
        [mig_pod("a", {P1: 1}, node="n", mig_uuids=["MIG-gone"])],
        (None,) * 5,
        ((P1, 1),),
        {P1: 3, P2: 1},
    ),
    HoldCase(
        "two pods' records naming one device: the second is anonymous",
        [
            mig_pod("a", {P1: 1}, node="n", mig_uuids=[mig_uuid("n", 1, 0)]),
            mig_pod("b", {P1: 1}, node="n", mig_uuids=[mig_uuid("n", 1, 0)]),
        ],
        (None, None, None, "a", None),
        ((P1, 1),),
        {P1: 2, P2: 1},
    ),
    HoldCase(
        "asking more than its record names: the rest anonymous",
        [mig_pod("a", {P1: 2}, node="n", mig_uuids=[mig_uuid("n", 1, 1)])],
        (None, None, None, None, "a"),
        ((P1, 1),),
        {P1: 2, P2: 1},
    ),
]


@pytest.mark.parametrize("case", HOLD_CASES, ids=lambda c: c.id)
def test_who_holds_which_mig_device(case: HoldCase) -> None:
    scheduler = scheduler_with([TWO_MIG_GPUS], case.bound)
    view = scheduler.inventory.node("n")
    assert view is not None
    by_uid = {uid_of(p): p["metadata"]["name"] for p in case.bound}
    assert tuple(by_uid.get(h) if h else None for h in view.mig.holders) == case.holders
    assert view.mig.anonymous == case.anonymous
    slot = scheduler.inventory.ids(["n"])
    for profile, free in case.free.items():
        assert scheduler.inventory.mig_arrays(profile).free[slot].tolist() == [free]


def test_holdings_come_back_when_the_pods_are_listed_again_and_leave_when_they_go() -> None:
    pod = mig_pod("a", {P1: 1}, node="n", mig_uuids=[mig_uuid("n", 1, 0)])
    scheduler = scheduler_with([TWO_MIG_GPUS])
    holding = holding_from_pod(pod)
    assert holding is not None
    scheduler.inventory.replace_bound([holding])  # a restart: the relist rebuilds it
    view = scheduler.inventory.node("n")
    assert view is not None
    assert view.mig.holders[3] == uid_of(pod)
    scheduler.delete_pod(uid_of(pod))
    view = scheduler.inventory.node("n")
    assert view is not None
    assert view.mig.holders == (None,) * 5
    assert scheduler.inventory.mig_arrays(P1).free[scheduler.inventory.ids(["n"])].tolist() == [4]


def test_a_changed_mig_layout_applies_the_holdings_again() -> None:
    pod = mig_pod("a", {P1: 1}, node="n", mig_uuids=[mig_uuid("n", 0, 1)])
    scheduler = scheduler_with([mig_node("n", whole=1, migs={0: [P1, P1]})], [pod])
    scheduler.upsert_node(mig_node("n", whole=1, migs={0: [P2, P1]}))  # the same UUIDs, reshaped
    view = scheduler.inventory.node("n")
    assert view is not None
    assert view.mig.holders == (None, uid_of(pod))
    slot = scheduler.inventory.ids(["n"])
    assert scheduler.inventory.mig_arrays(P1).free[slot].tolist() == [0]
    assert scheduler.inventory.mig_arrays(P2).free[slot].tolist() == [1]


# ----------------------------------------------------------------------------- filter


@dataclass
class FilterCase:
    id: str
    nodes: list[dict[str, Any]]
    pod: dict[str, Any]
    passed: list[str]
    rejected: dict[str, tuple[Reason, str]] = field(default_factory=dict)  # node: (reason, msg)
    bound: list[dict[str, Any]] = field(default_factory=list)


FULL = mig_node("full", migs={0: [P1]})
FULL_POD = mig_pod("b", {P1: 1}, node="full", mig_uuids=[mig_uuid("full", 0, 0)])

FILTER_CASES = [
    FilterCase(
        "a node without the profile is unresolvable; a full one resolvable",
        [mig_node("has", migs={0: [P1, P2]}), mig_node("other", migs={0: [P2]}), FULL,
         make_node("whole", gpus=4), make_node("cpu")],
        mig_pod("p", {P1: 1}),
        ["has"],
        {
            "other": (Reason.GPU_MIG_PROFILE, "schedext: node has no healthy MIG 1g.10gb slice"),
            "full": (Reason.GPU_MIG_FREE, "schedext: no free MIG 1g.10gb slice"),
            "whole": (Reason.GPU_MIG_PROFILE, "schedext: node has no healthy MIG 1g.10gb slice"),
            "cpu": (Reason.NO_GPUS, "schedext: node has no GPUs"),
        },
        [FULL_POD],
    ),
    FilterCase(
        "several of a profile",
        [mig_node("two", migs={0: [P1, P1]}), mig_node("one", migs={0: [P1]})],
        mig_pod("p", {P1: 2}),
        ["two"],
        {"one": (Reason.GPU_MIG_PROFILE,
                 "schedext: node has fewer than 2 healthy MIG 1g.10gb slices")},
    ),
    FilterCase(
        "several profiles: each must be there",
        [mig_node("both", migs={0: [P1], 1: [P2]}), mig_node("one", migs={0: [P1]})],
        mig_pod("p", {P1: 1, P2: 1}),
        ["both"],
        {"one": (Reason.GPU_MIG_PROFILE,
                 "schedext: node has too few healthy MIG slices for 1g.10gb x1, 2g.20gb x1")},
    ),
    FilterCase(
        "MIG devices of an unhealthy GPU are not there",
        [mig_node("sick", migs={0: [P1]}, unhealthy={0: "XID 79"})],
        mig_pod("p", {P1: 1}),
        [],
        {"sick": (Reason.GPU_MIG_PROFILE, "schedext: node has no healthy MIG 1g.10gb slice")},
    ),
    FilterCase(
        "a whole-GPU pod never lands on a MIG GPU",
        [mig_node("mixed", whole=1, migs={0: [P1]}), mig_node("sliced", migs={0: [P1]})],
        make_pod("g", gpus=2),
        [],
        {"mixed": (Reason.GPU_TOTAL, "schedext: node has fewer than 2 GPUs"),
         "sliced": (Reason.GPU_TOTAL, "schedext: node has fewer than 2 GPUs")},
    ),
    FilterCase(
        "a share never lands on a MIG GPU",
        [mig_node("mixed", whole=1, migs={0: [P1]})],
        share_pod("s", memory_mib=1024, shares=2),
        [],
        {"mixed": (Reason.GPU_TOTAL, "schedext: node has fewer than 2 GPUs")},
    ),
]  # fmt: skip


@pytest.mark.parametrize("case", FILTER_CASES, ids=lambda c: c.id)
def test_filter_reasons_for_mig(case: FilterCase) -> None:
    scheduler = scheduler_with(case.nodes, case.bound)
    names_ = [n["metadata"]["name"] for n in case.nodes]
    verdict = scheduler.filter(case.pod, names_)
    assert list(verdict.passed) == case.passed
    got = {n: (r.reason, r.message) for r in verdict.rejections for n in r.nodes}
    assert got == case.rejected
    for rejection in verdict.rejections:
        assert rejection.resolvable is (rejection.reason is Reason.GPU_MIG_FREE)


# --------------------------------------------------------------------------- bind choice


@dataclass
class ChoiceCase:
    id: str
    migs: dict[int, list[str]]
    bound: list[dict[str, Any]]
    asked: tuple[tuple[str, int], ...]
    chosen: tuple[tuple[int, int], ...] | None  # (gpu, MIG device index) in order


CHOICE_CASES = [
    ChoiceCase("nothing in use: the lowest GPU", {0: [P1, P1], 1: [P1]}, [], ((P1, 1),), ((0, 0),)),
    ChoiceCase(
        "onto the GPU with the most in use",
        {0: [P1, P1, P1], 1: [P1, P1, P1]},
        [mig_pod("a", {P1: 2}, node="n", mig_uuids=[mig_uuid("n", 1, 0), mig_uuid("n", 1, 2)])],
        ((P1, 1),),
        ((1, 1),),
    ),
    ChoiceCase(
        "in use counts every profile",
        {0: [P1, P2], 1: [P1, P1]},
        [mig_pod("a", {P2: 1}, node="n", mig_uuids=[mig_uuid("n", 0, 1)])],
        ((P1, 1),),
        ((0, 0),),
    ),
    ChoiceCase(
        "a pod's own devices pack onto each other",
        {0: [P1, P1], 1: [P2, P1]},
        [],
        ((P1, 1), (P2, 1)),
        ((0, 0), (1, 0)),
    ),
    ChoiceCase(
        "spilling over: the fullest first, then the lowest index",
        {0: [P1], 1: [P1, P1], 2: [P1, P1]},
        [mig_pod("a", {P1: 1}, node="n", mig_uuids=[mig_uuid("n", 2, 0)])],
        ((P1, 3),),
        ((2, 1), (0, 0), (1, 0)),
    ),
    ChoiceCase(
        "an unhealthy GPU's devices are never chosen",
        {0: [P1], 1: [P1]},
        [],
        ((P1, 2),),
        None,
    ),
]


@pytest.mark.parametrize("case", CHOICE_CASES, ids=lambda c: c.id)
def test_bind_packs_mig_devices(case: ChoiceCase) -> None:
    unhealthy = {0: "XID 79"} if "unhealthy" in case.id else None
    scheduler = scheduler_with([mig_node("n", migs=case.migs, unhealthy=unhealthy)], case.bound)
    view = scheduler.inventory.node("n")
    assert view is not None
    chosen = choose_mig(view.mig, case.asked)
    expected = None if case.chosen is None else tuple(mig_uuid("n", g, m) for g, m in case.chosen)
    assert chosen == expected


def test_pick_slices_breaks_ties_by_gpu_then_the_nodes_order() -> None:
    free = [(1, "b"), (0, "a"), (1, "c")]
    assert pick_slices(free, {}, 2) == ("a", "b")
    assert pick_slices(free, {1: 1}, 2) == ("b", "c")
    assert pick_slices(free, {}, 4) is None
    assert pick_slices(free, {}, 0) == ()


def test_bind_writes_the_mig_uuids_and_reserves_them() -> None:
    scheduler = scheduler_with([mig_node("n", migs={0: [P1, P1]})])
    pod = mig_pod("p", {P1: 1})
    assert scheduler.filter(pod, ["n"]).passed == ["n"]
    plan = scheduler.plan_bind(uid=uid_of(pod), namespace="default", name="p", node="n", now=0.0)
    assert plan.gpu_ids == ()
    assert plan.annotations == {names.MIG_UUIDS: mig_uuid("n", 0, 0)}
    second = mig_pod("q", {P1: 2})
    verdict = scheduler.filter(second, ["n"])
    assert [r.reason for r in verdict.rejections] == [Reason.GPU_MIG_FREE]


def test_a_reservation_on_a_stale_view_is_refused() -> None:
    held = mig_pod("a", {P1: 1}, node="n", mig_uuids=[mig_uuid("n", 0, 0)])
    scheduler = scheduler_with([mig_node("n", migs={0: [P1, P1]})], [held])
    request = pod_request(mig_pod("p", {P1: 1}))
    stale = Holding.placing(
        request,
        node="n",
        kind=HoldingKind.RESERVED,
        gpu_ids=(),
        mig_uuids=(mig_uuid("n", 0, 0),),
    )
    with pytest.raises(InventoryConflictError, match="MIG"):
        scheduler.inventory.reserve(stale)


# --------------------------------------------------------------------------- preemption


def victim(pod: dict[str, Any]) -> Victim:
    return Victim(uid=uid_of(pod))


def test_preemption_evicts_the_pod_holding_a_mig_device_of_the_profile() -> None:
    small = mig_pod("small", {P2: 1}, node="n", priority=0, mig_uuids=[mig_uuid("n", 0, 1)])
    big = mig_pod("big", {P1: 1}, node="n", priority=0, mig_uuids=[mig_uuid("n", 0, 0)])
    scheduler = scheduler_with([mig_node("n", migs={0: [P1, P2]})], [small, big])
    preemptor = mig_pod("p", {P1: 1}, priority=100)
    verdict = scheduler.filter(preemptor, ["n"])
    assert [(r.reason, r.resolvable) for r in verdict.rejections] == [(Reason.GPU_MIG_FREE, True)]
    chosen = scheduler.preempt(preemptor, {"n": [victim(small), victim(big)]})
    assert chosen["n"].uids == [uid_of(big)]  # the P2 holder frees nothing the pod needs


def test_no_preemption_where_evicting_frees_no_device_of_the_profile() -> None:
    other = mig_pod("o", {P2: 1}, node="n", priority=0, mig_uuids=[mig_uuid("n", 0, 0)])
    scheduler = scheduler_with([mig_node("n", migs={0: [P2]})], [other])
    assert scheduler.preempt(mig_pod("p", {P1: 1}, priority=100), {"n": [victim(other)]}) == {}


def test_preemption_for_a_whole_gpu_never_counts_a_mig_gpu_as_free() -> None:
    whole = make_pod("w", gpus=1, node="n", priority=0, gpu_ids=[1])
    cpu = make_pod("c", node="n", priority=0)
    scheduler = scheduler_with([mig_node("n", whole=1, migs={0: [P1]})], [whole, cpu])
    chosen = scheduler.preempt(make_pod("p", gpus=1, priority=100), {"n": [victim(cpu)]})
    assert chosen["n"].uids == [uid_of(whole)]  # GPU 0 is sliced: only GPU 1 can be freed


# ------------------------------------------------------------------------- precedence


def test_what_no_eviction_changes_wins_over_a_full_node() -> None:
    pod = mig_pod("p", {P1: 1}, model="A100")
    scheduler = scheduler_with([FULL], [FULL_POD])
    verdict = scheduler.filter(pod, ["full"])
    assert [r.reason for r in verdict.rejections] == [Reason.GPU_MODEL]
    verdict = scheduler.filter(mig_pod("q", {P1: 1, P2: 1}), ["full"])
    assert [r.reason for r in verdict.rejections] == [Reason.GPU_MIG_PROFILE]
