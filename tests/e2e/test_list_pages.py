"""Pod and node lists read as protobuf (app/kube/list_pages.py) against the real API server:
for every object, the values decoded from the protobuf page are the values decoded from the
JSON page of the same list, and so is everything the core derives from them. The objects
cover every field the shapes keep: GPU and address annotations, init containers and a
sidecar, pod-level resources, claims in a container and in the pod, each kind of affinity and
spread, an owning StatefulSet, a status written through its subresource, and nodes with GPUs
and extended resources."""

from __future__ import annotations

import asyncio
import ssl
from typing import Any

import pytest

from app.kube import list_pages
from app.kube.api import KubeApi
from app.kube.config import ClusterConfig
from app.kube.shapes import NODE_DECODERS, POD_DECODERS, Decoders
from extender.dra import decode_pod_claims
from extender.nodes import node_spec
from extender.requests import PodRequestError, holding_from_pod, pod_request, statefulset_identity
from testbed.controlplane import ControlPlane

JSON = dict[str, Any]
NAMESPACE = "e2e-wire"
NODES = ("wire-gpu", "wire-cpu")
IMAGE = "registry.invalid/pause:never-pulled"
TERM = {"labelSelector": {"matchLabels": {"app": "trainer"}}, "topologyKey": "zone"}
SELECTOR = {"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["yes"]}]}
SPREAD = {"maxSkew": 1, "topologyKey": "zone", "labelSelector": {"matchLabels": {"app": "x"}}}


def _container(name: str, requests: JSON, **more: Any) -> JSON:
    # Extended resources (no overcommit) must have limits equal to their requests.
    limits = {k: v for k, v in requests.items() if "/" in k}
    resources = {"requests": requests} | ({"limits": limits} if limits else {})
    return {"name": name, "image": IMAGE, "resources": resources, **more}


def _pod(name: str, *containers: JSON, meta: JSON | None = None, **spec: Any) -> JSON:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, **(meta or {})},
        "spec": {"containers": list(containers), "terminationGracePeriodSeconds": 0, **spec},
    }


