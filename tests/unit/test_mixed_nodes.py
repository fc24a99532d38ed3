"""A node whose GPUs both the device plugin and DRA offer is reported once, as a Warning event
on the Node, each time it becomes mixed (app.service.node_problems.MixedNodeReporter)."""

from __future__ import annotations

import pytest

from app.kube.events import NodeEvent
from app.service.node_problems import MixedNodeReporter
from extender.dra import Ownership
from tests.recorded_events import RecordedEvents

MIXED, DRA = Ownership.MIXED, Ownership.DRA


@pytest.mark.parametrize(
    ("passes", "reported"),
    [
        pytest.param([{"a": MIXED}], ["a"], id="a mixed node: one event"),
        pytest.param([{"a": MIXED}, {"a": MIXED}], ["a"], id="still mixed: no second event"),
        pytest.param([{"a": DRA}], [], id="a DRA node: none"),
        pytest.param([{"a": MIXED}, {"a": DRA}, {"a": MIXED}], ["a", "a"], id="mixed again: again"),
        pytest.param([{"b": MIXED, "a": MIXED}], ["a", "b"], id="two nodes, by name"),
    ],
)
def test_a_node_is_reported_when_it_becomes_mixed(
    passes: list[dict[str, Ownership]], reported: list[str]
) -> None:
    events = RecordedEvents()
    reporter = MixedNodeReporter(events, fence=False)
    for owners in passes:
        reporter.check(owners)
    assert [e.node for e in events.events if isinstance(e, NodeEvent)] == reported
    assert all(e.reason == "GpuOwnerMixed" and e.warning for e in events.events)


@pytest.mark.parametrize(
    ("fence", "says"),
    [(False, "refuses it to its GPU pods"), (True, "fences the GPUs it binds")],
)
def test_the_event_says_what_schedext_does_about_it(fence: bool, says: str) -> None:
    events = RecordedEvents()
    MixedNodeReporter(events, fence=fence).check({"a": MIXED})
    (event,) = events.events
    assert isinstance(event, NodeEvent)
    assert "offered twice" in event.message
    assert says in event.message
