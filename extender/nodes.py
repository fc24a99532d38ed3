"""Decoding a node object into a :class:`NodeSpec`.

GPU facts come from the node's allocatable ``nvidia.com/gpu`` count and NVIDIA GPU feature
discovery labels; NVLink/NUMA domains, GPU UUIDs and health from an optional
``schedext.io/gpu-topology`` annotation that the node agent publishes (or a person writes:
``{"groups": [[0, 1, 2, 3], [4, 5, 6, 7]]}``), and live use from ``schedext.io/gpu-use``
(:mod:`extender.devices.document`). GPUs in MIG mode and their MIG devices come from the same
topology document (see :mod:`extender.mig` for how they count beside allocatable). Where the
kubelet disagrees with schedext's placements comes from ``schedext.io/gpu-drift``
(:mod:`extender.devices.drift_document`): its GPUs in use are mapped to indices through the
UUIDs the topology publishes, and held.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction

from extender import fields, mig, names
from extender.devices.document import (
    DocumentError,
    Topology,
    UseSample,
    decode_topology,
    decode_use,
    listed_gpus,
)
from extender.devices.drift import Drift, in_use_text
from extender.devices.drift_document import decode_drift
from extender.fields import JSONObject
from extender.model import GpuInUse, NodeSpec
from extender.quantity import MAX_MAGNITUDE, QuantityError, parse_quantity

__all__ = ["node_spec", "parse_topology", "read_drift", "read_topology", "read_use"]


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
    allocatable_gpus = math.floor(_quantity(allocatable.get(gpu_resource)))
    if not 0 <= allocatable_gpus <= _MAX_GPUS:
        allocatable_gpus = 0
    raw_topology = annotations.get(names.GPU_TOPOLOGY)
    topology, problem = read_topology(raw_topology, allocatable_gpus)
    links: tuple[tuple[str, ...], ...] = ()
    if problem and not allocatable_gpus and raw_topology is not None:
        # No nvidia.com/gpu: DRA may hand out the GPUs the agent lists. Their NVLink groups
        # (by UUID) are what DRA pods are rated by; the node has none of schedext's own.
        listed, _ = read_topology(raw_topology, listed_gpus(raw_topology))
        uuid = {gpu.index: gpu.uuid for gpu in listed.gpus if gpu.uuid}
        links = tuple(tuple(uuid[i] for i in group if i in uuid) for group in listed.groups)
        problem = None if listed.gpus else problem
    shape = mig.node_gpus(allocatable_gpus, topology)
    indices = shape.gpu_count + len(shape.gpu_mig)
    use, use_problem = read_use(annotations.get(names.GPU_USE), indices)
    drift, drift_problem = read_drift(annotations.get(names.GPU_DRIFT))
    memory_label = labels.get(names.GPU_MEMORY_LABEL, "")
    return NodeSpec(
        name=name if _NODE_NAME.fullmatch(name) else "",
        uid=fields.text(meta, "uid"),
        cpu_milli=_bounded(_ceil(_quantity(allocatable.get("cpu")) * 1000)),
        memory_bytes=max(0, _ceil(_quantity(allocatable.get("memory")))),
        gpu_count=shape.gpu_count,
        gpu_model=labels.get(names.GPU_PRODUCT_LABEL) or None,
        gpu_memory_mib=fields.whole_number(memory_label),
        gpu_groups=topology.groups,
        gpu_links=links,
        labels=labels,
        topology_problem=problem,
        gpu_uuids=shape.gpu_uuids,
        gpu_unhealthy=topology.unhealthy(),
        gpu_use=use,
        use_problem=use_problem,
        gpu_mig=shape.gpu_mig,
        mig_slices=shape.mig_slices,
        drift=drift,
        drift_problem=drift_problem,
        gpu_in_use=_gpus_in_use(drift, shape.gpu_uuids),
        mig_in_use=frozenset(u.uuid for u in drift.in_use if u.mig) if drift else frozenset(),
    )


GpuGroups = tuple[tuple[int, ...], ...]


def parse_topology(raw: str | None, gpu_count: int) -> tuple[GpuGroups, str | None]:
    """GPU groups from the topology annotation, and why it was rejected if it was."""
    topology, problem = read_topology(raw, gpu_count)
    return topology.groups, problem


def read_topology(raw: str | None, gpu_count: int) -> tuple[Topology, str | None]:
    """The node agent's topology document (any version this core reads), and why it was
    rejected if it was.

    A rejected annotation leaves the node usable without topology: a wrong hint must not take
    GPUs out of service. (A GPU the agent marked unhealthy in a document we cannot read is
    still guarded by the device plugin, which never hands it out.)
    """
    if raw is None:
        return _NO_TOPOLOGY, None
    try:
        return decode_topology(raw, gpu_count), None
    except DocumentError as error:
        return _NO_TOPOLOGY, f"{names.GPU_TOPOLOGY}: {error}"


def read_use(raw: str | None, gpu_count: int) -> tuple[UseSample | None, str | None]:
    """The node agent's live-use sample, and why it was rejected if it was."""
    if raw is None:
        return None, None
    try:
        return decode_use(raw, gpu_count), None
    except DocumentError as error:
        return None, f"{names.GPU_USE}: {error}"


def read_drift(raw: str | None) -> tuple[Drift | None, str | None]:
    """The node agent's drift document, and why it was rejected if it was: a malformed or
    newer-version document reads as "no drift" (the node stays as schedext sees it)."""
    if raw is None:
        return None, None
    try:
        return decode_drift(raw), None
    except DocumentError as error:
        return None, f"{names.GPU_DRIFT}: {error}"


def _gpus_in_use(drift: Drift | None, uuids: tuple[str, ...]) -> tuple[GpuInUse, ...]:
    """The drift's GPUs in use by index, one entry per GPU and pod; those the node does not
    name by UUID are left out (explain still shows them)."""
    if drift is None or not uuids:
        return ()
    index_of = {uuid: i for i, uuid in enumerate(uuids)}
    found = {
        (index_of[u.uuid], u.pod): GpuInUse(
            index_of[u.uuid], u.pod, in_use_text(u, index_of[u.uuid])
        )
        for u in drift.in_use
        if not u.mig and u.uuid in index_of
    }
    return tuple(found[key] for key in sorted(found))


_NO_TOPOLOGY = Topology(groups=(), version=0)

# More GPUs than any node has: a larger count is a broken value, and every GPU of a node
# takes room in the inventory's per-device rows.
_MAX_GPUS = 1024


def _bounded(value: int) -> int:
    """A count for an int64 column: what does not fit is unreadable, and counts as absent."""
    return value if 0 <= value <= MAX_MAGNITUDE else 0


def _quantity(raw: object) -> Fraction:
    if raw is None or isinstance(raw, bool) or not isinstance(raw, str | int | float):
        return Fraction(0)
    try:
        return parse_quantity(raw)
    except QuantityError:
        return Fraction(0)


def _ceil(value: Fraction) -> int:
    return -((-value.numerator) // value.denominator)
