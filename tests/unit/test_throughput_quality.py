"""The throughput benchmark's pure parts: the placement-quality figures (loadtests/quality.py)
from plain pod and node records, the records from API objects, and the workload mix
(loadtests/mix.py) that decides which pods ask for GPUs."""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest

from loadtests import payloads
from loadtests.mix import Mix
from loadtests.quality import (
    NodeRecord,
    PodRecord,
    Quality,
    choice_counts,
    medians,
    node_record,
    placement_quality,
    pod_record,
    table_row,
)

pytestmark = pytest.mark.unit

EIGHT_IN_TWO_GROUPS = ((0, 1, 2, 3), (4, 5, 6, 7))


def node(
    name: str, gpus: int = 8, groups: Sequence[Sequence[int]] = EIGHT_IN_TWO_GROUPS
) -> NodeRecord:
    return NodeRecord(name, gpus, tuple(frozenset(g) for g in groups))


def pod(name: str, on: str | None, gpus: int = 1, ids: Sequence[int] | None = None) -> PodRecord:
    return PodRecord(name, on, gpus, tuple(ids) if ids is not None else None)


def pods_of(gpus: int, nodes: Sequence[str | None], *, first_id: int = 0) -> list[PodRecord]:
    """One pod of ``gpus`` GPUs on each node named (None: pending), ids from ``first_id``."""
    return [pod(f"p{i}", n, gpus, range(first_id, first_id + gpus)) for i, n in enumerate(nodes)]


NODES = [node(f"n{i}") for i in range(4)]

