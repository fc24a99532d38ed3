from dataclasses import dataclass

import pytest

from extender.policy import choose_gpus
from testbed.builders import make_node, make_pod
from tests.unit.helpers import scheduler_with


@dataclass
class GpuCase:
    name: str
    gpus: int
    groups: list[list[int]] | None
    held: list[int]
    count: int
    expected: tuple[int, ...] | None


CASES = [
    GpuCase("no topology: lowest free indices", 4, None, [0], 2, (1, 2)),
    GpuCase(
        "best fit: the smallest group that holds them all",
        8,
        [[0, 1, 2, 3], [4, 5, 6, 7]],
        [0, 1],
        2,
        (2, 3),
    ),
    GpuCase(
        "keeps the whole group free for larger pods",
        8,
        [[0, 1, 2, 3], [4, 5, 6, 7]],
        [4],
        3,
        (5, 6, 7),
    ),
    GpuCase(
        "a full group when it fits exactly", 8, [[0, 1, 2, 3], [4, 5, 6, 7]], [], 4, (0, 1, 2, 3)
    ),
    GpuCase(
        "spans as few groups as possible",
        8,
        [[0, 1], [2, 3], [4, 5, 6, 7]],
        [4, 5],
        4,
        (0, 1, 2, 3),
    ),
    GpuCase(
        "a partly used big group beats two small ones",
        8,
        [[0], [1], [2, 3, 4, 5, 6, 7]],
        [2],
        5,
        (3, 4, 5, 6, 7),
    ),
    GpuCase(
        "spanning takes the groups with most free first",
        8,
        [[0, 1, 2, 3], [4, 5, 6, 7]],
        [0, 4, 5],
        5,
        (1, 2, 3, 6, 7),
    ),
    GpuCase("gpus outside any published group are singletons", 4, [[0, 1]], [], 1, (2,)),
    GpuCase("not enough free gpus", 4, None, [0, 1, 2], 2, None),
    GpuCase("zero gpus", 4, None, [], 0, ()),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_choose_gpus(case: GpuCase) -> None:
    pods = (
        [make_pod("holder", gpus=len(case.held), node="n", gpu_ids=case.held)] if case.held else []
    )
    scheduler = scheduler_with([make_node("n", gpus=case.gpus, groups=case.groups)], pods)
    view = scheduler.inventory.node("n")
    assert view is not None
    assert choose_gpus(view, case.count) == case.expected


def test_anonymous_gpus_are_assumed_on_the_highest_free_indices() -> None:
    scheduler = scheduler_with([make_node("n", gpus=4)], [make_pod("legacy", gpus=2, node="n")])
    view = scheduler.inventory.node("n")
    assert view is not None
    assert view.free_gpu_ids == (0, 1)
    assert choose_gpus(view, 2) == (0, 1)
    assert choose_gpus(view, 3) is None
