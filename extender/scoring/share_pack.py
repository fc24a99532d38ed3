"""GPU shares packed: a share goes onto the fullest device that has room for it, so that
whole devices stay free for whole-GPU pods (anti-fragmentation). The default share objective
(``policy.share_placement: pack``; ``share_weight`` goes to it). A node is rated by the
devices bind would give the share there (:func:`extender.shares.pick_share_gpus` makes the
same choice)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from extender.config import PolicyConfig, SharePlacement
from extender.scoring.scorer import Candidates, FloatArray, Scorer
from extender.shares import fitting, used_after

__all__ = ["SCORER", "for_share_pods", "share_rating", "share_weight"]


def for_share_pods(nodes: Candidates) -> bool:
    """``applies`` of the share objectives."""
    return nodes.request.shares > 0


def share_rating(nodes: Candidates, placement: SharePlacement) -> FloatArray:
    """0..1 per node, from the devices bind would pick there (0 where fewer than ``shares``
    devices have room).

    ``pack``: a device that already holds shares rates 0.5 to 1, by how full it gets; an empty
    one at most 0.45, by how few whole devices the node keeps free once it is opened. So a
    share goes onto a shared device wherever one has room, and opens a device, when it must,
    on the node with the fewest free whole devices: scores are whole numbers 0..10, so the
    two kinds of choice are kept far apart. ``spread``: 1 less how full the device gets."""
    request = nodes.request
    grid = nodes.inventory.devices
    memory_free = grid.memory_free.take(nodes.ids, axis=0)
    _, fits = fitting(memory_free, grid.cores_free.take(nodes.ids, axis=0), request)
    used = used_after(memory_free, nodes.column("gpu_memory_mib"), request)
    pack = placement is SharePlacement.PACK
    if pack:
        total = np.maximum(nodes.column("gpu_total"), 1)
        opened = (total - nodes.column("gpu_free") + 1) / total
        shared = grid.sharers.take(nodes.ids, axis=0) > 0
        device = np.where(shared, 0.5 + 0.5 * used, 0.45 * opened.reshape(-1, 1))
        rated = np.where(fits, device, -np.inf)
        ordered = -np.sort(-rated, axis=1)
    else:
        rated = np.where(fits, 1.0 - used, -np.inf)
        ordered = -np.sort(-rated, axis=1)
    chosen = ordered[:, : request.shares]
    room = np.isfinite(chosen).all(axis=1) & (chosen.shape[1] == request.shares)
    mean = np.where(np.isfinite(chosen), chosen, 0.0).mean(axis=1) if chosen.size else 0.0
    rating: FloatArray = np.where(room, np.clip(mean, 0.0, 1.0), 0.0)
    return rating


def share_weight(placement: SharePlacement) -> Callable[[PolicyConfig], int]:
    """``share_weight`` for the share objective ``share_placement`` names, else 0."""
    return lambda config: config.share_weight if config.share_placement is placement else 0


SCORER = Scorer(
    name="share_pack",
    default_weight=share_weight(SharePlacement.PACK),
    applies=for_share_pods,
    score=lambda nodes: share_rating(nodes, SharePlacement.PACK),
)
