"""Preemption against the real kube-scheduler (v1.36): kube-scheduler proposes victims from
its in-tree filters (nvidia.com/gpu is visible in node allocatable, ignoredByScheduler: false,
as manifests/scheduler-config.yaml configures it), and schedext's preempt turns them into the
victims that really free what the pod needs."""

from __future__ import annotations

import httpx

from tests.e2e.conftest import GROUP_LABEL, Cluster, eventually
from tests.e2e.test_scheduling import H100

RACK = "topology.kubernetes.io/rack"


def gpu_ids(ids: list[int]) -> dict[str, str]:
    return {"schedext.io/gpu-ids": ",".join(map(str, ids))}


def pods(cluster: Cluster) -> set[str]:
    return {p["metadata"]["name"] for p in cluster.api.list_pods(cluster.namespace)}


def seen_bound(cluster: Cluster, *names: str) -> None:
    """Wait until both schedext's inventory and kube-scheduler's cache hold these pre-bound
    pods. Either may see them first: a preempt call before schedext does would judge their
    node as if they were not there (a node whose pods schedext cannot check is dropped, or
    looks free); kube-scheduler, before it does, finds a node free that schedext's filter
    rejects, and never offers that node for preemption (kubernetes issue #139270)."""

    def seen() -> bool:
        return all(
            cluster.schedext.get(f"/explain/{cluster.namespace}/{name}").get("state") == "bound"
            for name in names
        )

    eventually(seen, message=f"schedext does not hold all of {names}")
    cluster.scheduler_caught_up()


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
    seen_bound(cluster, *(f"small-{i}" for i in range(4)), "pair-0", "pair-1")
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
    seen_bound(cluster, *(f"trainee-{i}" for i in range(4)), "vip", "batch-0", "batch-1", "batch-2")
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
    seen_bound(cluster, "team-0", "team-1", "solo-0", "solo-1")
    cluster.pod("urgent", gpus=4, priority_class="high")
    assert cluster.wait_bound("urgent", timeout=120) == "solo-node"
    remaining = pods(cluster)
    assert {"team-0", "team-1"} <= remaining
    assert not remaining & {"solo-0", "solo-1"}


def preempts_refused(cluster: Cluster) -> float:
    """How many preempt calls schedext answered without any candidate node."""
    text = httpx.get(f"{cluster.schedext.url}/metrics", timeout=10).text
    return sum(
        float(line.split()[-1])
        for line in text.splitlines()
        if line.startswith("schedext_decisions_total{")
        and 'verb="preempt"' in line
        and 'outcome="no_candidates"' in line
    )


def refused_to_preempt_for(cluster: Cluster, name: str, *, before: float) -> None:
    """Wait until schedext's preempt has refused every candidate node for ``name``: then
    kube-scheduler evicts nothing for it (it keeps asking, and keeps being refused)."""
    eventually(
        lambda: preempts_refused(cluster) > before,
        timeout=60,
        message=f"schedext's preempt never refused the candidates for {name}",
    )
    assert name not in cluster.bound_pods()


def address_rack(cluster: Cluster) -> None:
    """One node of 4 CPUs, selected by a pool of two addresses."""
    cluster.node("a1", cpu="4", labels={RACK: "a"})
    cluster.ip_pool("rack-a", ranges=[("10.20.1.15", "10.20.1.16")], rack="a")


def test_an_address_holder_is_evicted_only_for_a_higher_priority_pod_needing_that_address(
    cluster: Cluster,
) -> None:
    """Every preemptor also needs CPU: kube-scheduler v1.36 offers a node for preemption only
    when its own filters find a shortage there (kubernetes issue #139270)."""
    address_rack(cluster)
    cluster.ip_pod("holder", ip="10.20.1.15", cpu="1500m", priority_class="low", node="a1")
    cluster.pod("filler", cpu="1500m", priority_class="lowest", node="a1")
    seen_bound(cluster, "holder", "filler")
    # The holder's address at the holder's priority: kube-scheduler would evict the filler for
    # the CPU, but schedext refuses the node (the address stays held), so nothing is evicted.
    before = preempts_refused(cluster)
    cluster.ip_pod("peer", ip="10.20.1.15", cpu="1500m", priority_class="low")
    refused_to_preempt_for(cluster, "peer", before=before)
    assert {"holder", "filler"} <= pods(cluster)
    cluster.api.delete_pod(cluster.namespace, "peer")
    # A lower priority than the holder (and the filler): no victim at all.
    cluster.ip_pod("lesser", ip="10.20.1.15", cpu="1500m", priority_class="lowest")
    eventually(
        lambda: any("preemption" in e.get("message", "") for e in cluster.events("lesser")),
        timeout=60,
        message="kube-scheduler never decided on preemption for lesser",
    )
    assert {"holder", "filler"} <= pods(cluster)
    cluster.api.delete_pod(cluster.namespace, "lesser")
    # Its very address at a higher priority: the holder goes, and it alone frees enough CPU.
    cluster.ip_pod("that-address", ip="10.20.1.15", cpu="1500m", priority_class="high")
    assert cluster.wait_bound("that-address", timeout=120) == "a1"
    assert cluster.address("that-address") == ("10.20.1.15", "rack-a")
    assert "holder" not in pods(cluster)
    assert "filler" in pods(cluster)
    # Any address, for CPU: the filler goes, and the address holder keeps its address.
    cluster.ip_pod("any-address", pool="rack-a", cpu="1500m", priority_class="high")
    assert cluster.wait_bound("any-address", timeout=120) == "a1"
    assert cluster.address("any-address")[0] == "10.20.1.16"
    assert "that-address" in pods(cluster)
    assert "filler" not in pods(cluster)


def test_a_sticky_address_holder_is_never_evicted_for_its_address(cluster: Cluster) -> None:
    """Its IPClaim outlives it: evicting it would free nothing, and its StatefulSet would
    re-create it under the same identity, which takes the address back."""
    address_rack(cluster)
    uid = cluster.statefulset("web", replicas=1)
    cluster.ip_pod("web-0", ip="10.20.1.15", policy="sticky", statefulset=("web", uid),
                   cpu="1500m", priority_class="low")  # fmt: skip
    assert cluster.wait_bound("web-0") == "a1"
    eventually(lambda: f"sts/{cluster.namespace}/web/0" in cluster.ip_claims(), message="no claim")
    sticky_uid = cluster.get_pod("web-0")["metadata"]["uid"]
    cluster.pod("filler", cpu="1500m", priority_class="lowest", node="a1")
    seen_bound(cluster, "web-0", "filler")
    # Its address at a higher priority: no node is worth preempting on, nothing is evicted.
    before = preempts_refused(cluster)
    cluster.ip_pod("wants-it", ip="10.20.1.15", cpu="1500m", priority_class="high")
    refused_to_preempt_for(cluster, "wants-it", before=before)
    assert cluster.get_pod("web-0")["metadata"]["uid"] == sticky_uid
    assert "filler" in pods(cluster)
    assert any(
        "kept by the claim of" in (n.get("reason") or "")
        for n in cluster.schedext.get(f"/explain/{cluster.namespace}/wants-it")["nodes"]
    )
