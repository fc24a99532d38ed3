"""Builders for Dynamic Resource Allocation objects (``resource.k8s.io/v1``), shaped like what
the API server sends and like what NVIDIA's DRA driver (``gpu.nvidia.com``) publishes: what
the unit tests feed the claims ledger (``extender.dra``).

``resource_slice("n1", [gpu(0), gpu(1, shared=True)])``
``resource_claim("c", results=[result("n1", "gpu-0")], reserved_for=["pod-a"])``
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

DRIVER = "gpu.nvidia.com"
V1 = "resource.k8s.io/v1"
V1BETA2 = "resource.k8s.io/v1beta2"
H100 = "NVIDIA H100 80GB HBM3"

Obj = dict[str, Any]


def gpu_uuid(node: str, index: int) -> str:
    return f"GPU-{node}-{index}"


def gpu(
    index: int,
    *,
    node: str = "n1",
    uuid: str | None = None,
    memory: str = "80Gi",
    shared: bool = False,
    taints: Sequence[Mapping[str, str]] = (),
    attributes: Mapping[str, Any] | None = None,
) -> Obj:
    """A whole GPU as NVIDIA's driver publishes it ("gpu-<index>"); ``attributes`` replace or
    add to its attributes (a None value removes one)."""
    attrs: dict[str, Any] = {
        "type": {"string": "gpu"},
        "uuid": {"string": uuid if uuid is not None else gpu_uuid(node, index)},
        "productName": {"string": H100},
        "architecture": {"string": "Hopper"},
        "cudaComputeCapability": {"version": "9.0.0"},
        "driverVersion": {"version": "580.65.6"},
        "resource.kubernetes.io/pciBusID": {"string": f"0000:{index + 0x18:02x}:00.0"},
        "resource.kubernetes.io/pcieRoot": {"string": f"pci0000:{index // 4:02x}"},
    }
    for name, value in (attributes or {}).items():
        if value is None:
            attrs.pop(name, None)
        else:
            attrs[name] = value
    device: Obj = {"name": f"gpu-{index}", "attributes": attrs, "capacity": {}}
    if memory:
        device["capacity"]["memory"] = {"value": memory}
    if shared:
        device["allowMultipleAllocations"] = True
    if taints:
        device["taints"] = [dict(taint) for taint in taints]
    return device


def mig(name: str, *, uuid: str, parent_uuid: str, memory: str = "10Gi") -> Obj:
    """A MIG device as NVIDIA's driver publishes it."""
    return {
        "name": name,
        "attributes": {
            "type": {"string": "mig"},
            "uuid": {"string": uuid},
            "parentUUID": {"string": parent_uuid},
            "profile": {"string": "1g.10gb"},
        },
        "capacity": {"memory": {"value": memory}},
    }


def resource_slice(
    node: str,
    devices: Sequence[Obj],
    *,
    name: str | None = None,
    driver: str = DRIVER,
    pool: str | None = None,
    generation: int = 1,
    count: int = 1,
    api_version: str | None = V1,
) -> Obj:
    """A node-local slice; the pool is the node's name, as NVIDIA's driver names it."""
    obj: Obj = {
        "kind": "ResourceSlice",
        "metadata": {"name": name or f"{node}-{driver}-{generation}", "uid": f"slice-{node}"},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": pool or node, "generation": generation, "resourceSliceCount": count},
            "devices": list(devices),
        },
    }
    if api_version is not None:
        obj["apiVersion"] = api_version
    return obj


def result(
    pool: str,
    device: str,
    *,
    request: str = "gpu",
    driver: str = DRIVER,
    admin: bool = False,
    share_id: str | None = None,
    consumed_memory: str | None = None,
) -> Obj:
    """One entry of ``status.allocation.devices.results``."""
    entry: Obj = {"request": request, "driver": driver, "pool": pool, "device": device}
    if admin:
        entry["adminAccess"] = True
    if share_id is not None:
        entry["shareID"] = share_id
    if consumed_memory is not None:
        entry["consumedCapacity"] = {"memory": consumed_memory}
    return entry


