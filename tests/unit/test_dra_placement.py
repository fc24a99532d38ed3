"""What schedext decides on DRA's nodes (issue 31): a mixed node is refused to schedext's GPU
pods unless fenced; on a node DRA owns, a pod whose nvidia.com/gpu a DeviceClass serves
(KEP-5004) passes through, bind writes no GPU of its own, and prioritize rates the node by
DRA's free devices and their NVLink group (or PCIe root); a claim pod is rated the same way;
and a team quota counts the GPUs claims hold."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from extender import names
from extender.columns import NO_TOPOLOGY
from extender.config import DraConfig, PolicyConfig
from extender.dra import ClaimsLedger, DraGpus, Ownership, decode_claim, decode_slice, dra_gpus
from extender.errors import BindRefusedError
from extender.gang.packing import fits_all
from extender.model import Reason, Victim, WorkloadClass
from extender.requests import pod_request
from extender.scheduler import Scheduler
from testbed.builders import (
    agent_annotations,
    elastic_quota,
    make_node,
    make_pod,
    make_pod_group,
    share_pod,
)
from testbed.dra_builders import (
    device_class,
    gpu,
    gpu_uuid,
    mig,
    resource_claim,
    resource_slice,
    result,
)

Obj = dict[str, Any]
Step = Callable[[Scheduler], object]
NOW = 1000.0
GPU_CLASS = names.DRA_GPU_DRIVER  # NVIDIA's driver names its class after itself


# ----------------------------------------------------------------------------- builders


def plugin_node(name: str, gpus: int = 4) -> Step:
    """A node whose GPUs the device plugin advertises (nvidia.com/gpu), with the agent's UUIDs."""
    annotations = agent_annotations(gpus, uuids=[gpu_uuid(name, i) for i in range(gpus)])
    return lambda s: s.upsert_node(make_node(name, gpus=gpus, annotations=annotations))


def bare_node(name: str, **kwargs: Any) -> Step:
    """A node with no nvidia.com/gpu (``annotations``: the agent's, publishing topology)."""
    return lambda s: s.upsert_node(make_node(name, **kwargs))


def dra_slice(node: str, gpus: int = 4, **kwargs: Any) -> Step:
    devices = [gpu(i, node=node, **kwargs) for i in range(gpus)]
    return lambda s: s.upsert_resource_slice(resource_slice(node, devices))


def held(node: str, claim: str, devices: Sequence[int], namespace: str = "default") -> Step:
    results = [result(node, f"gpu-{i}") for i in devices]
    obj = resource_claim(claim, namespace=namespace, results=results, node=node)
    return lambda s: s.upsert_resource_claim(obj)


def serving_class(
    extended: str | None = names.GPU_RESOURCE, driver: str = GPU_CLASS, name: str = GPU_CLASS
) -> Step:
    obj = device_class(name, extended_resource=extended, driver=driver)
    return lambda s: s.upsert_device_class(obj)


def fed(*steps: Step, fence: bool = False) -> Scheduler:
    scheduler = Scheduler(PolicyConfig(dra=DraConfig(fence=fence)))
    for step in steps:
        step(scheduler)
    return scheduler


def claim_pod(name: str, claim: str, namespace: str = "default") -> Obj:
    """A pod that asks no extended resource, only a claim by name."""
    pod = make_pod(name, namespace=namespace)
    pod["spec"]["resourceClaims"] = [{"name": "gpus", "resourceClaimName": claim}]
    return pod


def asked(claim: str, count: int, namespace: str = "default") -> Step:
    obj = resource_claim(claim, namespace=namespace, device_class=GPU_CLASS, count=count)
    return lambda s: s.upsert_resource_claim(obj)


def scores(scheduler: Scheduler, pod: Obj, nodes: Sequence[str]) -> dict[str, int]:
    return dict(zip(nodes, (int(x) for x in scheduler.prioritize(pod, nodes)), strict=True))


# ------------------------------------------------------------------------------- filter


@dataclass(frozen=True)
class FilterCase:
    id: str
    steps: tuple[Step, ...]
    pod: Obj
    reason: Reason  # FITS: it passes
    fence: bool = False
    resolvable: bool = field(default=False)


