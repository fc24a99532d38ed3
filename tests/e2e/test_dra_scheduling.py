"""schedext beside kube-scheduler's Dynamic Resource Allocation (issue 31), against the real
kube-scheduler v1.36 with schedext registered as its extender and binder by
``manifests/scheduler-config.yaml`` (shortlist mode, schedext's default: filter answers only
the node schedext rates best), kube-controller-manager's resourceclaim controller and garbage
collector beside it (``tests/e2e/dra_cluster.py``):

* claim pods get their devices from kube-scheduler, and schedext's ledger counts them held;
* a pod asking ``nvidia.com/gpu`` that a DeviceClass serves (KEP-5004) lands on a node DRA
  owns exactly as it does with kube-scheduler alone, and schedext writes no GPU of its own;
* between two nodes DRA owns, a 2-GPU pod goes to the one whose free devices share a PCIe
  root, or an NVLink group of the node agent's topology.

No feature gate and no runtime-config: in v1.36 ``resource.k8s.io/v1`` is served and
DynamicResourceAllocation is GA (locked on); DRAExtendedResource (a DeviceClass's
``extendedResourceName``) is beta and on by default. DeviceTaintRules are not used.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from testbed.controlplane import ControlPlane
from testbed.dra_manifests import (
    EXTENDED_RESOURCE_CLAIM_ANNOTATION,
    GPU_DRIVER,
    allocation_results,
)
from tests.e2e import dra_cluster as env
from tests.e2e.conftest import GPU, GPU_IDS, eventually, scheduler_config
from tests.e2e.dra_cluster import SCHEDULER_ALONE, DraCluster


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    yield from env.control_plane(tmp_path_factory)


@pytest.fixture
def cluster(
    plane: ControlPlane, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[DraCluster]:
    yield from env.cluster(plane, tmp_path, request)


def owner(cluster: DraCluster, node: str) -> str | None:
    found = cluster.inventory_node(node)
    return None if found is None else found["gpuOwner"]


def test_claim_pods_get_devices_from_kube_scheduler_and_schedext_counts_them_held(
    cluster: DraCluster,
) -> None:
    cluster.dra_node("dra-1", roots=["pci0000:00"] * 2 + ["pci0000:01"] * 2)
    cluster.device_class()
    cluster.template("one-gpu", count=1)
    # Two claims that no pod uses: what a pod naming one would ask (probes of DRA's free GPUs).
    cluster.standalone_claim("asks-2", count=2)
    cluster.standalone_claim("asks-3", count=3)
    eventually(lambda: owner(cluster, "dra-1") == "dra", message="dra-1 never DRA's")

    def fits(claim: str) -> bool:
        return cluster.probe(["dra-1"], claim=claim)["dra-1"] > 0

    eventually(lambda: fits("asks-3"), message="schedext never saw dra-1's 4 free GPUs")

    for i in range(2):  # no opt-in: kube-scheduler places and binds them on its own
        cluster.claim_pod(f"p{i}", template="one-gpu")
    for i in range(2):
        assert cluster.wait_bound(f"p{i}") == "dra-1"
    claims = [cluster.claim_of(f"p{i}") for i in range(2)]
    held = [device for claim in claims for device in cluster.devices_of(claim)]
    assert len(set(held)) == 2, held
    assert {pool for pool, _ in held} == {"dra-1"}, held

    # schedext's ledger: 2 of 4 held, so a pod asking 3 fits no more and one asking 2 does.
    eventually(lambda: not fits("asks-3"), message="schedext never saw the claims hold GPUs")
    assert fits("asks-2")
    node = cluster.inventory_node("dra-1")
    assert node is not None
    assert node["gpuOwner"] == "dra"
    # schedext hands out none of them itself: the device plugin's view of the node is empty.
    assert (node["gpus"], node["freeGpus"]) == ([], 0)
    if "dra" in node:  # the inventory's DRA view (issue 31): what it says of the devices
        assert (node["dra"]["held"], node["dra"]["advertised"]) == (2, 4), node["dra"]
    assert cluster.metric("schedext_decisions_total", verb="bind", outcome="bound") == 0

    # The first pod goes; its claim is deleted with it, and its device is free again.
    cluster.api.delete_pod(cluster.namespace, "p0")
    first = claims[0]["metadata"]["name"]
    eventually(lambda: cluster.claim_gone(first), timeout=60, message=f"{first} not deleted")
    eventually(lambda: fits("asks-3"), message="schedext never saw the device freed")


def extended_pod_outcome(cluster: DraCluster, name: str) -> dict[str, Any]:
    """What DRA made of a bound KEP-5004 pod: its node, its claim and no GPU of schedext's."""
    node = cluster.wait_bound(name)
    pod = cluster.get_pod(name)
    status = pod["status"]["extendedResourceClaimStatus"]
    claim = cluster.claim(status["resourceClaimName"])
    results = allocation_results(claim)
    return {
        "node": node,
        "mappings": [(m["containerName"], m["resourceName"]) for m in status["requestMappings"]],
        "extended": claim["metadata"]["annotations"].get(EXTENDED_RESOURCE_CLAIM_ANNOTATION),
        "owners": [(o["kind"], o["name"]) for o in claim["metadata"]["ownerReferences"]],
        "results": sorted((r["driver"], r["pool"]) for r in results),
        "requests": {r["request"] for r in results}
        == {m["requestName"] for m in status["requestMappings"]},
        "devices": len({r["device"] for r in results}),
        "reserved": [(r["resource"], r["name"]) for r in claim["status"]["reservedFor"]],
        "gpu_ids": (pod["metadata"].get("annotations") or {}).get(GPU_IDS),
        "claim": claim["metadata"]["name"],
    }


