"""Dynamic Resource Allocation payloads for the benchmarks: GPU nodes whose GPUs NVIDIA's DRA
driver publishes (``gpu.nvidia.com`` ResourceSlices) instead of the device plugin, the
ResourceClaims that hold some of them (allocated, charged to bound pods), the DeviceClass that
serves ``nvidia.com/gpu`` through DRA (KEP-5004), and a pending pod that names a claim.

The objects are the shapes of ``testbed.dra_builders`` (what the unit and end-to-end tests feed
the claims ledger), placed on :mod:`loadtests.payloads`' nodes:

- a DRA node (:func:`as_dra_node`) is a GPU node without ``nvidia.com/gpu`` allocatable (no
  device plugin), with GPU feature discovery's labels and the node agent's topology document
  (its GPUs' UUIDs, the same as the slice's);
- its slice (:func:`node_slice`) lists its GPUs with ``uuid``, ``productName``, PCIe root and
  memory;
- a held GPU is in an allocated claim (:func:`allocated_claim`) reserved for a bound pod that
  names it (:func:`claim_holder`): half of them from a ResourceClaimTemplate, half of them
  KEP-5004's claims for a pod's ``nvidia.com/gpu``.

:func:`make_dra_cluster` is the benchmark's half-DRA cluster. Pure: no I/O.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import orjson

from loadtests import payloads
from testbed import dra_builders
from testbed.builders import agent_annotations

JSON = dict[str, Any]

GPU = "nvidia.com/gpu"
DRIVER = dra_builders.DRIVER
DEVICE_CLASS = "gpu.nvidia.com"  # the DeviceClass of the driver's GPUs, serving nvidia.com/gpu
DRA_GPUS = 8  # GPUs per DRA node
NAMESPACE = "ml"  # payloads.make_pod's namespace
TEMPLATE = "trainer-gpu"  # the ResourceClaimTemplate the claim-naming pods come from
EXTENDED_REQUEST = "container-0-request-0"  # KEP-5004's request name for the first container
TOPOLOGY = "schedext.io/gpu-topology"
EXTENDED_CLAIM = "resource.kubernetes.io/extended-resource-claim"


def is_dra_index(index: int) -> bool:
    """Whether node ``index`` of a half-DRA cluster is a DRA node: the even ones. (The odd
    ones are the device plugin's, the CPU-only nodes of :func:`payloads.make_node` among
    them: index 9, 19, ...)"""
    return index % 2 == 0


def dra_model(index: int) -> payloads.GpuModel:
    """The GPU of DRA node ``index``: payloads' model mix, eight of each."""
    model, memory, _, _ = payloads.MODELS[index % len(payloads.MODELS)]
    return model, memory, DRA_GPUS, [[0, 1, 2, 3], [4, 5, 6, 7]]


def as_dra_node(node: JSON) -> JSON:
    """``node`` (a GPU node of :func:`payloads.make_node`) as DRA publishes its GPUs: no
    ``nvidia.com/gpu`` in its status, and the node agent's topology document with its GPUs'
    UUIDs (:func:`dra_builders.gpu_uuid`, as in :func:`node_slice`). Changed in place."""
    status, meta = node["status"], node["metadata"]
    count = int(status["allocatable"].pop(GPU))
    status["capacity"].pop(GPU, None)
    groups = orjson.loads(meta["annotations"][TOPOLOGY])["groups"]
    meta["annotations"][TOPOLOGY] = _topology(meta["name"], count, groups)
    return node


def _topology(node: str, count: int, groups: Sequence[Sequence[int]]) -> str:
    """The node agent's topology document, by its own encoder: groups, each GPU's UUID."""
    uuids = [dra_builders.gpu_uuid(node, i) for i in range(count)]
    return agent_annotations(count, groups=groups, uuids=uuids)[TOPOLOGY]


def node_slice(node: JSON) -> JSON:
    """The ResourceSlice NVIDIA's DRA driver publishes for a DRA node: every GPU the node's
    GPU feature discovery labels count, named ``gpu-<i>``, its UUID the agent's."""
    name = node["metadata"]["name"]
    labels = node["metadata"]["labels"]
    product = labels["nvidia.com/gpu.product"].replace("-", " ")
    memory = f"{labels['nvidia.com/gpu.memory']}Mi"
    attributes = {"productName": {"string": product}}
    devices = [
        dra_builders.gpu(i, node=name, memory=memory, attributes=attributes)
        for i in range(int(labels["nvidia.com/gpu.count"]))
    ]
    piece = dra_builders.resource_slice(name, devices)
    del piece["metadata"]["uid"]  # the API server's to set
    return piece


