"""Shortlist mode (the shipped configuration: no prioritizeVerb, policy.shortlist 1 and
shortlist_preferred 8) against the real kube-scheduler: a pod without soft preferences goes
to the node schedext rates best, while a pod that states one (here a preferred node affinity)
gets a longer shortlist and kube-scheduler's NodeAffinity score picks among it."""

from __future__ import annotations

from typing import Any

import httpx

from testbed.manifests import pod_manifest
from tests.e2e.conftest import Cluster
from tests.e2e.test_scheduling import H100

GPU = "nvidia.com/gpu"


def _resident(cluster: Cluster, node: str, gpus: int) -> None:
    """A pod already running on ``node`` with its GPUs recorded as schedext records them."""
    count = str(gpus)
    manifest = pod_manifest(
        f"resident-{node}",
        requests={"cpu": "10m", "memory": "64Mi", GPU: count},
        limits={GPU: count},
        annotations={"schedext.io/gpu-ids": ",".join(map(str, range(gpus)))},
    )
    manifest["spec"]["nodeName"] = node
    cluster.api.create_pod(cluster.namespace, manifest)


def _gpu_pod(cluster: Cluster, name: str, *, prefers: str | None = None) -> None:
    manifest = pod_manifest(
        name, requests={"cpu": "100m", "memory": "64Mi", GPU: "1"}, limits={GPU: "1"}
    )
    if prefers is not None:
        term: dict[str, Any] = {
            "weight": 100,
            "preference": {
                "matchExpressions": [{"key": "pool", "operator": "In", "values": [prefers]}]
            },
        }
        manifest["spec"]["affinity"] = {
            "nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [term]}
        }
    cluster.api.create_pod(cluster.namespace, manifest)
    cluster.created_pods.append(name)


def _choices(cluster: Cluster) -> dict[str, float]:
    text = httpx.get(f"{cluster.schedext.url}/metrics", timeout=10).text
    prefix = "schedext_placement_choice_total{choice="
    return {
        line[len(prefix) + 1 : line.index('"}')]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(prefix)
    }


def _three_nodes(cluster: Cluster) -> None:
    """busy: 6 of 8 GPUs held (schedext's bin-packing rates it best); two idle nodes, one of
    them labelled pool=blue."""
    cluster.node("busy", gpus=8, model=H100)
    cluster.node("idle-a", gpus=8, model=H100)
    cluster.node("idle-b", gpus=8, model=H100, labels={"pool": "blue"})
    _resident(cluster, "busy", 6)


def test_a_pod_without_preferences_goes_to_the_node_schedext_rates_best(cluster: Cluster) -> None:
    _three_nodes(cluster)
    _gpu_pod(cluster, "plain")
    assert cluster.wait_bound("plain") == "busy"
    assert _choices(cluster) == {"best": 1.0}
    metrics = httpx.get(f"{cluster.schedext.url}/metrics", timeout=10).text
    # one call per pod: kube-scheduler never called prioritize
    assert 'schedext_decisions_total{outcome="scored",verb="prioritize"}' not in metrics


def test_a_preferred_node_affinity_is_weighed_among_the_longer_shortlist(
    cluster: Cluster,
) -> None:
    _three_nodes(cluster)
    _gpu_pod(cluster, "picky", prefers="blue")
    # schedext shortlists all three (up to 8), best first; kube-scheduler's NodeAffinity score
    # (weight 2 x 100) then outweighs its other plugins, and the pod goes where it asked to.
    assert cluster.wait_bound("picky") == "idle-b"
    assert _choices(cluster) == {"lower": 1.0}
