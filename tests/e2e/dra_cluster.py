"""The DRA scheduling tests' cluster: a control plane of the module's own with
kube-controller-manager's resourceclaim controller and garbage collector (which make a pod's
claims from its ResourceClaimTemplates and delete them with it), the project's CRDs, and per
test a fresh schedext and a real kube-scheduler with ``manifests/scheduler-config.yaml``, as
the other e2e tests run them (:class:`DraCluster` is their :class:`Cluster` with DRA's
objects).

No kubelet and no DRA driver run: a ResourceSlice is posted through the API as a driver's
kubelet plugin would post it. kube-scheduler's DynamicResources plugin allocates the claims;
where a test must choose which devices a claim holds, it writes the allocation itself
(:meth:`DraCluster.held_claim`), as that plugin records one.

What schedext's claims ledger holds is read from outside through what schedext serves:
``/inventory`` (each node's ``gpuOwner``, and a team quota's ``used``, which counts the GPUs
the namespace's allocated claims hold), and prioritize's full answer for a pod that is never
created (:meth:`DraCluster.probe`): a pod asking for DRA's GPUs scores 0 on a node where DRA
has fewer free than it asks (``extender.scoring``).
"""

from __future__ import annotations

import itertools
import uuid as uuidlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from testbed.builders import agent_annotations
from testbed.controlplane import DRA_CONTROLLERS, ControlPlane, find_binaries
from testbed.dra_manifests import (
    GPU_DRIVER,
    allocation_results,
    device_class,
    gpu_device,
    pod_claim_name,
    pod_with_claims,
    resource_claim_template,
    resource_path,
    resource_slice,
)
from testbed.kubeapi import ApiError
from testbed.manifests import pod_manifest
from tests.e2e.conftest import (
    GPU,
    PODGROUPS,
    Cluster,
    Schedext,
    eventually,
    install_crds,
)

MANAGED = "schedext.io/managed"
# NVIDIA's DRA driver names its DeviceClass after itself; schedext takes a class of that name
# for a GPU class even before it has read the class's selectors.
GPU_CLASS = GPU_DRIVER
CLAIMS = "gpu"  # the pods' one claim entry, and the request in their claims
# kube-scheduler with its default profile (DynamicResources included) and no extender.
SCHEDULER_ALONE = """\
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
clientConnection:
  kubeconfig: {{KUBECONFIG}}
leaderElection:
  leaderElect: false
"""
_namespaces = itertools.count(1)


def uuids(node: str, gpus: int) -> list[str]:
    """The UUIDs of a node's GPUs, the same in its slice and in its agent's topology."""
    return [f"GPU-{node}-{i}" for i in range(gpus)]


