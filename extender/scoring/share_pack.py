"""GPU shares packed: a share goes onto the fullest device that has room for it, so that
whole devices stay free for whole-GPU pods (anti-fragmentation). The default share objective
(``policy.share_placement: pack``; ``share_weight`` goes to it). A node is rated by the
devices bind would give the share there (:func:`extender.shares.pick_share_gpus` makes the
same choice)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from extender.config import PolicyConfig, SharePlacement
from extender.inventory import IntArray
from extender.scoring.scorer import Candidates, FloatArray, Scorer
from extender.shares import count_per_row, room_counts, shared_devices, used_after

__all__ = ["SCORER", "for_share_pods", "share_rating", "share_weight"]


def for_share_pods(nodes: Candidates) -> bool:
    """``applies`` of the share objectives."""
    return nodes.request.share.devices > 0


def share_rating(nodes: Candidates, placement: SharePlacement) -> FloatArray:
    """0..1 per node, from the devices bind would pick there (0 where fewer than ``shares``
    devices have room).

    ``pack``: a device that already holds shares rates 0.5 to 1, by how full it gets; an empty
    one at most 0.45, by how few whole devices the node keeps free once it is opened. So a
    share goes onto a shared device wherever one has room, and opens a device, when it must,
    on the node with the fewest free whole devices: scores are whole numbers 0..10, so the
    two kinds of choice are kept far apart. ``spread``: 1 less how full the device gets."""
    if nodes.request.share.devices == 1:
        return _one_device(nodes, placement)
    return _every_device(nodes, placement)


def _every_device(nodes: Candidates, placement: SharePlacement) -> FloatArray:
    """:func:`share_rating` by rating every device and sorting the ratings per node."""
    request = nodes.request
    memory_free = nodes.inventory.devices.memory_free.take(nodes.ids, axis=0)
    counts = room_counts(nodes.inventory, request)
    fits = counts.fits.take(nodes.ids, axis=0)
    used = used_after(memory_free, nodes.column("gpu_memory_mib"), request)
    if placement is SharePlacement.PACK:
        shared = shared_devices(nodes.inventory).take(nodes.ids, axis=0)
        device = np.where(shared, 0.5 + 0.5 * used, 0.45 * _opened(nodes).reshape(-1, 1))
    else:
        device = 1.0 - used
    rated = np.where(fits, device, -np.inf)
    ordered = -np.sort(-rated, axis=1)
    chosen = ordered[:, : request.share.devices]
    room = np.isfinite(chosen).all(axis=1) & (chosen.shape[1] == request.share.devices)
    mean = np.where(np.isfinite(chosen), chosen, 0.0).mean(axis=1) if chosen.size else 0.0
    rating: FloatArray = np.where(room, np.clip(mean, 0.0, 1.0), 0.0)
    return rating


def _opened(nodes: Candidates) -> FloatArray:
    """Per node, the share of its GPUs no longer free once one more device is opened."""
    total = np.maximum(nodes.column("gpu_total"), 1)
    opened: FloatArray = (total - nodes.column("gpu_free") + 1) / total
    return opened


def _one_device(nodes: Candidates, placement: SharePlacement) -> FloatArray:
    """:func:`share_rating` for a share of one GPU (the common case), without rating every
    device as :func:`_every_device` does. A device's rating only grows with how full it gets
    (``pack``, among the shared devices; every unshared one rates the same) or how empty it
    stays (``spread``), and each operation that makes it (an integer numerator, a division,
    a product by 0.5, a sum or a difference) rounds monotonically: so the best device is the
    shared one with room that has the least memory free, or any unshared one with room
    (``pack``), or the one with room that has the most memory free (``spread``), and only
    its rating is computed, with the same operations: the same number as
    :func:`_every_device`'s.

    Only branch-free operations touch the devices: with node orders that change from call
    to call, ``np.where`` over a 2-D mask mispredicts its branches (48 µs for 1,700 nodes
    of 8 devices, against 6 µs for a product)."""
    request, ids = nodes.request, nodes.ids
    memory_free = nodes.inventory.devices.memory_free.take(ids, axis=0)
    counts = room_counts(nodes.inventory, request)
    fits = counts.fits.take(ids, axis=0)
    capacity = np.maximum(nodes.column("gpu_memory_mib"), 1)  # as used_after has it
    mib = request.share.memory_mib
    if placement is SharePlacement.PACK:
        shared = shared_devices(nodes.inventory).take(ids, axis=0)
        # A device without room is pushed _FAR above every device with room.
        nearest = _row_min(memory_free + np.multiply(~(fits & shared), _FAR))
        on_shared = np.clip(0.5 + 0.5 * ((capacity - nearest + mib) / capacity), 0.0, 1.0)
        on_unshared = np.clip(0.45 * _opened(nodes), 0.0, 1.0)
        # clip(max(a, b)) = max(clip(a), clip(b)), and clip gives 0 where _every_device has
        # -inf (no device): so a missing kind of device counts as 0.
        rating: FloatArray = np.maximum(
            on_shared * (nearest < _FAR // 2), on_unshared * (count_per_row(fits & ~shared) > 0)
        )
        return rating
    widest = _row_max(memory_free - np.multiply(~fits, _FAR))
    emptiest: FloatArray = np.clip(1.0 - (capacity - widest + mib) / capacity, 0.0, 1.0)
    return emptiest * (widest > -_FAR // 2)


# Far above (or below) any device's free memory (MiB), and far from overflowing int64.
_FAR = np.int64(1 << 62)


def _row_min(values: IntArray) -> IntArray:
    """The smallest value of each row (_FAR where there are none): one ufunc per column, for
    numpy reduces a 2-D array along its short rows one row at a time (``min(axis=1)``: 45
    µs over 1,700 rows of 8 devices, against 8)."""
    smallest = np.full(len(values), _FAR, dtype=np.int64)
    for column in range(values.shape[1]):
        np.minimum(smallest, values[:, column], out=smallest)
    return smallest


def _row_max(values: IntArray) -> IntArray:
    """The largest value of each row (-_FAR where there are none; see :func:`_row_min`)."""
    largest = np.full(len(values), -_FAR, dtype=np.int64)
    for column in range(values.shape[1]):
        np.maximum(largest, values[:, column], out=largest)
    return largest


def share_weight(placement: SharePlacement) -> Callable[[PolicyConfig], int]:
    """``share_weight`` for the share objective ``share_placement`` names, else 0."""
    return lambda config: config.share_weight if config.share_placement is placement else 0


SCORER = Scorer(
    name="share_pack",
    default_weight=share_weight(SharePlacement.PACK),
    applies=for_share_pods,
    score=lambda nodes: share_rating(nodes, SharePlacement.PACK),
)
