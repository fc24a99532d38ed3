"""Prioritize's answer lists only the hosts above the lowest score, lowered by it: the same
choice for kube-scheduler, which adds ``score * weight`` to each listed host's total."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import orjson
import pytest

from app.service import wire
from extender.packed import PackedNames


@dataclass
class Case:
    name: str
    hosts: list[str]
    scores: list[int]
    answer: dict[str, int]  # host -> score listed


CASES = [
    Case("no hosts", [], [], {}),
    Case("one host: nothing to prefer", ["a"], [7], {}),
    Case("all tied: nothing to prefer", ["a", "b", "c"], [4, 4, 4], {}),
    Case("lowest at 0: the zeros are left out", ["a", "b", "c"], [0, 6, 0], {"b": 6}),
    Case(
        "lowest above 0: every score lowered by it",
        ["a", "b", "c", "d"],
        [3, 5, 10, 3],
        {"b": 2, "c": 7},
    ),
    Case("full range kept", ["lo", "hi"], [0, 10], {"hi": 10}),
    Case(
        "names that need escaping are escaped",
        ['evil"node', "back\\slash", "tab\tname", "plain"],
        [2, 9, 5, 1],
        {'evil"node': 1, "back\\slash": 8, "tab\tname": 4},
    ),
]


def _answer(hosts: Sequence[str], scores: list[int]) -> list[dict[str, object]]:
    result = orjson.loads(wire.host_priorities(hosts, np.array(scores, dtype=np.int64)))
    assert isinstance(result, list)
    return result


# Names as strings, and as kube-scheduler's bytes where they are plain (names that need
# escaping never arrive packed: the decoder keeps them as strings).
FORMS = [pytest.param(c, False, id=f"{c.name}-strings") for c in CASES] + [
    pytest.param(c, True, id=f"{c.name}-packed")
    for c in CASES
    if PackedNames.of(c.hosts) is not None
]


@pytest.mark.parametrize(("case", "packed"), FORMS)
def test_host_priorities(case: Case, packed: bool) -> None:
    hosts: Sequence[str] = (PackedNames.of(case.hosts) or []) if packed else case.hosts
    result = _answer(hosts, case.scores)
    assert all(list(entry) == ["Host", "Score"] for entry in result)
    assert all(type(entry["Score"]) is int for entry in result)
    assert {str(e["Host"]): e["Score"] for e in result} == case.answer
    assert len(result) == len(case.answer)  # each host at most once


def _best(totals: dict[str, int]) -> set[str]:
    top = max(totals.values())
    return {host for host, total in totals.items() if total == top}


@pytest.mark.parametrize("seed", range(20))
def test_kube_scheduler_picks_among_the_same_hosts(seed: int) -> None:
    """kube-scheduler's sum (schedule_one.go, prioritizeNodes): its plugins' total per host,
    plus ``score * weight * 10`` for every host the extender lists. The hosts with the highest
    total are the same whether every host is listed with its score or only the compact answer."""
    rng = random.Random(seed)
    hosts = [f"node-{i}" for i in range(rng.randint(2, 40))]
    scores = [rng.choice([2, 2, 2, 5, 7, 10]) for _ in hosts]
    plugins = {h: rng.randint(0, 3) * 100 for h in hosts}
    weight = rng.randint(1, 5)
    compact = {str(e["Host"]): int(str(e["Score"])) for e in _answer(hosts, scores)}
    full = {h: plugins[h] + s * weight * 10 for h, s in zip(hosts, scores, strict=True)}
    listed = {h: plugins[h] + compact.get(h, 0) * weight * 10 for h in hosts}
    assert _best(listed) == _best(full)
    assert len(compact) == sum(1 for s in scores if s > min(scores))
