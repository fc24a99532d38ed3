"""What a scorer is (:class:`Scorer`) and what it reads (:class:`Candidates`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from extender.addressing import IPContext
from extender.columns import DRA_NONE, DRA_OWNED
from extender.config import PolicyConfig
from extender.inventory import IdArray, IntArray, Inventory
from extender.model import PodRequest

__all__ = ["Candidates", "FloatArray", "GpuFit", "GroupAffinity", "Scorer", "for_gpu_pods"]

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class GroupAffinity:
    """Where a gang member's group already is (the gang coordinator says): the racks/zones of
    its placed members (most members first), and how many GPUs its unplaced members still
    need. What the ``gang_rack`` scorer rates nodes by; ``gang_topology`` rates a group with a
    preferred level by ``topology``."""

    racks: tuple[int, ...] = ()
    zones: tuple[int, ...] = ()
    gpus_needed: int = 0
    # A group with a preferred topology level (extender.gang.preference): per node slot, 0..1,
    # how well the node keeps it in as few domains of that level as it can, narrowest first.
    # None: the rack affinity above rates it instead.
    topology: FloatArray | None = None


class GpuFit(NamedTuple):
    """Per candidate node, the whole GPUs the pod's GPUs come from: the node's own (the
    device plugin's) or, where DRA gives the pod its GPUs, DRA's (extender.dra.capacity)."""

    total: IntArray
    free: IntArray
    group_free: IntArray  # most free in one NVLink group; NO_TOPOLOGY: unknown
    asked: IntArray  # the GPUs the pod takes there


class Candidates:
    """The nodes being scored for one pod, and what the scorers read about them. A column is
    gathered for these nodes once, however many scorers read it."""

    __slots__ = ("_arrays", "_fit", "_gathered", "affinity", "ids", "inventory", "ip", "request")

    def __init__(
        self,
        inventory: Inventory,
        request: PodRequest,
        ids: IdArray,
        *,
        affinity: GroupAffinity | None = None,
        ip: IPContext | None = None,
    ) -> None:
        self.inventory, self.request, self.ids = inventory, request, ids
        self.affinity = affinity  # a gang member's group, where it is (extender.gang)
        self.ip = ip  # the pod's address request against the address book
        self._arrays = inventory.arrays
        self._gathered: dict[str, IntArray] = {}
        self._fit: GpuFit | None = None

    def column(self, name: str) -> IntArray:
        """The inventory column ``name`` (a field of NodeArrays) for these nodes."""
        gathered = self._gathered.get(name)
        if gathered is None:
            # take: twice as fast as [ids] over a few thousand ids
            gathered = self._gathered[name] = getattr(self._arrays, name).take(self.ids)
        return gathered

    def gpus(self) -> GpuFit:
        """Where the pod's whole GPUs come from on each node (see :class:`GpuFit`): DRA's on
        a node DRA owns when a DeviceClass serves the pod's ``nvidia.com/gpu``, and on any
        node DRA offers GPUs for the GPUs its claims ask; else the node's own."""
        if self._fit is not None:
            return self._fit
        request = self.request
        own = GpuFit(
            self.column("gpu_total"),
            self.column("gpu_free"),
            self.column("max_group_free"),
            np.full(len(self.ids), request.gpus, dtype=np.int64),
        )
        if not request.dra_asks:
            self._fit = own
            return own
        owner = self.column("dra_owner")
        dra = owner == DRA_OWNED if request.gpus_via_dra else np.zeros(len(owner), np.bool_)
        if request.dra_gpus:
            dra |= owner != DRA_NONE
        dra_fit = GpuFit(
            self.column("dra_total"),
            self.column("dra_free"),
            self.column("dra_group_free"),
            np.full(len(self.ids), request.dra_asks, dtype=np.int64),
        )
        self._fit = GpuFit._make(
            np.where(dra, theirs, mine) for theirs, mine in zip(dra_fit, own, strict=True)
        )
        return self._fit


@dataclass(frozen=True, slots=True)
class Scorer:
    """One scoring objective. Prioritize sums ``weight * score`` over the scorers that apply to
    the pod and weigh more than 0, and scales the sum to 0..10 by their total weight."""

    name: str  # the key of its weight in settings (policy.weights)
    # Its weight when settings name none: built-in scorers read their PolicyConfig knob.
    default_weight: Callable[[PolicyConfig], int]
    applies: Callable[[Candidates], bool]
    # 0..1 per candidate node (1: the best this objective can say of a node).
    score: Callable[[Candidates], FloatArray]


def for_gpu_pods(nodes: Candidates) -> bool:
    """``applies`` of the objectives that weigh where a pod's whole GPUs go, its own or
    DRA's."""
    return nodes.request.gpus > 0 or nodes.request.dra_gpus > 0
