"""schedext driven by a real, unmodified kube-scheduler against a real kube-apiserver."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.e2e.conftest import Cluster, eventually

H100 = "NVIDIA-H100-80GB-HBM3"
A100 = "NVIDIA-A100-SXM4-40GB"


def test_gpu_pods_land_on_nodes_with_free_gpus_of_the_requested_model(cluster: Cluster) -> None:
    cluster.node("a100-1", gpus=4, model=A100, memory_mib=40960)
    cluster.node("h100-1", gpus=4, model=H100, memory_mib=81559, groups=[[0, 1], [2, 3]])
    cluster.node("cpu-1")
    for i in range(2):
        cluster.pod(f"train-{i}", gpus=2, annotations={"schedext.io/gpu-model": "H100"})
    nodes = {name: cluster.wait_bound(name) for name in ("train-0", "train-1")}
    assert set(nodes.values()) == {"h100-1"}
    ids = [cluster.gpu_ids(name) for name in nodes]
    assert sorted(ids[0] + ids[1]) == [0, 1, 2, 3]
    # each pod got one whole NVLink group
    assert sorted(map(sorted, ids)) == [[0, 1], [2, 3]]


CPU_INTENSIVE = {"workload-type": "CPU-intensive"}


def test_cpu_intensive_pod_avoids_nodes_under_the_cpu_threshold(cluster: Cluster) -> None:
    # kube-scheduler's own scoring prefers the small nodes: they are empty and untainted, while
    # "big" is mostly allocated and tainted PreferNoSchedule. Only schedext's CPU threshold
    # (2 CPUs by default; the small nodes have 1.5) can send CPU-intensive pods to "big".
    for i in range(3):
        cluster.node(f"small-{i}", cpu="1500m")
    prefer_not = {"key": "dedicated", "value": "batch", "effect": "PreferNoSchedule"}
    cluster.node("big", cpu="16", taints=[prefer_not])
    cluster.pod("resident", cpu="14", node="big")  # leaves 2 CPUs free
    cluster.scheduler_caught_up()
    # The control: the same pod without the CPU-intensive label, sent to schedext too
    # (managed), lands where kube-scheduler's scores say.
    cluster.pod("control", cpu="500m", managed=True)
    assert cluster.wait_bound("control").startswith("small-")
    for i in range(3):
        cluster.pod(f"crunch-{i}", cpu="500m", managed=True, labels=CPU_INTENSIVE)
    assert {cluster.wait_bound(f"crunch-{i}") for i in range(3)} == {"big"}


def test_cpu_intensive_pod_with_only_small_nodes_stays_pending_with_schedext_reason(
    cluster: Cluster,
) -> None:
    for i in range(3):
        cluster.node(f"small-{i}", cpu="1500m")
    cluster.pod("crunch", cpu="500m", managed=True, labels=CPU_INTENSIVE)

    def failed_scheduling() -> str:
        events = cluster.events("crunch")
        messages = [e.get("message", "") for e in events if e.get("reason") == "FailedScheduling"]
        return next((m for m in messages if "schedext" in m), "")

    message = eventually(
        failed_scheduling, timeout=60, message="no FailedScheduling with schedext's reason"
    )
    assert "0/3 nodes are available: 3 schedext: CPU-intensive needs 2+ CPU nodes" in message
    assert "nodeName" not in cluster.get_pod("crunch")["spec"]


def test_unplaceable_pod_stays_pending_with_schedext_reasons_in_its_event(cluster: Cluster) -> None:
    # kube-scheduler's own filters run first (the node without GPUs fails there); schedext
    # rejects the two GPU nodes and its reasons reach the pod's FailedScheduling event.
    cluster.node("cpu-only")
    cluster.node("a100", gpus=4, model=A100, memory_mib=40960)
    cluster.node("h100-pcie", gpus=4, model=H100, memory_mib=40000)
    annotations = {"schedext.io/gpu-model": "H100", "schedext.io/gpu-memory-mib": "80000"}
    cluster.pod("stuck", gpus=2, annotations=annotations)

    def failed_scheduling() -> str:
        events = cluster.events("stuck")
        messages = [e.get("message", "") for e in events if e.get("reason") == "FailedScheduling"]
        return next((m for m in messages if "schedext" in m), "")

    message = eventually(
        failed_scheduling, timeout=60, message="no FailedScheduling with schedext's reasons"
    )
    assert "0/3 nodes are available" in message
    assert "1 schedext: GPU model is not H100" in message
    assert "1 schedext: GPU memory under 80000 MiB" in message
    assert "1 Insufficient nvidia.com/gpu" in message
    assert "nodeName" not in cluster.get_pod("stuck")["spec"]


@pytest.mark.node_cache_capable(False)
def test_full_node_objects_mode_schedules_correctly(cluster: Cluster) -> None:
    cluster.node("a100", gpus=4, model=A100)
    cluster.node("h100", gpus=4, model=H100)
    cluster.pod("wants-a100", gpus=3, annotations={"schedext.io/gpu-model": "a100"})
    assert cluster.wait_bound("wants-a100") == "a100"
    assert cluster.gpu_ids("wants-a100") == [0, 1, 2]
    metrics = httpx.get(f"{cluster.schedext.url}/metrics", timeout=10).text
    assert 'schedext_requests_by_mode_total{mode="nodes",verb="filter"}' in metrics
    assert 'mode="names"' not in metrics


def test_names_mode_is_what_the_shipped_config_uses(cluster: Cluster) -> None:
    cluster.node("h100-a", gpus=4, model=H100)
    cluster.node("h100-b", gpus=4, model=H100)
    cluster.pod("p", gpus=1)
    cluster.wait_bound("p")
    metrics = httpx.get(f"{cluster.schedext.url}/metrics", timeout=10).text
    assert 'schedext_requests_by_mode_total{mode="names",verb="filter"}' in metrics
    assert 'mode="nodes"' not in metrics


def _assert_no_gpu_given_twice(cluster: Cluster) -> dict[str, list[int]]:
    held: dict[tuple[str, int], str] = {}
    per_pod: dict[str, list[int]] = {}
    for name, node in cluster.bound_pods().items():
        ids = cluster.gpu_ids(name)
        per_pod[name] = ids
        for index in ids:
            assert (node, index) not in held, (
                f"GPU {index} on {node} given to {held[(node, index)]} and {name}"
            )
            held[(node, index)] = name
    return per_pod


def _settled(cluster: Cluster, nodes: dict[str, int], requests: dict[str, int]) -> bool:
    """True when every pod that could fit is bound: no pending pod fits any node's free GPUs."""
    bound = cluster.bound_pods()
    free = dict(nodes)
    for name, node in bound.items():
        free[node] -= requests[name]
    pending = [name for name in requests if name not in bound]
    return all(requests[name] > max(free.values()) for name in pending)


def test_fifty_gpu_pods_at_once_never_share_a_gpu_and_all_that_fit_are_bound(
    cluster: Cluster,
) -> None:
    nodes = {f"gpu-{i}": 4 for i in range(10)}
    for name, gpus in nodes.items():
        cluster.node(name, gpus=gpus, model=H100, groups=[[0, 1], [2, 3]])
    requests = {f"job-{i}": 1 + (i % 3 == 0) for i in range(50)}  # 67 GPUs asked, 40 exist
    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(lambda item: cluster.pod(item[0], gpus=item[1]), requests.items()))
    eventually(
        lambda: _settled(cluster, nodes, requests),
        timeout=120,
        message="pods that fit are not all bound",
    )
    per_pod = _assert_no_gpu_given_twice(cluster)
    assert all(len(per_pod[name]) == requests[name] for name in per_pod)
    assert sum(map(len, per_pod.values())) >= 39  # only 1-GPU holes may stay when 2-GPU pods wait
    assert len(per_pod) < len(requests)
