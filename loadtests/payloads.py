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


# The GPU of the shares scenario: every node has 8 of them, 80 GiB each.
SHARE_MODEL = ("NVIDIA-H100-80GB-HBM3", 81920, 8, [[0, 1, 2, 3], [4, 5, 6, 7]])
GpuModel = tuple[str, int, int, list[list[int]]]  # product, MiB per GPU, count, NVLink groups


def make_node(index: int, rng: random.Random, *, gpu: GpuModel | None = None) -> dict[str, Any]:
    """A node; with ``gpu``, that GPU, else the mix of MODELS with every tenth node CPU-only."""
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
    if gpu is None and index % 10 != 9:  # 90 % GPU nodes, the rest CPU-only
        gpu = MODELS[index % len(MODELS)]
    if gpu is not None:
        model, memory, count, groups = gpu
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
    for node in items:
        count = int(node["status"]["allocatable"].get("nvidia.com/gpu", 0))
        used = used_gpus(count, rng, used_fraction)
        pods += bound_gpu_pods(node["metadata"]["name"], used)
    return {"apiVersion": "v1", "kind": "List", "items": items + pods}


def used_gpus(count: int, rng: random.Random, used_fraction: float) -> list[int]:
    """The GPUs of a node of ``count`` held by pods (or claims): about ``used_fraction`` of
    them (0.5 to 1.5 times it), chosen at random, sorted."""
    held = int(count * used_fraction * rng.uniform(0.5, 1.5)) if count else 0
    return sorted(rng.sample(range(count), held))


def bound_gpu_pods(node: str, used: list[int]) -> list[dict[str, Any]]:
    """Bound pods holding ``used`` (2 GPUs each, the last maybe 1) with schedext's
    ``schedext.io/gpu-ids``, as :func:`make_cluster` places them."""
    return [
        make_pod(
            f"bound-{node}-{start}",
            gpus=len(used[start : start + 2]),
            model=None,
            node=node,
            gpu_ids=used[start : start + 2],
        )
        for start in range(0, len(used), 2)
    ]


QUOTAS = 50  # ElasticQuotas in the quotas scenario
QUOTA_NAMESPACE = "ml"  # every pod's namespace, the one under test included