FILTER_CASES = [
    FilterCase(
        "a mixed node is refused to a GPU pod",
        (plugin_node("n1"), dra_slice("n1")),
        make_pod("p", gpus=1),
        Reason.GPU_OWNER_MIXED,
    ),
    FilterCase(
        "a mixed node is refused even to a pod whose GPUs a class serves: the plugin's there",
        (plugin_node("n1"), dra_slice("n1"), serving_class()),
        make_pod("p", gpus=1),
        Reason.GPU_OWNER_MIXED,
    ),
    FilterCase(
        "a fenced mixed node serves a GPU pod",
        (plugin_node("n1"), dra_slice("n1")),
        make_pod("p", gpus=1),
        Reason.FITS,
        fence=True,
    ),
    FilterCase(
        "a mixed node serves a CPU pod",
        (plugin_node("n1"), dra_slice("n1")),
        make_pod("p"),
        Reason.FITS,
    ),
    FilterCase(
        "a DRA node passes a pod whose nvidia.com/gpu a class serves",
        (bare_node("n1"), dra_slice("n1"), serving_class()),
        make_pod("p", gpus=2),
        Reason.FITS,
    ),
    FilterCase(
        "DRA judges the count there: schedext passes even past DRA's free devices",
        (bare_node("n1"), dra_slice("n1", 2), serving_class(), held("n1", "c", (0, 1))),
        make_pod("p", gpus=2),
        Reason.FITS,
    ),
    FilterCase(
        "no class serves nvidia.com/gpu: the DRA node has no GPUs for it",
        (bare_node("n1"), dra_slice("n1"), serving_class(extended=None)),
        make_pod("p", gpus=2),
        Reason.NO_GPUS,
    ),
    FilterCase(
        "the class that serves it selects another driver: no GPUs",
        (bare_node("n1"), dra_slice("n1"), serving_class(driver="fpga.example.com", name="fpga")),
        make_pod("p", gpus=2),
        Reason.NO_GPUS,
    ),
    FilterCase(
        "a node without slices has no GPUs, class or not",
        (bare_node("n1"), serving_class()),
        make_pod("p", gpus=2),
        Reason.NO_GPUS,
    ),
    FilterCase(
        "the pod's GPU model still counts on a DRA node",
        (bare_node("n1"), dra_slice("n1"), serving_class()),
        make_pod("p", gpus=1, model="A100"),
        Reason.GPU_MODEL,
    ),
]


@pytest.mark.parametrize("case", FILTER_CASES, ids=[c.id for c in FILTER_CASES])
def test_filter_on_dra_nodes(case: FilterCase) -> None:
    scheduler = fed(*case.steps, fence=case.fence)
    verdict = scheduler.filter(case.pod, ["n1"])
    if case.reason is Reason.FITS:
        assert verdict.passed == ["n1"], verdict.rejections
        return
    (rejection,) = verdict.rejections
    assert rejection.reason is case.reason
    assert rejection.resolvable is case.resolvable


def test_the_mixed_refusal_names_the_misconfiguration() -> None:
    scheduler = fed(plugin_node("n1"), dra_slice("n1"))
    verdict = scheduler.filter(make_pod("p", gpus=1), ["n1"])
    assert verdict.unresolvable == {
        "n1": "schedext: node's GPUs are offered twice, by the device plugin and by DRA: "
        "run one of them, or set dra.fence"
    }


def test_a_node_that_drops_the_plugin_is_dras_and_passes_the_pod() -> None:
    scheduler = fed(plugin_node("n1"), dra_slice("n1"), serving_class())
    pod = make_pod("p", gpus=1)
    assert scheduler.filter(pod, ["n1"]).passed == []
    bare_node("n1")(scheduler)  # the device plugin is gone: nvidia.com/gpu is 0
    assert scheduler.gpu_owner("n1") is Ownership.DRA
    assert scheduler.filter(pod, ["n1"]).passed == ["n1"]


# --------------------------------------------------------------------------------- bind


def test_bind_on_a_dra_node_chooses_no_gpu_and_writes_none() -> None:
    scheduler = fed(bare_node("n1"), dra_slice("n1"), serving_class())
    pod = make_pod("p", gpus=2)
    assert scheduler.filter(pod, ["n1"]).passed == ["n1"]
    meta = pod["metadata"]
    plan = scheduler.plan_bind(uid=meta["uid"], namespace="default", name="p", node="n1", now=NOW)
    assert plan.gpu_ids == ()
    assert names.GPU_IDS not in plan.annotations
    assert names.GPU_UUIDS not in plan.annotations


