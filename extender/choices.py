"""Whether kube-scheduler placed each pod on a node schedext rated best.

schedext rates the nodes it offers a pod (prioritize in full mode, filter's shortlist in
shortlist mode), but kube-scheduler makes the choice: it adds its own plugins' scores, and in
shortlist mode it ranks the shortlist by them alone. Neither mode says how often that choice
is the node schedext would have taken. This book keeps, per pod, the nodes schedext rated
best in its last offer, so that bind can tell: the chosen node was one of them (``BEST``), it
was another (``LOWER``), or schedext made no offer that still applies (``UNSCORED``: a
restart, a layout change, a pod never rated). The shell counts the three as a metric: the
figure that compares the modes' placement, and that says when kube-scheduler's own scoring
overrules schedext's.

One small bounded book: an offer outlives neither the pod's bind nor ``capacity`` newer
offers (pods rated but never bound, e.g. unschedulable ones, age out).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

import numpy as np
import numpy.typing as npt

__all__ = ["Choice", "ChoiceBook"]


class Choice(StrEnum):
    BEST = "best"
    LOWER = "lower"
    UNSCORED = "unscored"


@dataclass(frozen=True, slots=True)
class _Offer:
    best: npt.NDArray[np.integer]  # node ids at the best score (an array: cheap to keep)
    layout: int  # the inventory layout the ids belong to


class ChoiceBook:
    def __init__(self, *, capacity: int = 512) -> None:
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self._capacity = capacity
        self._offers: dict[str, _Offer] = {}

    def __len__(self) -> int:
        return len(self._offers)

    def offer(
        self,
        uid: str,
        ids: npt.NDArray[np.integer],
        scores: npt.NDArray[np.integer],
        layout: int,
    ) -> None:
        """schedext rated nodes ``ids`` with ``scores`` for pod ``uid``: replaces its earlier
        offer (kube-scheduler acts on the latest)."""
        if not uid:
            return
        self._offers.pop(uid, None)
        if not len(ids):
            return
        self._offers[uid] = _Offer(ids[scores == scores.max()], layout)
        while len(self._offers) > self._capacity:
            del self._offers[next(iter(self._offers))]  # the oldest offer

    def take(self, uid: str, node_id: int | None, layout: int) -> Choice:
        """How the node kube-scheduler chose for ``uid`` compares with schedext's last offer;
        the offer is then forgotten."""
        offer = self._offers.pop(uid, None)
        if offer is None or node_id is None or offer.layout != layout:
            return Choice.UNSCORED
        return Choice.BEST if bool(np.any(offer.best == node_id)) else Choice.LOWER
