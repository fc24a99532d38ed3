"""Decoding a node object into a :class:`NodeSpec`.

GPU facts come from the node's allocatable ``nvidia.com/gpu`` count and NVIDIA GPU feature
discovery labels; NVLink/NUMA domains from an optional ``schedext.io/gpu-topology`` annotation
that a node agent publishes, e.g. ``{"groups": [[0, 1, 2, 3], [4, 5, 6, 7]]}``.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from fractions import Fraction

from extender import fields, names
from extender.fields import JSONObject
from extender.model import NodeSpec
from extender.quantity import QuantityError, parse_quantity

__all__ = ["node_spec", "parse_topology"]


# What the API server allows in a node name (a DNS subdomain). Names are checked on the way in
# so that the wire encoder may write known names into JSON without escaping them.
_NODE_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")


def node_spec(node: JSONObject, *, gpu_resource: str = names.GPU_RESOURCE) -> NodeSpec:
    """Reduce a node object to what scheduling uses. Unreadable values count as absent; a
    node whose name is not a valid Kubernetes node name gets the empty name (callers skip it).
    """
    meta = fields.obj(node, "metadata")
    name = fields.text(meta, "name")
    status = fields.obj(node, "status")
    allocatable = fields.obj(status, "allocatable") or fields.obj(status, "capacity")
    labels = fields.string_map(meta, "labels")
    annotations = fields.string_map(meta, "annotations")
    # A fractional GPU count is not a thing; round down to whole devices.
    gpu_count = max(0, math.floor(_quantity(allocatable.get(gpu_resource))))
    groups, problem = parse_topology(annotations.get(names.GPU_TOPOLOGY), gpu_count)
    memory_label = labels.get(names.GPU_MEMORY_LABEL, "")
    return NodeSpec(
        name=name if _NODE_NAME.fullmatch(name) else "",
        uid=fields.text(meta, "uid"),
        cpu_milli=max(0, _ceil(_quantity(allocatable.get("cpu")) * 1000)),
        memory_bytes=max(0, _ceil(_quantity(allocatable.get("memory")))),
        gpu_count=gpu_count,
        gpu_model=labels.get(names.GPU_PRODUCT_LABEL) or None,
        gpu_memory_mib=int(memory_label) if memory_label.isdigit() else None,
        gpu_groups=groups,
        labels=labels,
        topology_problem=problem,
    )


GpuGroups = tuple[tuple[int, ...], ...]


def parse_topology(raw: str | None, gpu_count: int) -> tuple[GpuGroups, str | None]:
    """GPU groups from the topology annotation, and why it was rejected if it was.

    A rejected annotation leaves the node usable without topology: a wrong hint must not take
    GPUs out of service.
    """
    if raw is None:
        return (), None
    try:
        return _groups(raw, gpu_count), None
    except _TopologyError as error:
        return (), f"{names.GPU_TOPOLOGY}: {error}"


class _TopologyError(ValueError):
    pass


def _groups(raw: str, gpu_count: int) -> GpuGroups:
    try:
        document = json.loads(raw)
    except ValueError:
        raise _TopologyError("not JSON") from None
    groups = document.get("groups") if isinstance(document, Mapping) else None
    if not isinstance(groups, list) or not all(isinstance(g, list) and g for g in groups):
        raise _TopologyError('expected {"groups": [[gpu indices], ...]}')
    seen: set[int] = set()
    parsed: list[tuple[int, ...]] = []
    for group in groups:
        if not all(isinstance(i, int) and not isinstance(i, bool) for i in group):
            raise _TopologyError("GPU indices must be integers")
        members = tuple(sorted(group))
        if any(i < 0 or i >= gpu_count for i in members):
            raise _TopologyError(f"GPU index outside 0..{gpu_count - 1}")
        if seen.intersection(members) or len(set(members)) != len(members):
            raise _TopologyError("a GPU is listed twice")
        seen.update(members)
        parsed.append(members)
    return tuple(parsed)


def _quantity(raw: object) -> Fraction:
    if raw is None or isinstance(raw, bool) or not isinstance(raw, str | int | float):
        return Fraction(0)
    try:
        return parse_quantity(raw)
    except QuantityError:
        return Fraction(0)


def _ceil(value: Fraction) -> int:
    return -((-value.numerator) // value.denominator)