def test_bind_on_a_dra_node_passes_a_pod_that_changed_since_filter() -> None:
    # kube-scheduler writes the pod's extended-resource claim into its status in PreBind,
    # before it calls bind: the watch's new decode of the pending pod knows nothing of DRA.
    scheduler = fed(bare_node("n1"), dra_slice("n1"), serving_class())
    pod = make_pod("p", gpus=2)
    assert scheduler.filter(pod, ["n1"]).passed == ["n1"]
    pod["status"] = {
        "extendedResourceClaimStatus": {
            "resourceClaimName": "p-extended-resources-x",
            "requestMappings": [
                {"containerName": "main", "resourceName": names.GPU_RESOURCE,
                 "requestName": "container-0-request-0"}
            ],
        }
    }  # fmt: skip
    scheduler.upsert_pod(pod)
    meta = pod["metadata"]
    plan = scheduler.plan_bind(uid=meta["uid"], namespace="default", name="p", node="n1", now=NOW)
    assert plan.gpu_ids == ()
    assert names.GPU_IDS not in plan.annotations


def test_bind_on_a_plugin_node_still_chooses_gpus_for_the_same_pod() -> None:
    scheduler = fed(plugin_node("n2"), serving_class())
    pod = make_pod("p", gpus=2)
    assert scheduler.filter(pod, ["n2"]).passed == ["n2"]
    meta = pod["metadata"]
    plan = scheduler.plan_bind(uid=meta["uid"], namespace="default", name="p", node="n2", now=NOW)
    assert plan.gpu_ids == (0, 1)
    assert plan.annotations[names.GPU_IDS] == "0,1"


# ---------------------------------------------------------------------------- prioritize


def test_a_two_gpu_pod_prefers_the_dra_node_whose_free_gpus_share_a_pcie_root() -> None:
    # gpu() puts GPUs 0-3 under one PCIe root and 4-7 under the next. On "split", GPUs 2, 3
    # and 4, 5 are free (two per root); on "paired", 0, 1 (one root) and 4 (the other).
    scheduler = fed(
        bare_node("split"),
        bare_node("paired"),
        dra_slice("split", 8),
        dra_slice("paired", 8),
        serving_class(),
        held("split", "a", (0, 1, 6, 7)),
        held("paired", "b", (2, 3, 5, 6, 7)),
    )
    got = scores(scheduler, make_pod("p", gpus=3), ["split", "paired"])
    assert got["paired"] > got["split"]


def test_without_pcie_roots_the_agents_nvlink_groups_decide() -> None:
    groups = [[0, 1], [2, 3]]
    topology = agent_annotations(4, groups=groups, uuids=[gpu_uuid("t", i) for i in range(4)])
    other = agent_annotations(4, groups=groups, uuids=[gpu_uuid("u", i) for i in range(4)])
    no_root = {"resource.kubernetes.io/pcieRoot": None}
    scheduler = fed(
        bare_node("t", annotations=topology),
        bare_node("u", annotations=other),
        dra_slice("t", attributes=no_root),
        dra_slice("u", attributes=no_root),
        serving_class(),
        held("t", "a", (0, 2)),  # free: 1 and 3, one per group
        held("u", "b", (0, 1)),  # free: 2 and 3, one group
    )
    got = scores(scheduler, make_pod("p", gpus=2), ["t", "u"])
    assert got["u"] > got["t"]


def test_a_claim_pod_is_rated_by_dras_devices_and_packs() -> None:
    scheduler = fed(
        bare_node("fuller"),
        bare_node("emptier"),
        plugin_node("plugin"),
        dra_slice("fuller"),
        dra_slice("emptier"),
        held("fuller", "a", (0, 1)),
        asked("mine", 2),
    )
    pod = claim_pod("p", "mine")
    got = scores(scheduler, pod, ["fuller", "emptier", "plugin"])
    assert got["fuller"] > got["emptier"] > 0
    assert got["plugin"] == 0  # DRA offers nothing there


