"""Reading the API server's state into the checker's values (``loadtests.soak.checker``).

One :func:`read` lists the soak's pods, the nodes, the PodGroups, the IPClaims and the
StatefulSets (and, when asked, the FailedScheduling events), each a plain GET to the API
server itself: the checker judges what the cluster says, never what schedext believes.
Decoding is pure (:func:`pod_of` and friends), so that the unit tests can build the same
values from objects.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Mapping
from typing import Any

from extender import names
from loadtests.soak.checker import Claim, Group, Node, Pod, Snapshot
from loadtests.soak.workload import SOAK_LABEL
from testbed.kubeapi import KubeApi

__all__ = ["pod_of", "read"]

JSON = Mapping[str, Any]
PODGROUPS = "/apis/scheduling.x-k8s.io/v1alpha1/podgroups"
IPCLAIMS = "/apis/schedext.io/v1alpha1/ipclaims"
STATEFULSETS = "/apis/apps/v1/statefulsets"


def read(api: KubeApi, *, events: bool = False) -> tuple[Snapshot, list[JSON]]:
    """The snapshot, and the live pods' objects as listed (the runner follows its units by
    them). Raises what the client raises while the API server is away."""
    selector = {"labelSelector": f"{SOAK_LABEL}=1"}
    at = time.time()
    items = api.apply_raw("GET", "/api/v1/pods", params=selector).get("items", [])
    live = [pod for pod in items if not pod["metadata"].get("deletionTimestamp")]
    nodes = {
        node.name: node
        for obj in api.apply_raw("GET", "/api/v1/nodes").get("items", [])
        if (node := node_of(obj)) is not None
    }
    groups = {
        g.key: g
        for obj in api.apply_raw("GET", PODGROUPS).get("items", [])
        if (g := group_of(obj)) is not None
    }
    claims = tuple(
        claim
        for obj in api.apply_raw("GET", IPCLAIMS).get("items", [])
        if (claim := claim_of(obj)) is not None
    )
    statefulsets = {
        f"{obj['metadata']['namespace']}/{obj['metadata']['name']}": int(
            obj.get("spec", {}).get("replicas", 1)
        )
        for obj in api.apply_raw("GET", STATEFULSETS, params=selector).get("items", [])
        if not obj["metadata"].get("deletionTimestamp")
    }
    reasons = None
    if events:
        listed = api.apply_raw(
            "GET", "/api/v1/events", params={"fieldSelector": "reason=FailedScheduling"}
        ).get("items", [])
        reasons = frozenset(
            f"{e['involvedObject'].get('namespace')}/{e['involvedObject'].get('name')}"
            for e in listed
        )
    pods = tuple(pod_of(obj) for obj in live)
    snapshot = Snapshot(at, pods, nodes, groups, claims, statefulsets, reasons)
    return snapshot, live


def pod_of(obj: JSON) -> Pod:
    meta, spec = obj["metadata"], obj.get("spec", {})
    annotations = meta.get("annotations") or {}
    labels = meta.get("labels") or {}
    asked: dict[str, str] = {}
    for container in spec.get("containers", ()):
        asked.update((container.get("resources") or {}).get("requests") or {})
    namespace = meta.get("namespace", "")
    group = labels.get(names.POD_GROUP_LABEL)
    return Pod(
        key=f"{namespace}/{meta['name']}",
        uid=meta.get("uid", ""),
        node=spec.get("nodeName") or None,
        gpus=_indices(annotations.get(names.GPU_IDS)),
        asked_gpus=_count(asked.get(names.GPU_RESOURCE)),
        share_mib=_count(annotations.get(names.GPU_SHARE_MEMORY))
        if names.SHARE_MEMORY_RESOURCE in asked
        else 0,
        share_cores=_count(annotations.get(names.GPU_SHARE_CORES)),
        ip=annotations.get(names.IP) if spec.get("nodeName") else None,
        asks_address=names.IP_RESOURCE in asked,
        group=f"{namespace}/{group}" if group else None,
        identity=_identity(meta, namespace, annotations),
        created=_seconds(meta.get("creationTimestamp")),
    )


def node_of(obj: JSON) -> Node | None:
    meta, status = obj["metadata"], obj.get("status", {})
    gpus = _count((status.get("allocatable") or {}).get(names.GPU_RESOURCE))
    memory = _count((meta.get("labels") or {}).get(names.GPU_MEMORY_LABEL))
    return Node(meta["name"], gpus, memory) if gpus else None


def group_of(obj: JSON) -> Group | None:
    meta, spec = obj["metadata"], obj.get("spec", {})
    if meta.get("deletionTimestamp"):
        return None
    return Group(
        f"{meta['namespace']}/{meta['name']}",
        int(spec.get("minMember", 1)),
        float(spec.get("scheduleTimeoutSeconds", 20)),
    )


def claim_of(obj: JSON) -> Claim | None:
    spec = obj.get("spec", {})
    if not spec.get("owner") or obj["metadata"].get("deletionTimestamp"):
        return None
    return Claim(
        obj["metadata"]["name"],
        spec.get("address", ""),
        spec["owner"],
        spec.get("holderUID") or None,
    )


def _identity(meta: JSON, namespace: str, annotations: JSON) -> str | None:
    if annotations.get(names.IP_POLICY) != "sticky":
        return None
    for owner in meta.get("ownerReferences") or ():
        if owner.get("kind") == "StatefulSet":
            ordinal = meta["name"].rsplit("-", 1)[-1]
            return f"sts/{namespace}/{owner['name']}/{ordinal}"
    return None


def _indices(value: str | None) -> tuple[int, ...] | None:
    if value is None:
        return None
    parts = [p.strip() for p in value.split(",")]
    return tuple(int(p) for p in parts) if parts and all(p.isdigit() for p in parts) else None


def _count(value: object) -> int:
    text = str(value or "0")
    return int(text) if text.isdigit() else 0


def _seconds(stamp: str | None) -> float:
    if not stamp:
        return 0.0
    return dt.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
