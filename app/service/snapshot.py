"""Loading a snapshot file: nodes, pods, PodGroups, IPPools and IPClaims, ElasticQuotas, and
DRA's ResourceSlices, ResourceClaims, DeviceClasses and DeviceTaintRules, as
``kubectl get nodes,pods,podgroups,ippools,ipclaims -A -o json`` (or ``-o yaml``) prints them,
or a NodeList/PodList, single objects, or several YAML documents."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import orjson
import yaml

__all__ = ["Snapshot", "SnapshotError", "demo_snapshot", "read_snapshot"]

_LOADER: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class SnapshotError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class Snapshot:
    source: str
    nodes: list[Mapping[str, Any]]
    pods: list[Mapping[str, Any]]
    pod_groups: list[Mapping[str, Any]] = field(default_factory=list)
    ip_pools: list[Mapping[str, Any]] = field(default_factory=list)
    ip_claims: list[Mapping[str, Any]] = field(default_factory=list)
    quotas: list[Mapping[str, Any]] = field(default_factory=list)  # ElasticQuotas
    resource_slices: list[Mapping[str, Any]] = field(default_factory=list)
    resource_claims: list[Mapping[str, Any]] = field(default_factory=list)
    device_classes: list[Mapping[str, Any]] = field(default_factory=list)
    device_taint_rules: list[Mapping[str, Any]] = field(default_factory=list)


def read_snapshot(path: Path) -> Snapshot:
    try:
        data = path.read_bytes()
    except OSError as error:
        raise SnapshotError(f"cannot read snapshot {path}: {error.strerror}") from None
    return parse_snapshot(data, source=str(path))


def demo_snapshot() -> Snapshot:
    data = resources.files("app.service").joinpath("demo/inventory.json").read_bytes()
    return parse_snapshot(data, source="embedded demo inventory")


def parse_snapshot(data: bytes, *, source: str) -> Snapshot:
    documents: list[Any]
    try:
        documents = [orjson.loads(data)]
    except orjson.JSONDecodeError:
        try:
            documents = list(yaml.load_all(data, Loader=_LOADER))
        except yaml.YAMLError as error:
            raise SnapshotError(f"{source} is neither JSON nor YAML: {error}") from None
    nodes: list[Mapping[str, Any]] = []
    pods: list[Mapping[str, Any]] = []
    by_kind: dict[str, list[Mapping[str, Any]]] = {
        "Node": nodes,
        "Pod": pods,
        "PodGroup": [],
        "IPPool": [],
        "IPClaim": [],
        "ElasticQuota": [],
        "ResourceSlice": [],
        "ResourceClaim": [],
        "DeviceClass": [],
        "DeviceTaintRule": [],
    }
    for kind, obj in _objects(documents, default_kind=""):
        if kind in by_kind:
            by_kind[kind].append(obj)
    if not nodes:
        raise SnapshotError(
            f"{source} contains no Node objects (expected e.g. `kubectl get nodes,pods -A -o json`)"
        )
    return Snapshot(
        source=source,
        nodes=nodes,
        pods=pods,
        pod_groups=by_kind["PodGroup"],
        ip_pools=by_kind["IPPool"],
        ip_claims=by_kind["IPClaim"],
        quotas=by_kind["ElasticQuota"],
        resource_slices=by_kind["ResourceSlice"],
        resource_claims=by_kind["ResourceClaim"],
        device_classes=by_kind["DeviceClass"],
        device_taint_rules=by_kind["DeviceTaintRule"],
    )


def _objects(documents: list[Any], default_kind: str) -> Iterator[tuple[str, Mapping[str, Any]]]:
    for document in documents:
        if not isinstance(document, Mapping):
            continue
        kind = document.get("kind") or default_kind
        items = document.get("items")
        if isinstance(items, list) and (kind.endswith("List") or "items" in document):
            # A NodeList's items carry no kind; a plain List's items carry their own.
            item_kind = kind[: -len("List")] if kind not in ("", "List") else ""
            yield from _objects(items, default_kind=item_kind)
        elif isinstance(kind, str):
            yield kind, document


def dumps(snapshot: Snapshot) -> str:
    """A snapshot as a kubectl-style List (used to write generated snapshots)."""
    items = [{"kind": "Node", **n} for n in snapshot.nodes] + [
        {"kind": "Pod", **p} for p in snapshot.pods
    ]
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": items}, indent=1)
