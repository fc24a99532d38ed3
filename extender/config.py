"""The knobs the pure core takes (:class:`PolicyConfig`), built by the shell from settings."""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from enum import Enum

from extender import names

__all__ = [
    "SHARE_PRESETS",
    "DraConfig",
    "GpuScoring",
    "PolicyConfig",
    "SharePlacement",
    "ShareResources",
    "lenient",
]


class GpuScoring(Enum):
    """Which allocation objective GPU pods are scored by (``allocation_weight`` goes to it)."""

    BINPACK = "binpack"  # fill the most-allocated GPU nodes first, keep whole nodes free
    SPREAD = "spread"  # prefer the least-allocated GPU nodes


class SharePlacement(Enum):
    """Where GPU shares go (the ``gpu_share`` scorer and bind's choice of device)."""

    PACK = "pack"  # onto the fullest device that has room: whole devices stay free
    SPREAD = "spread"  # onto the emptiest device: less interference between sharers


@dataclass(frozen=True, slots=True)
class ShareResources:
    """The extended resources a pod asks for a share of a GPU with, and their units.

    ``memory`` is read in units of ``memory_unit_mib`` MiB (1: MiB; 1024: GiB, as gpushare
    counts). ``cores`` is percent of a device's SMs (None: the cluster has no such resource).
    ``count`` is how many devices the pod takes a share on (None: always one). When ``count``
    is the whole-GPU resource (HAMi's ``nvidia.com/gpu``), that resource counts shares in a
    pod that also asks for memory or cores, and whole GPUs otherwise.
    """

    memory: str = names.SHARE_MEMORY_RESOURCE
    memory_unit_mib: int = 1
    cores: str | None = names.SHARE_CORES_RESOURCE
    count: str | None = names.SHARE_COUNT_RESOURCE
    # Whether a share must name ``count`` (when there is one). The agent's device plugin gives
    # a share its GPU through that resource: a pod without it is never handed to the plugin,
    # and a CUDA image (NVIDIA_VISIBLE_DEVICES=all) would then see every GPU of the node.
    count_required: bool = True

    def __post_init__(self) -> None:
        for name in (self.memory, self.cores, self.count):
            if name is not None and ("/" not in name or not name.strip()):
                raise ValueError(f"share resource {name!r} must be an extended resource name")
        if self.memory_unit_mib not in (1, 1024):
            raise ValueError("share memory unit must be 1 (MiB) or 1024 (GiB)")
        if len({n for n in (self.memory, self.cores, self.count) if n}) != len(
            [n for n in (self.memory, self.cores, self.count) if n]
        ):
            raise ValueError("share resources must have distinct names")

    def names(self) -> tuple[str, ...]:
        return tuple(n for n in (self.memory, self.cores, self.count) if n is not None)


@functools.lru_cache(maxsize=8)  # per bound pod, a dataclass replaced cost 3 of its 24 µs
def lenient(shares: ShareResources) -> ShareResources:
    """``shares`` with no count required: how a bound pod's share is read (it is a fact)."""
    return dataclasses.replace(shares, count_required=False)


# Clusters moving from another GPU-sharing scheduler keep their pods' resources as written.
SHARE_PRESETS: dict[str, ShareResources] = {
    "schedext": ShareResources(),
    # gpushare (Alibaba): memory in GiB, one device, no compute share.
    "gpushare": ShareResources(
        memory="aliyun.com/gpu-mem", memory_unit_mib=1024, cores=None, count=None
    ),
    # HAMi: memory in MiB, cores in percent, and nvidia.com/gpu counting the devices.
    "hami": ShareResources(
        memory="nvidia.com/gpumem", cores="nvidia.com/gpucores", count=names.GPU_RESOURCE
    ),
}


@dataclass(frozen=True, slots=True)
class DraConfig:
    """Dynamic Resource Allocation (extender.dra): the drivers whose devices are GPUs, and
    whether schedext fences the GPUs it binds on a node both DRA and the device plugin offer
    (the shell publishes a DeviceTaintRule per GPU; filter then serves such a node)."""

    gpu_drivers: tuple[str, ...] = (names.DRA_GPU_DRIVER,)
    fence: bool = False

    def __post_init__(self) -> None:
        if not self.gpu_drivers or not all(d.strip() for d in self.gpu_drivers):
            raise ValueError("dra.gpu_drivers must name at least one driver, none empty")


