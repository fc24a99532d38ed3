"""Bin-packing: GPU pods go to the GPU nodes that are fullest after placing them, so that
whole nodes stay free for large pods. The default allocation objective."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from extender.config import GpuScoring, PolicyConfig
from extender.scoring.scorer import Candidates, FloatArray, Scorer, for_gpu_pods

__all__ = ["SCORER", "allocation_weight", "used_after"]


def used_after(nodes: Candidates) -> FloatArray:
    """The share of each node's GPUs in use once the pod has its own (0 on GPU-less nodes);
    DRA's GPUs where DRA gives the pod its GPUs (:meth:`Candidates.gpus`)."""
    total, free, _, asked = nodes.gpus()
    with np.errstate(divide="ignore", invalid="ignore"):
        used = np.where(total > 0, (total - free + asked) / total, 0.0)
    return np.clip(used, 0.0, 1.0)


def allocation_weight(objective: GpuScoring) -> Callable[[PolicyConfig], int]:
    """``allocation_weight`` for the allocation objective ``gpu_scoring`` names, else 0."""
    return lambda config: config.allocation_weight if config.gpu_scoring is objective else 0


SCORER = Scorer(
    name="binpack",
    default_weight=allocation_weight(GpuScoring.BINPACK),
    applies=for_gpu_pods,
    score=used_after,
)
