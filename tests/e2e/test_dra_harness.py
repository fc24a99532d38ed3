"""Dynamic Resource Allocation (``resource.k8s.io/v1``) in the real control plane, with
kube-scheduler alone (no schedext) and no kubelet: the harness part of issue 31's checks.

A ResourceSlice is posted through the API as a driver's kubelet plugin would post it, on a Node
created through the API as the other e2e tests create theirs. kube-controller-manager runs its
resourceclaim controller (which makes a pod's ResourceClaims from its ResourceClaimTemplates)
and its garbage collector (which deletes them with the pod); kube-scheduler allocates the
devices, reserves the claim for the pod and binds it.

These scenarios set no feature gate: in v1.36 DynamicResourceAllocation is GA (locked on) and
DRAExtendedResource (a DeviceClass's ``extendedResourceName``) is beta and on by default.
DeviceTaintRule is beta and off by default (the gate DRADeviceTaintRules and the API version
resource.k8s.io/v1beta2): the last test starts a control plane with both.

The control plane here is the module's own, not the session's: the garbage collector and the
DeviceClasses must not reach the other e2e tests.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from testbed.controlplane import (
    DRA_CONTROLLERS,
    ControlPlane,
    find_binaries,
)
from testbed.dra_manifests import (
    DEVICE_TAINT_RULE_API,
    EXTENDED_RESOURCE_CLAIM_ANNOTATION,
    GPU_DRIVER,
    POD_CLAIM_NAME_ANNOTATION,
    RESOURCE_API,
    allocation_results,
    device_class,
    device_taint_rule,
    gpu_device,
    pod_claim_name,
    pod_with_claims,
    resource_claim_template,
    resource_path,
    resource_slice,
)
from testbed.kubeapi import ApiError, KubeApi
from testbed.manifests import pod_manifest
from tests.e2e.conftest import eventually

GPU = "nvidia.com/gpu"
# kube-scheduler with its default profile (DynamicResources included) and nothing else.
SCHEDULER_ALONE = """\
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
clientConnection:
  kubeconfig: {{KUBECONFIG}}
leaderElection:
  leaderElect: false
"""
_namespaces = itertools.count(1)


@dataclass
class Dra:
    """One test's objects on the module's control plane; cluster-scoped ones are deleted after
    the test, newest first, and the namespace's pods before them."""

    cp: ControlPlane
    namespace: str
    created: list[str] = field(default_factory=list)

    @property
    def api(self) -> KubeApi:
        return self.cp.api

    def create(self, collection: str, body: Mapping[str, Any]) -> dict[str, Any]:
        made = self.api.apply_raw("POST", collection, body)
        if "/namespaces/" not in collection:
            self.created.append(f"{collection}/{made['metadata']['name']}")
        return made

    def gpu_node(self, name: str, *, gpus: int = 2) -> None:
        """A Ready node with no GPU in its allocatable, and a ResourceSlice listing ``gpus``
        GPUs of GPU_DRIVER on it (one pool named after the node)."""
        self.api.create_node(name, cpu="32", memory="256Gi")
        self.created.append(f"/api/v1/nodes/{name}")
        devices = [gpu_device(i, pcie_root=f"pci0000:{i // 4:02x}") for i in range(gpus)]
        self.create(resource_path("resourceslices"), resource_slice(name, devices))

    def device_class(self, name: str, **kwargs: Any) -> str:
        self.create(resource_path("deviceclasses"), device_class(name, **kwargs))
        return name

    def template(self, name: str, *, device_class: str, count: int = 1) -> None:
        body = resource_claim_template(name, device_class=device_class, count=count)
        self.create(resource_path("resourceclaimtemplates", self.namespace), body)

    def pod(self, manifest: Mapping[str, Any]) -> str:
        return str(self.api.create_pod(self.namespace, manifest)["metadata"]["uid"])

    def get_pod(self, name: str) -> dict[str, Any]:
        return self.api.get_pod(self.namespace, name)

    def wait_bound(self, name: str) -> str:
        return self.api.wait_pod_bound(self.namespace, name, timeout=60)

    def claim(self, name: str) -> dict[str, Any]:
        return self.api.apply_raw(
            "GET", f"{resource_path('resourceclaims', self.namespace)}/{name}"
        )

    def claim_made_for(self, pod: str, entry: str = "gpu") -> dict[str, Any]:
        """The ResourceClaim the resourceclaim controller made for the pod's claim ``entry``."""
        name = eventually(
            lambda: pod_claim_name(self.get_pod(pod), entry),
            timeout=30,
            message=f"no ResourceClaim made for {pod}'s claim {entry!r}",
        )
        return self.claim(name)

    def claim_gone(self, name: str) -> bool:
        try:
            self.claim(name)
        except ApiError as exc:
            if exc.status == 404:
                return True
            raise
        return False

    def cleanup(self) -> None:
        for pod in self.api.list_pods(self.namespace):
            self.api.delete_pod(self.namespace, pod["metadata"]["name"])
        for path in reversed(self.created):
            try:
                self.api.apply_raw("DELETE", path)
            except ApiError as exc:
                if exc.status != 404:
                    raise


