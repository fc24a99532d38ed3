"""The throughput benchmark's placement-quality report: from the pods of a phase and the nodes
they were bound to, how well the GPUs were packed and how well multi-GPU pods fit NVLink.

The figures, per phase:

- GPU pods and how many were bound; plain pods (no GPU) are counted apart;
- nodes used (holding at least one GPU pod), nodes fully used (every GPU taken), and GPUs
  stranded: the free GPUs of the nodes that are used but not full (their sum, and their mean
  per such node). Fewer nodes used and fewer GPUs stranded is tighter packing;
- NVLink fit: of the pods with 2 or more GPUs whose ``schedext.io/gpu-ids`` annotation names
  as many devices as they asked for, the fraction whose devices lie in one NVLink group of
  their node. None where no pod could be judged (kube-scheduler alone writes no ids; the null
  extenders write a dummy "0");
- from schedext's ``schedext_placement_choice_total{choice}`` counter (before and after the
  phase): the share of binds where kube-scheduler chose the node schedext scored best
  (``best``), another one (``lower``), or one it did not score (``unscored``). None where the
  metric is absent.

Everything here is pure: records from API objects, figures from records. The benchmark does
the listing.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

JSON = dict[str, Any]
GPU = "nvidia.com/gpu"
GPU_IDS = "schedext.io/gpu-ids"
TOPOLOGY = "schedext.io/gpu-topology"
CHOICE_METRIC = "schedext_placement_choice_total"
CHOICES = ("best", "lower", "unscored")


@dataclass(frozen=True)
class NodeRecord:
    """A node's GPU count and NVLink groups (device indices; empty when unknown)."""

    name: str
    gpus: int
    groups: tuple[frozenset[int], ...] = ()


@dataclass(frozen=True)
class PodRecord:
    """A pod's node (None while pending), its GPU count, and the device indices schedext
    wrote at bind (None without the annotation)."""

    name: str
    node: str | None
    gpus: int
    gpu_ids: tuple[int, ...] | None = None


@dataclass(frozen=True)
class Quality:
    """The placement figures of one phase (see the module docstring)."""

    gpu_pods: int
    gpu_pods_bound: int
    plain_pods: int
    gpus_used: int
    nodes_used: int
    nodes_full: int
    nodes_partly_used: int
    gpus_stranded: int
    nvlink_judged: int
    nvlink_fit: float | None
    choices: dict[str, int] | None = None

    @property
    def stranded_per_partly_used(self) -> float | None:
        if not self.nodes_partly_used:
            return None
        return self.gpus_stranded / self.nodes_partly_used

    @property
    def best_choice_share(self) -> float | None:
        """The fraction of scored-and-bound pods placed on schedext's best node."""
        if not self.choices:
            return None
        total = sum(self.choices.values())
        return self.choices.get("best", 0) / total if total else None

    def as_json(self) -> JSON:
        def rounded(value: float | None) -> float | None:
            return None if value is None else round(value, 4)

        return {
            "gpu_pods": self.gpu_pods,
            "gpu_pods_bound": self.gpu_pods_bound,
            "plain_pods": self.plain_pods,
            "gpus_used": self.gpus_used,
            "nodes_used": self.nodes_used,
            "nodes_full": self.nodes_full,
            "nodes_partly_used": self.nodes_partly_used,
            "gpus_stranded": self.gpus_stranded,
            "stranded_per_partly_used": rounded(self.stranded_per_partly_used),
            "nvlink_judged": self.nvlink_judged,
            "nvlink_fit": rounded(self.nvlink_fit),
            "choices": self.choices,
            "best_choice_share": rounded(self.best_choice_share),
        }


# ---------------------------------------------------------------------------------------------
# Records from API objects
# ---------------------------------------------------------------------------------------------


def node_record(node: Mapping[str, Any]) -> NodeRecord:
    """From a Node: ``nvidia.com/gpu`` in allocatable, the groups of the topology annotation
    (``{"groups": [[0, 1, 2, 3], ...]}``; none when absent or unreadable)."""
    metadata = node.get("metadata") or {}
    allocatable = (node.get("status") or {}).get("allocatable") or {}
    groups: tuple[frozenset[int], ...] = ()
    text = (metadata.get("annotations") or {}).get(TOPOLOGY)
    if text:
        try:
            decoded = orjson.loads(text)
            groups = tuple(frozenset(int(i) for i in g) for g in decoded.get("groups") or ())
        except (orjson.JSONDecodeError, AttributeError, TypeError, ValueError):
            groups = ()
    return NodeRecord(metadata.get("name", ""), _count(allocatable.get(GPU)), groups)


def pod_record(pod: Mapping[str, Any]) -> PodRecord:
    """From a Pod: ``spec.nodeName``, the GPUs its containers limit (request where no limit),
    and the ``schedext.io/gpu-ids`` annotation (None when absent or unreadable)."""
    metadata = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    gpus = 0
    for container in spec.get("containers") or ():
        resources = container.get("resources") or {}
        amount = (resources.get("limits") or {}).get(GPU)
        if amount is None:
            amount = (resources.get("requests") or {}).get(GPU)
        gpus += _count(amount)
    text = (metadata.get("annotations") or {}).get(GPU_IDS)
    ids: tuple[int, ...] | None = None
    if text is not None:
        try:
            ids = tuple(int(part) for part in text.split(",") if part.strip())
        except ValueError:
            ids = None
    return PodRecord(metadata.get("name", ""), spec.get("nodeName") or None, gpus, ids)


