"""Realistic kube-scheduler payloads for benchmarks: nodes shaped like a GPU cluster's (GPU
feature-discovery labels, topology annotations, conditions, images) and pods with several
containers, tolerations and affinity."""

from __future__ import annotations

import json
import random
from typing import Any

MODELS = [
    ("NVIDIA-H100-80GB-HBM3", 81559, 8, [[0, 1, 2, 3], [4, 5, 6, 7]]),
    ("NVIDIA-A100-SXM4-40GB", 40960, 8, [[0, 1, 2, 3], [4, 5, 6, 7]]),
    ("NVIDIA-L4", 23034, 4, [[0, 1], [2, 3]]),
]


def make_node(index: int, rng: random.Random) -> dict[str, Any]:
    name = f"node-{index:05d}"
    rack, zone = f"rack-{index // 40:03d}", f"zone-{'abc'[index % 3]}"
    labels = {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "beta.kubernetes.io/os": "linux",
        "beta.kubernetes.io/arch": "amd64",
        "node.kubernetes.io/instance-type": "p5.48xlarge",
        "topology.kubernetes.io/region": "region-1",
        "topology.kubernetes.io/zone": zone,
        "topology.kubernetes.io/rack": rack,
    }
    annotations = {
        "node.alpha.kubernetes.io/ttl": "0",
        "volumes.kubernetes.io/controller-managed-attach-detach": "true",
    }
    allocatable = {
        "cpu": "191450m",
        "memory": "2063229908Ki",
        "pods": "110",
        "ephemeral-storage": "3511937948Ki",
        "hugepages-1Gi": "0",
        "hugepages-2Mi": "0",
    }
    if index % 10 != 9:  # 90 % GPU nodes, the rest CPU-only
        model, memory, count, groups = MODELS[index % len(MODELS)]
        labels |= {
            "nvidia.com/gpu.product": model,
            "nvidia.com/gpu.memory": str(memory),
            "nvidia.com/gpu.count": str(count),
            "nvidia.com/gpu.present": "true",
            "nvidia.com/cuda.driver.major": "550",
        }
        annotations["schedext.io/gpu-topology"] = json.dumps({"groups": groups})
        allocatable["nvidia.com/gpu"] = str(count)
    conditions = [
        {
            "type": kind,
            "status": "True" if kind == "Ready" else "False",
            "lastHeartbeatTime": "2026-11-20T10:00:00Z",
            "lastTransitionTime": "2026-11-01T08:00:00Z",
            "reason": f"Kubelet{kind}",
            "message": f"kubelet reports {kind}",
        }
        for kind in ("MemoryPressure", "DiskPressure", "PIDPressure", "Ready")
    ]
    images = [
        {
            "names": [f"registry.example.com/team-{i}/image@sha256:{rng.getrandbits(256):064x}"],
            "sizeBytes": rng.randrange(10**8, 10**10),
        }
        for i in range(6)
    ]
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "uid": f"00000000-0000-4000-8000-{index:012d}",
            "resourceVersion": str(1000 + index),
            "creationTimestamp": "2026-11-01T08:00:00Z",
            "labels": labels,
            "annotations": annotations,
        },
        "spec": {
            "podCIDR": f"10.{index // 256 % 256}.{index % 256}.0/24",
            "taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}],
        },
        "status": {
            "capacity": dict(allocatable),
            "allocatable": allocatable,
            "conditions": conditions,
            "addresses": [
                {"type": "InternalIP", "address": f"10.200.{index // 256 % 256}.{index % 256}"},
                {"type": "Hostname", "address": name},
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {
                "kernelVersion": "6.1.0-27-amd64",
                "osImage": "Debian GNU/Linux 12 (bookworm)",
                "containerRuntimeVersion": "containerd://1.7.24",
                "kubeletVersion": "v1.36.3",
                "architecture": "amd64",
                "operatingSystem": "linux",
            },
            "images": images,
        },
    }


