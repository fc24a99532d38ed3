"""The inventory's per-node columns: listed once, in :class:`NodeArrays`.

Per-node numbers live in numpy arrays indexed by a slot id, so that a filter over 5,000 node
names is a handful of vectorised operations instead of 5,000 Python objects. Slot 0 is a
sentinel that is never alive: unknown node names map to it and fail as "unknown node".

Adding a column is one field of :class:`NodeArrays` (and, when an empty slot is not 0 or its
type is not an integer, one entry below), and one line where the inventory writes a node's row
(``NodeSlots._sync``).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

__all__ = [
    "DRA_MIXED",
    "DRA_NONE",
    "DRA_OWNED",
    "NO_ROOM",
    "NO_TOPOLOGY",
    "BoolArray",
    "Columns",
    "DeviceArrays",
    "IdArray",
    "IntArray",
    "NodeArrays",
]

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]
IdArray = npt.NDArray[np.int32]

NO_TOPOLOGY = -1
DRA_NONE, DRA_OWNED, DRA_MIXED = 0, 1, 2  # the dra_owner column
NO_ROOM = -1  # a device that takes no share: absent, held whole, unhealthy


class NodeArrays(NamedTuple):
    """Per-slot columns (index with ids from ``Inventory.ids``); read-only as handed out."""

    alive: BoolArray
    gpu_total: IntArray
    # GPUs the node agent has not marked unhealthy (never handed out; see NodeState.free_ids).
    gpu_healthy: IntArray
    # GPUs in MIG mode (never free whole; their MIG devices are counted per profile apart,
    # in extender.mig_state.MigColumns).
    gpu_mig: IntArray
    gpu_free: IntArray
    # GPUs the node agent reports in use by containers schedext did not place, which no pod
    # schedext knows holds (NodeState.outside_ids): not free, and the reason why not.
    gpu_in_use: IntArray
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
    # GPU shares: the devices that have some, and the memory (MiB) they hold in all.
    share_devices: IntArray
    share_memory_held: IntArray
    # DRA (extender.dra.capacity): who owns the node's GPUs (DRA_NONE, DRA_OWNED, DRA_MIXED),
    # the whole GPUs a GPU driver advertises healthy, those no claim holds, and the most of
    # those in one NVLink group or PCIe root (NO_TOPOLOGY: unknown).
    dra_owner: IntArray
    dra_total: IntArray
    dra_free: IntArray
    dra_group_free: IntArray


class DeviceArrays(NamedTuple):
    """Per slot (rows) and GPU index (columns): the room a share has on each device. A row is
    as wide as the largest node's GPU count; NO_ROOM where a device takes no share (the node
    has no such index, a pod holds it whole, or it is unhealthy)."""

    memory_free: IntArray  # MiB
    cores_free: IntArray  # percent of the SMs
    sharers: IntArray  # how many pods hold a share of it


# The columns whose type is not int64, and those whose empty slot is not 0.
_DTYPES: dict[str, type[np.generic]] = {"alive": np.bool_}
_EMPTY: dict[str, int] = {"max_group_free": NO_TOPOLOGY, "dra_group_free": NO_TOPOLOGY}


class Columns:
    """Growable storage for :class:`NodeArrays`, one row per slot; :attr:`arrays` are
    writable (the inventory's own), :meth:`read_only` views are what it hands out."""

    def __init__(self, capacity: int) -> None:
        self.size = 1  # slot 0: the never-alive sentinel
        self.arrays = NodeArrays._make(
            np.full(capacity, _EMPTY.get(name, 0), dtype=_DTYPES.get(name, np.int64))
            for name in NodeArrays._fields
        )
        self.devices = _device_arrays(capacity, 0)
        # The read-only views, made once per allocation and size: a view shows every later
        # write to its column, so only growing (new arrays, another size) makes new ones.
        self._views: NodeArrays | None = None
        self._device_views: DeviceArrays | None = None

    def fit_width(self, gpus: int) -> None:
        """Make the device rows at least ``gpus`` wide (a node with more GPUs than any yet)."""
        rows, width = self.devices.sharers.shape
        if gpus > width:
            wider = _device_arrays(rows, gpus)
            for old, new in zip(self.devices, wider, strict=True):
                new[:, :width] = old
            self.devices = wider
            self._device_views = None

    def append(self) -> int:
        """A new slot at the end, growing every column when full."""
        if self.size == len(self.arrays.alive):
            self.arrays = NodeArrays._make(
                np.concatenate([old, np.full(len(old), _EMPTY.get(name, 0), dtype=old.dtype)])
                for name, old in zip(NodeArrays._fields, self.arrays, strict=True)
            )
            rows, width = self.devices.sharers.shape
            more = _device_arrays(rows, width)
            self.devices = DeviceArrays._make(
                np.concatenate([old, new]) for old, new in zip(self.devices, more, strict=True)
            )
        self.size += 1
        self._views = self._device_views = None
        return self.size - 1

    def clear(self, slot: int) -> None:
        for name, column in zip(NodeArrays._fields, self.arrays, strict=True):
            column[slot] = _EMPTY.get(name, 0)
        self.devices.memory_free[slot] = self.devices.cores_free[slot] = NO_ROOM
        self.devices.sharers[slot] = 0

    def read_only(self) -> NodeArrays:
        if self._views is None:
            size = self.size
            self._views = NodeArrays._make(_read_only(column[:size]) for column in self.arrays)
        return self._views

    def read_only_devices(self) -> DeviceArrays:
        if self._device_views is None:
            self._device_views = DeviceArrays._make(
                _read_only(grid[: self.size]) for grid in self.devices
            )
        return self._device_views


def _read_only(rows: npt.NDArray[Any]) -> npt.NDArray[Any]:
    view = rows.view()
    view.flags.writeable = False
    return view


def _device_arrays(rows: int, width: int) -> DeviceArrays:
    return DeviceArrays(
        memory_free=np.full((rows, width), NO_ROOM, dtype=np.int64),
        cores_free=np.full((rows, width), NO_ROOM, dtype=np.int64),
        sharers=np.zeros((rows, width), dtype=np.int64),
    )
