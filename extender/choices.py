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

It also keeps which nodes the last offer held (when there were at most ``_KEPT`` of them:
shortlists are), so that a bind refused on a node can say whether the pod no longer fits it
or never did (:meth:`ChoiceBook.offered`).
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


_NO_IDS = np.zeros(0, dtype=np.int64)
_KEPT = 256  # the most offered node ids kept per pod (1,024 pods of 5,000 ids: 40 MB)


@dataclass(frozen=True, slots=True)
class _Offer:
    best: npt.NDArray[np.integer]  # node ids at the best score (an array: cheap to keep)
    layout: int  # the inventory layout the ids belong to
    offered: npt.NDArray[np.integer] | None  # every node id offered; None: too many to keep


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
        self._offers[uid] = _Offer(
            ids[scores == scores.max()], layout, ids if len(ids) <= _KEPT else None
        )
        while len(self._offers) > self._capacity:
            del self._offers[next(iter(self._offers))]  # the oldest offer

    def passed(self, uid: str, ids: npt.NDArray[np.integer], layout: int) -> None:
        """Filter passed nodes ``ids`` for pod ``uid`` without rating them (full mode, where
        prioritize rates them; or none passed): an offer of no best node."""
        if not uid:
            return
        self._offers.pop(uid, None)
        self._offers[uid] = _Offer(_NO_IDS, layout, ids if len(ids) <= _KEPT else None)
        while len(self._offers) > self._capacity:
            del self._offers[next(iter(self._offers))]  # the oldest offer

    def take(self, uid: str, node_id: int | None, layout: int) -> Choice:
        """How the node kube-scheduler chose for ``uid`` compares with schedext's last offer;
        the offer is then forgotten."""
        offer = self._offers.pop(uid, None)
        if offer is None or node_id is None or offer.layout != layout or not len(offer.best):
            return Choice.UNSCORED
        return Choice.BEST if bool(np.any(offer.best == node_id)) else Choice.LOWER

    def offered(self, uid: str, node_id: int | None, layout: int) -> bool | None:
        """Whether schedext's last offer for ``uid`` held the node ``node_id``; None when
        unknown (no offer that still applies, or one of too many nodes to keep)."""
        offer = self._offers.get(uid)
        if offer is None or offer.offered is None or offer.layout != layout:
            return None
        return node_id is not None and bool(np.any(offer.offered == node_id))
