"""schedext beside DRA on a *mixed* node (NVIDIA's device plugin and its DRA driver offer the
same GPUs), against the real kube-apiserver, kube-scheduler and kube-controller-manager of
v1.36 (issue 31):

* with ``dra.fence`` off, the node is refused to schedext's GPU pods, and says why;
* with it on, the plane is started with ``--runtime-config=resource.k8s.io/v1beta2=true`` and
  the ``DRADeviceTaintRules`` gate on every component; schedext keeps its pods off the GPUs
  DRA's claims hold, and publishes a DeviceTaintRule on each GPU it binds, so that
  kube-scheduler's DRA allocator keeps off them: over 200 random pods, claim pods and
  schedext's, no GPU is ever handed out twice;
* with it on, schedext refuses to start where the API server does not serve DeviceTaintRules,
  or where its identity may not write them; with the shipped roles and
  ``manifests/rbac-dra-fence.yaml`` it is refused nothing.

No DRA driver and no kubelet run here: a ResourceSlice is posted as the driver's kubelet
plugin posts it; kube-controller-manager makes the claims of ResourceClaimTemplates, and
kube-scheduler allocates them (or, in the first test, the claim's allocation is written to its
status as kube-scheduler's plugin writes it). Pods stay Pending once bound.
"""

from __future__ import annotations

import itertools
import logging
import random
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from testbed.builders import agent_annotations
from testbed.controlplane import DRA_CONTROLLERS, ControlPlane, find_binaries
from testbed.dra_manifests import (
    DEVICE_TAINT_RULE_API,
    GPU_DRIVER,
    RESOURCE_API,
    allocation_results,
    device_class,
    gpu_device,
    pod_with_claims,
    resource_claim_template,
    resource_path,
    resource_slice,
)
from testbed.kubeapply import SYSTEM_NAMESPACE, Kube, documents, service_account_kubeconfig
from testbed.waiting import wait_for
from tests.e2e.conftest import GPU_IDS, ROOT, Cluster, Schedext, eventually

FENCE_ENV = {"SCHEDEXT_DRA__FENCE": "true"}
RULES = f"/apis/{DEVICE_TAINT_RULE_API}/devicetaintrules"
FENCE_KEY = "schedext.io/fenced"
MANIFESTS = ROOT / "manifests"
_namespaces = itertools.count(1)
log = logging.getLogger(__name__)


def gpu_uuid(node: str, index: int) -> str:
    return f"GPU-{node}-{index}"


def publish(cluster: Cluster, node: str, *, gpus: int = 4) -> None:
    """A mixed node: ``gpus`` nvidia.com/gpu the agent names by UUID, and the same GPUs
    (``gpu-<i>``, by UUID) in a ResourceSlice of GPU_DRIVER."""
    annotations = agent_annotations(gpus, uuid_prefix=f"GPU-{node}")
    cluster.api.create_node(node, cpu="32", memory="256Gi", gpus=gpus, annotations=annotations)
    devices = [gpu_device(i, uuid=gpu_uuid(node, i)) for i in range(gpus)]
    cluster.api.apply_raw("POST", resource_path("resourceslices"), resource_slice(node, devices))


def inventory_node(cluster: Cluster, node: str) -> dict[str, Any]:
    nodes = cluster.schedext.get("/inventory")["nodes"]
    return next((n for n in nodes if n["name"] == node), {})


def wait_mixed(cluster: Cluster, node: str, *, free: int) -> None:
    def seen() -> bool:
        found = inventory_node(cluster, node)
        return found.get("gpuOwner") == "mixed" and found.get("freeGpus") == free

    eventually(seen, message=f"schedext never saw {node} mixed with {free} free GPUs")
    cluster.scheduler_caught_up()


