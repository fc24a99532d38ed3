"""GPU shares spread: a share goes onto the emptiest device that has room, for workloads
that suffer from neighbours on their GPU (``policy.share_placement: spread``)."""

from __future__ import annotations

from extender.config import SharePlacement
from extender.scoring.scorer import Scorer
from extender.scoring.share_pack import for_share_pods, share_rating, share_weight

__all__ = ["SCORER"]

SCORER = Scorer(
    name="share_spread",
    default_weight=share_weight(SharePlacement.SPREAD),
    applies=for_share_pods,
    score=lambda nodes: share_rating(nodes, SharePlacement.SPREAD),
)