def _count(value: object) -> int:
    try:
        return int(str(value)) if value is not None else 0
    except ValueError:
        return 0


# ---------------------------------------------------------------------------------------------
# Figures
# ---------------------------------------------------------------------------------------------


def placement_quality(
    pods: Iterable[PodRecord],
    nodes: Iterable[NodeRecord],
    choices: Mapping[str, int] | None = None,
) -> Quality:
    """The figures of one phase from its pods and the cluster's nodes (plain pods count only
    as plain pods; a node no GPU pod uses is not counted anywhere)."""
    by_name = {node.name: node for node in nodes}
    used: dict[str, int] = {}
    gpu_pods = bound = plain = judged = fit = 0
    for pod in pods:
        if pod.gpus <= 0:
            plain += 1
            continue
        gpu_pods += 1
        if pod.node is None:
            continue
        bound += 1
        used[pod.node] = used.get(pod.node, 0) + pod.gpus
        node = by_name.get(pod.node)
        verdict = _nvlink_verdict(pod, node)
        if verdict is not None:
            judged += 1
            fit += verdict
    full = partly = stranded = 0
    for name, taken in used.items():
        node = by_name.get(name)
        if node is None or node.gpus <= 0:
            continue
        free = max(node.gpus - taken, 0)
        if free == 0:
            full += 1
        else:
            partly += 1
            stranded += free
    return Quality(
        gpu_pods=gpu_pods,
        gpu_pods_bound=bound,
        plain_pods=plain,
        gpus_used=sum(used.values()),
        nodes_used=len(used),
        nodes_full=full,
        nodes_partly_used=partly,
        gpus_stranded=stranded,
        nvlink_judged=judged,
        nvlink_fit=fit / judged if judged else None,
        choices=dict(choices) if choices is not None else None,
    )


def _nvlink_verdict(pod: PodRecord, node: NodeRecord | None) -> bool | None:
    """Whether a multi-GPU pod's devices share one NVLink group; None when it cannot be told
    (one GPU, no or a dummy annotation, a node without known groups)."""
    if pod.gpus < 2 or pod.gpu_ids is None or len(set(pod.gpu_ids)) != pod.gpus:
        return None
    if node is None or not node.groups:
        return None
    ids = set(pod.gpu_ids)
    return any(ids <= group for group in node.groups)


def choice_counts(
    before: Mapping[str, float] | None, after: Mapping[str, float] | None
) -> dict[str, int] | None:
    """The ``choice`` label's counts over a window, from the counter's per-label sums before
    and after; None when the metric is absent after (a schedext without it, no schedext)."""
    if not after:
        return None
    before = before or {}
    return {
        choice: int(after.get(choice, 0.0) - before.get(choice, 0.0))
        for choice in sorted({*CHOICES, *after})
    }


# ---------------------------------------------------------------------------------------------
# Medians and the table
# ---------------------------------------------------------------------------------------------

MEDIAN_KEYS = (
    "nodes_used",
    "nodes_full",
    "gpus_stranded",
    "stranded_per_partly_used",
    "nvlink_fit",
    "best_choice_share",
)


def medians(figures: Sequence[Mapping[str, Any]]) -> JSON:
    """The median of each figure over several phases of one kind (None where none has it)."""
    result: JSON = {}
    for key in MEDIAN_KEYS:
        values = [f[key] for f in figures if f.get(key) is not None]
        result[key] = round(statistics.median(values), 4) if values else None
    return result


TABLE_HEADER = (
    f"{'phase':<9}{'GPU pods':>9}{'bound':>7}{'plain':>7}{'nodes':>7}{'full':>6}"
    f"{'stranded':>10}{'/partly':>9}{'NVLink fit':>12}{'best node':>11}"
)


def table_row(label: str, figures: Mapping[str, Any]) -> str:
    """One line of the quality table, from :meth:`Quality.as_json` (or :func:`medians`,
    whose counts are left blank)."""

    def cell(key: str, width: int, form: str) -> str:
        value = figures.get(key)
        # A figure that could not be had is n/a; one the row does not carry stays blank.
        text = ("n/a" if key in figures else "") if value is None else format(value, form)
        return f"{text:>{width}}"

    return (
        f"{label:<9}{cell('gpu_pods', 9, 'd')}{cell('gpu_pods_bound', 7, 'd')}"
        f"{cell('plain_pods', 7, 'd')}{cell('nodes_used', 7, 'g')}{cell('nodes_full', 6, 'g')}"
        f"{cell('gpus_stranded', 10, 'g')}{cell('stranded_per_partly_used', 9, '.2f')}"
        f"{cell('nvlink_fit', 12, '.1%')}{cell('best_choice_share', 11, '.1%')}"
    )