@dataclass
class DraCluster(Cluster):
    """The :class:`Cluster` of the other e2e tests, with DRA's objects. Cluster-scoped objects
    a test creates are deleted after it (:func:`clean`)."""

    created: list[str] = field(default_factory=list)

    # -- what a driver publishes, what an administrator adds --------------------------------

    def dra_node(
        self,
        name: str,
        *,
        gpus: int = 4,
        roots: Sequence[str] | None = None,
        nvlink: Sequence[Sequence[int]] | None = None,
        labels: Mapping[str, str] | None = None,
    ) -> None:
        """A node whose GPUs DRA alone hands out: no ``nvidia.com/gpu`` in its allocatable,
        and a ResourceSlice of GPU_DRIVER listing ``gpus`` GPUs (``gpu-<i>``, UUID
        ``GPU-<node>-<i>``) under the PCIe roots ``roots`` (default: four to a root). With
        ``nvlink``, the node agent's topology document names the same GPUs by UUID, in those
        NVLink groups of indices."""
        ids = uuids(name, gpus)
        annotations = (
            agent_annotations(gpus, groups=nvlink, uuids=ids) if nvlink is not None else None
        )
        self.api.create_node(name, cpu="32", memory="256Gi", labels=labels, annotations=annotations)
        self.created.append(f"/api/v1/nodes/{name}")
        pcie = list(roots) if roots is not None else [f"pci0000:{i // 4:02x}" for i in range(gpus)]
        devices = [gpu_device(i, uuid=ids[i], pcie_root=pcie[i]) for i in range(gpus)]
        self.create(resource_path("resourceslices"), resource_slice(name, devices))

    def plugin_node(self, name: str, *, gpus: int = 4) -> None:
        """A node whose GPUs the device plugin hands out (``nvidia.com/gpu`` allocatable)."""
        self.node(name, gpus=gpus)
        self.created.append(f"/api/v1/nodes/{name}")

    def device_class(self, *, extended_resource_name: str | None = None) -> None:
        body = device_class(GPU_CLASS, extended_resource_name=extended_resource_name)
        self.create(resource_path("deviceclasses"), body)

    def template(self, name: str, *, count: int) -> None:
        body = resource_claim_template(name, device_class=GPU_CLASS, count=count, request=CLAIMS)
        self.create(resource_path("resourceclaimtemplates", self.namespace), body)

    def quota(self, *, max_gpus: int) -> None:
        """The namespace's ElasticQuota: at most ``max_gpus`` GPUs, no guarantee."""
        body = {
            "apiVersion": "scheduling.x-k8s.io/v1alpha1",
            "kind": "ElasticQuota",
            "metadata": {"name": "team", "namespace": self.namespace},
            "spec": {"max": {GPU: str(max_gpus)}},
        }
        self.api.apply_raw("POST", f"{PODGROUPS}/namespaces/{self.namespace}/elasticquotas", body)

    def create(self, collection: str, body: Mapping[str, Any]) -> dict[str, Any]:
        made = self.api.apply_raw("POST", collection, body)
        if "/namespaces/" not in collection:
            self.created.append(f"{collection}/{made['metadata']['name']}")
        return made

    # -- claims ----------------------------------------------------------------------------

    def claim_spec(self, count: int) -> dict[str, Any]:
        exactly = {"deviceClassName": GPU_CLASS, "allocationMode": "ExactCount", "count": count}
        return {"devices": {"requests": [{"name": CLAIMS, "exactly": exactly}]}}

    def standalone_claim(self, name: str, *, count: int) -> None:
        """A ResourceClaim of its own (no template) asking ``count`` GPUs, not allocated."""
        body = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": self.namespace},
            "spec": self.claim_spec(count),
        }
        self.api.apply_raw("POST", resource_path("resourceclaims", self.namespace), body)

    def held_claim(self, name: str, node: str, devices: Sequence[int]) -> None:
        """A claim holding the devices ``gpu-<i>`` of ``node``'s slice, its allocation written
        as kube-scheduler's DynamicResources plugin records one (a test chooses the devices;
        the allocator would pick its own). Reserved for no pod: the resourceclaim controller
        deallocates a claim only when its last consumer goes, so it stays held."""
        self.standalone_claim(name, count=len(devices))
        path = f"{resource_path('resourceclaims', self.namespace)}/{name}"
        claim = self.api.apply_raw("GET", path)
        results = [
            {"request": CLAIMS, "driver": GPU_DRIVER, "pool": node, "device": f"gpu-{i}"}
            for i in devices
        ]
        term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
        claim["status"] = {
            "allocation": {
                "devices": {"results": results},
                "nodeSelector": {"nodeSelectorTerms": [term]},
            }
        }
        self.api.apply_raw("PUT", f"{path}/status", claim)

    def claim(self, name: str) -> dict[str, Any]:
        return self.api.apply_raw(
            "GET", f"{resource_path('resourceclaims', self.namespace)}/{name}"
        )

    def claim_of(self, pod: str) -> dict[str, Any]:
        """The claim the resourceclaim controller made for the pod's claim entry."""
        name = eventually(
            lambda: pod_claim_name(self.get_pod(pod), CLAIMS),
            message=f"no ResourceClaim made for {pod}",
        )
        return self.claim(name)

    def claim_gone(self, name: str) -> bool:
        try:
            self.claim(name)
        except ApiError as error:
            if error.status == 404:
                return True
            raise
        return False

    def devices_of(self, claim: Mapping[str, Any]) -> list[tuple[str, str]]:
        """The (pool, device) pairs a claim was allocated, sorted."""
        return sorted((r["pool"], r["device"]) for r in allocation_results(claim))

    # -- pods ------------------------------------------------------------------------------

    def claim_pod(
        self,
        name: str,
        *,
        template: str | None = None,
        claim: str | None = None,
        managed: bool = False,
        node_selector: Mapping[str, str] | None = None,
    ) -> None:
        """A pod using one claim, made from ``template`` or named (``claim``). ``managed``:
        it requests ``schedext.io/managed: 1``, the opt-in that makes kube-scheduler send a
        pod asking no ``nvidia.com/gpu`` to schedext (managedResources)."""
        requests = {"cpu": "100m", "memory": "64Mi"}
        limits = {}
        if managed:
            requests[MANAGED] = limits[MANAGED] = "1"
        source = template if template is not None else claim
        assert source is not None, "a claim pod needs a template or a claim"
        manifest = pod_with_claims(
            name,
            {CLAIMS: source},
            requests=requests,
            limits=limits or None,
            node_selector=node_selector,
        )
        if claim is not None:
            manifest["spec"]["resourceClaims"] = [{"name": CLAIMS, "resourceClaimName": claim}]
        self.api.create_pod(self.namespace, manifest)
        self.created_pods.append(name)

    def gpu_pod(
        self, name: str, *, gpus: int, node_selector: Mapping[str, str] | None = None
    ) -> None:
        """A pod asking ``nvidia.com/gpu``: the device plugin's, or DRA's where a DeviceClass
        serves it (KEP-5004) and the node does not advertise it."""
        self.pod(name, gpus=gpus, node_selector=node_selector)

    def failed_scheduling(self, pod: str) -> str:
        """The newest FailedScheduling message about ``pod`` ("" while there is none)."""
        messages = [
            e.get("message", "") for e in self.events(pod) if e["reason"] == "FailedScheduling"
        ]
        return messages[-1] if messages else ""

    # -- what schedext says ----------------------------------------------------------------

    def inventory_node(self, name: str) -> dict[str, Any] | None:
        nodes = self.schedext.get("/inventory")["nodes"]
        return next((n for n in nodes if n["name"] == name), None)

    def quota_used(self) -> int | None:
        """What /inventory says the namespace's quota uses of nvidia.com/gpu (None: no quota
        applies, or it does not name nvidia.com/gpu)."""
        for quota in self.schedext.get("/inventory")["quotas"]:
            if quota["namespace"] == self.namespace:
                for resource in quota["resources"]:
                    if resource["resource"] == GPU:
                        return int(resource["used"])
        return None

    def probe(
        self, nodes: Sequence[str], *, gpus: int = 0, claim: str | None = None
    ) -> dict[str, int]:
        """schedext's scores (prioritize's full answer, 0-10) for a pod that is never created:
        one asking ``gpus`` nvidia.com/gpu, or one naming claim ``claim`` (and opting in). A
        pod asking for DRA's GPUs scores 0 on a node where DRA has fewer free than it asks."""
        requests = {"cpu": "100m", "memory": "64Mi"}
        if gpus:
            requests[GPU] = str(gpus)
        if claim is not None:
            requests[MANAGED] = "1"
        pod = pod_manifest("probe", requests=requests, limits=requests)
        pod["metadata"] |= {"namespace": self.namespace, "uid": f"probe-{uuidlib.uuid4()}"}
        if claim is not None:
            pod["spec"]["resourceClaims"] = [{"name": CLAIMS, "resourceClaimName": claim}]
        body = {"Pod": pod, "NodeNames": list(nodes)}
        answer = httpx.post(f"{self.schedext.url}/prioritize?full=1", json=body, timeout=10)
        answer.raise_for_status()
        return {host["Host"]: int(host["Score"]) for host in answer.json()}


