"""Prioritize: the scorers, one module per objective, summed with weights from settings.

Each scorer (:class:`Scorer`) says whether it applies to a pod and rates each candidate node
0..1. A node's score is ``rint(10 * sum(weight * rating) / sum(weight))`` over the scorers
that apply and weigh more than 0. A GPU pod scores 0 on a node that lacks the free GPUs now
(or, for a share, too few devices with room; for MIG, too few free MIG devices; prioritize
normally sees only filter's survivors, but such a node must never look attractive), and an
unknown node scores 0.

Adding an objective: a module here that defines ``SCORER``, and its line in :data:`SCORERS`.
Its weight is ``policy.weights.<name>`` in settings (or its ``default_weight``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from extender.addressing import ip_context
from extender.config import PolicyConfig
from extender.inventory import IdArray, Inventory
from extender.kinds import asked
from extender.model import PodRequest
from extender.scoring import (
    binpack,
    cpu_only,
    gang_rack,
    gang_topology,
    ip_headroom,
    live_use,
    mig_pack,
    share_pack,
    share_spread,
    spread,
    topology,
)
from extender.scoring.scorer import Candidates, FloatArray, GroupAffinity, Scorer

__all__ = [
    "MAX_SCORE",
    "NAMES",
    "SCORERS",
    "GroupAffinity",
    "ScoreArray",
    "Scorer",
    "score_nodes",
    "weights",
]

ScoreArray = npt.NDArray[np.int64]

MAX_SCORE = 10  # k8s.io/kube-scheduler/extender/v1 MaxExtenderPriority

# In the order their terms are summed.
SCORERS: tuple[Scorer, ...] = (
    binpack.SCORER,
    spread.SCORER,
    topology.SCORER,
    cpu_only.SCORER,
    gang_rack.SCORER,
    gang_topology.SCORER,
    ip_headroom.SCORER,
    live_use.SCORER,
    share_pack.SCORER,
    share_spread.SCORER,
    mig_pack.SCORER,
)
NAMES = frozenset(scorer.name for scorer in SCORERS)


def score_nodes(
    inventory: Inventory,
    request: PodRequest,
    ids: IdArray,
    scorers: Sequence[tuple[Scorer, int]],
    affinity: GroupAffinity | None = None,
) -> ScoreArray:
    """0..10 per node id (see the module docstring); ``scorers`` as :func:`weights` gives
    them for a config."""
    nodes = Candidates(
        inventory, request, ids, affinity=affinity, ip=ip_context(inventory, request)
    )
    raw: FloatArray | None = None
    total = 0
    for scorer, weight in scorers:
        if scorer.applies(nodes):
            term = weight * scorer.score(nodes)
            raw = term if raw is None else raw + term
            total += weight
    if raw is None:  # no scorer that applies weighs more than 0: no preference
        return np.zeros(len(ids), dtype=np.int64)
    scores = np.rint(raw / total * MAX_SCORE)
    for kind in asked(request):  # 0 where the pod does not fit now
        scores = np.where(kind.score_gate(inventory, request, ids), scores, 0)
    if request.dra_gpus:  # a claim pod: only where DRA has that many GPUs free
        scores = np.where(nodes.gpus().free >= request.dra_asks, scores, 0)
    return np.where(inventory.arrays.alive[ids], scores, 0).astype(np.int64)


def weights(config: PolicyConfig) -> tuple[tuple[Scorer, int], ...]:
    """The scorers that weigh more than 0 under ``config``, with their weights, in the order
    their terms are summed; ValueError when ``config.weights`` names a scorer that does not
    exist. Resolved once per config by its user (the scheduler), not per call."""
    unknown = sorted(name for name, _ in config.weights if name not in NAMES)
    if unknown:
        known = ", ".join(sorted(NAMES))
        raise ValueError(f"no scorer is named {', '.join(unknown)}: scorers must be {known}")
    chosen = dict(config.weights)
    weighted = ((s, chosen.get(s.name, s.default_weight(config))) for s in SCORERS)
    return tuple((scorer, weight) for scorer, weight in weighted if weight > 0)
