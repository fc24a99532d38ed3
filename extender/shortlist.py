"""Shortlist mode: filter answers only the few feasible nodes schedext rates best.

The extender protocol costs kube-scheduler per pod what crosses it: in full mode it encodes
the pod and every candidate's name twice (filter, then prioritize), decodes two answers, and
runs its own Score plugins on every node filter kept. On a cluster of a thousand nodes that is
most of what an extender costs, whatever the extender decides (docs/performance.md, section 4).
With a shortlist, filter scores the nodes that pass with schedext's own scorers (those
prioritize would use) and answers only the ``size`` best: one call per pod, a few names to
decode, a few nodes to score. kube-scheduler's prioritizeVerb is then left out of its
configuration.

What it changes: kube-scheduler's own soft preferences (preferred affinities, topology spread
scoring, its resource-fit strategy) choose only among the shortlist, and schedext's scores no
longer add to theirs; size 1 leaves kube-scheduler no choice between nodes schedext rates
differently. Nodes rated equal to the last one kept stay in, up to ``shortlist_preferred``:
among them kube-scheduler's preferences choose, and schedext has none. Beyond that bound,
ties at the cut go to the nodes kube-scheduler listed first, an order it rotates every cycle.
A pod that fits nowhere still gets every node's reason (preemption and the FailedScheduling
event read them); a shortlisted answer lists no rejected node, which only a second extender
rejecting the whole shortlist would have shown. ``extender.choices`` counts how often
kube-scheduler's pick is schedext's best, in either mode.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from extender.inventory import IdArray
from extender.model import FilterVerdict
from extender.packed import NameView
from extender.scoring import ScoreArray

__all__ = ["cut"]


def cut(
    verdict: FilterVerdict, ids: IdArray, scores: ScoreArray, size: int, *, ties: int = 0
) -> tuple[FilterVerdict, IdArray, ScoreArray]:
    """The verdict with ``passed`` cut to the ``size`` best by ``scores`` (aligned with
    ``passed`` and ``ids``), best first, and the ids and scores of what it kept. Nodes rated
    equal to the last one kept are kept too, up to ``ties`` in all: among nodes schedext rates
    alike, kube-scheduler's own preferences (a ``PreferNoSchedule`` taint, spreading) choose,
    at no cost to schedext's. A verdict with nothing passed is returned as it is."""
    if size < 1:
        raise ValueError("shortlist size must be >= 1")
    feasible = len(verdict.passed)
    if not feasible:
        return verdict, ids, scores
    if feasible <= size:
        return replace(verdict, shortlisted_from=feasible), ids, scores
    # Stable: equal scores keep kube-scheduler's order, which it rotates from cycle to cycle.
    order = np.argsort(-scores, kind="stable")
    ranked = scores[order]
    tied = int(np.count_nonzero(ranked >= ranked[size - 1]))
    keep = max(size, min(tied, ties))
    if keep >= feasible:
        return replace(verdict, shortlisted_from=feasible), ids, scores
    best = order[:keep]
    passed = verdict.passed
    names = passed.pick(best) if isinstance(passed, NameView) else [passed[i] for i in best]
    return replace(verdict, passed=names, shortlisted_from=feasible), ids[best], scores[best]