def test_a_claim_pod_scores_0_where_dra_has_too_few_free() -> None:
    scheduler = fed(bare_node("n1"), dra_slice("n1"), held("n1", "a", (0, 1, 2)), asked("m", 2))
    assert scores(scheduler, claim_pod("p", "m"), ["n1"]) == {"n1": 0}


def test_a_pod_whose_claim_is_not_seen_yet_is_rated_as_a_cpu_pod() -> None:
    scheduler = fed(bare_node("cpu"), bare_node("dra"), dra_slice("dra"))
    got = scores(scheduler, claim_pod("p", "unseen"), ["cpu", "dra"])
    assert got["cpu"] >= got["dra"]


# -------------------------------------------------------------------------------- quota


def quota(gpus: int) -> Step:
    obj = elastic_quota("team", max={names.GPU_RESOURCE: gpus})
    return lambda s: s.upsert_quota(obj)


def test_a_quota_counts_the_gpus_claims_hold() -> None:
    scheduler = fed(
        plugin_node("p1", 8),
        bare_node("d1"),
        dra_slice("d1"),
        quota(4),
        held("d1", "c", (0, 1, 2), namespace="team"),
    )
    assert scheduler.namespace_use("team").gpus == 3
    assert scheduler.filter(make_pod("one", namespace="team", gpus=1), ["p1"]).passed == ["p1"]
    verdict = scheduler.filter(make_pod("two", namespace="team", gpus=2), ["p1"])
    (rejection,) = verdict.rejections
    assert rejection.reason is Reason.QUOTA_MAX


def test_a_claim_pod_over_its_quota_is_refused() -> None:
    scheduler = fed(
        plugin_node("p1", 8),
        bare_node("d1"),
        dra_slice("d1"),
        quota(4),
        lambda s: s.upsert_pod(make_pod("bound", namespace="team", gpus=3, node="p1")),
        asked("more", 2, namespace="team"),
        asked("fits", 1, namespace="team"),
    )
    verdict = scheduler.filter(claim_pod("over", "more", namespace="team"), ["d1"])
    (rejection,) = verdict.rejections
    assert rejection.reason is Reason.QUOTA_MAX
    assert scheduler.filter(claim_pod("ok", "fits", namespace="team"), ["d1"]).passed == ["d1"]


def bind_team_pod(scheduler: Scheduler, pod: Obj, node: str) -> None:
    meta = pod["metadata"]
    scheduler.plan_bind(uid=meta["uid"], namespace="team", name=meta["name"], node=node, now=NOW)


def allocated_for(node: str, claim: str, devices: Sequence[int], uid: str) -> Step:
    """A claim of the team's, allocated on ``node`` and reserved for pod ``uid`` (as
    kube-scheduler's PreBind leaves it before it calls bind)."""
    results = [result(node, f"gpu-{i}") for i in devices]
    obj = resource_claim(
        claim, namespace="team", results=results, node=node, reserved_for=[uid] if uid else []
    )
    return lambda s: s.upsert_resource_claim(obj)


def quota_full_of(gpus: int) -> Scheduler:
    """A team at ``gpus`` GPUs of its quota of 4: a pod bound on a plugin node holds them."""
    return fed(
        plugin_node("p1", 8),
        bare_node("d1"),
        dra_slice("d1"),
        quota(4),
        lambda s: s.upsert_pod(make_pod("bound", namespace="team", gpus=gpus, node="p1")),
    )


def test_a_claim_pod_over_its_quota_is_refused_at_bind_once_its_claim_is_allocated() -> None:
    # filter saw no claim yet (schedext's watch lagged kube-scheduler's): it asked nothing.
    scheduler = quota_full_of(4)
    pod = claim_pod("late", "mine", namespace="team")
    assert scheduler.filter(pod, ["d1"]).passed == ["d1"]
    # kube-scheduler allocated and reserved the claim in PreBind: the team's use counts it,
    # and it is the pod's ask all the same.
    allocated_for("d1", "mine", (0,), pod["metadata"]["uid"])(scheduler)
    assert scheduler.namespace_use("team").gpus == 5
    with pytest.raises(BindRefusedError, match="5 of max 4"):
        bind_team_pod(scheduler, pod, "d1")


