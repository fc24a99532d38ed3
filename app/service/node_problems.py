"""Warning events on the nodes whose agent annotations schedext could not read, and on the
nodes whose GPUs both the device plugin and DRA offer.

A malformed or newer-version ``schedext.io/gpu-topology`` is read as "no topology" (the node
stays usable), and a ``schedext.io/gpu-drift`` as "no drift"; the operator learns of it here,
once per new problem, on the Node itself (``kubectl describe node``), and from the
``schedext_node_annotations_unreadable`` gauge.

A *mixed* node (extender.dra.ownership) is a misconfiguration: NVIDIA's device plugin and its
DRA driver both offer the node's GPUs, and either may hand one out behind the other's back.
schedext refuses it to its GPU pods (or, with ``dra.fence``, fences the GPUs it binds); the
operator learns of it once per node that becomes mixed, here and in the log, and from the
``schedext_nodes_by_gpu_owner`` gauge.

With the fence on, a GPU schedext binds there that cannot be fenced (extender.fencing: no UUID
to match it to a DRA device by) is reported the same way, once each time it appears: DRA's
allocator may hand it out too."""

from __future__ import annotations

import logging
from collections.abc import Mapping

from app.kube.events import EventRecorder, NodeEvent, PodGroupEvent
from extender.dra import Ownership
from extender.fencing import FencePlan, Unfenced

__all__ = ["GangTopologyReporter", "MixedNodeReporter", "NodeProblemReporter", "UnfencedReporter"]

log = logging.getLogger("schedext.nodes")


class NodeProblemReporter:
    def __init__(self, events: EventRecorder) -> None:
        self._events = events
        self._reported: dict[str, tuple[str, ...]] = {}

    def check(self, problems: Mapping[str, tuple[str, ...]]) -> None:
        """Record an event for each node whose problem is new or changed since the last call."""
        if problems == self._reported:
            return
        for node, why in problems.items():
            if self._reported.get(node) != why:
                message = "; ".join(why) + " (ignored: the node is used without it)"
                self._events.record(NodeEvent(node, "GpuAnnotationUnreadable", message))
        self._reported = dict(problems)


class MixedNodeReporter:
    def __init__(self, events: EventRecorder, *, fence: bool) -> None:
        self._events = events
        self._fence = fence
        self._mixed: set[str] = set()

    def check(self, owners: Mapping[str, Ownership]) -> None:
        """A Warning event and a log line for each node that became mixed since the last
        call; a node that stops being mixed is forgotten (reported again if it returns)."""
        mixed = {node for node, owner in owners.items() if owner is Ownership.MIXED}
        for node in sorted(mixed - self._mixed):
            if self._fence:
                effect = "schedext fences the GPUs it binds here (dra.fence)"
            else:
                effect = "schedext refuses it to its GPU pods; run one of them, or set dra.fence"
            message = (
                "the node's GPUs are offered twice, by the device plugin (nvidia.com/gpu) and "
                f"by a DRA driver's ResourceSlices: {effect}"
            )
            log.warning("GPUs offered twice", extra={"node": node, "fenced": self._fence})
            self._events.record(NodeEvent(node, "GpuOwnerMixed", message))
        self._mixed = mixed


class UnfencedReporter:
    def __init__(self, events: EventRecorder) -> None:
        self._events = events
        self._reported: set[Unfenced] = set()

    def check(self, plan: FencePlan) -> None:
        """A Warning event on the node, and a log line, for each GPU that cannot be fenced
        and was not last time; one fenced again (or let go) is forgotten."""
        unfenced = set(plan.unfenced)
        for gpu in sorted(unfenced - self._reported):
            message = (
                f"{gpu.gpu}, bound to pod {gpu.pod}, cannot be fenced from DRA: {gpu.why}; "
                "DRA's allocator may hand it out too"
            )
            log.warning(
                "GPU not fenced", extra={"node": gpu.node, "pod": gpu.pod, "reason": gpu.why}
            )
            self._events.record(NodeEvent(gpu.node, "GpuNotFenced", message))
        self._reported = unfenced


class GangTopologyReporter:
    """A Warning event on each PodGroup whose topology annotation is not followed (a level
    not configured, annotations that disagree: the gang runs without that rule), once per
    problem; again when the reason changes."""

    def __init__(self, events: EventRecorder) -> None:
        self._events = events
        self._reported: dict[str, str] = {}

    def check(self, problems: Mapping[str, tuple[str, str]]) -> None:
        for group, (uid, why) in sorted(problems.items()):
            if self._reported.get(group) != why:
                log.warning("gang topology ignored", extra={"group": group, "why": why})
                self._events.record(PodGroupEvent(group, "TopologyIgnored", why, uid=uid))
        self._reported = {group: why for group, (_, why) in problems.items()}
