from typing import Any

import pytest

from extender.policy import GpuScoring, PolicyConfig
from extender.requests import PodRequestError
from testbed.builders import make_node, make_pod
from tests.unit.helpers import scheduler_with

NVLINK_2X4 = [[0, 1, 2, 3], [4, 5, 6, 7]]


def scores(
    nodes: list[dict[str, Any]],
    pod: dict[str, Any],
    bound: list[dict[str, Any]] = (),
    config: PolicyConfig | None = None,
) -> dict[str, int]:  # type: ignore[assignment]
    scheduler = scheduler_with(nodes, bound, config)
    names = [n["metadata"]["name"] for n in nodes] + ["ghost"]
    return dict(zip(names, scheduler.prioritize(pod, names).tolist(), strict=True))


def test_binpacking_prefers_the_fuller_gpu_node() -> None:
    got = scores(
        [make_node("full", gpus=8), make_node("empty", gpus=8)],
        make_pod(gpus=2),
        bound=[make_pod("b", gpus=4, node="full", gpu_ids=[0, 1, 2, 3])],
    )
    assert got["full"] > got["empty"]


def test_spread_prefers_the_emptier_gpu_node() -> None:
    got = scores(
        [make_node("full", gpus=8), make_node("empty", gpus=8)],
        make_pod(gpus=2),
        bound=[make_pod("b", gpus=4, node="full", gpu_ids=[0, 1, 2, 3])],
        config=PolicyConfig(gpu_scoring=GpuScoring.SPREAD),
    )
    assert got["empty"] > got["full"]


def test_fitting_inside_one_nvlink_group_earns_the_topology_bonus() -> None:
    # Both nodes have 4 free GPUs; only on "whole" do they share one NVLink group.
    got = scores(
        [
            make_node("whole", gpus=8, groups=NVLINK_2X4),
            make_node("split", gpus=8, groups=NVLINK_2X4),
        ],
        make_pod(gpus=4),
        bound=[
            make_pod("a", gpus=4, node="whole", gpu_ids=[0, 1, 2, 3]),
            make_pod("b", gpus=4, node="split", gpu_ids=[0, 1, 4, 5]),
        ],
    )
    assert got["whole"] > got["split"]


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        (PolicyConfig(allocation_weight=1, topology_weight=0), 10),
        (PolicyConfig(allocation_weight=0, topology_weight=1), 10),
        (PolicyConfig(), 10),
    ],
    ids=["allocation only", "topology only", "default weights"],
)
def test_a_perfect_fit_scores_ten(config: PolicyConfig, expected: int) -> None:
    got = scores([make_node("g", gpus=4, groups=[[0, 1, 2, 3]])], make_pod(gpus=4), config=config)
    assert got["g"] == expected


def test_scores_are_integers_between_0_and_10() -> None:
    nodes = [make_node(f"g{i}", gpus=8, groups=NVLINK_2X4) for i in range(8)]
    bound = [make_pod(f"b{i}", gpus=i, node=f"g{i}", gpu_ids=list(range(i))) for i in range(1, 8)]
    got = scores(nodes, make_pod(gpus=1), bound=bound)
    assert all(isinstance(s, int) and 0 <= s <= 10 for s in got.values())
    assert len(set(got.values())) > 2  # the score actually discriminates


def test_pods_without_gpus_prefer_nodes_without_gpus() -> None:
    got = scores([make_node("cpu"), make_node("gpu", gpus=4)], make_pod())
    assert got == {"cpu": 10, "gpu": 0, "ghost": 0}


def test_unknown_nodes_score_zero() -> None:
    assert scores([make_node("g", gpus=4)], make_pod(gpus=1))["ghost"] == 0


def test_invalid_pod_is_refused_with_the_reason_filter_gives() -> None:
    scheduler = scheduler_with([make_node("g", gpus=4)])
    pod = make_pod(gpus=1, workload="bogus")
    with pytest.raises(PodRequestError) as refused:
        scheduler.prioritize(pod, ["g"])
    rejection = scheduler.filter(pod, ["g"]).rejections[0]
    assert refused.value.reason == rejection.message
    assert "label workload-type='bogus' must be" in rejection.message


def test_prioritize_after_filter_reuses_the_filter_result_and_stays_correct() -> None:
    scheduler = scheduler_with(
        [make_node(f"g{i}", gpus=4) for i in range(4)],
        [make_pod("b", gpus=3, node="g2", gpu_ids=[0, 1, 2])],
    )
    pod = make_pod(gpus=1)
    passed = scheduler.filter(pod, ["g0", "g1", "g2", "g3"]).passed
    after_filter = scheduler.prioritize(pod, passed).tolist()
    scheduler.upsert_node(make_node("g9", gpus=4))  # changes the name -> id layout
    fresh = scheduler.prioritize(pod, passed).tolist()
    assert after_filter == fresh
    assert after_filter[passed.index("g2")] == max(after_filter)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"allocation_weight": -1},
        {"topology_weight": -1},
        {"allocation_weight": 0, "topology_weight": 0},
        {"cpu_intensive_min_cpu_milli": -5},
        {"gpu_resource": "gpu"},
    ],
)
def test_policy_config_is_validated(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="must"):
        PolicyConfig(**kwargs)
