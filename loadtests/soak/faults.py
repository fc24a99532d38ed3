"""The soak's faults: their kinds, and the seeded schedule that says when each comes.

The schedule deals the kinds from a shuffled deck, one deck after another, so that every
kind comes equally often over a run (a run of N decks has each kind N times) in an order the
seed fixes. The gaps between faults are the interval with a seeded jitter of a quarter either
side. What each kind does to the cluster is the rig's (``loadtests.soak.rig``).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from enum import StrEnum

__all__ = ["Fault", "FaultKind", "parse_kinds", "schedule"]


class FaultKind(StrEnum):
    KILL_LEADER = "kill-leader"  # kill -9 of the leading replica (restarted a moment later)
    TERM_LEADER = "term-leader"  # SIGTERM of the leading replica (it hands over the lease)
    APISERVER = "apiserver-restart"  # kube-apiserver stopped and started on its port
    COMPACTION = "compaction"  # etcd compacted to now, kube-apiserver crashed: 410 Gone
    WATCH_CUT = "watch-cut"  # every connection from schedext to the API server broken
    SLOW_API = "slow-api"  # the API server's answers to schedext delayed, for a while
    SCHEDULER = "scheduler-restart"  # kube-scheduler stopped and started again


def parse_kinds(text: str) -> tuple[FaultKind, ...]:
    """``all``, ``none``, or kinds separated by commas."""
    text = text.strip()
    if text == "all":
        return tuple(FaultKind)
    if text in ("", "none"):
        return ()
    kinds = []
    for part in (p.strip() for p in text.split(",")):
        try:
            kinds.append(FaultKind(part))
        except ValueError:
            known = ", ".join(k.value for k in FaultKind)
            raise ValueError(f"unknown fault {part!r}; known: all, none, {known}") from None
    return tuple(dict.fromkeys(kinds))


@dataclass(frozen=True, slots=True)
class Fault:
    """One fault as injected: when (seconds into the run), what, and how it went."""

    kind: FaultKind
    at: float
    ended: float
    detail: str = ""


def schedule(
    seed: int, kinds: tuple[FaultKind, ...], *, interval_s: float, duration_s: float
) -> list[tuple[float, FaultKind]]:
    """When each fault comes, in seconds from the start, within ``duration_s``: the first
    after one interval, none in the last interval (the run then drains)."""
    if not kinds or interval_s <= 0:
        return []
    rng = random.Random(f"faults-{seed}")
    plan: list[tuple[float, FaultKind]] = []
    at = 0.0
    deck: list[FaultKind] = []
    while True:
        at += interval_s * rng.uniform(0.75, 1.25)
        if at > duration_s - interval_s:
            return plan
        if not deck:
            deck = list(kinds)
            rng.shuffle(deck)
        plan.append((at, deck.pop()))
