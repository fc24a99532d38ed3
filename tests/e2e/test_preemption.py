"""Preemption against the real kube-scheduler (v1.36): kube-scheduler proposes victims from
its in-tree filters (nvidia.com/gpu is visible in node allocatable, ignoredByScheduler: false,
as manifests/scheduler-config.yaml configures it), and schedext's preempt turns them into the
victims that really free what the pod needs."""

from __future__ import annotations

from tests.e2e.conftest import GROUP_LABEL, Cluster, eventually
from tests.e2e.test_scheduling import H100

RACK = "topology.kubernetes.io/rack"


def gpu_ids(ids: list[int]) -> dict[str, str]:
    return {"schedext.io/gpu-ids": ",".join(map(str, ids))}


def pods(cluster: Cluster) -> set[str]:
    return {p["metadata"]["name"] for p in cluster.api.list_pods(cluster.namespace)}


def test_a_high_priority_pod_evicts_exactly_the_pods_that_free_four_gpus_on_one_node(
    cluster: Cluster,
) -> None:
    cluster.node("n1", gpus=4, model=H100)
    cluster.node("n2", gpus=4, model=H100)
    for i in range(4):
        cluster.pod(f"small-{i}", gpus=1, priority_class="low", node="n1", annotations=gpu_ids([i]))
    for i in range(2):
        cluster.pod(
            f"pair-{i}",
            gpus=2,
            priority_class="low",
            node="n2",
            annotations=gpu_ids([2 * i, 2 * i + 1]),
        )
    cluster.pod("urgent", gpus=4, priority_class="high")
    assert cluster.wait_bound("urgent", timeout=120) == "n2"
    assert cluster.gpu_ids("urgent") == [0, 1, 2, 3]
    remaining = pods(cluster)
    assert {f"small-{i}" for i in range(4)} <= remaining  # nothing evicted on n1
    assert not remaining & {"pair-0", "pair-1"}


def test_a_node_whose_low_priority_pods_use_cpu_but_no_gpu_is_never_chosen(
    cluster: Cluster,
) -> None:
    cluster.node("gpu-busy", gpus=4, model=H100, cpu="8")
    cluster.node("cpu-rich", gpus=4, model=H100, cpu="8")
    for i in range(4):
        cluster.pod(
            f"trainee-{i}", gpus=1, priority_class="low", node="gpu-busy", annotations=gpu_ids([i])
        )
    cluster.pod(
        "vip", gpus=4, priority_class="high", node="cpu-rich", annotations=gpu_ids([0, 1, 2, 3])
    )
    for i in range(3):
        cluster.pod(f"batch-{i}", cpu="2", priority_class="low", node="cpu-rich")
    cluster.pod("urgent", gpus=4, priority_class="high")
    assert cluster.wait_bound("urgent", timeout=120) == "gpu-busy"
    remaining = pods(cluster)
    assert {f"batch-{i}" for i in range(3)} <= remaining
    assert "vip" in remaining


def test_with_gang_protection_a_gang_survives_while_another_victim_exists(cluster: Cluster) -> None:
    cluster.node("gang-node", gpus=4, model=H100)
    cluster.node("solo-node", gpus=4, model=H100)
    cluster.pod_group("team", min_member=2)
    for i in range(2):
        # The gang is the cheapest to evict (lowest priority): without protection,
        # kube-scheduler itself would pick its node.
        ids = gpu_ids([2 * i, 2 * i + 1])
        labels = {GROUP_LABEL: "team"}
        cluster.pod(
            f"team-{i}",
            gpus=2,
            priority_class="lowest",
            node="gang-node",
            labels=labels,
            annotations=ids,
        )
        cluster.pod(
            f"solo-{i}",
            gpus=2,
            priority_class="low",
            node="solo-node",
            annotations=gpu_ids([2 * i, 2 * i + 1]),
        )
    cluster.pod("urgent", gpus=4, priority_class="high")
    assert cluster.wait_bound("urgent", timeout=120) == "solo-node"
    remaining = pods(cluster)
    assert {"team-0", "team-1"} <= remaining
    assert not remaining & {"solo-0", "solo-1"}


def test_an_address_holder_is_evicted_only_for_a_higher_priority_pod_needing_that_address(
    cluster: Cluster,
) -> None:
    cluster.node("a1", cpu="4", labels={RACK: "a"})
    cluster.ip_pool("rack-a", ranges=[("10.20.1.15", "10.20.1.16")], rack="a")
    cluster.ip_pod("holder", ip="10.20.1.15", cpu="1500m", priority_class="low", node="a1")
    cluster.pod("filler", cpu="1500m", priority_class="low", node="a1")
    eventually(lambda: cluster.address("holder")[0] == "10.20.1.15", message="holder not annotated")
    # Needs CPU and any address: evicting the filler is enough, the holder keeps its address.
    cluster.ip_pod("any-address", pool="rack-a", cpu="1500m", priority_class="high")
    assert cluster.wait_bound("any-address", timeout=120) == "a1"
    assert cluster.address("any-address")[0] == "10.20.1.16"
    assert "holder" in pods(cluster)
    assert "filler" not in pods(cluster)
    # Needs the holder's very address, at higher priority: the holder goes. (It also needs
    # CPU: kube-scheduler v1.36 offers a node for preemption only when its own filters find
    # a shortage there, kubernetes issue #139270.)
    cluster.ip_pod("that-address", ip="10.20.1.15", cpu="1500m", priority_class="high")
    assert cluster.wait_bound("that-address", timeout=120) == "a1"
    assert cluster.address("that-address") == ("10.20.1.15", "rack-a")
    assert "holder" not in pods(cluster)
