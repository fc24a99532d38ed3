"""A node's GPUs as DRA hands them out, counted the way filter and prioritize read a node's
columns: :class:`DraGpus`, built by :func:`dra_gpus`.

On a node DRA owns, kube-scheduler's DynamicResources plugin, not schedext, picks the
devices; schedext only rates the node for a DRA pod (how full it gets, whether the pod's
devices can share an NVLink group). So it counts, per node: the whole GPUs a GPU driver
advertises there, readable and with no ``NoSchedule``/``NoExecute`` taint (``total``); those
no claim holds, whole, as a share, or through a partition of it (``free``); and the most
free ones inside one group (``group_free``). A group is an NVLink/NUMA group of the node
agent's topology document, the devices matched by UUID (on a node with no
``nvidia.com/gpu``, ``NodeSpec.gpu_links``; else its groups of indices, by the agent's
UUIDs); where no agent publishes one, the devices under one PCIe root (the driver's
``pcieRoot`` attribute); else none is known.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import NamedTuple

from extender.columns import NO_TOPOLOGY
from extender.dra.node_view import NodeDra
from extender.dra.ownership import Ownership, ownership

__all__ = ["DraGpus", "dra_gpus", "uuid_groups"]

_WHOLE_KINDS = frozenset({"", "gpu"})  # the driver's "type": a MIG device is "mig"


class DraGpus(NamedTuple):
    owner: Ownership  # DRA or MIXED: a node DRA does not advertise GPUs on has none
    total: int
    free: int
    group_free: int  # NO_TOPOLOGY when the node's groups are unknown


def dra_gpus(
    node: NodeDra, *, device_plugin_gpus: int, groups: Sequence[Sequence[str]] = ()
) -> DraGpus | None:
    """What DRA offers on ``node``; None when no GPU driver publishes slices for it.
    ``device_plugin_gpus``: the node's ``nvidia.com/gpu`` (and MIG) GPUs, which make it mixed;
    ``groups``: the node agent's NVLink/NUMA groups, by UUID (see :func:`uuid_groups`)."""
    owner = ownership(node, device_plugin_gpus)
    if owner is Ownership.DEVICE_PLUGIN:
        return None
    held_refs = {held.ref for held in node.held}
    held_uuids = {uuid for held in node.held for uuid in (held.uuid, held.parent_uuid) if uuid}
    whole = [
        state
        for state in node.devices
        if not state.unknown and not state.unhealthy and not state.device.parent_uuid
        if state.device.kind in _WHOLE_KINDS
    ]
    free = [s for s in whole if s.ref not in held_refs and s.uuid not in held_uuids]
    group_of = {uuid: number for number, group in enumerate(groups) for uuid in group}
    keys = [group_of.get(s.uuid) if group_of else s.device.pcie_root for s in free]
    known = Counter(key for key in keys if key is not None and key != "")
    grouped = bool(group_of) or any(s.device.pcie_root for s in whole)
    most = max(known.values(), default=0) if grouped else NO_TOPOLOGY
    return DraGpus(owner, len(whole), len(free), most)


def uuid_groups(
    gpu_uuids: Sequence[str], gpu_groups: Sequence[Sequence[int]]
) -> tuple[tuple[str, ...], ...]:
    """The agent's groups of GPU indices as groups of their UUIDs (a GPU without one left
    out)."""
    return tuple(
        tuple(gpu_uuids[i] for i in group if 0 <= i < len(gpu_uuids) and gpu_uuids[i])
        for group in gpu_groups
    )