def gpu_device_class() -> JSON:
    """DeviceClass ``gpu.nvidia.com``: the driver's GPUs, and ``nvidia.com/gpu`` served
    through them (KEP-5004's ``extendedResourceName``)."""
    device_class = dra_builders.device_class(DEVICE_CLASS, extended_resource=GPU)
    del device_class["metadata"]["creationTimestamp"]
    return device_class


def allocated_claim(
    name: str,
    node: str,
    devices: Sequence[int],
    *,
    pod: str,
    pod_uid: str | None,
    namespace: str = NAMESPACE,
    extended: bool = False,
) -> JSON:
    """A claim holding ``devices`` (``gpu-<i>``) of ``node``, as kube-scheduler's
    DynamicResources plugin allocates it and reserves it for ``pod`` (its ``reservedFor``
    needs the pod's UID: None leaves it out). ``extended``: KEP-5004's claim for a pod's
    ``nvidia.com/gpu``, else a claim made from :data:`TEMPLATE`."""
    request = EXTENDED_REQUEST if extended else "gpu"
    claim = dra_builders.resource_claim(
        name,
        namespace=namespace,
        results=[dra_builders.result(node, f"gpu-{i}", request=request) for i in devices],
        node=node,
        extended=extended,
        device_class=DEVICE_CLASS,
        count=len(devices),
        request=request,
    )
    if pod_uid is not None:
        claim["status"]["reservedFor"] = [{"resource": "pods", "name": pod, "uid": pod_uid}]
    return claim


def claim_status(claim: JSON) -> JSON:
    """What a status write gives ``claim`` (its allocation and ``reservedFor``), for the
    API's ``/status`` subresource: a create drops the status."""
    return {"status": claim["status"]}


def creatable_claim(claim: JSON) -> JSON:
    """``claim`` as a create sends it: no uid, no status."""
    meta = {k: v for k, v in claim["metadata"].items() if k != "uid"}
    return {**{k: v for k, v in claim.items() if k != "status"}, "metadata": meta}


def claim_holder(
    name: str, node: str, claim: str, gpus: int, *, extended: bool, namespace: str = NAMESPACE
) -> JSON:
    """A lean running pod on ``node`` whose ``gpus`` GPUs ``claim`` holds: named through
    :data:`TEMPLATE` (``status.resourceClaimStatuses``), or with ``extended`` its
    ``nvidia.com/gpu`` served by KEP-5004's claim (``status.extendedResourceClaimStatus``)."""
    requests: JSON = {"cpu": "4", "memory": "32Gi"}
    spec: JSON = {"nodeName": node}
    status: JSON = {"phase": "Running"}
    container: JSON = {"name": "main", "resources": {"requests": requests}}
    if extended:
        requests[GPU] = str(gpus)
        container["resources"]["limits"] = dict(requests)
        status["extendedResourceClaimStatus"] = {
            "resourceClaimName": claim,
            "requestMappings": [
                {"containerName": "main", "resourceName": GPU, "requestName": EXTENDED_REQUEST}
            ],
        }
    else:
        container["resources"]["claims"] = [{"name": "gpu"}]
        spec["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": TEMPLATE}]
        status["resourceClaimStatuses"] = [{"name": "gpu", "resourceClaimName": claim}]
    spec["containers"] = [container]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "uid": f"pod-{name}"},
        "spec": spec,
        "status": status,
    }


