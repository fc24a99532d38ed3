"""Gang members that take GPU shares: a placement of all of them at once over the device grid,
found greedily (:func:`place_shares`), and what it leaves of the whole GPUs for the rest of
the group.

A share member takes ``shares`` distinct devices of one node, each with its memory and cores
free. A device either already holds shares (its room is the grid's) or is free whole (its room
is all of it): opening a free one takes a whole GPU from the group's whole-GPU members, so
the placement is returned as the whole GPUs it opens per node, for the exact whole-GPU search
to subtract (:mod:`extender.gang.packing`).

The greedy, first-fit decreasing: the members with the fewest eligible nodes first (the
others can go elsewhere), then those on the most devices, then the largest (memory, then
cores). Each goes onto the eligible node where it opens the fewest free devices (room on
shared devices costs the whole-GPU members nothing), then where the fewest whole-GPU members
could go, then by the node's free whole GPUs (:class:`Opening`: the fewest first keeps large
nodes whole; the most first is the other guess, tried when the first fails), then the lowest
node id; on that node, onto the shared devices it fits most tightly, then onto free ones. It
may miss a placement that exists (per device this is bin packing); a placement it returns
always exists.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from enum import Enum

import numpy as np
import numpy.typing as npt

from extender.columns import NO_ROOM
from extender.inventory import Inventory
from extender.model import PodRequest

__all__ = ["Opening", "after_shares", "place_shares", "whole_demand"]


class Opening(Enum):
    """Which node a share opens free devices on, when several could take it."""

    FEWEST_FREE = "fewest-free"  # best fit: large nodes stay whole for whole-GPU members
    MOST_FREE = "most-free"  # keeps the small nodes whole instead


def place_shares(
    inventory: Inventory,
    members: Sequence[PodRequest],
    masks: Sequence[npt.NDArray[np.bool_]],
    kinds: Sequence[int],
    *,
    free: npt.NDArray[np.int64],
    wanted: npt.NDArray[np.int64],
    opening: Opening,
) -> npt.NDArray[np.int64] | None:
    """Per node id, how many of its ``free`` whole GPUs the share ``members`` open (each a
    member of eligibility class ``kinds[i]``, its nodes ``masks[kind]``), once all of them
    are placed; None when the greedy finds no room for one of them. ``wanted``: per node id,
    the whole GPUs of the group's whole-GPU members that may use it."""
    opened = np.zeros(len(free), dtype=np.int64)
    if not members:
        return opened
    a, grid = inventory.arrays, inventory.devices
    fresh_all = np.maximum(np.minimum(free, a.gpu_total), 0)
    shared_all = grid.sharers > 0
    smallest = min(m.share.memory_mib for m in members)
    eligible = np.zeros(len(free), dtype=np.bool_)
    for kind in set(kinds):
        eligible |= masks[kind]
    has_room = ((fresh_all > 0) & (a.gpu_memory_mib >= smallest)) | (
        shared_all & (grid.memory_free >= smallest)
    ).any(axis=1)
    rows = np.flatnonzero(eligible & a.alive & has_room)
    # The candidate nodes' shared devices (free devices are counted, all alike), and room for
    # the devices the members open: at most one column per share.
    extra = sum(m.share.devices for m in members)
    pad = np.full((len(rows), extra), NO_ROOM, dtype=np.int64)
    shared = shared_all[rows]
    memory = np.hstack([np.where(shared, grid.memory_free[rows], NO_ROOM), pad])
    cores = np.hstack([np.where(shared, grid.cores_free[rows], NO_ROOM), pad])
    width = shared.shape[1]
    fresh = fresh_all[rows]
    pressure = wanted[rows]
    capacity = a.gpu_memory_mib[rows]
    used = np.zeros(len(rows), dtype=np.int64)
    # The members with the fewest nodes to choose from first (the others can go elsewhere),
    # then the largest.
    choices = {kind: int(np.count_nonzero(masks[kind][rows])) for kind in set(kinds)}
    order = sorted(
        range(len(members)),
        key=lambda i: (
            choices[kinds[i]],
            -members[i].share.devices,
            -members[i].share.memory_mib,
            -members[i].share.cores,
            kinds[i],
        ),
    )
    for i in order:
        member = members[i]
        need, mib, pct = member.share.devices, member.share.memory_mib, member.share.cores
        fits = (memory >= mib) & (cores >= pct)
        on_shared = np.count_nonzero(fits, axis=1)
        on_fresh = np.where(capacity >= mib, fresh, 0)
        ok = masks[kinds[i]][rows] & (on_shared + on_fresh >= need)
        if not ok.any():
            return None
        opens = np.maximum(need - on_shared, 0)
        by_free = fresh if opening is Opening.FEWEST_FREE else -fresh
        candidates = np.flatnonzero(ok)
        keys = (by_free[candidates], pressure[candidates], opens[candidates])
        best = candidates[np.lexsort(keys)[0]]
        # The shared devices it fits most tightly, then as many free ones as still needed.
        columns = np.flatnonzero(fits[best])
        tightest = columns[np.argsort(memory[best, columns], kind="stable")][:need]
        memory[best, tightest] -= mib
        cores[best, tightest] -= pct
        for _ in range(need - len(tightest)):
            column = width + used[best]
            memory[best, column], cores[best, column] = capacity[best] - mib, 100 - pct
            used[best] += 1
            fresh[best] -= 1
    opened[rows] = used
    return opened


def after_shares(
    inventory: Inventory,
    members: Sequence[PodRequest],
    masks: Sequence[npt.NDArray[np.bool_]],
    kinds: Sequence[int],
    *,
    free: npt.NDArray[np.int64],
    wanted: npt.NDArray[np.int64],
) -> Iterator[npt.NDArray[np.int64]]:
    """The whole GPUs left per node once the share ``members`` are placed, for each guess of
    :func:`place_shares` that places them all (distinct ones only); ``free`` itself when
    there are none."""
    if not members:
        yield free
        return
    seen: list[npt.NDArray[np.int64]] = []
    for opening in Opening:
        opened = place_shares(
            inventory, members, masks, kinds, free=free, wanted=wanted, opening=opening
        )
        if opened is None or any(np.array_equal(opened, s) for s in seen):
            continue
        seen.append(opened)
        yield free - opened


def whole_demand(
    free: npt.NDArray[np.int64],
    masks: Sequence[npt.NDArray[np.bool_]],
    sizes: Sequence[int],
    kinds: Sequence[int],
) -> npt.NDArray[np.int64]:
    """Per node id, the whole GPUs of the members (``sizes``, of classes ``kinds``) that may
    use it: where opening a device for a share hurts the whole-GPU members most."""
    demand = np.zeros(len(free), dtype=np.int64)
    for size, kind in zip(sizes, kinds, strict=True):
        demand += masks[kind] * size
    return demand
