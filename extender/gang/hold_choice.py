"""Where a starving gang's hold goes (:func:`choose_hold`): the nodes it would take if the
pods that block it finished, and how many whole GPUs on each.

The pods that may block a gang, and whose GPUs a hold may wait for, are the running ones of no
higher priority than the gang that are in no gang (``releasable``, per node): a hold never
waits for a gang's members (they leave together, or not at all) nor for pods that outrank
the gang. A place holds the gang when its free GPUs plus those would fit every unplaced
member at once (:func:`~extender.gang.packing.fits_all`, with the same rules as the members'
own filter: GPU model, memory, CPU, and each member's address from the pools there).

**The rule**: of the places that hold the gang (each domain of its required level, or the whole
cluster for a gang that requires none), the one where the *fewest GPUs must still free*; then
the one with the most free already; then the first by name. Within it, each member (the
largest first) is planned onto the node where it must wait for the fewest GPUs, then where it
fits tightest, then the first by id. So a hold waits for as little work to end as it can, and
a restarted schedext, whose hold kept its GPUs free meanwhile, would choose the same nodes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from extender.config import PolicyConfig
from extender.gang.capacity import Within, free_gpus
from extender.gang.domain_fit import MAX_DOMAINS, addresses_short
from extender.gang.packing import FitCache, eligible, fits_all
from extender.gang.topology import domains
from extender.inventory import BoolArray, IntArray, Inventory
from extender.model import PodRequest

__all__ = ["HoldChoice", "choose_hold"]


class HoldChoice(NamedTuple):
    """Per node name, the whole GPUs the gang would take there; the domain (its level's
    label value, "" for none); or, with no nodes, why the gang gets no hold."""

    need: dict[str, int]
    domain: str = ""
    why_not: str = ""


def choose_hold(
    inventory: Inventory,
    config: PolicyConfig,
    *,
    needed: Sequence[PodRequest],
    level: str,
    releasable: IntArray,
) -> HoldChoice:
    """The hold for a gang whose unplaced members are ``needed`` (see the module docstring);
    ``releasable``: per node id, the GPUs that the pods it may wait for hold."""
    if any(r.share.devices or r.mig for r in needed):
        return HoldChoice({}, why_not="a hold keeps whole GPUs, and some members ask shares")
    members = [r for r in needed if r.gpus > 0]
    if not members:
        return HoldChoice({}, why_not="its members ask no GPUs")
    alive = inventory.arrays.alive
    free = np.where(alive, free_gpus(inventory, None, dra=any(r.gpus_via_dra for r in members)), 0)
    potential = free + np.where(alive, releasable, 0)
    want = sum(r.gpus for r in members)
    places: list[tuple[Within | None, str]] = [(None, "")]
    if level:
        zones = domains(inventory, level)
        room = np.bincount(zones.ids[alive], weights=potential[alive], minlength=len(zones.names))
        ready = np.bincount(zones.ids[alive], weights=free[alive], minlength=len(zones.names))
        enough = [d for d in np.flatnonzero(room >= want).tolist() if d > 0]
        enough.sort(key=lambda d: (-ready[d], d))
        places = [(Within(zones.ids == d, (level, d)), zones.names[d]) for d in enough]
    delta = {int(i): int(releasable[i]) for i in np.flatnonzero(releasable > 0)}
    cache = FitCache()  # the members' node masks, once per shape
    best: tuple[tuple[int, int, str], HoldChoice] | None = None
    for within, name in places[:MAX_DOMAINS]:
        nodes = within.nodes if within is not None else alive
        if addresses_short(inventory, needed, nodes):
            continue
        if not fits_all(inventory, members, config, free_delta=delta, within=within, cache=cache):
            continue
        need = _plan(inventory, config, members, (free, potential), (nodes, cache))
        if need is None:
            continue
        ids = inventory.ids(list(need))
        short = sum(max(0, g - int(f)) for g, f in zip(need.values(), free[ids], strict=True))
        rank = (short, -int(free[nodes].sum()), name)
        if best is None or rank < best[0]:
            best = (rank, HoldChoice(need, name))
    if best is None:
        where = f"no {level}" if level else "the cluster"
        return HoldChoice(
            {},
            why_not=f"{where} could hold it even if the pods of no higher priority outside "
            "gangs finished",
        )
    return best[1]


def _plan(
    inventory: Inventory,
    config: PolicyConfig,
    members: Sequence[PodRequest],
    free_and_potential: tuple[IntArray, IntArray],
    nodes_and_cache: tuple[BoolArray, FitCache],
) -> dict[str, int] | None:
    """Each member onto a node (the largest first): where it waits for the fewest GPUs, then
    fits tightest. None when the greedy finds no node for one."""
    free_left, room_left = (a.copy() for a in free_and_potential)
    nodes, cache = nodes_and_cache
    need: dict[int, int] = {}
    for request in sorted(members, key=lambda r: -r.gpus):
        usable = np.flatnonzero(
            eligible(inventory, request, config, cache) & nodes & (room_left >= request.gpus)
        )
        if not len(usable):
            return None
        short = np.maximum(0, request.gpus - free_left[usable])
        spare = room_left[usable] - request.gpus
        node_id = int(usable[np.lexsort((usable, spare, short))[0]])
        free_left[node_id] -= min(int(free_left[node_id]), request.gpus)
        room_left[node_id] -= request.gpus
        need[node_id] = need.get(node_id, 0) + request.gpus
    names = inventory.names_of(list(need))
    return dict(zip(names, need.values(), strict=True))
