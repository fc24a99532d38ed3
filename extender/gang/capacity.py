"""The whole GPUs a gang's members may take per node, for the whole-group fit search: the
node's own free GPUs, or, for members whose ``nvidia.com/gpu`` DRA serves (KEP-5004), DRA's
free devices on the nodes DRA owns (extender.dra.capacity); and only those of one topology
domain, for a gang that requires one (:class:`Within`)."""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import replace
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from extender.columns import DRA_OWNED
from extender.inventory import Inventory
from extender.model import PodRequest

__all__ = ["Within", "free_gpus", "inside", "via_dra"]


def via_dra(requests: list[PodRequest]) -> list[PodRequest]:
    """The members, each with the DRA verdict of the one a verb read (a cluster fact: does a
    class serve nvidia.com/gpu; members seen only by the watch lack it)."""
    via = any(r.gpus_via_dra for r in requests)
    return [replace(r, gpus_via_dra=True) if via and r.gpus else r for r in requests]


def free_gpus(
    inventory: Inventory, free_delta: Mapping[int, int] | None, *, dra: bool
) -> npt.NDArray[np.int64]:
    """Free whole GPUs per node id; with ``dra``, DRA's on the nodes DRA owns."""
    a = inventory.arrays
    owned = a.dra_owner == DRA_OWNED if dra else np.zeros(len(a.alive), np.bool_)
    free = np.where(owned, a.dra_free, a.gpu_free)
    for node_id, delta in (free_delta or {}).items():
        free[node_id] += delta
    return np.minimum(free, np.where(owned, a.dra_total, a.gpu_total))


class Within(NamedTuple):
    """Only these nodes (a required topology domain); ``key`` names them for the cache."""

    nodes: npt.NDArray[np.bool_]
    key: Hashable


def inside(free: npt.NDArray[np.int64], within: Within | None) -> npt.NDArray[np.int64]:
    """``free`` where ``within`` allows, 0 elsewhere (everywhere when it is None)."""
    return free if within is None else np.where(within.nodes, free, 0)
