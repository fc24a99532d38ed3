"""NVLink/NUMA fit: a GPU pod prefers nodes where all its GPUs fit inside one NVLink/NUMA
group (the node agent's ``schedext.io/gpu-topology``), where they talk fastest."""

from __future__ import annotations

from extender.scoring.scorer import Candidates, FloatArray, Scorer, for_gpu_pods

__all__ = ["SCORER"]


def _score(nodes: Candidates) -> FloatArray:
    # A node without published groups has max_group_free -1: it never earns the bonus.
    return (nodes.column("max_group_free") >= nodes.request.gpus).astype(float)


SCORER = Scorer(
    name="topology",
    default_weight=lambda config: config.topology_weight,
    applies=for_gpu_pods,
    score=_score,
)