def resource_claim(
    name: str,
    *,
    namespace: str = "default",
    results: Sequence[Obj] | None = None,
    node: str | None = None,
    reserved_for: Sequence[str] = (),
    extended: bool = False,
    api_version: str | None = V1,
    device_class: str = "gpu",
    count: int | None = None,
    request: str = "gpu",
    selectors: Sequence[str] = (),
) -> Obj:
    """A claim; allocated when ``results`` is given (``node``: the allocation's node
    selector, as kube-scheduler writes it for node-local devices). Its one request,
    ``request``, asks ``device_class`` for ``count`` devices (the API's default, one, when
    None), narrowed by the CEL ``selectors``."""
    status: Obj = {}
    if results is not None:
        allocation: Obj = {"devices": {"results": list(results)}}
        if node is not None:
            allocation["nodeSelector"] = {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
                ]
            }
        status["allocation"] = allocation
    if reserved_for:
        status["reservedFor"] = [
            {"resource": "pods", "name": f"pod-{uid}", "uid": uid} for uid in reserved_for
        ]
    exactly: Obj = {"deviceClassName": device_class}
    if count is not None:
        exactly |= {"allocationMode": "ExactCount", "count": count}
    if selectors:
        exactly["selectors"] = [{"cel": {"expression": e}} for e in selectors]
    meta: Obj = {"name": name, "namespace": namespace, "uid": f"claim-{namespace}-{name}"}
    if extended:
        meta["annotations"] = {"resource.kubernetes.io/extended-resource-claim": "true"}
    obj: Obj = {
        "kind": "ResourceClaim",
        "metadata": meta,
        "spec": {"devices": {"requests": [{"name": request, "exactly": exactly}]}},
        "status": status,
    }
    if api_version is not None:
        obj["apiVersion"] = api_version
    return obj


def device_class(
    name: str,
    *,
    extended_resource: str | None = None,
    driver: str | None = DRIVER,
    created: str = "2026-01-01T00:00:00Z",
) -> Obj:
    spec: Obj = {}
    if driver is not None:
        spec["selectors"] = [{"cel": {"expression": f"device.driver == '{driver}'"}}]
    if extended_resource is not None:
        spec["extendedResourceName"] = extended_resource
    return {
        "apiVersion": V1,
        "kind": "DeviceClass",
        "metadata": {"name": name, "creationTimestamp": created},
        "spec": spec,
    }


def taint_rule(
    name: str,
    *,
    selector: Mapping[str, str] | None,
    key: str = f"{DRIVER}/xid",
    value: str = "79",
    effect: str = "NoSchedule",
    api_version: str = V1BETA2,
) -> Obj:
    """A DeviceTaintRule; ``selector`` None: no deviceSelector at all (matches nothing)."""
    spec: Obj = {"taint": {"key": key, "value": value, "effect": effect}}
    if selector is not None:
        spec["deviceSelector"] = dict(selector)
    return {
        "apiVersion": api_version,
        "kind": "DeviceTaintRule",
        "metadata": {"name": name},
        "spec": spec,
    }


def dra_pod(
    uid: str,
    *,
    namespace: str = "default",
    node: str | None = None,
    claims: Mapping[str, str] | None = None,
    templates: Mapping[str, str | None] | None = None,
    extended_claim: str | None = None,
    extended_resource: str = "nvidia.com/gpu",
) -> Obj:
    """A pod naming claims: ``claims`` {entry name: claim name}; ``templates`` {entry name:
    the generated claim's name (None: not generated yet)}; ``extended_claim``: the claim
    KEP-5004's scheduler wrote for its ``extended_resource``."""
    entries: list[Obj] = [
        {"name": entry, "resourceClaimName": claim} for entry, claim in (claims or {}).items()
    ]
    statuses: list[Obj] = []
    for entry, generated in (templates or {}).items():
        entries.append({"name": entry, "resourceClaimTemplateName": f"{entry}-template"})
        if generated is not None:
            statuses.append({"name": entry, "resourceClaimName": generated})
    spec: Obj = {
        "containers": [{"name": "main", "resources": {"requests": {extended_resource: "1"}}}],
        "resourceClaims": entries,
    }
    if node is not None:
        spec["nodeName"] = node
    status: Obj = {"resourceClaimStatuses": statuses}
    if extended_claim is not None:
        status["extendedResourceClaimStatus"] = {
            "resourceClaimName": extended_claim,
            "requestMappings": [
                {
                    "containerName": "main",
                    "resourceName": extended_resource,
                    "requestName": "container-0-request-0",
                }
            ],
        }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"pod-{uid}", "namespace": namespace, "uid": uid},
        "spec": spec,
        "status": status,
    }
