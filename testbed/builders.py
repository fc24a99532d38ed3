"""Builders for Kubernetes node and pod objects, shaped like what the API server sends: what
the unit and api tests feed the core and the service, and the scenarios of
``loadtests.scenarios`` too.

``make_node(gpus=8, model="NVIDIA-H100-80GB-HBM3", groups=[[0, 1, 2, 3], [4, 5, 6, 7]])``
``make_pod("trainer", gpus=2, model="H100", node="gpu-1", gpu_ids=[0, 1])``
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Sequence
from typing import Any

from extender import names
from extender.devices import (
    Gpu,
    GpuHealth,
    GpuUse,
    Topology,
    UseSample,
    encode_topology,
    encode_use,
)
from extender.devices.drift import Drift
from extender.devices.drift_document import encode_drift

_uids = itertools.count(1)

H100 = "NVIDIA-H100-80GB-HBM3"
A100 = "NVIDIA-A100-SXM4-40GB"
T4 = "Tesla-T4"
GPU_MEMORY = {H100: 81559, A100: 40960, T4: 15360}


def make_node(
    name: str = "node",
    *,
    gpus: int = 0,
    model: str | None = None,
    gpu_memory_mib: int | None = None,
    groups: Sequence[Sequence[int]] | None = None,
    cpu: str = "32",
    memory: str = "128Gi",
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    gpu_resource: str = names.GPU_RESOURCE,
) -> dict[str, Any]:
    node_labels = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux"}
    if gpus and model is None:
        model = H100
    if model:
        node_labels[names.GPU_PRODUCT_LABEL] = model
        memory_mib = gpu_memory_mib or GPU_MEMORY.get(model)
        if memory_mib:
            node_labels[names.GPU_MEMORY_LABEL] = str(memory_mib)
    node_labels.update(labels or {})
    node_annotations = dict(annotations or {})
    if groups is not None:
        node_annotations[names.GPU_TOPOLOGY] = json.dumps({"groups": [list(g) for g in groups]})
    resources = {"cpu": cpu, "memory": memory, "pods": "110"}
    if gpus:
        resources[gpu_resource] = str(gpus)
    return {
        "metadata": {
            "name": name,
            "uid": f"node-uid-{name}",
            "labels": node_labels,
            "annotations": node_annotations,
        },
        "spec": {},
        "status": {
            "capacity": dict(resources),
            "allocatable": dict(resources),
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def make_pod(
    name: str = "pod",
    *,
    namespace: str = "default",
    uid: str | None = None,
    gpus: int = 0,
    cpu: str | None = "100m",
    memory: str | None = "128Mi",
    workload: str | None = None,
    model: str | None = None,
    gpu_memory_mib: int | str | None = None,
    node: str | None = None,
    gpu_ids: Sequence[int] | None = None,
    priority: int | None = None,
    preemption_policy: str | None = None,
    phase: str | None = None,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    init_containers: list[dict[str, Any]] | None = None,
    gpu_resource: str = names.GPU_RESOURCE,
) -> dict[str, Any]:
    requests: dict[str, str] = {}
    limits: dict[str, str] = {}
    if cpu is not None:
        requests["cpu"] = cpu
    if memory is not None:
        requests["memory"] = memory
        limits["memory"] = memory
    if gpus:
        limits[gpu_resource] = str(gpus)
        requests[gpu_resource] = str(gpus)
    pod_labels = dict(labels or {})
    if workload is not None:
        pod_labels[names.WORKLOAD_TYPE] = workload
    pod_annotations = dict(annotations or {})
    if model is not None:
        pod_annotations[names.GPU_MODEL] = model
    if gpu_memory_mib is not None:
        pod_annotations[names.GPU_MEMORY_MIB] = str(gpu_memory_mib)
    if gpu_ids is not None:
        pod_annotations[names.GPU_IDS] = ",".join(map(str, gpu_ids))
    spec: dict[str, Any] = {
        "containers": [
            {
                "name": "main",
                "image": "busybox",
                "resources": {"requests": requests, "limits": limits},
            }
        ],
        "schedulerName": "default-scheduler",
        "terminationGracePeriodSeconds": 0,
    }
    if init_containers:
        spec["initContainers"] = init_containers
    if node is not None:
        spec["nodeName"] = node
    if priority is not None:
        spec["priority"] = priority
    if preemption_policy is not None:
        spec["preemptionPolicy"] = preemption_policy
    return {
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": uid or f"uid-{name}-{next(_uids)}",
            "labels": pod_labels,
            "annotations": pod_annotations,
        },
        "spec": spec,
        "status": {"phase": phase or ("Running" if node else "Pending")},
    }


def container(
    name: str,
    *,
    requests: dict[str, Any] | None = None,
    limits: dict[str, Any] | None = None,
    restart: str | None = None,
) -> dict[str, Any]:
    """One container spec asking for ``requests`` and ``limits`` as given (quantities as
    strings or numbers); ``restart`` "Always" makes an init container a sidecar."""
    c: dict[str, Any] = {
        "name": name,
        "resources": {"requests": requests or {}, "limits": limits or {}},
    }
    if restart:
        c["restartPolicy"] = restart
    return c


def with_containers(
    pod: dict[str, Any], containers: Sequence[tuple[str, str, dict[str, int]]]
) -> dict[str, Any]:
    """``pod`` with these containers instead of its one: (name, role, {resource: count}),
    role "init", "sidecar" (an init container with restartPolicy Always) or "app", each
    asking for its resources in limits and requests, as the API server stores them."""
    spec = pod["spec"]
    spec["containers"], spec["initContainers"] = [], []
    for name, role, asked in containers:
        amounts = {resource: str(count) for resource, count in asked.items()}
        container: dict[str, Any] = {
            "name": name,
            "image": "busybox",
            "resources": {"requests": dict(amounts), "limits": dict(amounts)},
        }
        if role == "sidecar":
            container["restartPolicy"] = "Always"
        spec["initContainers" if role in ("init", "sidecar") else "containers"].append(container)
    if not spec["initContainers"]:
        del spec["initContainers"]
    return pod


def share_pod(
    name: str = "share",
    *,
    memory_mib: int,
    cores: int | None = None,
    shares: int | None = 1,
    gpu_ids: Sequence[int] | None = None,
    **kwargs: Any,
) -> dict[str, Any]:
    """A pod asking for a share of GPUs (schedext's resources): ``memory_mib`` and ``cores``
    on each of ``shares`` GPUs. With ``node`` and ``gpu_ids``, bound as schedext's bind
    writes it (the share annotations beside the indices)."""
    pod = make_pod(name, gpu_ids=gpu_ids, **kwargs)
    resources = pod["spec"]["containers"][0]["resources"]
    asked = {names.SHARE_MEMORY_RESOURCE: str(memory_mib)}
    if cores is not None:
        asked[names.SHARE_CORES_RESOURCE] = str(cores)
    if shares is not None:
        asked[names.SHARE_COUNT_RESOURCE] = str(shares)
    resources["limits"].update(asked)
    resources["requests"].update(asked)
    if gpu_ids is not None:
        pod["metadata"]["annotations"][names.GPU_SHARE_MEMORY] = str(memory_mib)
        if cores:
            pod["metadata"]["annotations"][names.GPU_SHARE_CORES] = str(cores)
    return pod


def uid_of(obj: dict[str, Any]) -> str:
    return str(obj["metadata"]["uid"])


def name_of(obj: dict[str, Any]) -> str:
    return str(obj["metadata"]["name"])


def make_pod_group(
    name: str,
    *,
    min_member: int,
    namespace: str = "default",
    timeout_s: int | None = None,
    created: str = "2026-01-01T00:00:00Z",
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {"minMember": min_member}
    if timeout_s is not None:
        spec["scheduleTimeoutSeconds"] = timeout_s
    return {
        "apiVersion": "scheduling.x-k8s.io/v1alpha1",
        "kind": "PodGroup",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": f"pg-uid-{name}",
            "creationTimestamp": created,
            "annotations": dict(annotations or {}),
        },
        "spec": spec,
    }


def gang_pod(name: str, group: str, *, gpus: int = 2, **kwargs: Any) -> dict[str, Any]:
    labels = {names.POD_GROUP_LABEL: group, **kwargs.pop("labels", {})}
    return make_pod(name, gpus=gpus, labels=labels, **kwargs)


def make_ip_pool(
    name: str,
    *,
    cidr: str | None = None,
    ranges: list[tuple[str, str]] | None = None,
    exclude: list[str] | None = None,
    gateway: str | None = None,
    rack: str | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {}
    if cidr:
        spec["cidr"] = cidr
    if ranges:
        spec["ranges"] = [{"start": a, "end": b} for a, b in ranges]
    if exclude:
        spec["exclude"] = exclude
    if gateway:
        spec["gateway"] = gateway
    if rack:
        spec["nodeSelector"] = {"topology.kubernetes.io/rack": rack}
    return {
        "apiVersion": "schedext.io/v1alpha1",
        "kind": "IPPool",
        "metadata": {"name": name},
        "spec": spec,
    }


def make_ip_claim(
    pool: str,
    address: str,
    owner: str,
    *,
    policy: str | None = None,
    holder_uid: str | None = None,
) -> dict[str, Any]:
    """An IPClaim named after its address, as schedext creates them."""
    spec: dict[str, Any] = {"pool": pool, "address": address, "owner": owner}
    if policy:
        spec["releasePolicy"] = policy
    if holder_uid:
        spec["holderUID"] = holder_uid
    name = f"{pool}.{address.replace(':', '-').replace('.', '-')}"
    return {
        "apiVersion": "schedext.io/v1alpha1",
        "kind": "IPClaim",
        "metadata": {"name": name, "uid": f"claim-uid-{name}"},
        "spec": spec,
    }


def ip_pod(
    name: str,
    *,
    ip: str | None = None,
    pool: str | None = None,
    policy: str | None = None,
    statefulset: str | None = None,
    **kwargs: Any,
) -> dict[str, Any]:
    annotations = dict(kwargs.pop("annotations", {}))
    if ip:
        annotations[names.IP] = ip
    if pool:
        annotations[names.IP_POOL] = pool
    if policy:
        annotations[names.IP_POLICY] = policy
    pod = make_pod(name, annotations=annotations, **kwargs)
    if statefulset:
        pod["metadata"]["ownerReferences"] = [
            {
                "apiVersion": "apps/v1",
                "kind": "StatefulSet",
                "name": statefulset,
                "uid": f"sts-{statefulset}",
                "controller": True,
            }
        ]
    return pod


def bound_ip_pod(name: str, *, node: str, ip: str, pool: str, **kwargs: Any) -> dict[str, Any]:
    annotations = {names.IP: ip, names.IP_POOL: pool, **kwargs.pop("annotations", {})}
    return make_pod(name, node=node, annotations=annotations, **kwargs)


def agent_annotations(
    gpus: int,
    *,
    groups: Sequence[Sequence[int]] = (),
    unhealthy: dict[int, str] | None = None,
    uuid_prefix: str = "GPU-n",
    uuids: Sequence[str] | None = None,
    use: dict[int, tuple[int, int]] | None = None,
    use_at: float = 1_000_000.0,
    drift: Drift | None = None,
) -> dict[str, str]:
    """The node agent's annotations, written by its own encoders: its topology document
    (UUIDs, health, groups) and, with
    ``use`` ({index: (utilisation %, MiB used)}), a live-use sample taken at ``use_at``; with
    ``drift``, its drift document."""
    bad = unhealthy or {}
    ids = list(uuids) if uuids is not None else [f"{uuid_prefix}-{i}" for i in range(gpus)]
    topology = Topology(
        groups=tuple(tuple(g) for g in groups),
        gpus=tuple(
            Gpu(
                index=i,
                uuid=ids[i],
                health=GpuHealth(False, bad[i]) if i in bad else GpuHealth(),
            )
            for i in range(gpus)
        ),
    )
    annotations = {names.GPU_TOPOLOGY: encode_topology(topology)}
    if use is not None:
        sample = UseSample(
            at=use_at, gpus=tuple(GpuUse(i, u, m) for i, (u, m) in sorted(use.items()))
        )
        annotations[names.GPU_USE] = encode_use(sample)
    if drift is not None:
        annotations[names.GPU_DRIFT] = encode_drift(drift)
    return annotations


def elastic_quota(
    namespace: str,
    *,
    name: str | None = None,
    min: dict[str, str | int] | None = None,
    max: dict[str, str | int] | None = None,
    created: str = "2026-01-01T00:00:00Z",
    weight: str | None = None,
) -> dict[str, Any]:
    """scheduler-plugins' ElasticQuota (scheduling.x-k8s.io/v1alpha1) for ``namespace``,
    named after it unless ``name`` says otherwise; ``weight``: schedext's borrow weight."""
    spec: dict[str, Any] = {}
    if min is not None:
        spec["min"] = dict(min)
    if max is not None:
        spec["max"] = dict(max)
    annotations = {names.BORROW_WEIGHT: weight} if weight is not None else {}
    quota_name = name or namespace
    return {
        "apiVersion": "scheduling.x-k8s.io/v1alpha1",
        "kind": "ElasticQuota",
        "metadata": {
            "name": quota_name,
            "namespace": namespace,
            "uid": f"eq-uid-{namespace}-{quota_name}",
            "creationTimestamp": created,
            "annotations": annotations,
        },
        "spec": spec,
    }
