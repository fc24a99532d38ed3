"""Holds against starvation (docs/gangs.md) against the real kube-scheduler: a stream of 1-GPU
pods keeps every GPU busy, each GPU that frees is taken at once, and a gang that needs whole
nodes would never see them free together; once it has waited ``gang.hold_after_s`` it gets a
hold, the held nodes drain, and the gang is placed while the stream goes on elsewhere."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from extender import names
from testbed.stream import SmallPodStream
from tests.e2e.conftest import Cluster, eventually
from tests.e2e.test_gangs import members
from tests.e2e.test_scheduling import H100, _assert_no_gpu_given_twice

HOLD_AFTER_S = 5
HOLD_ENV = {"SCHEDEXT_GANG__HOLD_AFTER_S": str(HOLD_AFTER_S)}
PLACED_WITHIN_S = 120.0  # the bound, from the gang's arrival


def small_pods(cluster: Cluster, **kwargs: Any) -> SmallPodStream:
    """1-GPU pods kept pending a few at a time, each deleted 3-5 s after it is bound."""
    cp = cluster.cp
    return SmallPodStream(cp.server, cp.token, cp.ca_cert, cluster.namespace, **kwargs)


def hold_record(cluster: Cluster, group: str) -> dict[str, Any] | None:
    annotations = cluster.get_pod_group(group)["metadata"].get("annotations") or {}
    text = annotations.get(names.GANG_HOLD)
    return json.loads(text) if text else None


def group_events(cluster: Cluster, group: str) -> list[str]:
    selector = f"involvedObject.kind=PodGroup,involvedObject.name={group}"
    path = f"/api/v1/namespaces/{cluster.namespace}/events"
    items = cluster.api.apply_raw("GET", path, params={"fieldSelector": selector})["items"]
    return [str(item.get("reason", "")) for item in items]


def gang_nodes(cluster: Cluster, pods: list[str]) -> set[str]:
    """The nodes of ``pods`` once every one is bound; empty until then."""
    bound = cluster.bound_pods()
    return {bound[pod] for pod in pods} if all(pod in bound for pod in pods) else set()


@pytest.mark.schedext_env(HOLD_ENV)
def test_a_starved_gang_gets_a_hold_and_is_placed_while_the_stream_goes_elsewhere(
    cluster: Cluster,
) -> None:
    nodes = [f"gpu-{i}" for i in range(6)]
    for node in nodes:
        cluster.node(node, gpus=8, model=H100)
    with small_pods(cluster, max_s=300) as stream:
        eventually(lambda: stream.running >= 48, timeout=60, message="the cluster never filled")
        cluster.pod_group("big", min_member=4)
        arrived = time.monotonic()
        gang = members(cluster, "big", 4, gpus=8)
        record = eventually(
            lambda: hold_record(cluster, "big"), timeout=60, message="no hold recorded"
        )
        held_seen = time.monotonic()
        held = set(record["nodes"])
        assert len(held) == 4, record
        assert set(record["nodes"].values()) == {8}, record
        placed_on = eventually(
            lambda: gang_nodes(cluster, gang),
            timeout=PLACED_WITHIN_S - (time.monotonic() - arrived),
            message=f"the gang was not placed within {PLACED_WITHIN_S:g}s of arriving",
        )
        placed = time.monotonic()
        assert placed_on == held  # where the hold kept the GPUs
        others = set(nodes) - held
        # The stream went on on the nodes not held, and none of its pods got a held GPU.
        assert stream.placements(held_seen, placed, nodes=others)
        assert not stream.placements(held_seen, placed, nodes=held)
        eventually(
            lambda: hold_record(cluster, "big") is None,
            message="the hold's record stayed on the PodGroup after the gang was placed",
        )
        eventually(  # and goes on after
            lambda: stream.placements(placed, nodes=others), message="the stream stopped"
        )
        stream.stop()
    reasons = eventually(
        lambda: (r := group_events(cluster, "big")) and "GangHoldEnded" in r and r,
        message="no GangHoldEnded event on the PodGroup",
    )
    assert "GangHoldStarted" in reasons
    assert "GangHoldExpired" not in reasons
    assert cluster.metric("schedext_gang_hold_events_total", event="started") == 1
    assert cluster.metric("schedext_gang_hold_events_total", event="ended") == 1
    assert cluster.metric("schedext_gang_hold_idle_gpu_seconds_total") > 0
    assert cluster.metric("schedext_gang_holds") == 0
    _assert_no_gpu_given_twice(cluster)
