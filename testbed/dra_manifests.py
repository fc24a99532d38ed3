"""Dynamic Resource Allocation objects (``resource.k8s.io/v1``) as a test creates them through the
API server: what a DRA driver publishes (ResourceSlices), what an administrator adds
(DeviceClasses, with or without an extended resource name) and what a workload asks with
(ResourceClaimTemplates, pods naming them), and the few fields of the answers a test reads.

No kubelet and no driver run here: a ResourceSlice is posted as the driver's kubelet plugin
would post it, and nothing prepares the allocated devices. kube-controller-manager's
resourceclaim controller makes a pod's claims from its templates; kube-scheduler allocates them.

``resource_slice("gpu-1", [gpu_device(0), gpu_device(1)])``
``device_class("gpu.nvidia.com", extended_resource_name="nvidia.com/gpu")``
``pod_with_claims("trainer", {"gpu": "one-gpu"})``
"""

from __future__ import annotations

import uuid as uuidlib
from collections.abc import Mapping, Sequence
from typing import Any

from testbed.manifests import pod_manifest

JSON = dict[str, Any]

RESOURCE_API = "resource.k8s.io/v1"
DEVICE_TAINT_RULE_API = "resource.k8s.io/v1beta2"  # DeviceTaintRule's only version in v1.36
GPU_DRIVER = "gpu.nvidia.com"
# The standard attribute of the device's PCIe root complex (k8s.io/dynamic-resource-allocation's
# deviceattribute package); a driver-qualified name would be "<driver>/pcieRoot".
PCIE_ROOT = "resource.kubernetes.io/pcieRoot"
# Set by kube-scheduler on the ResourceClaim it makes for a pod's DRA-backed extended resources.
EXTENDED_RESOURCE_CLAIM_ANNOTATION = "resource.kubernetes.io/extended-resource-claim"
# Set by the resourceclaim controller on a claim made from a template: the pod's claim entry.
POD_CLAIM_NAME_ANNOTATION = "resource.kubernetes.io/pod-claim-name"

Attribute = str | int | bool


def resource_path(plural: str, namespace: str | None = None) -> str:
    """The collection path of a resource.k8s.io/v1 resource (``resourceslices``,
    ``deviceclasses``, ``resourceclaimtemplates``, ``resourceclaims``)."""
    where = f"/namespaces/{namespace}" if namespace else ""
    return f"/apis/{RESOURCE_API}{where}/{plural}"


def attribute(value: Attribute) -> JSON:
    """A DeviceAttribute: exactly one of bool, int or string (checked in that order: a bool is
    an int to Python)."""
    if isinstance(value, bool):
        return {"bool": value}
    if isinstance(value, int):
        return {"int": value}
    return {"string": value}


def gpu_device(
    index: int,
    *,
    uuid: str | None = None,
    pcie_root: str = "pci0000:00",
    memory: str = "80Gi",
    attributes: Mapping[str, Attribute] | None = None,
) -> JSON:
    """A GPU as a driver lists it in a ResourceSlice: named ``gpu-<index>``, with attributes
    ``uuid`` (driver-qualified, as NVIDIA's driver names it) and the standard ``pcieRoot``, and
    capacity ``memory``. ``attributes`` adds or replaces attributes."""
    attrs: dict[str, Attribute] = {
        "uuid": uuid or f"GPU-{uuidlib.uuid4()}",
        PCIE_ROOT: pcie_root,
        **(attributes or {}),
    }
    return {
        "name": f"gpu-{index}",
        "attributes": {name: attribute(value) for name, value in attrs.items()},
        "capacity": {"memory": {"value": memory}},
    }


def resource_slice(
    node: str,
    devices: Sequence[JSON],
    *,
    driver: str = GPU_DRIVER,
    pool: str | None = None,
    generation: int = 1,
    name: str | None = None,
) -> JSON:
    """The one ResourceSlice of a node-local pool (named after the node, as a driver's kubelet
    plugin names it), listing ``devices``."""
    return {
        "apiVersion": RESOURCE_API,
        "kind": "ResourceSlice",
        "metadata": {"name": name or f"{node}-{driver}"},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": pool or node, "generation": generation, "resourceSliceCount": 1},
            "devices": [dict(d) for d in devices],
        },
    }


