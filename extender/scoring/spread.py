"""Spread: GPU pods go to the least-allocated GPU nodes (``gpu_scoring: spread``), to even out
heat and failures rather than keep whole nodes free."""

from __future__ import annotations

import numpy as np

from extender.config import GpuScoring
from extender.scoring.binpack import allocation_weight, used_after
from extender.scoring.scorer import Candidates, FloatArray, Scorer, for_gpu_pods

__all__ = ["SCORER"]


def _score(nodes: Candidates) -> FloatArray:
    return np.where(nodes.gpus().total > 0, 1.0 - used_after(nodes), 0.0)


SCORER = Scorer(
    name="spread",
    default_weight=allocation_weight(GpuScoring.SPREAD),
    applies=for_gpu_pods,
    score=_score,
)
