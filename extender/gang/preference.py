"""A gang's preferred topology level: how well each node keeps the group in as few domains
of that level as it can, the narrowest level first (:func:`preference`), for the
``gang_topology`` scorer.

Levels run from the narrowest (an NVLink clique) to the preferred one. With members placed
(reserved or bound), a node in the domain most of them are in rates by the narrowest level it
shares with them: 1 for their clique, less for their rack only, less again for their spine
only, 0 outside. With none placed, a node rates by the narrowest level at which its domain's
free GPUs could hold every unplaced member, so the first member goes where the rest can
follow; where no domain of the preferred level can, the roomiest domains of it rate as if they
could, so the first member starts the group where most of it fits and it spreads over as few
domains as it can. A preference never refuses a node: the group still places across domains
when it must.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import numpy as np

from extender.gang.capacity import free_gpus
from extender.gang.topology import domains
from extender.inventory import Inventory
from extender.scoring.scorer import FloatArray

__all__ = ["preference"]


def preference(
    inventory: Inventory,
    levels: Sequence[str],
    preferred: str,
    *,
    placed: Sequence[str],
    gpus_needed: int,
) -> FloatArray:
    """Per node slot, 0..1 (see the module docstring)."""
    chain = list(levels[: levels.index(preferred) + 1])
    alive = inventory.arrays.alive
    rating = np.zeros(len(alive), dtype=np.float64)
    slots = inventory.ids(placed) if placed else None
    free = free_gpus(inventory, None, dra=False) if slots is None else None
    for depth, level in enumerate(chain):
        worth = (len(chain) - depth) / len(chain)
        ids = domains(inventory, level).ids
        if slots is not None:
            (home, _), *_ = Counter(ids[slots].tolist()).most_common(1)
            here = ids == home
        else:
            assert free is not None
            room = np.bincount(ids[alive], weights=free[alive], minlength=int(ids.max()) + 1)
            enough = float(max(gpus_needed, 1))
            if depth == len(chain) - 1 and room.size:
                enough = min(enough, max(float(room.max()), 1.0))  # else the roomiest
            here = room[ids] >= enough
        rating = np.where((rating == 0) & here & alive, worth, rating)
    return rating
