"""Team quotas and restarts with Dynamic Resource Allocation (issue 31), against the real
kube-scheduler v1.36 with schedext registered as its extender and binder by
``manifests/scheduler-config.yaml``, and kube-controller-manager's resourceclaim controller
and garbage collector beside it (``tests/e2e/dra_cluster.py``):

* an ElasticQuota of 4 GPUs refuses the fifth GPU, whether the first four are held through
  claims and the fifth asked as ``nvidia.com/gpu``, or the other way round, or all of them
  are ``nvidia.com/gpu`` that DRA serves (KEP-5004), counted once;
* schedext killed and restarted while claims come and go is ready only once its claims
  ledger holds what the API server says: the first ``/readyz`` 200 already counts them.

A pod that asks no ``nvidia.com/gpu`` reaches schedext only when it opts in with
``schedext.io/managed: 1`` (managedResources in the scheduler config): the claim pods whose
quota is checked here do.

No feature gate and no runtime-config: in v1.36 ``resource.k8s.io/v1`` is served and
DynamicResourceAllocation is GA (locked on); DRAExtendedResource (a DeviceClass's
``extendedResourceName``) is beta and on by default. The ElasticQuota CRD is the project's
(``manifests/crds``).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from testbed.controlplane import ControlPlane
from testbed.dra_manifests import allocation_results
from testbed.waiting import wait_for
from tests.e2e import dra_cluster as env
from tests.e2e.conftest import GPU, eventually
from tests.e2e.dra_cluster import DraCluster


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    yield from env.control_plane(tmp_path_factory)


@pytest.fixture
def cluster(
    plane: ControlPlane, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[DraCluster]:
    yield from env.cluster(plane, tmp_path, request)


def over_quota(cluster: DraCluster, pod: str) -> str:
    """The FailedScheduling message that names the namespace's quota ("" until there is one)."""
    message = cluster.failed_scheduling(pod)
    return message if f"schedext: quota {cluster.namespace}: " in message else ""


def two_kinds_of_node(cluster: DraCluster) -> None:
    """dra-1, whose 4 GPUs DRA hands out, and plugin-1, whose 4 the device plugin does."""
    cluster.dra_node("dra-1")
    cluster.plugin_node("plugin-1")
    cluster.device_class()
    cluster.quota(max_gpus=4)


def test_four_gpus_held_through_claims_leave_no_room_for_a_fifth_nvidia_gpu(
    cluster: DraCluster,
) -> None:
    two_kinds_of_node(cluster)
    cluster.template("two-gpus", count=2)
    for i in range(2):
        cluster.claim_pod(f"claims-{i}", template="two-gpus", managed=True)
    for i in range(2):
        assert cluster.wait_bound(f"claims-{i}") == "dra-1"
    claims = [cluster.claim_of(f"claims-{i}") for i in range(2)]
    assert [len(allocation_results(c)) for c in claims] == [2, 2]
    # schedext bound them (they opted in), and its quota counts the GPUs their claims hold.
    assert cluster.metric("schedext_decisions_total", verb="bind", outcome="bound") == 2
    eventually(lambda: cluster.quota_used() == 4, message="claims' GPUs not counted")

    cluster.gpu_pod("fifth", gpus=1)
    message = eventually(lambda: over_quota(cluster, "fifth"), message="fifth not refused")
    assert f"5 of max 4 {GPU}" in message, message
    assert not cluster.get_pod("fifth")["spec"].get("nodeName")

    # One claim pod goes, and its claim with it: the fifth GPU is within the quota now.
    cluster.api.delete_pod(cluster.namespace, "claims-0")
    assert cluster.wait_bound("fifth", timeout=90) == "plugin-1"
    assert len(cluster.gpu_ids("fifth")) == 1
    eventually(lambda: cluster.quota_used() == 3, message="quota use not 2 + 1")


