"""A node whose GPUs both the device plugin and DRA offer is reported once, as a Warning event
on the Node, each time it becomes mixed (app.service.node_problems.MixedNodeReporter); so is a
GPU schedext binds there that the fence cannot cover (UnfencedReporter)."""

from __future__ import annotations

import pytest

from app.kube.events import NodeEvent
from app.service.node_problems import MixedNodeReporter, UnfencedReporter
from extender.dra import FenceDiff, Ownership
from extender.fencing import FencePlan, Unfenced
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


def unfenced_plan(*gpus: Unfenced) -> FencePlan:
    return FencePlan(rules=(), unfenced=gpus, diff=FenceDiff())


NO_UUID = Unfenced("a", "ml/p", "GPU 1", "the node agent publishes no UUID for it")


@pytest.mark.parametrize(
    ("passes", "reported"),
    [
        pytest.param([[NO_UUID]], 1, id="a GPU that cannot be fenced: one event"),
        pytest.param([[NO_UUID], [NO_UUID]], 1, id="still unfenced: no second event"),
        pytest.param([[NO_UUID], [], [NO_UUID]], 2, id="let go, and again: again"),
        pytest.param([[]], 0, id="everything fenced: none"),
    ],
)
def test_a_gpu_that_cannot_be_fenced_is_reported_on_its_node(
    passes: list[list[Unfenced]], reported: int
) -> None:
    events = RecordedEvents()
    reporter = UnfencedReporter(events)
    for gpus in passes:
        reporter.check(unfenced_plan(*gpus))
    assert len(events.events) == reported
    for event in events.events:
        assert isinstance(event, NodeEvent)
        assert (event.node, event.reason, event.warning) == ("a", "GpuNotFenced", True)
        assert "GPU 1, bound to pod ml/p, cannot be fenced" in event.message
        assert "publishes no UUID" in event.message
