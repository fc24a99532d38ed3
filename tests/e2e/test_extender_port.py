"""A port of kube-scheduler's TestSchedulerExtender idea to schedext: the node a pod lands on
is the one that only the combination of kube-scheduler's own filters, schedext's filter and
schedext's weighted prioritize can explain. Each of the three, taken away, would pick another
node:

- without the in-tree filters, machine5 (tainted NoSchedule) would win: it is as full of GPUs
  as machine3 (schedext scores it 10) and nearly empty of CPU and memory;
- without schedext's filter, machine2 (T4: the wrong model) would win the same way;
- without schedext's scoring, machine4 would win: kube-scheduler's least-allocated scoring
  prefers it by about 90 points to machine3, whose CPU and memory are 7/8 used. schedext
  scores machine3 10 (bin-packing, and the two GPUs in one NVLink group) and machine4 5. In
  full mode (prioritize) at weight 5 that is 500 against 250 points, which outweighs the
  in-tree preference; in shortlist mode, the shipped one, filter answers machine3 alone.
"""

from __future__ import annotations

import httpx
import pytest

from testbed.manifests import pod_manifest
from tests.e2e.conftest import Cluster
from tests.e2e.test_scheduling import H100

T4 = "Tesla-T4"
NVLINK = [[0, 1, 2, 3], [4, 5, 6, 7]]


def _bound_at_creation(
    cluster: Cluster,
    name: str,
    node: str,
    gpu_ids: list[int],
    *,
    cpu: str = "10m",
    memory: str = "64Mi",
) -> None:
    """A pod already running on ``node`` with its GPUs recorded as schedext records them."""
    manifest = pod_manifest(
        name,
        requests={"cpu": cpu, "memory": memory, "nvidia.com/gpu": str(len(gpu_ids))},
        limits={"nvidia.com/gpu": str(len(gpu_ids))},
        annotations={"schedext.io/gpu-ids": ",".join(map(str, gpu_ids))},
    )
    manifest["spec"]["nodeName"] = node
    cluster.api.create_pod(cluster.namespace, manifest)


@pytest.mark.parametrize("mode", ["shortlist", "full"])
def test_placement_combines_in_tree_filters_schedext_filter_and_schedext_scores(
    cluster: Cluster, mode: str
) -> None:
    if mode == "full":
        cluster.use_full_mode()
    # Every node: 32 CPUs and 256Gi of memory.
    cluster.node("machine1", cpu="32")  # no GPUs: kube-scheduler's NodeResourcesFit rejects
    cluster.node("machine2", gpus=4, model=T4, groups=[[0, 1], [2, 3]])  # schedext: wrong model
    cluster.node("machine3", gpus=8, model=H100, groups=NVLINK)
    cluster.node("machine4", gpus=8, model=H100, groups=NVLINK)  # empty
    taint = {"key": "dedicated", "value": "infra", "effect": "NoSchedule"}
    cluster.node("machine5", gpus=8, model=H100, groups=NVLINK, taints=[taint])
    # machine2, machine3 and machine5: two GPUs free, in one group. machine3 alone is busy
    # with CPU and memory too.
    _bound_at_creation(cluster, "resident-2", "machine2", [0, 1])
    _bound_at_creation(
        cluster, "resident-3", "machine3", [0, 1, 2, 3, 4, 5], cpu="28", memory="224Gi"
    )
    _bound_at_creation(cluster, "resident-5", "machine5", [0, 1, 2, 3, 4, 5])

    cluster.pod("trainer", gpus=2, annotations={"schedext.io/gpu-model": "H100"})

    assert cluster.wait_bound("trainer") == "machine3"
    assert cluster.gpu_ids("trainer") == [6, 7]
    metrics = httpx.get(f"{cluster.schedext.url}/metrics", timeout=10).text
    assert 'schedext_decisions_total{outcome="feasible",verb="filter"}' in metrics
    scored = 'schedext_decisions_total{outcome="scored",verb="prioritize"}' in metrics
    assert scored is (mode == "full")
    assert 'schedext_placement_choice_total{choice="best"} 1.0' in metrics
    assert 'schedext_decisions_total{outcome="bound",verb="bind"} 1.0' in metrics
    assert 'schedext_filter_nodes_total{outcome="unresolvable"} 1.0' in metrics  # machine2
