"""Live use: GPU pods go where the node agent saw the free GPUs idle (low utilisation, little
memory used by processes outside schedext's books, such as a node's own daemons or pods of
another scheduler).

Off by default (weight 0): most clusters' free GPUs are idle, and a sample is seconds old by
the time it is read. Turn it on with ``policy.weights.live_use``. A node without a fresh
sample (no agent, or older than ``policy.live_use_stale_s``) rates 0.5, between an idle and a
busy one, so that a silent agent neither attracts nor repels pods.
"""

from __future__ import annotations

import numpy as np

from extender.scoring.scorer import Candidates, FloatArray, Scorer, for_gpu_pods

__all__ = ["SCORER", "idle"]

UNKNOWN = 0.5


def idle(nodes: Candidates) -> FloatArray:
    """1 where the free GPUs were idle and empty, 0 where fully busy and full."""
    busy = (nodes.column("use_util") + nodes.column("use_memory")) / 200.0
    rating: FloatArray = np.where(nodes.column("use_fresh") == 1, 1.0 - busy, UNKNOWN)
    return rating


SCORER = Scorer(
    name="live_use",
    default_weight=lambda _config: 0,
    applies=for_gpu_pods,
    score=idle,
)