def allocate(cluster: Cluster, node: str, name: str, devices: list[int]) -> None:
    """A claim, allocated on ``node`` as kube-scheduler's DRA plugin records it."""
    path = resource_path("resourceclaims", cluster.namespace)
    exactly = {"deviceClassName": "gpu", "count": len(devices)}
    body: dict[str, Any] = {
        "apiVersion": RESOURCE_API,
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": cluster.namespace},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}},
    }
    created = cluster.api.apply_raw("POST", path, body)
    results = [
        {"request": "gpu", "driver": GPU_DRIVER, "pool": node, "device": f"gpu-{i}"}
        for i in devices
    ]
    selector = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
    created["status"] = {
        "allocation": {
            "devices": {"results": results},
            "nodeSelector": {"nodeSelectorTerms": [selector]},
        }
    }
    cluster.api.apply_raw("PUT", f"{path}/{name}/status", created)


def deallocate(cluster: Cluster, name: str) -> None:
    path = f"{resource_path('resourceclaims', cluster.namespace)}/{name}"
    claim = cluster.api.apply_raw("GET", path)
    claim["status"] = {}
    cluster.api.apply_raw("PUT", f"{path}/status", claim)


def fence_rules(cluster: Cluster) -> dict[str, dict[str, Any]]:
    """The fence's DeviceTaintRules by the device they taint."""
    rules = cluster.api.apply_raw("GET", RULES)["items"]
    return {
        r["spec"]["deviceSelector"]["device"]: r
        for r in rules
        if r["spec"]["taint"]["key"] == FENCE_KEY
    }


# ------------------------------------------------------------------------- fence off


def test_a_mixed_node_is_refused_to_schedexts_gpu_pods_without_the_fence(
    cluster: Cluster,
) -> None:
    publish(cluster, "mixed-a")
    wait_mixed(cluster, "mixed-a", free=4)
    cluster.pod("gpu-pod", gpus=1)

    def refused() -> str:
        return next(
            (
                e["message"]
                for e in cluster.events("gpu-pod")
                if e["reason"] == "FailedScheduling" and "offered twice" in e["message"]
            ),
            "",
        )

    message = eventually(refused, message="no FailedScheduling saying the GPUs are offered twice")
    assert "dra.fence" in message

    def unschedulable() -> dict[str, str] | None:
        # kube-scheduler posts the event and patches the pod's status apart: either may be
        # seen first.
        conditions = cluster.get_pod("gpu-pod")["status"].get("conditions", [])
        return next((c for c in conditions if c["type"] == "PodScheduled"), None)

    scheduled = eventually(unschedulable, message="no PodScheduled condition on the pod")
    assert (scheduled["status"], scheduled["reason"]) == ("False", "Unschedulable")
    assert "offered twice" in scheduled["message"]
    assert not cluster.get_pod("gpu-pod")["spec"].get("nodeName")


def test_the_fence_refuses_to_start_where_the_api_server_does_not_serve_it(
    cluster: Cluster, tmp_path: Path
) -> None:
    """The session's plane serves resource.k8s.io/v1 alone: a fence that could not be
    published would let DRA hand out schedext's GPUs, so schedext does not start."""
    log = exits_with_2(Schedext(cluster.cp.kubeconfig, tmp_path / "fenced.log", env=FENCE_ENV))
    (line,) = [line for line in log.splitlines() if line.startswith("schedext:")]
    assert "does not serve devicetaintrules in resource.k8s.io/v1beta2" in line
    assert "DRADeviceTaintRules" in line
    assert "--runtime-config=resource.k8s.io/v1beta2=true" in line


def exits_with_2(schedext: Schedext) -> str:
    """Start ``schedext``, expect it to exit with 2 (a settings error); its log."""
    schedext.start(wait_ready=False)
    assert schedext.process is not None
    assert schedext.process.wait(timeout=60) == 2, schedext.tail()
    return schedext.tail()


# -------------------------------------------------------------------------- fence on


@pytest.fixture(scope="module")
def fence_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """A plane of this module's own: DeviceTaintRules served, the gate on everywhere, and the
    controllers that make (and delete) the claims of templates."""
    work = tmp_path_factory.mktemp("fence-cp")
    with ControlPlane(find_binaries(), work, device_taint_rules=True) as cp:
        cp.start_controller_manager(DRA_CONTROLLERS)
        yield cp