@pytest.mark.parametrize("reserved", [True, False], ids=["reserved for it", "not reserved"])
def test_a_claim_pod_within_its_quota_binds_once_its_claim_is_allocated(reserved: bool) -> None:
    scheduler = quota_full_of(3)
    pod = claim_pod("fits", "mine", namespace="team")
    uid = pod["metadata"]["uid"]
    assert scheduler.filter(pod, ["d1"]).passed == ["d1"]
    allocated_for("d1", "mine", (0,), uid if reserved else "")(scheduler)
    bind_team_pod(scheduler, pod, "d1")  # 3 + its 1: not counted twice


def test_a_pod_sharing_a_claim_another_pod_holds_takes_nothing_more() -> None:
    scheduler = quota_full_of(3)
    allocated_for("d1", "shared", (0,), "other-pod")(scheduler)  # the team is at 4 of 4
    pod = claim_pod("second", "shared", namespace="team")
    assert scheduler.filter(pod, ["d1"]).passed == ["d1"]
    bind_team_pod(scheduler, pod, "d1")


def test_a_kep_5004_claim_is_counted_with_its_pod_once() -> None:
    ledger = ClaimsLedger()
    ledger.upsert_slice(_slice("n1"))
    claim = resource_claim("x", namespace="team", results=[result("n1", "gpu-0")], extended=True)
    decoded = decode_claim(claim)
    assert decoded is not None
    ledger.upsert_claim(decoded)
    assert ledger.namespace_gpus("team") == 0


def _slice(node: str) -> Any:
    piece = decode_slice(resource_slice(node, [gpu(i, node=node) for i in range(2)]))
    assert piece is not None
    return piece


# ------------------------------------------------------------------------------ capacity


@dataclass(frozen=True)
class CapacityCase:
    id: str
    devices: tuple[Obj, ...]
    held: tuple[str, ...]  # device names claims hold
    expected: DraGpus | None
    plugin_gpus: int = 0


def _gpu(index: int, **kwargs: Any) -> Obj:
    return gpu(index, node="n1", **kwargs)


NO_SCHEDULE = {"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoSchedule"}
CAPACITY_CASES = [
    CapacityCase(
        "all free, two per PCIe root",
        tuple(_gpu(i) for i in (0, 1, 4, 5)),
        (),
        DraGpus(Ownership.DRA, 4, 4, 2),
    ),
    CapacityCase(
        "held and tainted GPUs are not free; a tainted one is not offered",
        (_gpu(0), _gpu(1), _gpu(2, taints=[NO_SCHEDULE]), _gpu(3)),
        ("gpu-1",),
        DraGpus(Ownership.DRA, 3, 2, 2),
    ),
    CapacityCase(
        "a held MIG device takes its GPU",
        (_gpu(0), _gpu(1), mig("mig-0", uuid="MIG-a", parent_uuid=gpu_uuid("n1", 0))),
        ("mig-0",),
        DraGpus(Ownership.DRA, 2, 1, 1),
    ),
    CapacityCase(
        "no PCIe root and no agent: groups unknown",
        tuple(_gpu(i, attributes={"resource.kubernetes.io/pcieRoot": None}) for i in range(2)),
        (),
        DraGpus(Ownership.DRA, 2, 2, NO_TOPOLOGY),
    ),
    CapacityCase(
        "the device plugin's GPUs too: mixed",
        (_gpu(0),),
        (),
        DraGpus(Ownership.MIXED, 1, 1, 1),
        plugin_gpus=1,
    ),
]


@pytest.mark.parametrize("case", CAPACITY_CASES, ids=[c.id for c in CAPACITY_CASES])
def test_what_dra_offers_on_a_node(case: CapacityCase) -> None:
    ledger = ClaimsLedger()
    piece = decode_slice(resource_slice("n1", list(case.devices)))
    assert piece is not None
    ledger.upsert_slice(piece)
    if case.held:
        claim = decode_claim(
            resource_claim("c", results=[result("n1", name) for name in case.held], node="n1")
        )
        assert claim is not None
        ledger.upsert_claim(claim)
    got = dra_gpus(ledger.node("n1"), device_plugin_gpus=case.plugin_gpus)
    assert got == case.expected


