"""Address headroom: a pod that asks for an address prefers nodes whose IP pool has the larger
free share, so that no rack's pool runs dry while others have room."""

from __future__ import annotations

from extender.addressing import ip_headroom
from extender.scoring.scorer import Candidates, FloatArray, Scorer

__all__ = ["SCORER"]


def _score(nodes: Candidates) -> FloatArray:
    assert nodes.ip is not None  # applies() says so
    return ip_headroom(nodes.inventory, nodes.ids, nodes.ip)


SCORER = Scorer(
    name="ip_headroom",
    default_weight=lambda config: config.ip_weight,
    applies=lambda nodes: nodes.ip is not None,
    score=_score,
)
