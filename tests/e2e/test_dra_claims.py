"""schedext sees the GPUs DRA's ResourceClaims hold, through the real kube-apiserver's
resource.k8s.io/v1 (issue 31): a claim's devices are never handed to a pod of schedext's.

No DRA driver runs here: the ResourceSlice is published as a driver publishes it, and the
claim's allocation is written to its status as kube-scheduler's DynamicResources plugin
writes it. kube-scheduler itself counts the node's four nvidia.com/gpu as free (the claim is
not a pod's request), so only schedext can keep the pods off the claimed GPUs."""

from __future__ import annotations

from typing import Any

from testbed.builders import agent_annotations
from testbed.dra_builders import gpu, resource_slice, result
from tests.e2e.conftest import Cluster, eventually

DRA = "/apis/resource.k8s.io/v1"
NODE = "dra-a"


def publish(cluster: Cluster) -> None:
    """Node dra-a: 4 GPUs the agent names by UUID, and the same 4 in a ResourceSlice."""
    cluster.api.create_node(
        NODE, gpus=4, annotations=agent_annotations(4, uuid_prefix=f"GPU-{NODE}")
    )
    piece = resource_slice(NODE, [gpu(i, node=NODE) for i in range(4)])
    piece["metadata"].pop("uid")
    cluster.api.apply_raw("POST", f"{DRA}/resourceslices", piece)


def allocate(cluster: Cluster, name: str, devices: list[int]) -> None:
    """A claim, allocated on dra-a as kube-scheduler's DRA plugin records it."""
    path = f"{DRA}/namespaces/{cluster.namespace}/resourceclaims"
    body: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": cluster.namespace},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "gpu",
                        "exactly": {"deviceClassName": "gpu", "count": len(devices)},
                    }
                ]
            }
        },
    }
    created = cluster.api.apply_raw("POST", path, body)
    created["status"] = {
        "allocation": {
            "devices": {"results": [result(NODE, f"gpu-{i}") for i in devices]},
            "nodeSelector": {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [NODE]}]}
                ]
            },
        }
    }
    cluster.api.apply_raw("PUT", f"{path}/{name}/status", created)


def deallocate(cluster: Cluster, name: str) -> None:
    path = f"{DRA}/namespaces/{cluster.namespace}/resourceclaims/{name}"
    claim = cluster.api.apply_raw("GET", path)
    claim["status"] = {}
    cluster.api.apply_raw("PUT", f"{path}/status", claim)


def test_the_gpus_a_claim_holds_are_never_given_to_schedexts_pods(cluster: Cluster) -> None:
    publish(cluster)
    allocate(cluster, "train", [1, 2])
    cluster.scheduler_caught_up()

    def held_by_the_claim() -> bool:
        node = next(n for n in cluster.schedext.get("/inventory")["nodes"] if n["name"] == NODE)
        # Both the device plugin's nvidia.com/gpu and DRA's slices advertise its GPUs.
        return node["freeGpus"] == 2 and node["gpuOwner"] == "mixed"

    eventually(held_by_the_claim, message="schedext never saw the claim's GPUs held")
    cluster.pod("two", gpus=2)
    assert cluster.wait_bound("two") == NODE
    assert sorted(cluster.gpu_ids("two")) == [0, 3]
    cluster.pod("one", gpus=1)

    def turned_away_for_the_claim() -> bool:
        messages = [e.get("message", "") for e in cluster.events("one")]
        return any("allocated by DRA to claim" in m for m in messages)

    eventually(turned_away_for_the_claim, message="no FailedScheduling naming the claim")
    deallocate(cluster, "train")
    assert cluster.wait_bound("one", timeout=90) == NODE
    assert cluster.gpu_ids("one")[0] in (1, 2)