def make_dra_cluster(nodes: int, *, seed: int = 7, used_fraction: float = 0.4) -> JSON:
    """:func:`payloads.make_cluster`'s cluster with half of its nodes DRA's
    (:func:`is_dra_index`): 8 GPUs each (:func:`dra_model`), in a ResourceSlice, about
    ``used_fraction`` of them held by allocated claims of 2 GPUs (the last maybe 1), each
    reserved for a bound pod that names it, the claims alternating between template and
    KEP-5004 claims. The other half is the device plugin's, its GPUs held by schedext's pods
    as in :func:`payloads.make_cluster`. With the DeviceClass :data:`DEVICE_CLASS`."""
    rng = random.Random(seed)
    items: list[JSON] = []
    pods: list[JSON] = []
    dra: list[JSON] = [gpu_device_class()]
    claims = 0
    for index in range(nodes):
        if not is_dra_index(index):
            node = payloads.make_node(index, rng)
            count = int(node["status"]["allocatable"].get(GPU, 0))
            pods += payloads.bound_gpu_pods(node["metadata"]["name"], _used(count, rng))
            items.append(node)
            continue
        node = as_dra_node(payloads.make_node(index, rng, gpu=dra_model(index)))
        name = node["metadata"]["name"]
        items.append(node)
        dra.append(node_slice(node))
        used = payloads.used_gpus(DRA_GPUS, rng, used_fraction)
        for start in range(0, len(used), 2):
            devices = used[start : start + 2]
            extended = claims % 2 == 1
            pod = f"dra-{name}-{start}"
            claim = f"{pod}-{'extended-resources' if extended else 'gpu'}-{claims:05x}"
            holder = claim_holder(pod, name, claim, len(devices), extended=extended)
            pods.append(holder)
            dra.append(
                allocated_claim(
                    claim,
                    name,
                    devices,
                    pod=pod,
                    pod_uid=holder["metadata"]["uid"],
                    extended=extended,
                )
            )
            claims += 1
    return {"apiVersion": "v1", "kind": "List", "items": items + pods + dra}


def _used(count: int, rng: random.Random) -> list[int]:
    return payloads.used_gpus(count, rng, 0.4)


def make_claim_pod(name: str, *, uid: str, gpus: int = 2) -> JSON:
    """The benchmark's pending pod (:func:`payloads.make_pod`) asking for ``gpus`` GPUs
    through a claim instead of ``nvidia.com/gpu``: from :data:`TEMPLATE`, the claim already
    made (:func:`pending_claim`, named in ``status.resourceClaimStatuses``) and not yet
    allocated, as kube-scheduler sees such a pod. The GPU model goes in the claim's
    selector."""
    pod = payloads.make_pod(name, gpus=gpus, model=None, uid=uid)
    trainer = pod["spec"]["containers"][0]
    for part in ("requests", "limits"):
        del trainer["resources"][part][GPU]
    trainer["resources"]["claims"] = [{"name": "gpu"}]
    pod["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": TEMPLATE}]
    pod["status"]["resourceClaimStatuses"] = [
        {"name": "gpu", "resourceClaimName": pending_claim_name(name)}
    ]
    return pod


def pending_claim_name(pod: str) -> str:
    return f"{pod}-gpu-bench"


def pending_claim(pod: JSON, *, model: str | None, gpus: int = 2) -> JSON:
    """The claim :func:`make_claim_pod`'s pod names, made from :data:`TEMPLATE` and not yet
    allocated: ``gpus`` GPUs of :data:`DEVICE_CLASS`, of ``model`` when given."""
    meta = pod["metadata"]
    selectors = [f'device.attributes["{DRIVER}"].productName.contains("{model}")'] if model else []
    claim = dra_builders.resource_claim(
        pending_claim_name(meta["name"]),
        namespace=meta["namespace"],
        device_class=DEVICE_CLASS,
        count=gpus,
        selectors=selectors,
    )
    claim["metadata"]["ownerReferences"] = [
        {"apiVersion": "v1", "kind": "Pod", "name": meta["name"], "uid": meta["uid"]}
    ]
    return claim


def with_claim(cluster: JSON, pod: JSON, *, model: str | None) -> JSON:
    """``cluster`` with what ``pod`` (:func:`make_claim_pod`) needs beside it: its pending
    claim, and the DeviceClass where the cluster has none."""
    items = list(cluster["items"])
    if not any(i["kind"] == "DeviceClass" for i in items):
        items.append(gpu_device_class())
    items.append(pending_claim(pod, model=model))
    return {**cluster, "items": items}


def pod_model(pod: JSON) -> str | None:
    """The GPU model a benchmark pod asks for (schedext's ``schedext.io/gpu-model``)."""
    model: str | None = pod["metadata"].get("annotations", {}).get("schedext.io/gpu-model")
    return model