LAYOUTS = [
    pytest.param(
        pods_of(2, ["n0", "n0", "n0", "n0"]),
        {"nodes_used": 1, "nodes_full": 1, "nodes_partly_used": 0, "gpus_stranded": 0,
         "stranded_per_partly_used": None, "gpus_used": 8},
        id="packed: four 2-GPU pods fill one node",
    ),
    pytest.param(
        pods_of(2, ["n0", "n1", "n2", "n3"]),
        {"nodes_used": 4, "nodes_full": 0, "nodes_partly_used": 4, "gpus_stranded": 24,
         "stranded_per_partly_used": 6.0, "gpus_used": 8},
        id="spread: one 2-GPU pod per node strands six GPUs on each",
    ),
    pytest.param(
        [*pods_of(2, ["n0", "n0", "n0"]), pod("one", "n1", 1, [0])],
        {"nodes_used": 2, "nodes_full": 0, "nodes_partly_used": 2, "gpus_stranded": 9,
         "stranded_per_partly_used": 4.5, "gpus_used": 7},
        id="partly used nodes: 2 free on one, 7 on the other",
    ),
    pytest.param(
        [*pods_of(2, ["n0"] * 4), *pods_of(1, ["n1"] * 3)],
        {"nodes_used": 2, "nodes_full": 1, "nodes_partly_used": 1, "gpus_stranded": 5,
         "stranded_per_partly_used": 5.0, "gpus_used": 11},
        id="one full node and one partly used",
    ),
    pytest.param(
        [pod("plain-a", "n2", 0), pod("plain-b", "n3", 0), *pods_of(1, ["n0"])],
        {"nodes_used": 1, "plain_pods": 2, "gpu_pods": 1, "gpus_stranded": 7},
        id="plain pods use no node's GPUs",
    ),
    pytest.param(
        [*pods_of(1, ["n0", None, None])],
        {"gpu_pods": 3, "gpu_pods_bound": 1, "nodes_used": 1, "gpus_stranded": 7},
        id="pending GPU pods count, unbound",
    ),
    pytest.param(
        [],
        {"gpu_pods": 0, "nodes_used": 0, "nodes_full": 0, "gpus_stranded": 0,
         "nvlink_fit": None},
        id="no pods",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("pods", "expected"), LAYOUTS)
def test_packing_figures(pods: list[PodRecord], expected: dict[str, object]) -> None:
    figures = placement_quality(pods, NODES).as_json()
    assert {key: figures[key] for key in expected} == expected


NVLINK = [
    pytest.param([pod("a", "n0", 2, [0, 1])], 1, 1.0, id="two GPUs in one group"),
    pytest.param([pod("a", "n0", 2, [3, 4])], 1, 0.0, id="two GPUs across the groups"),
    pytest.param([pod("a", "n0", 4, [4, 5, 6, 7])], 1, 1.0, id="a whole group"),
    pytest.param(
        [pod("a", "n0", 2, [0, 1]), pod("b", "n0", 2, [2, 5]), pod("c", "n1", 2, [6, 7]),
         pod("d", "n1", 2, [3, 4])],
        4, 0.5, id="half in, half across",
    ),
    pytest.param([pod("a", "n0", 2)], 0, None, id="no gpu-ids annotation: n/a"),
    pytest.param(
        [pod("a", "n0", 2, [0])], 0, None,
        id="fewer ids than GPUs (the null extenders' dummy '0'): not judged",
    ),
    pytest.param([pod("a", "n0", 1, [0])], 0, None, id="one-GPU pods are not judged"),
    pytest.param([pod("a", "flat", 2, [0, 1])], 0, None, id="a node without groups: n/a"),
    pytest.param(
        [pod("a", "n0", 2, [0, 1]), pod("b", "n0", 2), pod("c", "n0", 2, [1, 4])],
        2, 0.5, id="only the pods with ids count",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("pods", "judged", "fit"), NVLINK)
def test_nvlink_fit(pods: list[PodRecord], judged: int, fit: float | None) -> None:
    quality = placement_quality(pods, [*NODES, node("flat", groups=())])
    assert (quality.nvlink_judged, quality.nvlink_fit) == (judged, fit)


CHOICES = [
    pytest.param({"best": 2, "lower": 1}, {"best": 12, "lower": 4, "unscored": 1},
                 {"best": 10, "lower": 3, "unscored": 1}, 10 / 14, id="window difference"),
    pytest.param(None, {"best": 5}, {"best": 5, "lower": 0, "unscored": 0}, 1.0,
                 id="no scrape before: counted from zero"),
    pytest.param({"best": 5}, {"best": 5}, {"best": 0, "lower": 0, "unscored": 0}, None,
                 id="no binds in the window: n/a"),
    pytest.param({}, {}, None, None, id="metric absent: n/a"),
    pytest.param(None, None, None, None, id="no schedext: n/a"),
]  # fmt: skip


@pytest.mark.parametrize(("before", "after", "counts", "best_share"), CHOICES)
def test_best_node_share_from_the_choice_counter(
    before: dict[str, float] | None,
    after: dict[str, float] | None,
    counts: dict[str, int] | None,
    best_share: float | None,
) -> None:
    assert choice_counts(before, after) == counts
    quality = placement_quality([], NODES, counts)
    assert quality.best_choice_share == best_share


def test_records_from_the_benchmarks_api_objects() -> None:
    h100 = payloads.make_node(0, random.Random(1), gpu=payloads.MODELS[0])
    assert node_record(h100) == node("node-00000")
    assert node_record(payloads.make_node(9, random.Random(1))) == NodeRecord("node-00009", 0)

    bound = payloads.make_pod("a", gpus=2, node="node-00000", gpu_ids=[4, 5])
    assert pod_record(bound) == pod("a", "node-00000", 2, [4, 5])
    pending = payloads.make_pod("b", gpus=1)
    assert pod_record(pending) == pod("b", None, 1)


@pytest.mark.parametrize(
    ("annotation", "ids"),
    [("3,4", (3, 4)), ("", ()), ("a,b", None), ("0", (0,))],
)
def test_unreadable_gpu_ids_are_no_ids(annotation: str, ids: tuple[int, ...] | None) -> None:
    obj = payloads.make_pod("a", gpus=2, node="n0", gpu_ids=[0, 1])
    obj["metadata"]["annotations"]["schedext.io/gpu-ids"] = annotation
    assert pod_record(obj).gpu_ids == ids


def test_a_plain_pod_record_has_no_gpus_and_an_unreadable_topology_no_groups() -> None:
    plain = payloads.make_pod("a", gpus=0, node="n0")
    assert pod_record(plain).gpus == 0
    broken = payloads.make_node(0, random.Random(1), gpu=payloads.MODELS[0])
    broken["metadata"]["annotations"]["schedext.io/gpu-topology"] = "{not json"
    assert node_record(broken) == NodeRecord("node-00000", 8)


def test_medians_per_kind_skip_missing_figures() -> None:
    spread = placement_quality(pods_of(2, ["n0", "n1"]), NODES).as_json()
    packed = placement_quality(pods_of(2, ["n0"] * 4), NODES).as_json()
    half = placement_quality([pod("a", "n0", 2, [0, 1]), pod("b", "n0", 2, [3, 4])], NODES)
    result = medians([spread, packed, half.as_json()])
    assert result["nodes_used"] == 1  # of 2, 1, 1
    assert result["gpus_stranded"] == 4  # of 12, 0, 4
    assert result["nvlink_fit"] == 1.0  # of 1.0, 1.0, 0.5
    assert result["best_choice_share"] is None  # no phase had the metric


def test_table_rows_say_n_a_for_what_a_phase_could_not_have() -> None:
    figures = Quality(
        gpu_pods=4, gpu_pods_bound=4, plain_pods=0, gpus_used=8, nodes_used=1, nodes_full=1,
        nodes_partly_used=0, gpus_stranded=0, nvlink_judged=0, nvlink_fit=None,
    ).as_json()  # fmt: skip
    row = table_row("B1", figures)
    assert row.split() == ["B1", "4", "4", "0", "1", "1", "0", "n/a", "n/a", "n/a"]
    assert table_row("B", medians([figures])).split() == ["B", "1", "1", "0", "n/a", "n/a", "n/a"]


# ---------------------------------------------------------------------------------------------
# The mix
# ---------------------------------------------------------------------------------------------

MIXES = [
    pytest.param(1.0, [1, 2, 1, 2, 1, 2, 1, 2, 1, 2], id="all GPU pods, 1 and 2 alternately"),
    pytest.param(0.5, [0, 1, 0, 2, 0, 1, 0, 2, 0, 1], id="every other pod"),
    pytest.param(0.2, [0, 0, 0, 0, 1, 0, 0, 0, 0, 2], id="one in five, the fifth"),
    pytest.param(0.3, [0, 0, 0, 1, 0, 0, 2, 0, 0, 1], id="three in ten, evenly"),
]


@pytest.mark.parametrize(("share", "gpus"), MIXES)
def test_the_mix_interleaves_gpu_pods_evenly(share: float, gpus: list[int]) -> None:
    mix = Mix(share)
    assert [mix.gpus(i) for i in range(10)] == gpus


@pytest.mark.parametrize(
    ("share", "pods", "counts"),
    [(1.0, 20, (20, 0)), (0.2, 400, (80, 320)), (0.5, 21, (10, 11)), (0.3, 2000, (600, 1400))],
)
def test_the_mix_counts_match_its_pods(share: float, pods: int, counts: tuple[int, int]) -> None:
    mix = Mix(share)
    assert mix.counts(pods) == counts
    assert sum(1 for i in range(pods) if mix.gpus(i)) == counts[0]


@pytest.mark.parametrize("share", [0.0, -0.5, 1.01, float("nan"), float("inf")])
def test_a_share_outside_zero_to_one_is_refused(share: float) -> None:
    with pytest.raises(ValueError, match="GPU share must be in"):
        Mix(share)