def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """A test module's plane (its module fixture yields from this): the garbage collector and
    the DeviceClasses must not reach the other e2e tests."""
    with ControlPlane(find_binaries(), tmp_path_factory.mktemp("dra-scheduling-cp")) as cp:
        install_crds(cp.api)
        cp.start_controller_manager(DRA_CONTROLLERS)
        yield cp


def cluster(
    cp: ControlPlane, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[DraCluster]:
    """A test's cluster (its fixture yields from this): a namespace of the test's own, a fresh
    schedext watching the plane, and kube-scheduler with the shipped config (schedext
    registered as its extender and binder)."""
    namespace = f"dra-sched-{next(_namespaces)}"
    cp.api.create_namespace(namespace)
    schedext = Schedext(cp.kubeconfig, tmp_path / "schedext.log")
    env = DraCluster(cp=cp, api=cp.api, schedext=schedext, namespace=namespace)
    request.node.e2e_cluster = env  # conftest prints the logs when the test fails
    try:
        schedext.start()
        env.start_scheduler()
        yield env
    finally:
        cp.stop_scheduler()
        env.schedext.stop()
        clean(env)


def clean(env: DraCluster) -> None:
    """Delete the test's pods, claims (once their pods are gone the resourceclaim controller
    releases them) and cluster-scoped objects, so that the next test's schedext sees none."""
    api = env.api
    for pod in api.list_pods(env.namespace):
        api.delete_pod(env.namespace, pod["metadata"]["name"])
    claims = resource_path("resourceclaims", env.namespace)

    def claims_gone() -> bool:
        items = api.apply_raw("GET", claims)["items"]
        for claim in items:  # the garbage collector deletes some of them meanwhile
            meta = claim["metadata"]
            path = f"{claims}/{meta['name']}"
            deleting = bool(meta.get("deletionTimestamp"))
            if deleting and not meta.get("finalizers"):
                continue
            meta["finalizers"] = []  # (once deleting) its pod is gone: nothing else uses it
            try:
                api.apply_raw("PUT", path, claim) if deleting else api.apply_raw("DELETE", path)
            except ApiError as error:
                if error.status not in (404, 409):
                    raise
        return not items

    eventually(claims_gone, timeout=60, message=f"claims left in {env.namespace}")
    for path in reversed(env.created):
        try:
            api.apply_raw("DELETE", path)
        except ApiError as error:
            if error.status != 404:
                raise
