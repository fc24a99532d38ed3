"""CPU-only preference: pods that need no GPU prefer nodes without GPUs, so that GPU nodes stay
free for GPU work. By default it weighs as much as the GPU objectives together (allocation and
topology), so that a CPU pod's score spans 0..10 like a GPU pod's."""

from __future__ import annotations

import numpy as np

from extender.kinds import asked
from extender.scoring.scorer import Candidates, FloatArray, Scorer

__all__ = ["SCORER"]


def _score(nodes: Candidates) -> FloatArray:
    gpus = nodes.column("gpu_total") + nodes.column("gpu_mig")  # MIG GPUs are GPUs too
    rating: FloatArray = np.equal(gpus, 0).astype(np.float64)
    return rating


SCORER = Scorer(
    name="cpu_only",
    default_weight=lambda config: config.allocation_weight + config.topology_weight,
    # no kind of GPU at all, nor GPUs through DRA's claims
    applies=lambda nodes: not asked(nodes.request) and not nodes.request.dra_gpus,
    score=_score,
)
