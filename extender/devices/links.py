"""Which of a node's GPUs belong together: NVLink groups folded from each GPU's peers, or
NUMA groups where a node has no NVLink at all.

The agent publishes only the groups (``schedext.io/gpu-topology``); the filter keeps a pod's
GPUs inside one group where it can, and treats a GPU outside every group as a group of one.
So a group of one says nothing and is never published.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from extender.devices.gpus import Gpu

__all__ = ["nvlink_groups", "pci_key"]

GpuGroups = tuple[tuple[int, ...], ...]


def pci_key(bus_id: str) -> str:
    """One spelling per PCI function: NVML writes the domain with 8 hex digits in ``busId``
    and with 4 in ``busIdLegacy`` and in some remote-link answers, in either case; a peer
    named one way must still match a GPU named the other."""
    text = bus_id.strip().lower()
    domain, colon, rest = text.partition(":")
    if not colon:
        return text
    try:
        return f"{int(domain, 16):08x}:{rest}"
    except ValueError:
        return text


def nvlink_groups(gpus: Sequence[Gpu]) -> GpuGroups:
    """Connected components of the NVLink graph, as sorted GPU indices, groups of 2+ only,
    sorted. Peers that name no GPU of this node are ignored (an NVSwitch the agent could not
    resolve, a GPU NVML did not list). With no NVLink at all, GPUs sharing a NUMA node
    group instead, but only when every GPU's NUMA node is known and there are two or more:
    one NUMA node, or some unknown, says nothing about locality."""
    by_bus = {pci_key(gpu.pci_bus_id): gpu.index for gpu in gpus if gpu.pci_bus_id}
    parent = {gpu.index: gpu.index for gpu in gpus}

    def root(index: int) -> int:
        while parent[index] != index:
            parent[index] = parent[parent[index]]  # path halving keeps the trees flat
            index = parent[index]
        return index

    linked = False
    for gpu in gpus:
        for peer in gpu.nvlink_peers:
            other = by_bus.get(pci_key(peer))
            if other is None or other == gpu.index:
                continue
            linked = True
            parent[root(gpu.index)] = root(other)
    if linked:
        components: dict[int, list[int]] = {}
        for index in parent:
            components.setdefault(root(index), []).append(index)
        return _sorted_groups(components.values())
    numa = [gpu.numa_node for gpu in gpus]
    if not gpus or any(node is None for node in numa) or len(set(numa)) < 2:
        return ()
    by_node: dict[int | None, list[int]] = {}
    for gpu in gpus:
        by_node.setdefault(gpu.numa_node, []).append(gpu.index)
    return _sorted_groups(by_node.values())


def _sorted_groups(groups: Iterable[list[int]]) -> GpuGroups:
    return tuple(sorted(tuple(sorted(g)) for g in groups if len(g) >= 2))
