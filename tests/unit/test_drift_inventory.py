"""The scheduler's side of drift: a node agent's ``schedext.io/gpu-drift`` becomes held GPUs
(never handed out twice), a filter reason that names them, explain's lines, and a problem when
the document cannot be read."""

from __future__ import annotations

import json
from typing import Any

import pytest

from extender import names
from extender.devices.drift import Cause, Drift, InUse, StaleRecord
from extender.model import Reason, Victim
from testbed.builders import agent_annotations, make_node, make_pod
from tests.mig_builders import mig_node, mig_pod, mig_uuid
from tests.unit.helpers import scheduler_with

GPU = "nvidia.com/gpu"


def uuid(index: int) -> str:
    return f"GPU-n-{index}"


def in_use(index: int, pod: str = "ml/ghost", cause: Cause = Cause.UNKNOWN_POD) -> InUse:
    return InUse(uuid(index), pod, "main", GPU, cause)


def drift_node(drift: Drift | None, gpus: int = 4, **kwargs: Any) -> dict[str, Any]:
    """A node whose agent published UUIDs (GPU-n-<index>) and ``drift``."""
    return make_node("g", gpus=gpus, annotations=agent_annotations(gpus, drift=drift), **kwargs)


GHOST_ON_3 = Drift(in_use=(in_use(3),))
GHOST_MESSAGE = "GPU 3 in use by a container schedext did not place (kubelet: ml/ghost/main)"


def test_a_gpu_in_use_by_a_container_schedext_did_not_place_is_never_free() -> None:
    scheduler = scheduler_with([drift_node(GHOST_ON_3)])
    view = scheduler.inventory.node("g")
    assert view is not None
    assert view.free_gpu_ids == (0, 1, 2)
    assert scheduler.inventory.arrays.gpu_in_use[scheduler.inventory.ids(["g"])[0]] == 1
    pod = make_pod("p", gpus=3)
    assert scheduler.filter(pod, ["g"]).passed == ["g"]
    plan = scheduler.plan_bind(
        uid=pod["metadata"]["uid"], namespace="default", name="p", node="g", now=0.0
    )
    assert plan.gpu_ids == (0, 1, 2)


def test_a_node_short_only_by_such_gpus_says_which_and_whose() -> None:
    scheduler = scheduler_with([drift_node(GHOST_ON_3)])
    (rejection,) = scheduler.filter(make_pod("p", gpus=4), ["g"]).rejections
    assert rejection.reason is Reason.GPU_IN_USE
    assert rejection.message == f"schedext: {GHOST_MESSAGE} (3 free, pod needs 4)"
    assert rejection.resolvable  # evicting schedext's pods may still free others


def test_a_node_short_anyway_is_short_of_free_gpus() -> None:
    holder = make_pod("holder", gpus=2, node="g", gpu_ids=[0, 1])
    scheduler = scheduler_with([drift_node(GHOST_ON_3)], [holder])
    (rejection,) = scheduler.filter(make_pod("p", gpus=3), ["g"]).rejections
    assert rejection.reason is Reason.GPU_FREE


def test_the_gpu_is_free_again_once_the_agent_reports_no_drift() -> None:
    scheduler = scheduler_with([drift_node(GHOST_ON_3)])
    scheduler.upsert_node(drift_node(None))
    view = scheduler.inventory.node("g")
    assert view is not None
    assert view.free_gpu_ids == (0, 1, 2, 3)
    assert not scheduler.inventory.gpus_in_use


def test_a_pod_placed_without_schedext_is_counted_where_the_kubelet_says() -> None:
    # Counted by number, its indices unknown: assumed on the highest free. The kubelet names
    # GPU 0: it is held there, once, and GPU 3 is free.
    stray = make_pod("stray", namespace="ml", gpus=1, node="g")
    drift = Drift(in_use=(in_use(0, "ml/stray", Cause.NOT_PLACED),))
    scheduler = scheduler_with([drift_node(drift)], [stray])
    view = scheduler.inventory.node("g")
    assert view is not None
    assert (view.anonymous_gpus, view.holders[0]) == (0, stray["metadata"]["uid"])
    assert view.free_gpu_ids == (1, 2, 3)


