"""Gang rack affinity: a gang member prefers the rack (or else the zone) where most of its
group already runs; the first member prefers racks whose free GPUs can hold the whole group.
The gang coordinator says where the group is (:class:`~extender.scoring.scorer.GroupAffinity`)."""

from __future__ import annotations

import numpy as np

from extender.scoring.scorer import Candidates, FloatArray, Scorer

__all__ = ["SCORER"]


def _score(nodes: Candidates) -> FloatArray:
    """1 for the group's rack, 0.5 for its zone; for a group not placed yet, 1 for racks whose
    free GPUs can hold all of it."""
    affinity = nodes.affinity
    assert affinity is not None  # applies() says so
    rack, zone = nodes.column("rack"), nodes.column("zone")
    if affinity.racks:
        in_rack = (rack == affinity.racks[0]) & (rack != 0)
        in_zone = np.isin(zone, [z for z in affinity.zones if z]) if affinity.zones else False
        return np.where(in_rack, 1.0, np.where(in_zone, 0.5, 0.0))
    if affinity.gpus_needed <= 0:
        return np.zeros(len(nodes.ids))
    a = nodes.inventory.arrays
    rack_free = np.bincount(a.rack[a.alive], weights=a.gpu_free[a.alive], minlength=1)
    rack_free = np.concatenate(
        [rack_free, np.zeros(max(0, int(rack.max(initial=0)) + 1 - len(rack_free)))]
    )
    return np.where((rack != 0) & (rack_free[rack] >= affinity.gpus_needed), 1.0, 0.0)


SCORER = Scorer(
    name="gang_rack",
    default_weight=lambda config: config.rack_weight,
    # A group with a preferred level is gang_topology's to rate.
    applies=lambda nodes: nodes.affinity is not None and nodes.affinity.topology is None,
    score=_score,
)
