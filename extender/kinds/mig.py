"""MIG devices (NVIDIA's mixed strategy, ``nvidia.com/mig-<profile>``): per profile, how many.

The node has too few healthy MIG devices of a profile at all (``GPU_MIG_PROFILE``), or too few
free now (``GPU_MIG_FREE``). Bind packs them onto the GPUs already busy
(:func:`extender.mig.choose_mig`); the inventory keeps them per node in
:mod:`extender.mig_state`.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping

import numpy as np

from extender import names
from extender.config import SharePlacement
from extender.inventory import IdArray, Inventory
from extender.kinds.kind import (
    BoolArray,
    Column,
    Conditions,
    Placed,
    VictimsCheck,
    frozen,
    gpu_node_frees,
)
from extender.mig import Mig, choose_mig, met_after, mig_messages
from extender.model import Demand, Holding, NodeSpec, PodRequest, Reason
from extender.node_state import NodeView

__all__ = ["MIG", "MigDevices"]


class MigDevices:
    name = "mig"
    via_dra = False

    def asks(self, demand: Demand) -> bool:
        return bool(demand.mig)

    def spec_key(self, request: PodRequest) -> Mig:
        return request.mig

    def spec_conditions(self, inventory: Inventory, key: Mig) -> Conditions:
        return [
            (inventory.mig_arrays(profile).healthy < count, Reason.GPU_MIG_PROFILE)
            for profile, count in key
        ]

    def held_conditions(self, inventory: Inventory, request: PodRequest, col: Column) -> Conditions:
        return [
            (col(inventory.mig_arrays(profile).free) < count, Reason.GPU_MIG_FREE)
            for profile, count in request.mig
        ]

    def messages(self, request: PodRequest) -> Mapping[Reason, str]:
        return _messages(request.mig)

    def score_gate(self, inventory: Inventory, request: PodRequest, ids: IdArray) -> BoolArray:
        gate = np.ones(len(ids), dtype=np.bool_)
        for profile, count in request.mig:
            gate &= inventory.mig_arrays(profile).free[ids] >= count
        return gate

    def choose(
        self, view: NodeView, request: PodRequest, placement: SharePlacement
    ) -> Placed | None:
        chosen = choose_mig(view.mig, request.mig)
        return None if chosen is None else Placed(mig_uuids=chosen)

    def annotations(self, holding: Holding) -> dict[str, str]:
        if not holding.mig_uuids:
            return {}
        # The MIG devices the node agent gives the containers, and the record a restart reads.
        return {names.MIG_UUIDS: ",".join(holding.mig_uuids)}

    def victims_check(self, view: NodeView, request: PodRequest) -> VictimsCheck:
        return lambda victims: met_after(view.mig, request, victims)

    def freed(self, view: NodeView, victim: Holding) -> int:
        """The whole GPUs a victim frees, all of them for nothing to a MIG preemptor: among
        sets as small, the one that evicts the fewest whole-GPU pods."""
        return victim.gpus

    freed_by_departure = frozenset({Reason.GPU_MIG_FREE})
    freed_by_node = frozenset({Reason.GPU_MIG_PROFILE})

    def waits(self, inventory: Inventory, request: PodRequest) -> set[str]:
        return {profile for profile, _ in request.mig}

    def departure_frees(self, holding: Holding, spec: NodeSpec) -> list[tuple[str, int]]:
        return list(holding.mig)

    def node_frees(self, old: NodeSpec | None, new: NodeSpec) -> set[str] | None:
        slots = (*(old.mig_slices if old else ()), *new.mig_slices)
        return gpu_node_frees(old, new, {slot.profile for slot in slots})

    def size(self, demand: Demand) -> Mig:
        return demand.mig

    def pack_shape(self, request: PodRequest) -> tuple[object, ...]:
        return ("mig", tuple(profile for profile, _ in request.mig))

    def unit(self, request: PodRequest) -> PodRequest:
        return dataclasses.replace(request, mig=tuple((p, 1) for p, _ in request.mig))

    def describe(self, demand: Demand) -> dict[str, object]:
        return {"mig": dict(demand.mig)} if demand.mig else {}  # profile -> devices

    def detail(self, view: NodeView, request: PodRequest, reason: Reason) -> str | None:
        return None


@functools.lru_cache(maxsize=64)
def _messages(mig: Mig) -> Mapping[Reason, str]:
    profile, free = mig_messages(mig)
    return frozen({Reason.GPU_MIG_PROFILE: profile, Reason.GPU_MIG_FREE: free})


MIG = MigDevices()
