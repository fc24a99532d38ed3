"""Explain and GPU shares: the share in the request's description, the devices a placed share
holds, and the per-node detail for nodes without room (where filter's answer stays grouped)."""

from __future__ import annotations

from typing import Any

import pytest

from extender.scheduler import Scheduler
from testbed.builders import make_node, make_pod, share_pod
from tests.mig_builders import mig_node, mig_pod
from tests.unit.helpers import scheduler_with


def shared_cluster(*pending: dict[str, Any]) -> Scheduler:
    """``g``: 4 GPUs of 40000 MiB; GPU 0 holds a 30000 MiB, 50% share, GPU 1 a 28000 MiB,
    60% one, GPUs 2-3 a whole-GPU pod. ``h``: 2 GPUs, both held whole. ``cpu``: no GPUs."""
    return scheduler_with(
        [make_node("g", gpus=4, gpu_memory_mib=40000), make_node("h", gpus=2), make_node("cpu")],
        [
            share_pod("a", memory_mib=30000, cores=50, node="g", gpu_ids=[0]),
            share_pod("b", memory_mib=28000, cores=60, node="g", gpu_ids=[1]),
            make_pod("whole", gpus=2, node="g", gpu_ids=[2, 3]),
            make_pod("full", gpus=2, node="h", gpu_ids=[0, 1]),
            *pending,
        ],
    )


HELD_WHOLE = "every GPU is held whole or unhealthy"
NO_GPUS = "schedext: node has no GPUs"
MEMORY_20000 = "schedext: no GPU with 20000 MiB free"
CORES_55 = "schedext: no GPU with 5000 MiB and 55% of the cores free"
TWO_11000 = "schedext: fewer than 2 GPUs with 11000 MiB free"


@pytest.mark.parametrize(
    ("pod", "expected"),
    [
        pytest.param(
            share_pod("p", memory_mib=20000),
            {
                "g": (MEMORY_20000, f"{MEMORY_20000}: largest free 12000 MiB on GPU 1"),
                "h": (MEMORY_20000, f"{MEMORY_20000}: {HELD_WHOLE}"),
            },
            id="memory",
        ),
        pytest.param(
            share_pod("p", memory_mib=5000, cores=55),
            {
                "g": (
                    "schedext: no GPU with 5000 MiB and 55% cores free",
                    f"{CORES_55}: largest free 12000 MiB on GPU 1, most cores free 50% on GPU 0",
                ),
                # No device of h has the memory: the memory reason, and the same detail.
                "h": ("schedext: no GPU with 5000 MiB free", f"{CORES_55}: {HELD_WHOLE}"),
            },
            id="cores",
        ),
        pytest.param(
            share_pod("p", memory_mib=11000, shares=2),
            {
                "g": (TWO_11000, f"{TWO_11000}: largest free 12000 MiB on GPU 1"),
                "h": (TWO_11000, f"{TWO_11000}: {HELD_WHOLE}"),
            },
            id="two-devices",
        ),
        pytest.param(
            share_pod("p", memory_mib=10000),
            {
                "h": (
                    "schedext: no GPU with 10000 MiB free",
                    f"schedext: no GPU with 10000 MiB free: {HELD_WHOLE}",
                )
            },
            id="fits-on-g",
        ),
    ],
)
def test_explain_names_each_nodes_largest_free_share_where_filter_groups(
    pod: dict[str, Any], expected: dict[str, tuple[str, str]]
) -> None:
    scheduler = shared_cluster(pod)
    filtered = scheduler.filter(pod, ["g", "h", "cpu"]).failed
    explained = scheduler.explain("default", "p")
    assert explained is not None
    # Filter's wire answer names the need only; explain adds each node's own detail.
    assert filtered == {node: grouped for node, (grouped, _) in expected.items()} | {"cpu": NO_GPUS}
    reasons = {n.node: n.reason for n in explained.nodes if not n.fits}
    # Another reason than a share's room keeps filter's message.
    assert reasons == {node: detail for node, (_, detail) in expected.items()} | {"cpu": NO_GPUS}
    assert all(n.resolvable for n in explained.nodes if n.node != "cpu" and not n.fits)