def test_a_pod_holding_another_gpu_than_it_was_given_holds_both() -> None:
    pod = make_pod("a", namespace="ml", gpus=1, node="g", gpu_ids=[0])
    drift = Drift(in_use=(in_use(1, "ml/a", Cause.NOT_GIVEN),))
    scheduler = scheduler_with([drift_node(drift)], [pod])
    view = scheduler.inventory.node("g")
    assert view is not None
    assert view.free_gpu_ids == (2, 3)


def test_without_published_uuids_the_drift_is_shown_but_holds_nothing() -> None:
    annotations = {names.GPU_DRIFT: agent_annotations(1, drift=GHOST_ON_3)[names.GPU_DRIFT]}
    scheduler = scheduler_with([make_node("g", gpus=4, annotations=annotations)])
    view = scheduler.inventory.node("g")
    assert view is not None
    assert view.free_gpu_ids == (0, 1, 2, 3)
    assert view.spec.drift == GHOST_ON_3


def test_a_mig_device_in_use_is_not_free() -> None:
    node = mig_node("n", migs={0: ["1g.10gb", "1g.10gb"]})
    used = InUse(mig_uuid("n", 0, 0), "ml/ghost", "main", "nvidia.com/mig-1g.10gb",
                 Cause.UNKNOWN_POD, mig=True)  # fmt: skip
    node["metadata"]["annotations"][names.GPU_DRIFT] = agent_annotations(
        0, drift=Drift(in_use=(used,))
    )[names.GPU_DRIFT]
    scheduler = scheduler_with([node])
    view = scheduler.inventory.node("n")
    assert view is not None
    assert view.mig.counts()["1g.10gb"].free == 1
    assert scheduler.filter(mig_pod("p", {"1g.10gb": 2}), ["n"]).passed == []


def test_preemption_never_counts_on_freeing_a_gpu_schedext_does_not_hold() -> None:
    low = make_pod("low", uid="low", gpus=1, node="g", gpu_ids=[0], priority=1)
    scheduler = scheduler_with([drift_node(Drift(in_use=(in_use(1),)), gpus=2)], [low])
    chosen = scheduler.preempt(make_pod("p", gpus=2, priority=100), {"g": [Victim("low")]})
    assert chosen == {}
    one = scheduler.preempt(make_pod("q", gpus=1, priority=100), {"g": [Victim("low")]})
    assert one["g"].uids == ["low"]


def test_explain_shows_the_drift_of_every_node() -> None:
    stale = StaleRecord("ml/gone", "u", (uuid(2),), 1000.0, released=True)
    scheduler = scheduler_with([drift_node(Drift(in_use=(in_use(3),), stale=(stale,)))])
    pod = make_pod("p", gpus=4)
    scheduler.filter(pod, ["g"])
    explanation = scheduler.explain("default", "p")
    assert explanation is not None
    (node,) = explanation.nodes
    assert node.drift == (
        GHOST_MESSAGE,
        "stale record: ml/gone holds GPU 2 but the kubelet no longer lists it (released)",
    )


FUTURE = json.dumps({"version": 2, "inUse": [], "stale": []})


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        pytest.param(FUTURE, "version 2 is not supported (this schedext reads 1)", id="future"),
        pytest.param("{broken", "not JSON", id="malformed"),
    ],
)
def test_an_unreadable_drift_is_no_drift_and_is_reported(raw: str, why: str) -> None:
    annotations = agent_annotations(4)
    annotations[names.GPU_DRIFT] = raw
    scheduler = scheduler_with([make_node("g", gpus=4, annotations=annotations)])
    view = scheduler.inventory.node("g")
    assert view is not None
    assert view.free_gpu_ids == (0, 1, 2, 3)
    assert view.spec.drift is None
    assert scheduler.inventory.problems == {"g": (f"{names.GPU_DRIFT}: {why}",)}