@dataclass(frozen=True, slots=True)
class PolicyConfig:
    """The few knobs the policies take. Validated on construction; hashable (caches are keyed
    by it)."""

    gpu_resource: str = names.GPU_RESOURCE
    cpu_intensive_min_cpu_milli: int = 2000
    gpu_scoring: GpuScoring = GpuScoring.BINPACK
    # The built-in scorers' weights (shares of the 0..10 score; see extender.scoring): how full
    # the node's GPUs get, and whether the pod's GPUs fit inside one NVLink/NUMA group.
    allocation_weight: int = 7
    topology_weight: int = 3
    # Gang members: share of the score for landing in the rack (or else the zone) of the
    # members already placed, or, for the first member, in a rack that can hold the group.
    rack_weight: int = 10
    # Pods asking for an address: share of the score for the free share of the node's pool.
    ip_weight: int = 3
    # Any scorer's weight by its name, over the default above (a scorer with no knob of its
    # own is weighed only here): (("topology", 5), ("cpu_only", 0)). The names are checked by
    # the registry that owns them (extender.scoring.weights).
    weights: tuple[tuple[str, int], ...] = ()
    rack_label: str = names.RACK_LABEL
    zone_label: str = names.ZONE_LABEL
    # The node agent's live-use samples older than this are ignored (the live_use scorer
    # treats the node as unknown): an agent that stopped writing must not steer placement.
    live_use_stale_s: float = 300.0
    # GPU shares: the resources they are asked with, where they go, and the weight of the
    # gpu_share scorer.
    shares: ShareResources = ShareResources()
    share_placement: SharePlacement = SharePlacement.PACK
    share_weight: int = 7
    # Shortlist mode (extender.shortlist): filter answers only this many of the feasible
    # nodes, the best by the scorers, and kube-scheduler needs no prioritize call; 0 answers
    # every feasible node (full mode, prioritize registered). A pod that states soft
    # preferences gets ``shortlist_preferred`` nodes instead (never fewer than ``shortlist``),
    # for kube-scheduler to weigh them.
    shortlist: int = 0
    shortlist_preferred: int = 0
    # How many of the pods filter turned away for what a freeing gives back (GPUs, a share's
    # room, a MIG device, an address, quota headroom) one freeing sends back to kube-scheduler,
    # the longest waiting first (see extender.capacity_waits).
    requeue_per_event: int = 8
    dra: DraConfig = DraConfig()
    # A gang's topology levels (extender.gang.topology): node label keys, narrowest first.
    topology_levels: tuple[str, ...] = (
        names.CLIQUE_LABEL,
        names.RACK_LABEL,
        names.SPINE_LABEL,
        names.ZONE_LABEL,
    )

    def shortlist_size(self, *, soft_preferences: bool) -> int:
        """How many feasible nodes filter answers for a pod; 0: all of them."""
        if not self.shortlist:
            return 0
        return max(self.shortlist_preferred, self.shortlist) if soft_preferences else self.shortlist

    def __post_init__(self) -> None:
        if "/" not in self.gpu_resource or not self.gpu_resource.strip():
            raise ValueError(
                f"gpu_resource must be an extended resource name such as {names.GPU_RESOURCE}"
            )
        if self.cpu_intensive_min_cpu_milli < 0:
            raise ValueError("cpu_intensive_min_cpu_milli must be >= 0")
        if min(self.allocation_weight, self.topology_weight, self.rack_weight, self.ip_weight) < 0:
            raise ValueError("score weights must be >= 0")
        if self.allocation_weight + self.topology_weight == 0:
            raise ValueError("at least one score weight must be > 0")
        if any(weight < 0 for _, weight in self.weights):
            raise ValueError("score weights must be >= 0")
        if self.share_weight < 0:
            raise ValueError("score weights must be >= 0")
        if self.shares.count != self.gpu_resource and self.gpu_resource in self.shares.names():
            raise ValueError(
                f"{self.gpu_resource} counts whole GPUs: only the share count may reuse it"
            )
        if self.shortlist < 0 or self.shortlist_preferred < 0:
            raise ValueError("shortlist must be >= 0 (0: answer every feasible node)")
        if self.live_use_stale_s <= 0:
            raise ValueError("live_use_stale_s must be > 0")
        if self.requeue_per_event < 1:
            raise ValueError("requeue_per_event must be >= 1")
        levels = self.topology_levels
        if len(set(levels)) != len(levels) or not all(level.strip() for level in levels):
            raise ValueError("topology_levels must be distinct node label keys, none empty")
