"""The knobs the pure core takes (:class:`PolicyConfig`), built by the shell from settings."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from extender import names

__all__ = ["GpuScoring", "PolicyConfig"]


class GpuScoring(Enum):
    """Which allocation objective GPU pods are scored by (``allocation_weight`` goes to it)."""

    BINPACK = "binpack"  # fill the most-allocated GPU nodes first, keep whole nodes free
    SPREAD = "spread"  # prefer the least-allocated GPU nodes


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
        if self.live_use_stale_s <= 0:
            raise ValueError("live_use_stale_s must be > 0")
