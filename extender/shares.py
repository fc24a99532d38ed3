"""GPU shares: which devices have room for a share, which to give it, and why none fits.

A share is some memory (MiB) and optionally some compute (percent of the SMs) on each of
``shares`` distinct GPUs of one node. A device takes shares while no pod holds it whole; once
it holds one, it is no longer free for a whole-GPU pod (:meth:`NodeState.free_ids`). The sum
of the shares on a device never exceeds its memory or 100% of its cores: the filter counts
only devices with room (:func:`fitting`), bind reserves on devices that still have it
(``Inventory.reserve``), and preemption frees room on one device (:func:`room_after`).

Where a share goes is :class:`SharePlacement`: ``pack`` puts it on the fullest device with
room, so that whole devices stay free for whole-GPU pods; ``spread`` on the emptiest, for
workloads that suffer from neighbours. A share of several GPUs stays inside one NVLink group
when one has room.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from extender.config import SharePlacement
from extender.inventory import Inventory
from extender.model import Demand, Holding
from extender.node_state import NodeView

__all__ = [
    "RoomCounts",
    "choose_share_gpus",
    "count_per_row",
    "fitting",
    "pick_share_gpus",
    "room_after",
    "room_counts",
    "share_detail",
    "shared_devices",
    "used_after",
]

Room = Sequence[tuple[int, int]]  # per GPU index: (MiB free, cores free); negative: none


def fitting(
    memory_free: npt.NDArray[np.int64], cores_free: npt.NDArray[np.int64], demand: Demand
) -> tuple[npt.NDArray[np.bool_], npt.NDArray[np.bool_]]:
    """Per row of the device grid, per device: whether the share's memory fits, and whether
    its memory and its cores both fit."""
    memory_fits = memory_free >= demand.share.memory_mib
    if not demand.share.cores:
        return memory_fits, memory_fits
    return memory_fits, memory_fits & (cores_free >= demand.share.cores)


class RoomCounts(NamedTuple):
    """Per slot of the inventory, how many devices have room for a share, and which
    (read-only)."""

    memory: npt.NDArray[np.int64]  # for its memory
    both: npt.NDArray[np.int64]  # for its memory and its cores (``memory`` if it asks none)
    fits: npt.NDArray[np.bool_]  # per slot and GPU index: room for both (what ``both`` counts)


def room_counts(inventory: Inventory, demand: Demand) -> RoomCounts:
    """:class:`RoomCounts` for ``demand``'s share, kept until the inventory changes: filter
    computes it for the whole cluster, and prioritize of the same pod reads it again."""
    key = ("share room", demand.share.memory_mib, demand.share.cores)
    return inventory.held_derived(key, lambda: _count_room(inventory, demand))


def _count_room(inventory: Inventory, demand: Demand) -> RoomCounts:
    grid = inventory.devices
    memory, both = fitting(grid.memory_free, grid.cores_free, demand)
    memory_count = count_per_row(memory)
    both_count = count_per_row(both) if both is not memory else memory_count
    for array in (memory_count, both_count, both):
        array.flags.writeable = False
    return RoomCounts(memory_count, both_count, both)


def shared_devices(inventory: Inventory) -> npt.NDArray[np.bool_]:
    """Per slot and GPU index, whether some pod holds a share of it (read-only), kept until
    the inventory changes."""

    def compute() -> npt.NDArray[np.bool_]:
        shared = inventory.devices.sharers > 0
        shared.flags.writeable = False
        return shared

    return inventory.held_derived("shared devices", compute)


_BYTE_SUM = np.uint64(0x0101010101010101)


def count_per_row(mask: npt.NDArray[np.bool_]) -> npt.NDArray[np.int64]:
    """Per row of a 2-D mask, how many are true: ``np.count_nonzero(mask, axis=1)``, which
    numpy reduces one short row at a time (70 µs over 5,000 rows of 8 GPUs). Here eight at
    a time: eight bools read as one uint64 and multiplied by 0x0101010101010101 leave their
    sum in the top byte (each partial sum is at most 8, so nothing carries), whatever the
    byte order."""
    rows, width = mask.shape
    words = -(-width // 8)
    if width != 8 * words or not mask.flags.c_contiguous:
        padded = np.zeros((rows, 8 * words), dtype=np.bool_)
        padded[:, :width] = mask
        mask = padded
    packed = mask.view(np.uint64)
    counts = np.zeros(rows, dtype=np.uint64)
    for word in range(words):
        counts += np.right_shift(np.multiply(packed[:, word], _BYTE_SUM), np.uint64(56))
    return counts.view(np.int64)


def used_after(
    memory_free: npt.NDArray[np.int64],
    capacity: npt.NDArray[np.int64],
    demand: Demand,
) -> npt.NDArray[np.float64]:
    """Per device, the share of its memory in use once the share is on it (the pack rating;
    capacity per row)."""
    cap = np.maximum(capacity, 1).reshape(-1, 1) if capacity.ndim == 1 else capacity
    return np.asarray((cap - memory_free + demand.share.memory_mib) / cap, dtype=np.float64)


def choose_share_gpus(
    view: NodeView, demand: Demand, placement: SharePlacement
) -> tuple[int, ...] | None:
    """The GPU indices a share goes on (see the module docstring); None when fewer than
    ``demand.shares`` devices have room."""
    capacity = view.spec.gpu_memory_mib or 0
    return pick_share_gpus(view.share_room, capacity, view.spec.gpu_groups, demand, placement)


def pick_share_gpus(
    room: Room,
    capacity: int,
    groups: Sequence[Sequence[int]],
    demand: Demand,
    placement: SharePlacement,
) -> tuple[int, ...] | None:
    """:func:`choose_share_gpus` over plain values (what preemption and gang packing use)."""
    fits = [
        i
        for i, (memory, cores) in enumerate(room)
        # Cores only when asked: as the filter's fitting() judges it.
        if memory >= demand.share.memory_mib
        and (not demand.share.cores or cores >= demand.share.cores)
    ]
    if len(fits) < demand.share.devices:
        return None

    def rank(index: int) -> tuple[float, int]:
        used = (capacity - room[index][0]) / capacity if capacity else 0.0
        return (-used if placement is SharePlacement.PACK else used, index)

    ordered = sorted(fits, key=rank)
    if demand.share.devices > 1:
        # Inside one NVLink group when one has room: the best group by its own best devices.
        best: tuple[list[tuple[float, int]], list[int]] | None = None
        for group in groups:
            inside = [i for i in ordered if i in set(group)][: demand.share.devices]
            if len(inside) == demand.share.devices:
                key = [rank(i) for i in inside]
                if best is None or key < best[0]:
                    best = (key, inside)
        if best is not None:
            return tuple(sorted(best[1]))
    return tuple(sorted(ordered[: demand.share.devices]))


def room_after(view: NodeView, victims: Sequence[Holding]) -> list[tuple[int, int]]:
    """Per GPU index, the room for a share once ``victims`` are evicted: their shares leave
    their devices, and the devices they held whole become empty. A device still held whole
    (by name or, on the highest free indices, anonymously) or unhealthy has none."""
    gone = {victim.uid for victim in victims}
    memory, cores = list(view.share_memory), list(view.share_cores)
    for victim in victims:
        if victim.share.devices:
            for index in victim.gpu_ids or ():
                if 0 <= index < len(memory):
                    memory[index] -= victim.share.memory_mib
                    cores[index] -= victim.share.cores
    unhealthy = {index for index, _ in view.spec.gpu_unhealthy} | set(view.spec.gpu_mig)
    unhealthy.update(view.outside())
    anonymous = view.anonymous_gpus - sum(
        v.devices for v in victims if v.gpu_ids is None and v.uid not in view.holders
    )
    usable = [
        i
        for i, holder in enumerate(view.holders)
        if (holder is None or holder in gone) and i not in unhealthy
    ]
    unshared = [i for i in usable if memory[i] <= 0]
    blocked = set(unshared[max(0, len(unshared) - anonymous) :]) if anonymous > 0 else set()
    capacity = view.spec.gpu_memory_mib or 0
    return [
        (capacity - memory[i], 100 - cores[i]) if i in usable and i not in blocked else (-1, -1)
        for i in range(len(view.holders))
    ]


def share_detail(view: NodeView, demand: Demand) -> str:
    """Why a share does not fit on this node, device by device: "no GPU with 20000 MiB free:
    largest free 12000 MiB on GPU 3" (for explain and bind; the filter's grouped message
    names the need only, so that kube-scheduler can aggregate it)."""
    open_room = [(m, c, i) for i, (m, c) in enumerate(view.share_room) if m >= 0]
    need = f"{demand.share.memory_mib} MiB"
    if demand.share.cores:
        need += f" and {demand.share.cores}% of the cores"
    many = f"fewer than {demand.share.devices} GPUs" if demand.share.devices > 1 else "no GPU"
    if not open_room:
        return f"{many} with {need} free: every GPU is held whole or unhealthy"
    memory, _, index = max(open_room, key=lambda r: (r[0], -r[2]))
    detail = f"largest free {memory} MiB on GPU {index}"
    if demand.share.cores:
        cores, _, at = max(((c, m, i) for m, c, i in open_room), key=lambda r: (r[0], -r[2]))
        detail += f", most cores free {cores}% on GPU {at}"
    return f"{many} with {need} free: {detail}"
