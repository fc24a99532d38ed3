"""The inventory's per-node columns: listed once, in :class:`NodeArrays`.

Per-node numbers live in numpy arrays indexed by a slot id, so that a filter over 5,000 node
names is a handful of vectorised operations instead of 5,000 Python objects. Slot 0 is a
sentinel that is never alive: unknown node names map to it and fail as "unknown node".

Adding a column is one field of :class:`NodeArrays` (and, when an empty slot is not 0 or its
type is not an integer, one entry below), and one line where the inventory writes a node's row
(``Inventory._sync``).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import numpy.typing as npt

__all__ = ["NO_TOPOLOGY", "BoolArray", "Columns", "IdArray", "IntArray", "NodeArrays"]

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]
IdArray = npt.NDArray[np.int32]

NO_TOPOLOGY = -1


class NodeArrays(NamedTuple):
    """Per-slot columns (index with ids from ``Inventory.ids``); read-only as handed out."""

    alive: BoolArray
    gpu_total: IntArray
    # GPUs the node agent has not marked unhealthy (never handed out; see NodeState.free_ids).
    gpu_healthy: IntArray
    gpu_free: IntArray
    # Most free GPUs inside one NVLink/NUMA group; NO_TOPOLOGY when the node publishes none.
    max_group_free: IntArray
    cpu_alloc: IntArray
    cpu_free: IntArray
    memory_alloc: IntArray
    memory_free: IntArray
    model: IntArray
    gpu_memory_mib: IntArray
    # Interned values of the rack and zone labels (0: the node has none).
    rack: IntArray
    zone: IntArray
    # The node agent's live use of the node's free GPUs (means, percent), the sample's time
    # (Unix seconds, 0: none) and whether it is fresh (1) or stale or absent (0).
    use_util: IntArray
    use_memory: IntArray
    use_at: IntArray
    use_fresh: IntArray


# The columns whose type is not int64, and those whose empty slot is not 0.
_DTYPES: dict[str, type[np.generic]] = {"alive": np.bool_}
_EMPTY: dict[str, int] = {"max_group_free": NO_TOPOLOGY}


class Columns:
    """Growable storage for :class:`NodeArrays`, one row per slot; :attr:`arrays` are
    writable (the inventory's own), :meth:`read_only` views are what it hands out."""

    def __init__(self, capacity: int) -> None:
        self.size = 1  # slot 0: the never-alive sentinel
        self.arrays = NodeArrays._make(
            np.full(capacity, _EMPTY.get(name, 0), dtype=_DTYPES.get(name, np.int64))
            for name in NodeArrays._fields
        )

    def append(self) -> int:
        """A new slot at the end, growing every column when full."""
        if self.size == len(self.arrays.alive):
            self.arrays = NodeArrays._make(
                np.concatenate([old, np.full(len(old), _EMPTY.get(name, 0), dtype=old.dtype)])
                for name, old in zip(NodeArrays._fields, self.arrays, strict=True)
            )
        self.size += 1
        return self.size - 1

    def clear(self, slot: int) -> None:
        for name, column in zip(NodeArrays._fields, self.arrays, strict=True):
            column[slot] = _EMPTY.get(name, 0)

    def read_only(self) -> NodeArrays:
        views = []
        for column in self.arrays:
            view = column[: self.size].view()
            view.flags.writeable = False
            views.append(view)
        return NodeArrays._make(views)