def test_a_node_without_slices_offers_nothing_through_dra() -> None:
    assert dra_gpus(ClaimsLedger().node("n1"), device_plugin_gpus=4) is None


def test_the_agents_topology_on_a_dra_node_is_read_by_uuid_and_is_no_problem() -> None:
    annotations = agent_annotations(4, groups=[[0, 1], [2, 3]], uuid_prefix="GPU-x")
    scheduler = fed(bare_node("n1", annotations=annotations))
    spec = scheduler.inventory.spec("n1")
    assert spec is not None
    assert spec.topology_problem is None
    assert spec.gpu_count == 0
    assert spec.gpu_links == (("GPU-x-0", "GPU-x-1"), ("GPU-x-2", "GPU-x-3"))


# -------------------------------------------------------------------------------- gangs


@pytest.mark.parametrize(
    ("via_dra", "fits"),
    [(True, True), (False, False)],
    ids=["DRA serves their GPUs: the DRA nodes hold them", "it does not: no GPUs there"],
)
def test_a_gangs_members_are_packed_onto_dras_free_devices(via_dra: bool, fits: bool) -> None:
    scheduler = fed(
        bare_node("d1"),
        bare_node("d2"),
        dra_slice("d1"),
        dra_slice("d2"),
        held("d2", "c", (0,)),
    )
    members = [
        dataclasses.replace(pod_request(make_pod(f"m{i}", gpus=g)), gpus_via_dra=via_dra)
        for i, g in enumerate((4, 3))
    ]
    assert fits_all(scheduler.inventory, members, PolicyConfig()) is fits
    # Only the member a verb read needs the verdict: the others get it from it.
    mixed = [members[0], pod_request(make_pod("m1", gpus=3))]
    assert fits_all(scheduler.inventory, mixed, PolicyConfig()) is fits
    too_big = [*members, dataclasses.replace(members[1], uid="m3", gpus=1)]
    assert not fits_all(scheduler.inventory, too_big, PolicyConfig())


# --------------------------------------------------------------------------- preemption


def test_preemption_counts_and_names_the_gpus_a_victims_claim_frees() -> None:
    victim = make_pod("low", uid="low", node="n1", priority=1)
    victim["spec"]["resourceClaims"] = [{"name": "gpus", "resourceClaimName": "lows"}]
    lows = resource_claim("lows", results=[result("n1", "gpu-0"), result("n1", "gpu-1")])
    lows["status"]["reservedFor"] = [{"resource": "pods", "name": "low", "uid": "low"}]
    scheduler = fed(
        plugin_node("n1"),
        dra_slice("n1"),
        lambda s: s.upsert_pod(victim),
        lambda s: s.upsert_resource_claim(lows),
        fence=True,
    )
    urgent = make_pod("urgent", gpus=4, priority=100)
    (rejection,) = scheduler.filter(urgent, ["n1"]).rejections
    assert rejection.reason is Reason.GPU_IN_USE
    chosen = scheduler.preempt(urgent, {"n1": [Victim("low")]})
    assert chosen["n1"].uids == ["low"]
    assert chosen["n1"].frees == (
        "GPU 0 allocated by DRA to claim default/lows (pod default/low)",
        "GPU 1 allocated by DRA to claim default/lows (pod default/low)",
    )


def test_a_claim_shared_with_a_pod_that_stays_frees_nothing() -> None:
    # "stays" outranks the preemptor: it can never be a victim.
    pods = [make_pod(n, uid=n, node="n1", priority=p) for n, p in (("low", 1), ("stays", 1000))]
    for pod in pods:
        pod["spec"]["resourceClaims"] = [{"name": "gpus", "resourceClaimName": "shared"}]
    shared = resource_claim(
        "shared", results=[result("n1", "gpu-0")], reserved_for=["low", "stays"]
    )
    scheduler = fed(
        plugin_node("n1", 1),
        dra_slice("n1", 1),
        *(lambda s, p=p: s.upsert_pod(p) for p in pods),
        lambda s: s.upsert_resource_claim(shared),
        fence=True,
    )
    assert (
        scheduler.preempt(make_pod("urgent", gpus=1, priority=100), {"n1": [Victim("low")]}) == {}
    )


