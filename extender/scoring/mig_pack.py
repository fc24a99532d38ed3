"""MIG devices packed: a pod's MIG devices go where they land on GPUs that already have MIG
devices in use, so that idle GPUs stay idle (for pods that need several MIG devices of one
GPU, and for power). A node is rated by the share of the pod's MIG devices that bind would
put on such a GPU there (:func:`extender.mig.choose_mig` makes the same choice), read from
the inventory's per-profile columns."""

from __future__ import annotations

import numpy as np

from extender.scoring.scorer import Candidates, FloatArray, Scorer

__all__ = ["SCORER"]


def packed(nodes: Candidates) -> FloatArray:
    """0..1 per node: of the pod's MIG devices, the share that can go onto a busy GPU."""
    onto_busy = np.zeros(len(nodes.ids), dtype=np.float64)
    total = 0
    for profile, count in nodes.request.mig:
        free_on_busy = nodes.inventory.mig_arrays(profile).free_on_busy[nodes.ids]
        onto_busy += np.minimum(free_on_busy, count)
        total += count
    rating: FloatArray = onto_busy / max(total, 1)
    return rating


SCORER = Scorer(
    name="mig_pack",
    # As much as the whole-GPU allocation objective: the one MIG objective for MIG pods.
    default_weight=lambda config: config.allocation_weight,
    applies=lambda nodes: bool(nodes.request.mig),
    score=packed,
)
