"""The labels, annotations and resource names schedext reads and writes.

Our own keys live under ``schedext.io/``; GPU facts come from NVIDIA GPU feature discovery
labels so that clusters running the GPU operator need no extra agent.
"""

from typing import Final

GPU_RESOURCE: Final = "nvidia.com/gpu"
# NVIDIA's DRA driver (kubernetes-sigs/dra-driver-nvidia-gpu): the GPU driver schedext reads
# ResourceSlices and claims of unless settings name others (dra.gpu_drivers).
DRA_GPU_DRIVER: Final = "gpu.nvidia.com"

# A share of one GPU (extender.config.ShareResources names the resources a cluster uses; these
# are schedext's own): memory in MiB per share, compute in percent of the device's SMs, and
# on how many GPUs the pod takes a share (the device plugin's handle for shares).
SHARE_MEMORY_RESOURCE: Final = "schedext.io/gpu-memory"
SHARE_CORES_RESOURCE: Final = "schedext.io/gpu-cores"
SHARE_COUNT_RESOURCE: Final = "schedext.io/gpu-shares"

# MIG devices, one resource per profile as NVIDIA's "mixed" strategy names them
# ("nvidia.com/mig-1g.10gb"); the node agent's device plugin serves them.
MIG_RESOURCE_PREFIX: Final = "nvidia.com/mig-"

# Written by schedext's bind, read back on every restart: the durable record of which GPU
# indices a pod holds ("0,1").
GPU_IDS: Final = "schedext.io/gpu-ids"
# The same GPUs by UUID, written beside them when the node agent published UUIDs: the node
# agent hands a container exactly these.
GPU_UUIDS: Final = "schedext.io/gpu-uuids"
# Written by bind for a pod that takes MIG devices: their UUIDs ("MIG-a,MIG-b"), which the node
# agent gives its containers; read back on every restart as the record of which it holds.
MIG_UUIDS: Final = "schedext.io/mig-uuids"
# Written by the node agent when it gave a pod's containers their GPUs (UUIDs, "GPU-a,GPU-b"),
# so that a restarted agent never hands the same GPUs to another pod.
GPU_ALLOCATED: Final = "schedext.io/gpu-allocated"
# Written by bind beside gpu-ids for a pod that shares GPUs: its share on each of them (MiB of
# memory, percent of the SMs; cores only when it asked for them). The agent's Allocate turns
# them into the CUDA MPS limits.
GPU_SHARE_MEMORY: Final = "schedext.io/gpu-share-memory-mib"
GPU_SHARE_CORES: Final = "schedext.io/gpu-share-cores"

# Pod hints (annotations, or labels as a fallback).
GPU_MODEL: Final = "schedext.io/gpu-model"
GPU_MEMORY_MIB: Final = "schedext.io/gpu-memory-mib"
WORKLOAD_TYPE: Final = "workload-type"

# Node facts.
GPU_PRODUCT_LABEL: Final = "nvidia.com/gpu.product"
GPU_MEMORY_LABEL: Final = "nvidia.com/gpu.memory"
# Published by the node agent (extender.devices.document): NVLink groups, UUIDs and health
# (on change), and live use (at a bounded rate).
GPU_TOPOLOGY: Final = "schedext.io/gpu-topology"
GPU_USE: Final = "schedext.io/gpu-use"
# Published by the node agent (extender.devices.drift_document), on change only: where the
# kubelet's PodResources disagree with what schedext placed (GPUs in use that schedext does not
# account for, which the extender treats as held; records of pods the kubelet no longer lists).
GPU_DRIFT: Final = "schedext.io/gpu-drift"

# Gangs (scheduler-plugins coscheduling compatible).
POD_GROUP_LABEL: Final = "scheduling.x-k8s.io/pod-group"
# Written by schedext on a gang member that filter turned away for missing members, once
# they exist: the pod update is what makes kube-scheduler retry it (extender.gang).
REQUEUED_AT: Final = "schedext.io/requeued-at"

# Team quotas (scheduler-plugins' ElasticQuota): an annotation on the ElasticQuota, the weight
# its namespace borrows idle capacity by (a whole number >= 0; default: each resource's min).
BORROW_WEIGHT: Final = "schedext.io/borrow-weight"

# Topology labels for rack/zone affinity of gang members.
RACK_LABEL: Final = "topology.kubernetes.io/rack"
ZONE_LABEL: Final = "topology.kubernetes.io/zone"
# An NVLink domain (an NVL72 rack's GPUs): NVIDIA's GPU feature discovery writes it.
CLIQUE_LABEL: Final = "nvidia.com/gpu.clique"
# A spine block: NVIDIA's topograph writes the network's levels under this prefix.
SPINE_LABEL: Final = "network.topology.nvidia.com/spine"
# A gang's topology (on its PodGroup): the level (a node label key of policy.topology_levels)
# all members must share one domain of, and the one they should share. Kueue's and KAI's
# annotations of the same meaning are read as aliases (extender.gang.topology).
TOPOLOGY_REQUIRED: Final = "schedext.io/topology-required"
TOPOLOGY_PREFERRED: Final = "schedext.io/topology-preferred"
TOPOLOGY_REQUIRED_KEYS: Final = (
    TOPOLOGY_REQUIRED,
    "kueue.x-k8s.io/podset-required-topology",
    "kai.scheduler/topology-required-placement",
)
TOPOLOGY_PREFERRED_KEYS: Final = (
    TOPOLOGY_PREFERRED,
    "kueue.x-k8s.io/podset-preferred-topology",
    "kai.scheduler/topology-preferred-placement",
)
# PodGroup annotation schedext writes: the hold that keeps GPUs for a starving gang
# (extender.gang.holds), so that a new leader adopts it.
GANG_HOLD: Final = "schedext.io/gang-hold"
TOPOLOGY_KEYS: Final = frozenset((*TOPOLOGY_REQUIRED_KEYS, *TOPOLOGY_PREFERRED_KEYS))

# Addresses.
IP: Final = "schedext.io/ip"  # pod annotation: this address; written by bind as well
IP_POOL: Final = "schedext.io/ip-pool"  # pod annotation: any address of these pools
IP_POLICY: Final = "schedext.io/ip-policy"  # sticky | never-release
IP_RESOURCE: Final = "schedext.io/ip"  # extended resource routing pods to schedext
