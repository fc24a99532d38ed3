"""What a scorer is (:class:`Scorer`) and what it reads (:class:`Candidates`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from extender.addressing import IPContext
from extender.config import PolicyConfig
from extender.inventory import IdArray, IntArray, Inventory
from extender.model import PodRequest

__all__ = ["Candidates", "FloatArray", "GroupAffinity", "Scorer", "for_gpu_pods"]

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class GroupAffinity:
    """Where a gang member's group already is (the gang coordinator says): the racks/zones of
    its placed members (most members first), and how many GPUs its unplaced members still
    need. What the ``gang_rack`` scorer rates nodes by."""

    racks: tuple[int, ...] = ()
    zones: tuple[int, ...] = ()
    gpus_needed: int = 0


class Candidates:
    """The nodes being scored for one pod, and what the scorers read about them. A column is
    gathered for these nodes once, however many scorers read it."""

    __slots__ = ("_arrays", "_gathered", "affinity", "ids", "inventory", "ip", "request")

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

    def column(self, name: str) -> IntArray:
        """The inventory column ``name`` (a field of NodeArrays) for these nodes."""
        gathered = self._gathered.get(name)
        if gathered is None:
            # take: twice as fast as [ids] over a few thousand ids
            gathered = self._gathered[name] = getattr(self._arrays, name).take(self.ids)
        return gathered


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
    """``applies`` of the objectives that weigh where a pod's GPUs go."""
    return nodes.request.gpus > 0