GPU = _container("main", {"cpu": "4", "nvidia.com/gpu": "2"})
CLAIMING = _container("main", {"cpu": "1"})  # names the pod's claims (resources.claims)
CLAIMING["resources"]["claims"] = [{"name": "gpu"}, {"name": "more"}]
PODS = [
    _pod("bound", GPU, nodeName="wire-gpu", priorityClassName="high", meta={
        "labels": {"app": "trainer", "team": "research"},
        "annotations": {"schedext.io/gpu-ids": "0,1", "schedext.io/ip": "10.20.1.15"}}),
    _pod("pending", GPU, schedulerName="schedext-test", affinity={
        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [SELECTOR]},
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 10, "preference": SELECTOR}]},
        "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [TERM]}}),
    _pod("preferring", GPU, affinity={"podAffinity": {
        "preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 5, "podAffinityTerm": TERM}, {"weight": 1, "podAffinityTerm": TERM}]}},
        topologySpreadConstraints=[{**SPREAD, "whenUnsatisfiable": "ScheduleAnyway"},
                                   {**SPREAD, "whenUnsatisfiable": "DoNotSchedule"}]),
    _pod("sidecar", _container("main", {"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": "1"}),
         initContainers=[
             _container("fetch", {"cpu": "4", "nvidia.com/gpu": "1"}),
             _container("proxy", {"cpu": "250m", "memory": "64Mi"}, restartPolicy="Always")],
         nodeName="wire-gpu", priorityClassName="low"),
    _pod("pod-level", _container("main", {"cpu": "1"}),
         resources={"requests": {"cpu": "2", "memory": "2Gi"}}),
    _pod("claims", CLAIMING,
         resourceClaims=[{"name": "gpu", "resourceClaimName": "wire-claim"},
                         {"name": "more", "resourceClaimTemplateName": "wire-template"}]),
    _pod("web-0", _container("main", {"cpu": "1"}), nodeName="wire-cpu", meta={
        "ownerReferences": [{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "web",
                             "uid": "0b0e4c1a-0000-4000-8000-000000000001",
                             "controller": True, "blockOwnerDeletion": True}]}),
]  # fmt: skip
STATUS = {
    "bound": {"phase": "Running"},
    "web-0": {"phase": "Succeeded"},
    # The claim made from the pod's template, as the ResourceClaim controller records it.
    "claims": {"resourceClaimStatuses": [{"name": "more", "resourceClaimName": "claims-more-x"}]},
}


@pytest.fixture(scope="module")
def objects(control_plane: ControlPlane) -> Any:
    """Made once for the module: a deleted namespace stays until a controller empties it."""
    api = control_plane.api
    api.create_node(NODES[0], gpus=8, extended={"example.com/fpga": "2"}, labels={"gpu": "yes"})
    api.create_node(NODES[1])
    api.create_namespace(NAMESPACE)
    try:
        for manifest in PODS:
            api.create_pod(NAMESPACE, manifest)
        for name, status in STATUS.items():
            path = f"/api/v1/namespaces/{NAMESPACE}/pods/{name}/status"
            pod = api.apply_raw("GET", path)
            pod["status"] = {**pod.get("status", {}), **status}
            api.apply_raw("PUT", path, pod)
        yield
    finally:
        for manifest in PODS:
            api.delete_pod(NAMESPACE, manifest["metadata"]["name"])
        api.apply_raw("DELETE", f"/api/v1/namespaces/{NAMESPACE}")
        for name in NODES:
            api.delete_node(name)


def _config(cp: ControlPlane) -> ClusterConfig:
    """schedext's own client to the harness's API server, as a kubeconfig would give it."""
    tls = ssl.create_default_context(cafile=str(cp.ca_cert))
    return ClusterConfig(server=cp.server, ssl_context=tls, token=cp.token)


def _both(cp: ControlPlane, path: str, decoders: Decoders) -> tuple[bytes, bytes]:
    config = _config(cp)

    async def read() -> tuple[bytes, bytes]:
        api = KubeApi(config)
        try:
            params = {"limit": "500"}
            protobuf = await api.get_bytes(path, params, accept=decoders.accept)
            json = await api.get_bytes(path, params)
            return protobuf, json
        finally:
            await api.close()

    return asyncio.run(read())


def _request_or_error(pod: JSON) -> object:
    try:
        return pod_request(pod)
    except PodRequestError as error:
        return f"error: {error}"


@pytest.mark.usefixtures("objects")
def test_pods_listed_in_protobuf_decode_to_what_their_json_decodes_to(
    control_plane: ControlPlane,
) -> None:
    path = f"/api/v1/namespaces/{NAMESPACE}/pods"
    protobuf, json = _both(control_plane, path, POD_DECODERS)
    assert list_pages.is_protobuf(protobuf), protobuf[:40]
    assert not list_pages.is_protobuf(json)
    assert len(protobuf) < len(json)

    from_protobuf, from_json = POD_DECODERS.list(protobuf), POD_DECODERS.list(json)
    assert from_protobuf["metadata"] == from_json["metadata"]
    assert [p["metadata"]["name"] for p in from_json["items"]] == sorted(
        m["metadata"]["name"] for m in PODS
    )
    for pod, twin in zip(from_protobuf["items"], from_json["items"], strict=True):
        name = twin["metadata"]["name"]
        assert pod == twin, name
        assert holding_from_pod(pod) == holding_from_pod(twin), name
        assert _request_or_error(pod) == _request_or_error(twin), name
        assert statefulset_identity(pod["metadata"]) == statefulset_identity(twin["metadata"])
        assert decode_pod_claims(pod) == decode_pod_claims(twin), name
    # The objects carry what they were made to: the test would pass on empty pods otherwise.
    by_name = {p["metadata"]["name"]: p for p in from_protobuf["items"]}
    assert holding_from_pod(by_name["bound"]).gpu_ids == (0, 1)
    assert by_name["bound"]["status"] == {"phase": "Running"}
    assert pod_request(by_name["preferring"]).soft_preferences
    assert pod_request(by_name["pending"]).soft_preferences  # a preferred node
    assert not pod_request(by_name["sidecar"]).soft_preferences
    assert len(by_name["sidecar"]["spec"]["initContainers"]) == 2
    assert by_name["pod-level"]["spec"]["resources"] == {"requests": {"cpu": "2", "memory": "2Gi"}}
    assert statefulset_identity(by_name["web-0"]["metadata"]) == f"sts/{NAMESPACE}/web/0"
    assert decode_pod_claims(by_name["claims"]) is not None
    assert (
        by_name["claims"]["status"]["resourceClaimStatuses"]
        == STATUS["claims"]["resourceClaimStatuses"]
    )


@pytest.mark.usefixtures("objects")
def test_nodes_listed_in_protobuf_decode_to_what_their_json_decodes_to(
    control_plane: ControlPlane,
) -> None:
    protobuf, json = _both(control_plane, "/api/v1/nodes", NODE_DECODERS)
    assert list_pages.is_protobuf(protobuf)
    from_protobuf, from_json = NODE_DECODERS.list(protobuf), NODE_DECODERS.list(json)
    assert from_protobuf == from_json
    specs = {n["metadata"]["name"]: node_spec(n) for n in from_protobuf["items"]}
    gpu_node = specs[NODES[0]]
    assert gpu_node is not None
    assert gpu_node.gpu_count == 8


def test_an_error_answered_in_protobuf_keeps_its_reason(control_plane: ControlPlane) -> None:
    config = _config(control_plane)

    async def read() -> Exception:
        api = KubeApi(config)
        try:
            await api.get_bytes(
                "/api/v1/namespaces/e2e-absent/pods/absent", accept=list_pages.ACCEPT
            )
        except Exception as error:  # noqa: BLE001 (the error is what is asserted)
            return error
        finally:
            await api.close()
        raise AssertionError("a missing pod was found")

    error = asyncio.run(read())
    assert type(error).__name__ == "ApiNotFoundError"
    assert getattr(error, "reason", None) == "NotFound"
    assert 'pods "absent" not found' in str(error)