def make_pod(
    name: str,
    *,
    gpus: int = 2,
    model: str | None = "H100",
    node: str | None = None,
    gpu_ids: list[int] | None = None,
    uid: str | None = None,
) -> dict[str, Any]:
    annotations: dict[str, str] = {"kubectl.kubernetes.io/default-container": "trainer"}
    if model:
        annotations["schedext.io/gpu-model"] = model
    if gpu_ids is not None:
        annotations["schedext.io/gpu-ids"] = ",".join(map(str, gpu_ids))
    spec: dict[str, Any] = {
        "initContainers": [
            {
                "name": "fetch-dataset",
                "image": "registry.example.com/tools/fetch:2.1",
                "resources": {"requests": {"cpu": "500m", "memory": "512Mi"}},
            }
        ],
        "containers": [
            {
                "name": "trainer",
                "image": "registry.example.com/ml/trainer:3.4.1",
                "args": ["--config", "/etc/trainer/config.yaml", "--epochs", "90"],
                "env": [{"name": f"VAR_{i}", "value": f"value-{i}"} for i in range(12)],
                "resources": {
                    "requests": {"cpu": "16", "memory": "128Gi", "nvidia.com/gpu": str(gpus)},
                    "limits": {"memory": "128Gi", "nvidia.com/gpu": str(gpus)},
                },
                "volumeMounts": [{"name": "data", "mountPath": "/data"}],
            },
            {
                "name": "metrics-sidecar",
                "image": "registry.example.com/obs/exporter:1.9",
                "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}},
            },
            {
                "name": "log-shipper",
                "image": "registry.example.com/obs/shipper:0.7",
                "resources": {"requests": {"cpu": "50m", "memory": "32Mi"}},
            },
        ],
        "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "dataset"}}],
        "tolerations": [
            {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
            {
                "key": "node.kubernetes.io/not-ready",
                "operator": "Exists",
                "effect": "NoExecute",
                "tolerationSeconds": 300,
            },
            {
                "key": "node.kubernetes.io/unreachable",
                "operator": "Exists",
                "effect": "NoExecute",
                "tolerationSeconds": 300,
            },
        ],
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {
                                    "key": "nvidia.com/gpu.present",
                                    "operator": "In",
                                    "values": ["true"],
                                }
                            ]
                        }
                    ]
                }
            },
            "podAntiAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "weight": 50,
                        "podAffinityTerm": {
                            "labelSelector": {"matchLabels": {"app": "trainer"}},
                            "topologyKey": "kubernetes.io/hostname",
                        },
                    }
                ]
            },
        },
        "priority": 1000,
        "priorityClassName": "research",
        "schedulerName": "default-scheduler",
        "serviceAccountName": "trainer",
        "terminationGracePeriodSeconds": 30,
    }
    if node:
        spec["nodeName"] = node
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "ml",
            "uid": uid or f"pod-{name}",
            "resourceVersion": "424242",
            "creationTimestamp": "2026-11-20T10:00:00Z",
            "labels": {"app": "trainer", "team": "research", "workload-type": "GPU-intensive"},
            "annotations": annotations,
            "ownerReferences": [
                {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "name": "trainer",
                    "uid": "job-uid",
                    "controller": True,
                }
            ],
        },
        "spec": spec,
        "status": {"phase": "Running" if node else "Pending", "qosClass": "Burstable"},
    }


def make_cluster(nodes: int, *, seed: int = 7, used_fraction: float = 0.4) -> dict[str, Any]:
    """A kubectl-style List: ``nodes`` nodes, with bound pods holding about ``used_fraction``
    of the GPUs (with the schedext.io/gpu-ids annotation)."""
    rng = random.Random(seed)
    items = [make_node(i, rng) for i in range(nodes)]
    pods: list[dict[str, Any]] = []
    for node in items[:]:
        count = int(node["status"]["allocatable"].get("nvidia.com/gpu", 0))
        used = sorted(
            rng.sample(
                range(count), int(count * used_fraction * rng.uniform(0.5, 1.5)) if count else 0
            )
        )
        for start in range(0, len(used), 2):
            ids = used[start : start + 2]
            name = f"bound-{node['metadata']['name']}-{start}"
            pods.append(
                make_pod(
                    name, gpus=len(ids), model=None, node=node["metadata"]["name"], gpu_ids=ids
                )
            )
    return {"apiVersion": "v1", "kind": "List", "items": items + pods}


def main(argv: list[str] | None = None) -> int:
    """Write a generated cluster (kubectl List JSON) for ``schedext serve --snapshot``."""
    import argparse  # noqa: PLC0415

    parser = argparse.ArgumentParser(prog="python -m loadtests.payloads")
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--out", required=True, help="file to write")
    args = parser.parse_args(argv)
    with open(args.out, "w", encoding="utf-8") as out:
        json.dump(make_cluster(args.nodes), out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
