"""NVLink/NUMA fit: a GPU pod prefers nodes where all its GPUs fit inside one NVLink/NUMA
group (the node agent's ``schedext.io/gpu-topology``), where they talk fastest. A DRA pod
likewise, over DRA's free devices: grouped by the agent's topology (matched by UUID), or by
PCIe root where no agent publishes one (extender.dra.capacity). DRA's own allocator picks
the devices inside the node; this only prefers the nodes where it can pick a group."""

from __future__ import annotations

from extender.scoring.scorer import Candidates, FloatArray, Scorer, for_gpu_pods

__all__ = ["SCORER"]


def _score(nodes: Candidates) -> FloatArray:
    # A node without known groups has group_free -1: it never earns the bonus.
    fit = nodes.gpus()
    return (fit.group_free >= fit.asked).astype(float)


SCORER = Scorer(
    name="topology",
    default_weight=lambda config: config.topology_weight,
    applies=for_gpu_pods,
    score=_score,
)
