"""The DRA benchmarks' inputs (loadtests/dra_payloads.py, the bench's DRA scenarios, the sync
benchmark's --claims plan): the half-DRA cluster is what the brief of issue 31's benchmarks
says, reads without a problem in the claims ledger, and reaches the core through the relists
the service's list+watch uses. No timing here."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from extender.dra import (
    ClaimsLedger,
    Ownership,
    decode_claim,
    decode_device_class,
    decode_pod_claims,
    decode_slice,
)
from extender.requests import pod_request
from loadtests import dra_payloads, payloads
from loadtests.bench import workload
from loadtests.corebench import Core
from loadtests.sync import Plan, spread_claims

pytestmark = pytest.mark.unit

JSON = dict[str, Any]
NODES = 40


@pytest.fixture(scope="module")
def cluster() -> JSON:
    return dra_payloads.make_dra_cluster(NODES)


def of_kind(cluster: JSON, kind: str) -> list[JSON]:
    return [i for i in cluster["items"] if i["kind"] == kind]


def ledger_of(cluster: JSON) -> ClaimsLedger:
    """The claims ledger fed every DRA object and pod of ``cluster`` by the core's decoders."""
    ledger = ClaimsLedger()
    for obj in of_kind(cluster, "DeviceClass"):
        device_class = decode_device_class(obj)
        assert device_class is not None
        ledger.upsert_device_class(device_class)
    for obj in of_kind(cluster, "ResourceSlice"):
        piece = decode_slice(obj)
        assert piece is not None
        ledger.upsert_slice(piece)
    for obj in of_kind(cluster, "ResourceClaim"):
        claim = decode_claim(obj)
        assert claim is not None
        ledger.upsert_claim(claim)
    for pod in of_kind(cluster, "Pod"):
        claims = decode_pod_claims(pod)
        if claims is not None:
            ledger.upsert_pod(claims)
    return ledger


def test_half_the_nodes_publish_eight_gpus_in_a_slice_and_no_device_plugin_resource(
    cluster: JSON,
) -> None:
    nodes = of_kind(cluster, "Node")
    slices = {s["spec"]["nodeName"]: s for s in of_kind(cluster, "ResourceSlice")}
    dra = [n for i, n in enumerate(nodes) if dra_payloads.is_dra_index(i)]
    assert len(dra) == NODES // 2
    assert set(slices) == {n["metadata"]["name"] for n in dra}
    for node in nodes:
        name, status = node["metadata"]["name"], node["status"]
        if name not in slices:
            continue
        assert dra_payloads.GPU not in status["allocatable"]
        assert dra_payloads.GPU not in status["capacity"]
        devices = slices[name]["spec"]["devices"]
        assert len(devices) == dra_payloads.DRA_GPUS
        for device in devices:
            attributes = device["attributes"]
            assert attributes["uuid"]["string"].startswith(f"GPU-{name}-")
            assert attributes["resource.kubernetes.io/pcieRoot"]["string"]
        assert slices[name]["spec"]["driver"] == "gpu.nvidia.com"
    # the other half: the device plugin's, as payloads.make_cluster has them
    plugin = [n for i, n in enumerate(nodes) if not dra_payloads.is_dra_index(i)]
    assert sum(1 for n in plugin if dra_payloads.GPU in n["status"]["allocatable"]) > 0
    (device_class,) = of_kind(cluster, "DeviceClass")
    assert device_class["metadata"]["name"] == "gpu.nvidia.com"
    assert device_class["spec"]["extendedResourceName"] == "nvidia.com/gpu"