@pytest.fixture
def fenced(
    fence_plane: ControlPlane, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[Cluster]:
    """schedext with dra.fence on, and kube-scheduler with the shipped extender config."""
    api = fence_plane.api
    namespace = f"fence-{next(_namespaces)}"
    api.create_namespace(namespace)
    schedext = Schedext(fence_plane.kubeconfig, tmp_path / "schedext.log", env=FENCE_ENV)
    env = Cluster(cp=fence_plane, api=api, schedext=schedext, namespace=namespace)
    request.node.e2e_cluster = env  # conftest prints the logs of a failed test
    try:
        schedext.start()
        env.start_scheduler()
        yield env
    finally:
        fence_plane.stop_scheduler()
        schedext.stop()
        for pod in api.list_pods(namespace):
            api.delete_pod(namespace, pod["metadata"]["name"])
        for node in api.apply_raw("GET", "/api/v1/nodes")["items"]:
            api.delete_node(node["metadata"]["name"])
        for collection in (resource_path("resourceslices"), resource_path("deviceclasses"), RULES):
            for item in api.apply_raw("GET", collection)["items"]:
                api.apply_raw("DELETE", f"{collection}/{item['metadata']['name']}")


def claim_templates(cluster: Cluster) -> None:
    """A DeviceClass of GPU_DRIVER's devices, and templates asking one or two of them."""
    name = f"gpu.{cluster.namespace}"
    cluster.api.apply_raw("POST", resource_path("deviceclasses"), device_class(name))
    for count, template in ((1, "one-gpu"), (2, "two-gpus")):
        body = resource_claim_template(template, device_class=name, count=count)
        cluster.api.apply_raw(
            "POST", resource_path("resourceclaimtemplates", cluster.namespace), body
        )


def test_the_gpus_a_claim_holds_are_never_given_to_schedexts_pods(fenced: Cluster) -> None:
    publish(fenced, "dra-a")
    allocate(fenced, "dra-a", "train", [1, 2])
    wait_mixed(fenced, "dra-a", free=2)
    fenced.pod("two", gpus=2)
    assert fenced.wait_bound("two") == "dra-a"
    assert sorted(fenced.gpu_ids("two")) == [0, 3]
    fenced.pod("one", gpus=1)

    def turned_away_for_the_claim() -> bool:
        messages = [e.get("message", "") for e in fenced.events("one")]
        return any("allocated by DRA to claim" in m for m in messages)

    eventually(turned_away_for_the_claim, message="no FailedScheduling naming the claim")
    deallocate(fenced, "train")
    assert fenced.wait_bound("one", timeout=90) == "dra-a"
    assert fenced.gpu_ids("one")[0] in (1, 2)


def test_a_claim_pod_and_a_schedext_pod_share_a_mixed_node_on_disjoint_gpus(
    fenced: Cluster,
) -> None:
    publish(fenced, "dra-b", gpus=2)
    claim_templates(fenced)
    wait_mixed(fenced, "dra-b", free=2)
    fenced.pod("plugin-pod", gpus=1)
    assert fenced.wait_bound("plugin-pod") == "dra-b"
    (mine,) = fenced.gpu_ids("plugin-pod")
    uid = fenced.get_pod("plugin-pod")["metadata"]["uid"]
    # Published before the Binding: the rule is there as soon as the pod is bound.
    rule = fence_rules(fenced)[f"gpu-{mine}"]
    assert rule["spec"]["taint"] == {
        "key": FENCE_KEY,
        "value": uid,
        "effect": "NoSchedule",
        "timeAdded": rule["spec"]["taint"]["timeAdded"],
    }
    assert rule["metadata"]["labels"] == {"app.kubernetes.io/managed-by": "schedext"}

    # kube-scheduler's DRA allocator takes the other GPU for the claim pod...
    fenced.api.create_pod(fenced.namespace, pod_with_claims("claim-pod", {"gpu": "one-gpu"}))
    assert fenced.wait_bound("claim-pod") == "dra-b"
    ((theirs, claim),) = allocated_gpus(fenced).items()
    assert (theirs, claim.startswith("claim-pod-gpu-")) == (1 - mine, True)
    # ...and a second claim pod finds none: the fenced one is not DRA's to give.
    fenced.api.create_pod(fenced.namespace, pod_with_claims("claim-pod-2", {"gpu": "one-gpu"}))
    assert settle(fenced, "claim-pod-2") == "unschedulable"

    # The pod gone, its fence is lifted, and DRA may give its GPU.
    fenced.api.delete_pod(fenced.namespace, "plugin-pod")
    eventually(lambda: not fence_rules(fenced), message="the fence outlived its pod")
    assert fenced.wait_bound("claim-pod-2", timeout=90) == "dra-b"
    assert sorted(allocated_gpus(fenced)) == [0, 1]


def allocated_gpus(cluster: Cluster) -> dict[int, str]:
    """The GPU indices the namespace's claims hold (device gpu-i is GPU i), and the claim of
    each; a device held twice fails."""
    held: dict[int, str] = {}
    path = resource_path("resourceclaims", cluster.namespace)
    for claim in cluster.api.apply_raw("GET", path)["items"]:
        name = claim["metadata"]["name"]
        for result in allocation_results(claim):
            assert result["driver"] == GPU_DRIVER
            index = int(result["device"].removeprefix("gpu-"))
            assert index not in held, f"GPU {index} allocated to {held[index]} and {name}"
            held[index] = name
    return held


def schedext_gpus(cluster: Cluster) -> dict[int, str]:
    """The GPU indices schedext wrote into its bound pods; a GPU written twice fails."""
    held: dict[int, str] = {}
    for pod in cluster.api.list_pods(cluster.namespace):
        ids = (pod["metadata"].get("annotations") or {}).get(GPU_IDS, "")
        if not pod["spec"].get("nodeName") or not ids:
            continue
        name = pod["metadata"]["name"]
        for index in map(int, ids.split(",")):
            assert index not in held, f"GPU {index} bound to {held[index]} and {name}"
            held[index] = name
    return held


def settle(cluster: Cluster, name: str) -> str:
    """Wait until pod ``name`` is bound ("bound") or kube-scheduler has found no node for it
    ("unschedulable")."""

    def outcome() -> str:
        pod = cluster.get_pod(name)
        if pod["spec"].get("nodeName"):
            return "bound"
        for condition in pod.get("status", {}).get("conditions") or []:
            if condition["type"] == "PodScheduled" and condition["reason"] == "Unschedulable":
                return "unschedulable"
        return ""

    return wait_for(outcome, timeout=60, interval=0.05, message=f"{name} never settled")


STEPS = 200
GPUS = 8
SEED = 31


def test_over_200_random_pods_no_gpu_is_handed_out_twice(fenced: Cluster) -> None:
    """Each step deletes a random bound pod now and then, then creates a claim pod (one or two
    GPUs through a ResourceClaimTemplate) or a pod of schedext's (nvidia.com/gpu: 1 or 2),
    waits until it is bound or unschedulable (then deletes it), and checks that the GPUs the
    claims hold and those schedext wrote are disjoint."""
    node = "dra-c"
    publish(fenced, node, gpus=GPUS)
    claim_templates(fenced)
    wait_mixed(fenced, node, free=GPUS)
    rng = random.Random(SEED)
    bound: list[str] = []
    outcomes: Counter[tuple[str, str]] = Counter()
    started = time.monotonic()
    for step in range(STEPS):
        if bound and rng.random() < 0.4:
            fenced.api.delete_pod(fenced.namespace, bound.pop(rng.randrange(len(bound))))
        name, gpus = f"p{step}", rng.choice((1, 2))
        if rng.random() < 0.5:
            kind = "claim"
            template = "one-gpu" if gpus == 1 else "two-gpus"
            fenced.api.create_pod(fenced.namespace, pod_with_claims(name, {"gpu": template}))
        else:
            kind = "schedext"
            fenced.pod(name, gpus=gpus)
        outcome = settle(fenced, name)
        outcomes[kind, outcome] += 1
        if outcome == "bound":
            bound.append(name)
        else:
            fenced.api.delete_pod(fenced.namespace, name)
        claimed, written = allocated_gpus(fenced), schedext_gpus(fenced)
        twice = sorted(set(claimed) & set(written))
        assert not twice, (
            f"step {step}: GPUs {twice} held by claims {[claimed[i] for i in twice]} and "
            f"bound by schedext to {[written[i] for i in twice]}"
        )
    elapsed = time.monotonic() - started
    log.info("%d pods in %.1fs: %s", STEPS, elapsed, dict(sorted(outcomes.items())))
    # Both kinds were placed often, and both ran out of GPUs now and then (about 35 of the
    # claim pods and 60 of schedext's are placed, in 20 s on two cores).
    for kind in ("claim", "schedext"):
        assert outcomes[kind, "bound"] >= STEPS // 10, outcomes
        assert outcomes[kind, "unschedulable"] >= 1, outcomes


# ------------------------------------------------------------------------ the roles


def test_the_fence_runs_with_the_shipped_roles_and_nothing_more(
    fence_plane: ControlPlane, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """schedext as sidecar mode runs it (the ServiceAccount schedext-scheduler, rbac.yaml and
    the sidecar's binding): without rbac-dra-fence.yaml it refuses to start and names it;
    with it, it publishes and lifts its rules and is refused nothing."""
    api = fence_plane.api
    if not any(
        ns["metadata"]["name"] == SYSTEM_NAMESPACE
        for ns in api.apply_raw("GET", "/api/v1/namespaces")["items"]
    ):
        api.create_namespace(SYSTEM_NAMESPACE)
    kube = Kube(fence_plane)
    try:
        roles = documents(MANIFESTS / "rbac.yaml")
        roles += [
            d
            for d in documents(MANIFESTS / "sidecar" / "deploy-sidecar.yaml")
            if d["kind"] == "ClusterRoleBinding"
        ]
        for obj in roles:
            kube.apply(obj, dry_run=False)
        identity = service_account_kubeconfig(
            fence_plane, "schedext-scheduler", tmp_path / "sa.kubeconfig"
        )
        log = exits_with_2(Schedext(identity, tmp_path / "no-rights.log", env=FENCE_ENV))
        assert "may not create devicetaintrules" in log
        assert "manifests/rbac-dra-fence.yaml" in log

        for obj in documents(MANIFESTS / "rbac-dra-fence.yaml"):
            kube.apply(obj, dry_run=False)
    finally:
        kube.close()
    namespace = f"fence-{next(_namespaces)}"
    api.create_namespace(namespace)
    schedext = Schedext(identity, tmp_path / "schedext.log", env=FENCE_ENV)
    cluster = Cluster(cp=fence_plane, api=api, schedext=schedext, namespace=namespace)
    request.node.e2e_cluster = cluster
    try:
        schedext.start()
        cluster.start_scheduler()
        publish(cluster, "dra-d", gpus=2)
        wait_mixed(cluster, "dra-d", free=2)
        cluster.pod("plugin-pod", gpus=1)
        assert cluster.wait_bound("plugin-pod") == "dra-d"
        (gpu,) = cluster.gpu_ids("plugin-pod")
        assert set(fence_rules(cluster)) == {f"gpu-{gpu}"}
        api.delete_pod(namespace, "plugin-pod")
        eventually(lambda: not fence_rules(cluster), message="the fence outlived its pod")
        assert "forbidden" not in schedext.tail(100_000).lower()
    finally:
        fence_plane.stop_scheduler()
        schedext.stop()
        api.delete_node("dra-d")
        for item in api.apply_raw("GET", resource_path("resourceslices"))["items"]:
            api.apply_raw("DELETE", f"{resource_path('resourceslices')}/{item['metadata']['name']}")