def test_four_nvidia_gpus_leave_no_room_for_a_claim_pods_fifth(cluster: DraCluster) -> None:
    two_kinds_of_node(cluster)
    cluster.template("one-gpu", count=1)
    for i in range(2):
        cluster.gpu_pod(f"gpus-{i}", gpus=2)
    for i in range(2):
        assert cluster.wait_bound(f"gpus-{i}") == "plugin-1"
    eventually(lambda: cluster.quota_used() == 4, message="the pods' GPUs not counted")

    cluster.claim_pod("claimer", template="one-gpu", managed=True)
    message = eventually(lambda: over_quota(cluster, "claimer"), message="claimer not refused")
    assert f"5 of max 4 {GPU}" in message, message
    assert not cluster.get_pod("claimer")["spec"].get("nodeName")
    eventually(  # kube-scheduler allocated nothing (or took it back, had bind refused it)
        lambda: allocation_results(cluster.claim_of("claimer")) == [],
        message="the refused pod's claim stays allocated",
    )

    cluster.api.delete_pod(cluster.namespace, "gpus-0")
    assert cluster.wait_bound("claimer", timeout=90) == "dra-1"
    [held] = allocation_results(cluster.claim_of("claimer"))
    assert held["pool"] == "dra-1"
    eventually(lambda: cluster.quota_used() == 3, message="quota use not 2 + 1")


def test_gpus_that_dra_serves_as_nvidia_gpu_count_once_against_the_quota(
    cluster: DraCluster,
) -> None:
    """KEP-5004: the pod asks nvidia.com/gpu, kube-scheduler writes a claim for it; the quota
    counts the pod's request, not the claim besides."""
    cluster.dra_node("dra-1")
    cluster.dra_node("dra-2")
    cluster.device_class(extended_resource_name=GPU)
    cluster.quota(max_gpus=4)
    for i in range(2):
        cluster.gpu_pod(f"gpus-{i}", gpus=2)
    for i in range(2):
        assert cluster.wait_bound(f"gpus-{i}") in ("dra-1", "dra-2")
        assert cluster.get_pod(f"gpus-{i}")["status"]["extendedResourceClaimStatus"]
    eventually(lambda: cluster.quota_used() == 4, message="the pods' GPUs not counted once")

    cluster.gpu_pod("fifth", gpus=1)
    message = eventually(lambda: over_quota(cluster, "fifth"), message="fifth not refused")
    assert f"5 of max 4 {GPU}" in message, message


def test_a_restarted_schedext_is_ready_only_with_the_claims_in_its_ledger(
    cluster: DraCluster,
) -> None:
    cluster.dra_node("dra-1")
    cluster.device_class()
    cluster.template("one-gpu", count=1)
    cluster.quota(max_gpus=8)  # what it uses shows what the ledger holds for the namespace
    for count in (2, 3):  # probes of DRA's free GPUs: claims that no pod uses
        cluster.standalone_claim(f"asks-{count}", count=count)
    cluster.claim_pod("before", template="one-gpu")
    assert cluster.wait_bound("before") == "dra-1"
    eventually(lambda: cluster.quota_used() == 1, message="the claim not counted")

    def free_gpus() -> str:
        """How many GPUs DRA has free on dra-1, as schedext's scores say: '3+', '2', 'under 2'."""
        if cluster.probe(["dra-1"], claim="asks-3")["dra-1"] > 0:
            return "3+"
        return "2" if cluster.probe(["dra-1"], claim="asks-2")["dra-1"] > 0 else "under 2"

    assert free_gpus() == "3+"

    # schedext dies. Meanwhile the first pod goes (its claim deleted with it) and two more
    # come: kube-scheduler places them without schedext, which they do not opt in to.
    cluster.schedext.stop(kill=True)
    first = cluster.claim_of("before")["metadata"]["name"]
    cluster.api.delete_pod(cluster.namespace, "before")
    for i in range(2):
        cluster.claim_pod(f"after-{i}", template="one-gpu")
    for i in range(2):
        assert cluster.wait_bound(f"after-{i}") == "dra-1"
        assert len(allocation_results(cluster.claim_of(f"after-{i}"))) == 1
    eventually(lambda: cluster.claim_gone(first), timeout=60, message=f"{first} not deleted")

    cluster.schedext.start(wait_ready=False)

    def ready() -> bool:
        try:
            return httpx.get(f"{cluster.schedext.url}/readyz", timeout=2).status_code == 200
        except httpx.TransportError:
            return False

    wait_for(ready, timeout=60, interval=0.02, message="schedext never ready again")
    # At once: the ledger was built from the lists before readiness, not from later events.
    node = cluster.inventory_node("dra-1")
    used = cluster.quota_used()
    free = free_gpus()
    assert node is not None
    assert node["gpuOwner"] == "dra"
    assert (used, free) == (2, "2")
