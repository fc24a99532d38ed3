"""Writing one node's derived rows: the device grid and share totals, the live-use
columns, and the DRA columns. The inventory calls these from ``_sync`` whenever a node's
state changes."""

from __future__ import annotations

from extender.columns import (
    DRA_MIXED,
    DRA_NONE,
    DRA_OWNED,
    NO_ROOM,
    NO_TOPOLOGY,
    Columns,
    NodeArrays,
)
from extender.dra import DraGpus, Ownership
from extender.node_state import NodeState

__all__ = ["write_devices", "write_dra", "write_use"]


def write_devices(columns: Columns, state: NodeState, free: list[int]) -> None:
    """The node's row of the device grid (the room a share has on each GPU), and its share
    totals."""
    slot, cols = state.slot, columns.arrays
    columns.fit_width(len(state.holders))
    grid = columns.devices
    grid.memory_free[slot] = grid.cores_free[slot] = NO_ROOM
    grid.sharers[slot] = 0
    for index, (memory, cores) in enumerate(state.share_room(free)):
        grid.memory_free[slot, index] = memory
        grid.cores_free[slot, index] = cores
        grid.sharers[slot, index] = state.sharers[index]
    cols.share_devices[slot] = sum(1 for n in state.sharers if n)
    cols.share_memory_held[slot] = sum(state.share_memory)


def write_use(cols: NodeArrays, state: NodeState, free: list[int], *, fresh_after: float) -> None:
    """The live-use columns: the means over the GPUs a pod would get (the free ones) of the
    agent's last sample, when there is one; fresh when stamped at or after ``fresh_after``."""
    spec, slot = state.spec, state.slot
    sample = spec.gpu_use
    by_index = {u.index: u for u in sample.gpus} if sample is not None else {}
    rows = [by_index[i] for i in free if i in by_index]
    if sample is None or not rows:
        cols.use_util[slot] = cols.use_memory[slot] = cols.use_at[slot] = 0
        cols.use_fresh[slot] = 0
        return
    memory = spec.gpu_memory_mib or 0
    cols.use_util[slot] = round(sum(u.utilisation for u in rows) / len(rows))
    cols.use_memory[slot] = (
        min(100, round(100 * sum(u.memory_used_mib for u in rows) / (memory * len(rows))))
        if memory
        else 0
    )
    cols.use_at[slot] = int(sample.at)
    cols.use_fresh[slot] = int(sample.at >= fresh_after)


def write_dra(cols: NodeArrays, slot: int, dra: DraGpus | None) -> None:
    """The node's DRA columns (see :class:`~extender.columns.NodeArrays`)."""
    if dra is None:
        cols.dra_owner[slot], cols.dra_total[slot], cols.dra_free[slot] = DRA_NONE, 0, 0
        cols.dra_group_free[slot] = NO_TOPOLOGY
        return
    cols.dra_owner[slot] = DRA_MIXED if dra.owner is Ownership.MIXED else DRA_OWNED
    cols.dra_total[slot], cols.dra_free[slot] = dra.total, dra.free
    cols.dra_group_free[slot] = dra.group_free
