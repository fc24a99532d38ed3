"""Warning events on the nodes whose agent annotations schedext could not read.

A malformed or newer-version ``schedext.io/gpu-topology`` is read as "no topology" (the node
stays usable), and a ``schedext.io/gpu-drift`` as "no drift"; the operator learns of it here,
once per new problem, on the Node itself (``kubectl describe node``), and from the
``schedext_node_annotations_unreadable`` gauge."""

from __future__ import annotations

from collections.abc import Mapping

from app.kube.events import EventRecorder, NodeEvent

__all__ = ["NodeProblemReporter"]


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