@pytest.fixture(scope="module")
def dra_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    with ControlPlane(find_binaries(), tmp_path_factory.mktemp("dra-cp")) as cp:
        cp.start_controller_manager(DRA_CONTROLLERS)
        cp.start_scheduler(SCHEDULER_ALONE)
        yield cp


@pytest.fixture
def dra(dra_plane: ControlPlane, request: pytest.FixtureRequest) -> Iterator[Dra]:
    namespace = f"dra-{next(_namespaces)}"
    dra_plane.api.create_namespace(namespace)
    request.node.e2e_control_plane = dra_plane  # conftest prints its logs when a test fails
    env = Dra(dra_plane, namespace)
    try:
        yield env
    finally:
        env.cleanup()


def assert_reserved_for(claim: Mapping[str, Any], pod: str, uid: str) -> None:
    reserved = [
        (r.get("apiGroup", ""), r["resource"], r["name"], r["uid"])
        for r in claim["status"].get("reservedFor") or []
    ]
    assert reserved == [("", "pods", pod, uid)], claim["status"]


def test_a_claim_from_a_template_gets_one_device_of_the_node_the_pod_is_bound_to(
    dra: Dra,
) -> None:
    dra.gpu_node("dra-node-1", gpus=2)
    gpus = dra.device_class(f"gpu.{dra.namespace}")
    dra.template("one-gpu", device_class=gpus)
    uid = dra.pod(pod_with_claims("trainer", {"gpu": "one-gpu"}))

    # kube-controller-manager made the claim: owned by the pod, named after its entry.
    claim = dra.claim_made_for("trainer")
    owners = claim["metadata"]["ownerReferences"]
    assert [(o["kind"], o["name"], o["uid"], o.get("controller")) for o in owners] == [
        ("Pod", "trainer", uid, True)
    ]
    assert claim["metadata"]["annotations"][POD_CLAIM_NAME_ANNOTATION] == "gpu"
    assert claim["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] == gpus

    # kube-scheduler allocated one device and reserved the claim before it bound the pod.
    assert dra.wait_bound("trainer") == "dra-node-1"
    claim = dra.claim(claim["metadata"]["name"])
    [result] = allocation_results(claim)
    assert result["request"] == "gpu"
    assert result["driver"] == GPU_DRIVER
    assert result["pool"] == "dra-node-1"
    assert result["device"] in {"gpu-0", "gpu-1"}
    assert_reserved_for(claim, "trainer", uid)
    # The allocation pins the claim to the node of its pool.
    [term] = claim["status"]["allocation"]["nodeSelector"]["nodeSelectorTerms"]
    assert term["matchFields"] == [
        {"key": "metadata.name", "operator": "In", "values": ["dra-node-1"]}
    ]


def test_devices_run_out_and_a_deleted_pods_claim_frees_its_device(dra: Dra) -> None:
    dra.gpu_node("dra-node-2", gpus=2)
    gpus = dra.device_class(f"gpu.{dra.namespace}")
    dra.template("one-gpu", device_class=gpus)
    for i in range(2):
        dra.pod(pod_with_claims(f"p{i}", {"gpu": "one-gpu"}))
    for i in range(2):
        assert dra.wait_bound(f"p{i}") == "dra-node-2"
    claims = [dra.claim_made_for(f"p{i}") for i in range(2)]
    devices = [allocation_results(c)[0]["device"] for c in claims]
    assert sorted(devices) == ["gpu-0", "gpu-1"]

    # Both devices are taken: a third pod's claim cannot be allocated anywhere.
    dra.pod(pod_with_claims("p2", {"gpu": "one-gpu"}))

    def failed_scheduling() -> str:
        events = dra.api.events_for(dra.namespace, "p2")
        return next((e["message"] for e in events if e["reason"] == "FailedScheduling"), "")

    message = eventually(failed_scheduling, timeout=30, message="p2 not turned away")
    assert "cannot allocate all claims" in message, message
    assert not dra.get_pod("p2")["spec"].get("nodeName")

    # Deleting p0: the resourceclaim controller deallocates its claim, the garbage collector
    # deletes it, and p2 gets the device it held.
    dra.api.delete_pod(dra.namespace, "p0")
    first = claims[0]["metadata"]["name"]
    eventually(lambda: dra.claim_gone(first), timeout=60, message=f"claim {first} not deleted")
    assert dra.wait_bound("p2") == "dra-node-2"
    [result] = allocation_results(dra.claim_made_for("p2"))
    assert result["device"] == devices[0]


def test_an_extended_resource_backed_by_a_device_class_gets_a_claim_from_the_scheduler(
    dra: Dra,
) -> None:
    dra.gpu_node("dra-node-3", gpus=2)
    assert GPU not in dra.api.get_node("dra-node-3")["status"]["allocatable"]
    dra.device_class(f"gpu-ext.{dra.namespace}", extended_resource_name=GPU)
    resources = {"cpu": "100m", "memory": "64Mi", GPU: "1"}
    uid = dra.pod(pod_manifest("legacy", requests=resources, limits={GPU: "1"}))

    # No node advertises nvidia.com/gpu; the DeviceClass maps it to DRA devices, and
    # kube-scheduler makes (and allocates, and reserves) a claim for the pod itself.
    assert dra.wait_bound("legacy") == "dra-node-3"
    status = dra.get_pod("legacy")["status"]["extendedResourceClaimStatus"]
    assert [(m["containerName"], m["resourceName"]) for m in status["requestMappings"]] == [
        ("main", GPU)
    ]
    claim = dra.claim(status["resourceClaimName"])
    assert claim["metadata"]["annotations"][EXTENDED_RESOURCE_CLAIM_ANNOTATION] == "true"
    owners = claim["metadata"]["ownerReferences"]
    assert [(o["kind"], o["name"], o["uid"]) for o in owners] == [("Pod", "legacy", uid)]
    [result] = allocation_results(claim)
    assert result["request"] == status["requestMappings"][0]["requestName"]
    assert (result["driver"], result["pool"]) == (GPU_DRIVER, "dra-node-3")
    assert result["device"] in {"gpu-0", "gpu-1"}
    assert_reserved_for(claim, "legacy", uid)


def test_device_taint_rules_are_served_and_honoured_only_when_asked(
    dra_plane: ControlPlane, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    # The default control plane serves resource.k8s.io/v1 and not v1beta2.
    group = dra_plane.api.apply_raw("GET", "/apis/resource.k8s.io")
    assert [v["version"] for v in group["versions"]] == ["v1"]
    resources = dra_plane.api.apply_raw("GET", f"/apis/{RESOURCE_API}")["resources"]
    served = {r["name"] for r in resources}
    assert {"deviceclasses", "resourceclaims", "resourceclaimtemplates", "resourceslices"} <= served
    assert "devicetaintrules" not in served

    with ControlPlane(find_binaries(), tmp_path / "cp", device_taint_rules=True) as cp:
        request.node.e2e_control_plane = cp
        # The gate goes to all three components; each refuses to start on a gate it lacks.
        cp.start_controller_manager(DRA_CONTROLLERS)
        cp.start_scheduler(SCHEDULER_ALONE)
        env = Dra(cp, "default")
        env.gpu_node("tainted", gpus=1)
        gpus = env.device_class("gpu.tainted")
        env.template("one-gpu", device_class=gpus)
        rule = device_taint_rule(
            "gpu-0-broken", key="example.com/broken", pool="tainted", device="gpu-0"
        )
        env.create(f"/apis/{DEVICE_TAINT_RULE_API}/devicetaintrules", rule)
        env.pod(pod_with_claims("wants-gpu", {"gpu": "one-gpu"}))

        # The only device is tainted NoSchedule: kube-scheduler (with the gate) leaves the
        # pod pending.
        def failed_scheduling() -> str:
            events = cp.api.events_for("default", "wants-gpu")
            return next((e["message"] for e in events if e["reason"] == "FailedScheduling"), "")

        message = eventually(failed_scheduling, timeout=30, message="wants-gpu not turned away")
        assert "cannot allocate all claims" in message, message
        # Once the rule is gone, the device is free again.
        cp.api.apply_raw("DELETE", f"/apis/{DEVICE_TAINT_RULE_API}/devicetaintrules/gpu-0-broken")
        assert cp.api.wait_pod_bound("default", "wants-gpu", timeout=60) == "tainted"