def device_class(
    name: str,
    *,
    driver: str = GPU_DRIVER,
    extended_resource_name: str | None = None,
    selectors: Sequence[str] = (),
) -> JSON:
    """A DeviceClass selecting the devices of ``driver`` (CEL ``device.driver == "<driver>"``),
    and every CEL expression of ``selectors`` too. ``extended_resource_name`` (KEP-5004,
    DRAExtendedResource) lets a pod ask for the class's devices as that extended resource
    (``nvidia.com/gpu: 1``) on nodes that do not advertise it."""
    expressions = [f'device.driver == "{driver}"', *selectors]
    spec: JSON = {"selectors": [{"cel": {"expression": e}} for e in expressions]}
    if extended_resource_name:
        spec["extendedResourceName"] = extended_resource_name
    return {
        "apiVersion": RESOURCE_API,
        "kind": "DeviceClass",
        "metadata": {"name": name},
        "spec": spec,
    }


def resource_claim_template(
    name: str,
    *,
    device_class: str,
    count: int = 1,
    request: str = "gpu",
    namespace: str | None = None,
) -> JSON:
    """A ResourceClaimTemplate asking for exactly ``count`` devices of ``device_class`` in one
    request named ``request``."""
    metadata: JSON = {"name": name}
    if namespace:
        metadata["namespace"] = namespace
    exactly = {"deviceClassName": device_class, "allocationMode": "ExactCount", "count": count}
    return {
        "apiVersion": RESOURCE_API,
        "kind": "ResourceClaimTemplate",
        "metadata": metadata,
        "spec": {"spec": {"devices": {"requests": [{"name": request, "exactly": exactly}]}}},
    }


def pod_with_claims(
    name: str,
    templates: Mapping[str, str],
    *,
    requests: Mapping[str, str] | None = None,
    **pod_kwargs: Any,
) -> JSON:
    """A pod (``pod_manifest``) whose container uses one claim per entry of ``templates``: the
    pod's claim name to the ResourceClaimTemplate it is made from."""
    manifest = pod_manifest(
        name, requests=requests or {"cpu": "100m", "memory": "64Mi"}, **pod_kwargs
    )
    spec = manifest["spec"]
    spec["resourceClaims"] = [
        {"name": claim, "resourceClaimTemplateName": template}
        for claim, template in templates.items()
    ]
    spec["containers"][0]["resources"]["claims"] = [{"name": claim} for claim in templates]
    return manifest


def pod_claim_name(pod: Mapping[str, Any], claim: str) -> str:
    """The name of the ResourceClaim made for the pod's claim entry ``claim`` (the resourceclaim
    controller records it in ``status.resourceClaimStatuses``), or "" while there is none."""
    for entry in (pod.get("status") or {}).get("resourceClaimStatuses") or []:
        if entry.get("name") == claim:
            return str(entry.get("resourceClaimName") or "")
    return ""


def allocation_results(claim: Mapping[str, Any]) -> list[JSON]:
    """``status.allocation.devices.results`` of a ResourceClaim: one entry (request, driver,
    pool, device) per allocated device; [] while it is not allocated."""
    allocation = (claim.get("status") or {}).get("allocation") or {}
    results: list[JSON] = (allocation.get("devices") or {}).get("results") or []
    return results


def device_taint_rule(
    name: str,
    *,
    key: str,
    effect: str = "NoSchedule",
    value: str = "",
    driver: str = GPU_DRIVER,
    pool: str | None = None,
    device: str | None = None,
) -> JSON:
    """A DeviceTaintRule tainting the devices of ``driver`` (in ``pool``, named ``device``,
    where given). Served only with ControlPlane(device_taint_rules=True): the API version is
    beta and off by default in v1.36, and so is the DRADeviceTaintRules gate."""
    selector: JSON = {"driver": driver}
    if pool:
        selector["pool"] = pool
    if device:
        selector["device"] = device
    taint: JSON = {"key": key, "effect": effect}
    if value:
        taint["value"] = value
    return {
        "apiVersion": DEVICE_TAINT_RULE_API,
        "kind": "DeviceTaintRule",
        "metadata": {"name": name},
        "spec": {"deviceSelector": selector, "taint": taint},
    }