def test_a_gpu_intensive_claim_pod_finds_gpus_on_a_dra_node() -> None:
    scheduler = fed(bare_node("d1"), bare_node("cpu"), dra_slice("d1"), asked("mine", 2))
    pod = claim_pod("p", "mine")
    pod["metadata"]["labels"] = {names.WORKLOAD_TYPE: WorkloadClass.GPU_INTENSIVE.value}
    verdict = scheduler.filter(pod, ["d1", "cpu"])
    assert verdict.passed == ["d1"]
    (rejection,) = verdict.rejections
    assert rejection.reason is Reason.NO_GPUS


# ------------------------------------------------------------------ consumable capacity


def shared_node(name: str = "n1", gpus: int = 2) -> Step:
    annotations = agent_annotations(gpus, uuids=[gpu_uuid(name, i) for i in range(gpus)])
    node = make_node(name, gpus=gpus, gpu_memory_mib=81920, annotations=annotations)
    return lambda s: s.upsert_node(node)


def dra_share(claim: str, device: int, memory: str, node: str = "n1") -> Step:
    results = [result(node, f"gpu-{device}", share_id=f"s-{claim}", consumed_memory=memory)]
    obj = resource_claim(claim, results=results, node=node)
    return lambda s: s.upsert_resource_claim(obj)


def test_dras_shares_leave_their_gpus_rest_to_schedexts_shares() -> None:
    scheduler = fed(
        shared_node(),
        dra_slice("n1", 2, shared=True),
        held("n1", "whole", (0,)),  # GPU 0 held whole by DRA
        dra_share("a", 1, "30Gi"),  # GPU 1: 30 GiB taken by a DRA share
        fence=True,
    )
    view = scheduler.inventory.node("n1")
    assert view is not None
    assert view.free_gpu_ids == ()  # neither GPU is free whole
    assert view.share_room[1][0] == 81920 - 30 * 1024
    assert view.share_room[0][0] < 0  # held whole: no room
    fits = share_pod("fits", memory_mib=40 * 1024)
    assert scheduler.filter(fits, ["n1"]).passed == ["n1"]
    meta = fits["metadata"]
    plan = scheduler.plan_bind(
        uid=meta["uid"], namespace="default", name="fits", node="n1", now=NOW
    )
    assert plan.gpu_ids == (1,)
    too_big = share_pod("too-big", memory_mib=60 * 1024)
    assert scheduler.filter(too_big, ["n1"]).passed == []
    assert scheduler.filter(make_pod("whole", gpus=1), ["n1"]).passed == []


def test_a_gpu_dra_holds_whole_besides_a_share_takes_no_share() -> None:
    scheduler = fed(
        shared_node(gpus=1),
        dra_slice("n1", 1, shared=True),
        dra_share("a", 0, "10Gi"),
        held("n1", "b", (0,)),
        fence=True,
    )
    assert scheduler.filter(share_pod("p", memory_mib=1024), ["n1"]).passed == []


def test_a_bound_kep_5004_pod_on_a_dra_node_takes_none_of_the_nodes_own_gpus() -> None:
    scheduler = fed(
        bare_node("d1"),
        dra_slice("d1"),
        serving_class(),
        lambda s: s.upsert_pod(make_pod("p", gpus=2, node="d1")),
    )
    view = scheduler.inventory.node("d1")
    assert view is not None
    assert view.anonymous_gpus == 0  # its GPUs are its claim's, DRA's
    assert scheduler.namespace_use("default").gpus == 2  # and its quota counts them


def test_a_gangs_quota_counts_what_every_members_claims_ask() -> None:
    members = [claim_pod(f"m{i}", f"c{i}", namespace="team") for i in range(2)]
    for member in members:
        member["metadata"]["labels"] = {names.POD_GROUP_LABEL: "g"}
    scheduler = fed(
        bare_node("d1"),
        dra_slice("d1", 8),
        quota(4),
        lambda s: s.upsert_pod_group(make_pod_group("g", min_member=2, namespace="team")),
        asked("c0", 3, namespace="team"),
        asked("c1", 3, namespace="team"),
        lambda s: s.upsert_pod(members[1]),  # pending: the gang's other member
    )
    (rejection,) = scheduler.filter(members[0], ["d1"]).rejections
    assert rejection.reason is Reason.QUOTA_MAX  # 3 + 3 over 4, not 3
