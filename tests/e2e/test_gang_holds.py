"""Holds against starvation (docs/gangs.md) against the real kube-scheduler: a stream of 1-GPU
pods keeps every GPU busy, each GPU that frees is taken at once, and a gang that needs whole
nodes would never see them free together; once it has waited ``gang.hold_after_s`` it gets a
hold, the held nodes drain, and the gang is placed while the stream goes on elsewhere."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from extender import names
from testbed.stream import SmallPodStream
from tests.e2e.conftest import Cluster, eventually
from tests.e2e.test_failover import Replica, leader_and_standby
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


def group_events(cluster: Cluster, group: str) -> list[dict[str, Any]]:
    """The PodGroup's events, oldest first."""
    selector = f"involvedObject.kind=PodGroup,involvedObject.name={group}"
    path = f"/api/v1/namespaces/{cluster.namespace}/events"
    items: list[dict[str, Any]] = cluster.api.apply_raw(
        "GET", path, params={"fieldSelector": selector}
    )["items"]
    return sorted(items, key=lambda e: (e.get("firstTimestamp") or "", e["metadata"]["name"]))


def reasons(cluster: Cluster, group: str) -> list[str]:
    return [str(event.get("reason", "")) for event in group_events(cluster, group)]


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
    told = eventually(
        lambda: (r := reasons(cluster, "big")) and "GangHoldEnded" in r and r,
        message="no GangHoldEnded event on the PodGroup",
    )
    assert "GangHoldStarted" in told
    assert "GangHoldExpired" not in told
    assert cluster.metric("schedext_gang_hold_events_total", event="started") == 1
    assert cluster.metric("schedext_gang_hold_events_total", event="ended") == 1
    assert cluster.metric("schedext_gang_hold_idle_gpu_seconds_total") > 0
    assert cluster.metric("schedext_gang_holds") == 0
    _assert_no_gpu_given_twice(cluster)


def replica_metric(replica: Replica, name: str, **labels: str) -> float:
    """A counter or gauge from that replica's /metrics (0 when absent)."""
    text = httpx.get(f"{replica.url}/metrics", timeout=10).text
    wanted = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    key = f"{name}{{{wanted}}}" if labels else name
    return next((float(line.split()[-1]) for line in text.splitlines()
                 if line.startswith(key + " ")), 0.0)  # fmt: skip


@pytest.fixture
def held_replicas(cluster: Cluster, tmp_path: Path) -> Iterator[tuple[Replica, Replica]]:
    with leader_and_standby(cluster, tmp_path, HOLD_ENV) as pair:
        yield pair


def test_a_new_leader_keeps_the_hold_its_predecessor_recorded_and_the_gang_is_placed(
    cluster: Cluster, held_replicas: tuple[Replica, Replica]
) -> None:
    first, second = held_replicas
    nodes = [f"gpu-{i}" for i in range(3)]
    for node in nodes:
        cluster.node(node, gpus=8, model=H100)
    # Pods that run 10-15 s: the failover (a lease of 5 s) does not drain every node.
    with small_pods(cluster, lifetime_s=(10, 15), max_s=300) as stream:
        eventually(lambda: stream.running >= 24, timeout=60, message="the cluster never filled")
        cluster.pod_group("pair", min_member=2)
        gang = members(cluster, "pair", 2, gpus=8)
        record = eventually(
            lambda: hold_record(cluster, "pair"), timeout=60, message="no hold recorded"
        )
        held = set(record["nodes"])
        assert len(held) == 2, record
        first.schedext.stop(kill=True)  # while the hold stands: no handover of any kind
        second.schedext.wait_ready(timeout=60)
        leading = time.monotonic()
        # Until the gang is placed the PodGroup carries the same record: the new leader
        # adopted it (a hold it chose itself would have started anew).
        records: list[dict[str, Any] | None] = []

        def placed() -> set[str]:
            records.append(hold_record(cluster, "pair"))
            return gang_nodes(cluster, gang)

        placed_on = eventually(placed, timeout=120, message="the gang was not placed")
        gang_placed = time.monotonic()
        assert placed_on == held
        assert all(seen in (record, None) for seen in records), records
        # No pod of the stream got a held GPU from the new leader.
        assert not stream.placements(leading, gang_placed, nodes=held)
        assert stream.placements(leading, gang_placed, nodes=set(nodes) - held)
        eventually(
            lambda: hold_record(cluster, "pair") is None,
            message="the hold's record stayed on the PodGroup after the gang was placed",
        )
        stream.stop()
    assert replica_metric(second, "schedext_gang_hold_events_total", event="started") == 1
    assert replica_metric(second, "schedext_gang_hold_events_total", event="ended") == 1
    messages = eventually(
        lambda: [
            e["message"] for e in group_events(cluster, "pair")
            if e["reason"] == "GangHoldStarted"
        ][1:],
        message="no second GangHoldStarted event (the new leader's)",
    )  # fmt: skip
    assert len(messages) == 1
    assert "adopted from its PodGroup" in messages[0]
    _assert_no_gpu_given_twice(cluster)