def test_a_kep_5004_gpu_pod_on_a_dra_node_schedules_with_schedext_as_without_it(
    cluster: DraCluster,
) -> None:
    cluster.dra_node("dra-1")
    assert GPU not in cluster.api.get_node("dra-1")["status"]["allocatable"]
    cluster.device_class(extended_resource_name=GPU)

    # kube-scheduler alone first: what DRA makes of the pod.
    cluster.cp.stop_scheduler()
    cluster.cp.start_scheduler(SCHEDULER_ALONE)
    cluster.gpu_pod("alone", gpus=2)
    alone = extended_pod_outcome(cluster, "alone")
    cluster.api.delete_pod(cluster.namespace, "alone")
    eventually(lambda: cluster.claim_gone(alone["claim"]), timeout=60, message="claim kept")

    # Then with schedext registered: sent to it (it asks nvidia.com/gpu), bound by it.
    cluster.cp.stop_scheduler()
    cluster.cp.start_scheduler(scheduler_config(cluster.schedext.url))
    eventually(lambda: owner(cluster, "dra-1") == "dra", message="dra-1 never DRA's")
    cluster.gpu_pod("with-schedext", gpus=2)
    served = extended_pod_outcome(cluster, "with-schedext")
    assert cluster.metric("schedext_decisions_total", verb="bind", outcome="bound") == 1

    expected = {
        "node": "dra-1",
        "mappings": [("main", GPU)],
        "extended": "true",
        "results": [(GPU_DRIVER, "dra-1")] * 2,
        "requests": True,
        "devices": 2,
        "gpu_ids": None,  # DRA's allocator picked the devices: schedext wrote none of its own
    }
    for name, outcome in (("alone", alone), ("with-schedext", served)):
        assert {k: outcome[k] for k in expected} == expected, outcome
        assert outcome["owners"] == [("Pod", name)]
        assert outcome["reserved"] == [("pods", name)]
    # Bound through schedext, the pod holds no GPU of schedext's: the node stays DRA's alone.
    node = cluster.inventory_node("dra-1")
    assert node is not None
    assert (node["gpuOwner"], node["gpus"], node["freeGpus"]) == ("dra", [], 0)


# Two nodes DRA owns, 4 GPUs each, 2 held on each. Where the free pair shares a group, the
# held devices are gpu-0 and gpu-1; where it does not, gpu-0 and gpu-2. Groups: by PCIe root
# (gpu-0 and gpu-1 under one root, gpu-2 and gpu-3 under another), or by the node agent's
# NVLink groups [[0, 1], [2, 3]] while every device sits under one root (which alone would
# rate both nodes alike: the agent's topology decides).
GROUPED_HELD, SPLIT_HELD = (0, 1), (0, 2)
TOPOLOGIES = {
    "pcie-root": {"roots": ["pci0000:00"] * 2 + ["pci0000:01"] * 2},
    "nvlink": {"roots": ["pci0000:00"] * 4, "nvlink": [[0, 1], [2, 3]]},
}


def place_between_two(
    cluster: DraCluster, number: int, topology: str, good: int, asking: str
) -> None:
    """One round: a pair of nodes of its own (its pod selects them by label), the one at
    index ``good`` with its free pair in one group, and a 2-GPU pod that must go there."""
    label = {"round": str(number)}
    pair = [f"r{number}-a", f"r{number}-b"]
    for index, node in enumerate(pair):
        cluster.dra_node(node, labels=label, **TOPOLOGIES[topology])
        cluster.held_claim(f"held-{node}", node, GROUPED_HELD if index == good else SPLIT_HELD)
    pod, claim = f"pod-{number}", f"wants-{number}"
    if asking == "claim":
        cluster.standalone_claim(claim, count=2)

    # Wait until schedext has seen the slices and the claims (and the pod's own claim): the
    # pod is rated on both nodes as it will be when kube-scheduler sends it.
    def rated() -> bool:
        if asking == "claim":
            scores = cluster.probe(pair, claim=claim)
        else:
            scores = cluster.probe(pair, gpus=2)
        return scores[pair[good]] > scores[pair[1 - good]] > 0

    eventually(rated, message=f"round {number}: schedext never rated the nodes apart")
    if asking == "claim":
        cluster.claim_pod(pod, claim=claim, managed=True, node_selector=label)
    else:
        cluster.gpu_pod(pod, gpus=2, node_selector=label)
    assert cluster.wait_bound(pod) == pair[good], f"round {number} ({topology})"
    if asking != "claim":
        claim = cluster.get_pod(pod)["status"]["extendedResourceClaimStatus"]["resourceClaimName"]
    free = sorted({0, 1, 2, 3} - set(GROUPED_HELD))
    assert cluster.devices_of(cluster.claim(claim)) == [(pair[good], f"gpu-{i}") for i in free]


@pytest.mark.parametrize("asking", ["claim", "nvidia.com/gpu"])
def test_a_2_gpu_dra_pod_goes_to_the_node_whose_free_devices_share_a_group(
    cluster: DraCluster, asking: str
) -> None:
    """Four rounds: by PCIe root, then by NVLink group, each with the roles of the two nodes
    swapped, so that neither their names nor their order decide."""
    cluster.device_class(extended_resource_name=GPU)
    rounds = [(topology, good) for topology in TOPOLOGIES for good in (0, 1)]
    for number, (topology, good) in enumerate(rounds):
        place_between_two(cluster, number, topology, good, asking)
    # Shortlist mode: schedext's filter answered only the better node, and schedext bound.
    assert cluster.metric("schedext_decisions_total", verb="bind", outcome="bound") == len(rounds)