def test_about_40_percent_of_the_dra_gpus_are_held_by_claims_reserved_for_pods_naming_them(
    cluster: JSON,
) -> None:
    pods = {p["metadata"]["uid"]: p for p in of_kind(cluster, "Pod")}
    claims = of_kind(cluster, "ResourceClaim")
    held = 0
    kinds: Counter[bool] = Counter()
    for claim in claims:
        allocation = claim["status"]["allocation"]
        results = allocation["devices"]["results"]
        node = allocation["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0]["values"][0]
        assert {r["pool"] for r in results} == {node}
        held += len(results)
        (reserved,) = claim["status"]["reservedFor"]
        pod = pods[reserved["uid"]]
        assert pod["spec"]["nodeName"] == node
        assert pod["metadata"]["name"] == reserved["name"]
        status = pod["status"]
        extended = "extendedResourceClaimStatus" in status
        kinds[extended] += 1
        named = (
            status["extendedResourceClaimStatus"]["resourceClaimName"]
            if extended
            else status["resourceClaimStatuses"][0]["resourceClaimName"]
        )
        assert named == claim["metadata"]["name"]
    assert abs(kinds[True] - kinds[False]) <= 1  # template and KEP-5004 claims alternate
    assert 0.25 <= held / (NODES // 2 * dra_payloads.DRA_GPUS) <= 0.55


def test_the_claims_ledger_reads_the_cluster_without_a_problem(cluster: JSON) -> None:
    ledger = ledger_of(cluster)
    assert ledger.problems() == ()
    claims = of_kind(cluster, "ResourceClaim")
    devices = sum(len(c["status"]["allocation"]["devices"]["results"]) for c in claims)
    nodes = ledger.node_names()
    assert len(nodes) == NODES // 2
    assert sum(len(ledger.node(n).held) for n in nodes) == devices
    for name in nodes:
        for held in ledger.node(name).held:
            assert held.pods  # charged to the pod it is reserved for
    assert ledger.classes.serving("nvidia.com/gpu") is not None


def test_the_core_process_feeds_the_dra_kinds_through_the_services_relists(
    cluster: JSON,
) -> None:
    names = [n["metadata"]["name"] for n in of_kind(cluster, "Node")]
    pod = workload.PODS["h100"]
    core = Core(cluster, pod, [names], [names])
    for index, name in enumerate(names):
        owner = core.scheduler.gpu_owner(name)
        dra = dra_payloads.is_dra_index(index)
        assert (owner is Ownership.DRA) == dra, name
    times = core.run(3)
    assert [len(times[verb]) for verb in ("filter", "prioritize")] == [3, 3]


def test_the_claim_pod_asks_for_its_gpus_through_a_pending_claim() -> None:
    pod = dra_payloads.make_claim_pod("bench-pod", uid="bench-pod-uid")
    for container in pod["spec"]["containers"]:
        for part in ("requests", "limits"):
            assert dra_payloads.GPU not in container["resources"].get(part, {})
    assert pod_request(pod).gpus == 0
    cluster = dra_payloads.with_claim(payloads.make_cluster(6), pod, model="H100")
    (claim,) = of_kind(cluster, "ResourceClaim")
    named = pod["status"]["resourceClaimStatuses"][0]["resourceClaimName"]
    assert claim["metadata"]["name"] == named
    assert claim["status"] == {}  # not yet allocated
    (request,) = claim["spec"]["devices"]["requests"]
    assert request["exactly"]["count"] == 2
    assert "H100" in request["exactly"]["selectors"][0]["cel"]["expression"]
    assert len(of_kind(cluster, "DeviceClass")) == 1
    assert len(of_kind(dra_payloads.with_claim(cluster, pod, model=None), "DeviceClass")) == 1


@pytest.mark.parametrize(
    ("scenario", "claim_pod", "slices"),
    [
        (workload.CLAIM, True, False),
        (workload.DRA, False, True),
        (workload.DRA_CLAIM, True, True),
    ],
)
def test_each_dra_scenario_has_its_pod_and_cluster(
    scenario: str, claim_pod: bool, slices: bool
) -> None:
    built = workload.Workload.build(scenario, 12, workload.PODS["h100"])
    assert built.dra
    assert ("resourceClaims" in built.pod["spec"]) == claim_pod
    assert bool(of_kind(built.cluster, "ResourceSlice")) == slices
    assert not workload.Workload.build(workload.WHOLE, 12, workload.PODS["h100"]).dra


def test_claims_spread_evenly_over_the_dra_nodes_within_one_per_gpu() -> None:
    assert spread_claims(20, 6, 8) == [4, 4, 3, 3, 3, 3]
    assert spread_claims(0, 6, 8) == [0] * 6
    assert sum(spread_claims(20_000, 2_500, 8)) == 20_000
    with pytest.raises(ValueError, match="at most 48"):
        spread_claims(49, 6, 8)


def test_the_sync_plan_names_a_claim_per_gpu_on_the_dra_nodes() -> None:
    plan = Plan.build(10, 100, gpu_fill=1.0, compact=True, claims=32)
    summary = plan.summary()
    assert summary["dra_nodes"] == 5
    assert summary["claims"] == 32
    holders = list(plan.holder_indices())
    assert len(holders) == 32
    assert len(plan.slices()) == 5
    seen = set()
    for index in holders:
        pod = plan.pod(index)
        name = plan.claim_name(index)
        assert pod["spec"]["resourceClaims"] == [{"name": "gpu", "resourceClaimName": name}]
        assert not plan.gpu_ids(index)  # no device-plugin GPU on a DRA node
        claim = plan.claim(index, "uid-1")
        (result,) = claim["status"]["allocation"]["devices"]["results"]
        assert result["pool"] == pod["spec"]["nodeName"]
        seen.add((result["pool"], result["device"]))
        assert claim["status"]["reservedFor"][0]["uid"] == "uid-1"
        assert "status" not in dra_payloads.creatable_claim(claim)
    assert len(seen) == 32  # one GPU each
    for index in range(plan.pods):
        if index not in set(holders):
            assert "resourceClaims" not in plan.pod(index)["spec"]


def test_the_sync_plan_without_claims_has_no_dra_node() -> None:
    plan = Plan.build(10, 100, gpu_fill=1.0, compact=True)
    assert plan.summary()["dra_nodes"] == 0
    assert plan.slices() == []
    assert list(plan.holder_indices()) == []
