"""The held DRA devices of a node as schedext's GPU indices, matched by UUID.

schedext names a node's GPUs by NVML index; the node agent publishes each index's UUID
(``NodeSpec.gpu_uuids``, from its topology document). A DRA device carries its GPU's UUID
as the ``uuid`` attribute, and a MIG device its GPU's as ``parentUUID``: so a held device
maps to the index of its UUID, or of its parent's (``via_parent``: the GPU is partly held).
What cannot be mapped is reported apart, with why, never dropped: a device unknown to the
slices, one with no UUID, or one whose UUID the agent does not list (or no agent).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from extender.dra.node_view import HeldDevice, NodeDra

__all__ = ["GpuMapping", "HeldGpu", "Unmapped", "held_gpus"]


class HeldGpu(NamedTuple):
    gpu: int  # the GPU's index
    held: HeldDevice
    via_parent: bool = False  # a MIG device on GPU ``gpu``, not the GPU itself


class Unmapped(NamedTuple):
    held: HeldDevice
    why: str


class GpuMapping(NamedTuple):
    mapped: tuple[HeldGpu, ...]  # by index, then device
    unmapped: tuple[Unmapped, ...]  # in the node summary's order

    @property
    def indices(self) -> tuple[int, ...]:
        """The GPU indices something holds, each once, sorted."""
        return tuple(sorted({held.gpu for held in self.mapped}))


def held_gpus(node: NodeDra, gpu_uuids: Sequence[str]) -> GpuMapping:
    """Map ``node``'s held devices to indices in ``gpu_uuids`` (the node agent's UUID of
    each GPU index)."""
    index = {uuid: i for i, uuid in enumerate(gpu_uuids) if uuid}
    mapped: list[HeldGpu] = []
    unmapped: list[Unmapped] = []
    for held in node.held:
        if held.unknown:
            unmapped.append(Unmapped(held, held.unknown))
        elif held.uuid in index:
            mapped.append(HeldGpu(index[held.uuid], held))
        elif held.parent_uuid in index:
            mapped.append(HeldGpu(index[held.parent_uuid], held, via_parent=True))
        elif not index:
            unmapped.append(Unmapped(held, "the node agent publishes no GPU UUIDs"))
        else:
            uuid = held.parent_uuid or held.uuid
            unmapped.append(Unmapped(held, f"UUID {uuid} is none of the node agent's GPUs"))
    mapped.sort(key=lambda gpu: (gpu.gpu, gpu.held.ref))
    return GpuMapping(tuple(mapped), tuple(unmapped))