def test_a_pending_share_pod_is_described_by_its_share() -> None:
    scheduler = shared_cluster(share_pod("p", memory_mib=20000, cores=30, shares=2))
    explained = scheduler.explain("default", "p")
    assert explained is not None
    request = dict(explained.request)
    assert (request["gpus"], request["shares"]) == (0, 2)
    assert (request["shareMemoryMiB"], request["shareCores"]) == (20000, 30)
    assert "gpuIds" not in request


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("a", {"gpuIds": [0], "shares": 1, "shareMemoryMiB": 30000, "shareCores": 50}),
        ("b", {"gpuIds": [1], "shares": 1, "shareMemoryMiB": 28000, "shareCores": 60}),
        ("whole", {"gpus": 2, "gpuIds": [2, 3]}),
    ],
)
def test_a_bound_pod_shows_its_devices_and_its_share(
    name: str, expected: dict[str, object]
) -> None:
    explained = shared_cluster().explain("default", name)
    assert explained is not None
    assert (explained.state, explained.node) == ("bound", "g")
    request = dict(explained.request)
    assert {key: request[key] for key in expected} == expected
    if name == "whole":  # a whole-GPU pod has no share fields
        assert not {"shares", "shareMemoryMiB", "shareCores"} & set(request)


def test_a_reserved_share_pod_shows_the_devices_its_reservation_holds() -> None:
    pod = share_pod("p", memory_mib=8000, cores=20)
    scheduler = shared_cluster(pod)
    assert scheduler.filter(pod, ["g"]).passed == ["g"]
    plan = scheduler.plan_bind(
        uid=pod["metadata"]["uid"], namespace="default", name="p", node="g", now=0.0
    )
    explained = scheduler.explain("default", "p")
    assert explained is not None
    assert (explained.state, explained.node) == ("reserved", "g")
    request = dict(explained.request)
    assert request["gpuIds"] == list(plan.gpu_ids)
    assert (request["shares"], request["shareMemoryMiB"], request["shareCores"]) == (1, 8000, 20)


def test_explain_and_the_reservation_count_tell_the_same_state_at_every_step() -> None:
    """ "reserved" in explain is one of the inventory's reservations, and nothing else."""
    scheduler = scheduler_with([make_node("g", gpus=2)])
    pod = make_pod("p", gpus=1)
    seen = []

    def step(name: str) -> None:
        explanation = scheduler.explain("default", "p")
        assert explanation is not None
        seen.append((name, explanation.state, scheduler.reservation_count))

    scheduler.filter(pod, ["g"])
    step("filtered")
    plan = scheduler.plan_bind(uid=pod["metadata"]["uid"], namespace="default", name="p",
                               node="g", now=0.0)  # fmt: skip
    step("bind planned")
    scheduler.confirm_bind(plan, awaiting_watch=True)
    step("bound by the API, not yet seen by the watch")
    scheduler.upsert_pod({**pod, "spec": {**pod["spec"], "nodeName": "g"}})
    step("seen bound by the watch")
    scheduler.filter(pod, ["g"])  # by hand: kube-scheduler never filters a bound pod
    step("filtered again once bound")
    assert seen == [
        ("filtered", "pending", 0),
        ("bind planned", "reserved", 1),
        ("bound by the API, not yet seen by the watch", "reserved", 1),
        ("seen bound by the watch", "bound", 0),
        ("filtered again once bound", "bound", 0),
    ]


def test_explain_scores_each_node_the_pod_fits_as_prioritize_does_and_no_other() -> None:
    scheduler = scheduler_with(
        [make_node("busy", gpus=8), make_node("idle", gpus=8), make_node("cpu")],
        [make_pod("b", gpus=6, node="busy", gpu_ids=[0, 1, 2, 3, 4, 5])],
    )
    pod = make_pod("p", gpus=2)
    scheduler.filter(pod, ["busy", "idle", "cpu"])
    explanation = scheduler.explain("default", "p")
    assert explanation is not None
    scores = dict(zip(["busy", "idle"], scheduler.prioritize(pod, ["busy", "idle"]).tolist(),
                      strict=True))  # fmt: skip
    assert {n.node: n.score for n in explanation.nodes} == {**scores, "cpu": None}
    assert scores["busy"] > scores["idle"] > 0  # absolute: the lowest is not taken off


def test_explain_names_the_mig_devices_a_pod_asks_and_no_other_kinds() -> None:
    scheduler = scheduler_with(
        [mig_node("m", migs={0: ["1g.10gb"] * 7})],
        [mig_pod("mig", {"1g.10gb": 2}, namespace="ml")],
    )
    explanation = scheduler.explain("ml", "mig")
    assert explanation is not None
    assert explanation.request["mig"] == {"1g.10gb": 2}
    assert "shares" not in explanation.request
