"""Gang topology: a member of a group with a preferred topology level
(``schedext.io/topology-preferred``) prefers the nodes that keep its group in as few domains
of that level as it can, the narrowest level first. The gang coordinator rates each node
(:mod:`extender.gang.preference`); this reads the rating. Such a group is not rated by
``gang_rack`` too."""

from __future__ import annotations

from extender.scoring.scorer import Candidates, FloatArray, Scorer

__all__ = ["SCORER"]


def _score(nodes: Candidates) -> FloatArray:
    affinity = nodes.affinity
    assert affinity is not None
    assert affinity.topology is not None
    rating: FloatArray = affinity.topology.take(nodes.ids)
    return rating


SCORER = Scorer(
    name="gang_topology",
    default_weight=lambda config: config.rack_weight,
    applies=lambda nodes: nodes.affinity is not None and nodes.affinity.topology is not None,
    score=_score,
)