def make_quota_cluster(nodes: int, *, quotas: int = QUOTAS, seed: int = 7) -> dict[str, Any]:
    """:func:`make_cluster`'s cluster plus ``quotas`` ElasticQuotas on whole GPUs: one for
    the pods' namespace (``ml``) with a min of half what its pods hold, so that the pod under
    test borrows, and one each for idle teams, whose mins leave room for it within the sum of
    mins: filter admits the pod after the borrowing checks, and then answers as without
    quotas."""
    cluster = make_cluster(nodes, seed=seed)
    pods = [item for item in cluster["items"] if item["kind"] == "Pod"]
    held = sum(len(p["metadata"]["annotations"]["schedext.io/gpu-ids"].split(",")) for p in pods)
    own = held // 2
    idle = max(1, -(-(held - own + 16) // max(1, quotas - 1)))  # the rest, and 16 to borrow
    mins = [own] + [idle] * (quotas - 1)
    namespaces = [QUOTA_NAMESPACE] + [f"team-{i:02d}" for i in range(1, quotas)]
    cluster["items"] += [
        {
            "apiVersion": "scheduling.x-k8s.io/v1alpha1",
            "kind": "ElasticQuota",
            "metadata": {
                "name": namespace,
                "namespace": namespace,
                "uid": f"eq-{namespace}",
                "creationTimestamp": "2026-11-01T00:00:00Z",
            },
            "spec": {"min": {"nvidia.com/gpu": str(low)}},
        }
        for namespace, low in zip(namespaces, mins, strict=True)
    ]
    return cluster


# What the pod under test in the shares scenario asks for, on each of SHARE_POD_SHARES GPUs.
SHARE_POD_MIB, SHARE_POD_CORES, SHARE_POD_SHARES = 10240, 25, 1
_SHARE_UNIT_MIB = 10240  # the shares the scenario's nodes hold are made of 10 GiB pieces


def make_share_pod(
    name: str,
    *,
    memory_mib: int = SHARE_POD_MIB,
    cores: int | None = SHARE_POD_CORES,
    shares: int = SHARE_POD_SHARES,
    uid: str | None = None,
) -> dict[str, Any]:
    """A pending pod asking for a share of GPUs (schedext's resources: ``memory_mib`` MiB and
    ``cores`` percent on each of ``shares`` GPUs), otherwise the benchmark's pod."""
    pod = make_pod(name, model=None, uid=uid)
    resources = pod["spec"]["containers"][0]["resources"]
    asked = {"schedext.io/gpu-memory": str(memory_mib), "schedext.io/gpu-shares": str(shares)}
    if cores is not None:
        asked["schedext.io/gpu-cores"] = str(cores)
    for part in ("requests", "limits"):
        del resources[part]["nvidia.com/gpu"]
        resources[part].update(asked)
    return pod


def make_share_cluster(nodes: int, *, seed: int = 7) -> dict[str, Any]:
    """A kubectl-style List for the shares scenario: ``nodes`` nodes of 8 GPUs (80 GiB each),
    half of the GPUs holding shares (3, 4 or 5 per node), the others mostly held whole.

    The nodes come in three kinds, in equal numbers, so that filter answers the share pod
    (:func:`make_share_pod`: 10 GiB and 25 % of the cores) as it answers the whole-GPU pod of
    :func:`make_cluster`, with a reason for two nodes in three:

    - *room*: 1-6 shares of 10 GiB and 10 % of the cores on each shared GPU (room left on
      every one of them); one of the other GPUs free on half of these nodes;
    - *memory*: 1-6 shares on each shared GPU, filling its 80 GiB (rejected: no GPU with
      10 GiB free);
    - *cores*: 1-6 shares of 10 GiB on each shared GPU, holding 80-84 % of its cores
      (rejected: memory, but not 25 % of the cores).

    The bound pods are lean (what bind writes and the resources, nothing else): there are
    about 16 per node, and only what they hold matters to the benchmark."""
    rng = random.Random(seed)
    items = [make_node(i, rng, gpu=SHARE_MODEL) for i in range(nodes)]
    pods: list[dict[str, Any]] = []
    gpus, capacity = SHARE_MODEL[2], SHARE_MODEL[1]
    for index, node in enumerate(items):
        name = node["metadata"]["name"]
        kind = ("room", "memory", "cores")[index % 3]
        order = rng.sample(range(gpus), gpus)
        shared = order[: rng.choice((3, 4, 5))]
        free = 1 if kind == "room" and rng.random() < 0.5 else 0
        whole = sorted(order[len(shared) : gpus - free])
        for start in range(0, len(whole), 2):
            ids = whole[start : start + 2]
            pods.append(_bound_pod(f"{name}-w{start}", name, ids, {"nvidia.com/gpu": len(ids)}))
        for device in shared:
            count = rng.randint(1, 6)
            memory = [_SHARE_UNIT_MIB] * count
            cores = [10] * count
            if kind == "memory":
                memory[-1] = capacity - _SHARE_UNIT_MIB * (count - 1)
            elif kind == "cores":
                cores = [-(-80 // count)] * count
            for k, (mib, pct) in enumerate(zip(memory, cores, strict=True)):
                pods.append(_share_holder(f"{name}-g{device}-s{k}", name, device, mib, pct))
    return {"apiVersion": "v1", "kind": "List", "items": items + pods}


def _share_holder(name: str, node: str, device: int, mib: int, cores: int) -> dict[str, Any]:
    """A bound share pod, as schedext's bind leaves it: the device and its share annotated."""
    pod = _bound_pod(
        name,
        node,
        [device],
        {
            "schedext.io/gpu-memory": mib,
            "schedext.io/gpu-cores": cores,
            "schedext.io/gpu-shares": 1,
        },
    )
    pod["metadata"]["annotations"] |= {
        "schedext.io/gpu-share-memory-mib": str(mib),
        "schedext.io/gpu-share-cores": str(cores),
    }
    return pod


def _bound_pod(name: str, node: str, gpu_ids: list[int], extra: dict[str, int]) -> dict[str, Any]:
    """A lean running pod on ``node`` holding ``extra`` resources on ``gpu_ids``."""
    resources = {"cpu": "4", "memory": "32Gi", **{k: str(v) for k, v in extra.items()}}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "ml",
            "uid": f"pod-{name}",
            "annotations": {"schedext.io/gpu-ids": ",".join(map(str, gpu_ids))},
        },
        "spec": {
            "nodeName": node,
            "containers": [
                {"name": "main", "resources": {"requests": resources, "limits": dict(resources)}}
            ],
        },
        "status": {"phase": "Running"},
    }


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
