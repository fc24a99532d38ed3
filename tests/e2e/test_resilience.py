"""Restarts and broken watches: no GPU is ever given twice, and nothing is lost."""

from __future__ import annotations

import threading
import time

import httpx

from tests.e2e.conftest import Cluster, eventually
from tests.e2e.test_scheduling import H100, _assert_no_gpu_given_twice


def test_schedext_killed_and_restarted_while_pods_arrive(cluster: Cluster) -> None:
    nodes = {f"gpu-{i}": 5 for i in range(6)}
    for name, gpus in nodes.items():
        cluster.node(name, gpus=gpus, model=H100)
    # As many 1-GPU pods as GPUs: every pod must end up bound, with every GPU given once.
    requests = {f"job-{i:02d}": 1 for i in range(sum(nodes.values()))}
    created = threading.Event()
    outage = threading.Event()  # set from the kill until schedext is ready again
    during_outage: list[str] = []
    errors: list[BaseException] = []

    def create_all() -> None:
        try:
            for index, name in enumerate(requests):
                down = outage.is_set()
                cluster.pod(name, gpus=1)
                if down and outage.is_set():  # created, start to end, while schedext was down
                    during_outage.append(name)
                if index == 9:
                    created.set()
                time.sleep(0.1)  # a steady stream of arrivals, bounded: 30 pods
        except BaseException as error:  # noqa: BLE001 - reported by the main thread
            errors.append(error)

    creator = threading.Thread(target=create_all)
    creator.start()
    assert created.wait(timeout=60)
    cluster.schedext.stop(kill=True)  # mid-stream, binds possibly in flight
    outage.set()
    time.sleep(1.0)  # an outage during which pods keep arriving (bounded, not a wait-for)
    cluster.schedext.start()  # returns once /readyz says ready
    outage.clear()
    creator.join(timeout=120)
    assert not errors, errors
    assert len(during_outage) >= 3, f"too few pods arrived during the outage: {during_outage}"

    eventually(
        lambda: len(cluster.bound_pods()) == len(requests),
        timeout=150,
        message="not every pod is bound",
    )
    bound = cluster.bound_pods()
    assert [name for name in during_outage if name not in bound] == []
    per_pod = _assert_no_gpu_given_twice(cluster)
    assert all(len(per_pod[name]) == 1 for name in requests)
    assert len(per_pod) == sum(nodes.values())


def _inventory_holders(cluster: Cluster) -> dict[str, tuple[str, tuple[int, ...]]]:
    """What schedext believes: pod -> (node, GPU indices)."""
    nodes = httpx.get(f"{cluster.schedext.url}/inventory", timeout=10).json()["nodes"]
    held: dict[str, list[int]] = {}
    where: dict[str, str] = {}
    for node in nodes:
        for gpu in node["gpus"]:
            if gpu["holder"]:
                name = gpu["holder"].split("/", 1)[1]
                held.setdefault(name, []).append(gpu["index"])
                where[name] = node["name"]
    return {name: (where[name], tuple(sorted(ids))) for name, ids in held.items()}


def _api_nodes(cluster: Cluster) -> set[str]:
    return {n["metadata"]["name"] for n in cluster.api.apply_raw("GET", "/api/v1/nodes")["items"]}


def _api_holders(cluster: Cluster) -> dict[str, tuple[str, tuple[int, ...]]]:
    """What the API server says, for pods on nodes that exist (no controller here deletes the
    pods of a deleted node)."""
    nodes = _api_nodes(cluster)
    return {
        name: (node, tuple(cluster.gpu_ids(name)))
        for name, node in cluster.bound_pods().items()
        if node in nodes
    }


def _eventually_consistent(cluster: Cluster, timeout: float = 60) -> None:
    """Wait until schedext's view equals the API server's; on timeout, show both."""
    seen: list[tuple[object, object]] = []

    def same() -> bool:
        ours, theirs = _inventory_holders(cluster), _api_holders(cluster)
        seen[:] = [(ours, theirs)]
        return ours == theirs

    try:
        eventually(
            same, timeout=timeout, message="schedext's inventory differs from the API server"
        )
    except AssertionError as error:
        raise AssertionError(f"{error}: schedext {seen[0][0]} vs API {seen[0][1]}") from None


def test_watch_cut_by_an_apiserver_restart_recovers_without_losing_events(cluster: Cluster) -> None:
    cluster.node("gpu-a", gpus=4, model=H100)
    cluster.node("gpu-b", gpus=4, model=H100)
    for name in ("p0", "p1", "p2"):
        cluster.pod(name, gpus=1)
        cluster.wait_bound(name)
    _eventually_consistent(cluster)

    cluster.cp.restart_apiserver()
    # Events right after the restart, while schedext's watches are still reconnecting.
    cluster.api.delete_pod(cluster.namespace, "p0")
    cluster.pod("p3", gpus=2)
    cluster.api.delete_node("gpu-b")
    cluster.node("gpu-c", gpus=2, model=H100)

    cluster.wait_bound("p3", timeout=90)
    _eventually_consistent(cluster)
    inventory = httpx.get(f"{cluster.schedext.url}/inventory", timeout=10).json()
    assert {n["name"] for n in inventory["nodes"]} == _api_nodes(cluster) == {"gpu-a", "gpu-c"}
    assert (
        cluster.metric("schedext_watch_restarts_total", cause="gone", resource="pods")
        + cluster.metric("schedext_watch_restarts_total", cause="broken", resource="pods")
        >= 1
    )
    assert 0 <= cluster.metric("schedext_watch_last_event_age_seconds", resource="pods") < 120
    # and it keeps scheduling
    cluster.pod("p4", gpus=2)
    assert cluster.wait_bound("p4", timeout=60) in {"gpu-a", "gpu-c"}
    _assert_no_gpu_given_twice(cluster)
