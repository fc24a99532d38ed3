"""The shell's report of what DRA's claims ledger could not read or count
(app.service.dra_problems): the decision of each pass (what is new, what is gone) as a table,
the reporter's log lines, Warning events and gauge values over passes, and the Event posted
on a ResourceClaim or a ResourceSlice."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass

import httpx
import orjson
import pytest

from app.kube.events import ApiEventRecorder, DraEvent
from app.kube.readiness import Readiness
from app.service.dra_problems import (
    KINDS,
    REASON,
    DraProblemReporter,
    compare,
    counts,
    event_for,
)
from extender.dra import Problem
from extender.scheduler import Scheduler
from testbed.builders import agent_annotations, make_node
from testbed.dra_builders import gpu, resource_claim, resource_slice, result
from tests.recorded_events import RecordedEvents
from tests.unit.kube_fakes import FakeApiServer

GHOST = Problem("ResourceClaim", "ml/ghost", "gpu.nvidia.com/n1/gpu-9 is in no ResourceSlice")
SLICE = Problem("ResourceSlice", "n1-slice", "device 'gpu-0': no uuid")
SLICE_2 = Problem("ResourceSlice", "n1-slice", "device 'gpu-1': no uuid")
REFUSED = Problem("Pod", "uid-1", "refused: the book holds 100000 of its kind")


@dataclass(frozen=True)
class Case:
    id: str
    reported: frozenset[Problem]
    current: tuple[Problem, ...]
    limit: int
    new: tuple[Problem, ...]
    gone: tuple[Problem, ...]
    held_back: int
    after: frozenset[Problem]


CASES = [
    Case("nothing", frozenset(), (), 5, (), (), 0, frozenset()),
    Case("first seen", frozenset(), (GHOST,), 5, (GHOST,), (), 0, frozenset({GHOST})),
    Case("seen again: nothing new", frozenset({GHOST}), (GHOST,), 5, (), (), 0, frozenset({GHOST})),
    Case("gone", frozenset({GHOST}), (), 5, (), (GHOST,), 0, frozenset()),
    Case(
        "the reason changed: the new one is new, the old one gone",
        frozenset({SLICE}), (SLICE_2,), 5, (SLICE_2,), (SLICE,), 0, frozenset({SLICE_2}),
    ),
    Case(
        "past the limit: the first ones by kind and key, the rest held back",
        frozenset(), (SLICE_2, GHOST, SLICE, REFUSED), 2, (REFUSED, GHOST), (), 2,
        frozenset({GHOST, REFUSED}),
    ),
    Case(
        "held back ones come next",
        frozenset({GHOST, REFUSED}), (REFUSED, SLICE_2, GHOST, SLICE), 2, (SLICE, SLICE_2), (), 0,
        frozenset({GHOST, REFUSED, SLICE, SLICE_2}),
    ),
]  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_each_pass_decides_what_is_new_and_what_is_gone(case: Case) -> None:
    decided = compare(case.reported, case.current, limit=case.limit)
    assert (decided.new, decided.gone, decided.held_back) == (case.new, case.gone, case.held_back)
    assert decided.reported == case.after


def test_counts_have_every_kind_and_an_event_names_the_object() -> None:
    assert counts([GHOST, SLICE, SLICE_2]) == dict.fromkeys(KINDS, 0) | {
        "ResourceClaim": 1,
        "ResourceSlice": 2,
    }
    assert event_for(GHOST) == DraEvent("ResourceClaim", "ml/ghost", REASON, GHOST.reason)
    assert event_for(REFUSED) is None  # a pod known by its UID alone


class Gauge:
    def __init__(self) -> None:
        self.values: list[dict[str, int]] = []

    def __call__(self, by_kind: Mapping[str, int]) -> None:
        self.values.append(dict(by_kind))


def ghost_claim(scheduler: Scheduler) -> None:
    node = make_node("n1", gpus=2, annotations=agent_annotations(2, uuid_prefix="GPU-n1"))
    scheduler.upsert_node(node)
    scheduler.upsert_resource_slice(resource_slice("n1", [gpu(0), gpu(1)]))
    claim = resource_claim("ghost", namespace="ml", results=[result("n1", "gpu-9")], node="n1")
    scheduler.upsert_resource_claim(claim)


def test_a_claim_naming_a_device_no_slice_has_is_logged_and_posted_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    scheduler, events, gauge = Scheduler(), RecordedEvents(), Gauge()
    ghost_claim(scheduler)
    reporter = DraProblemReporter(events, gauge, interval_s=10)
    readiness = Readiness()
    with caplog.at_level(logging.INFO, logger="schedext.dra"):
        reporter.check(scheduler, readiness, 0.0)  # not synced: a slice may not be listed yet
        assert (events.events, gauge.values) == ([], [])
        readiness.set_ready()
        reporter.check(scheduler, readiness, 1.0)
        reporter.check(scheduler, readiness, 5.0)  # not due yet
        reporter.check(scheduler, readiness, 11.0)  # due: the same problem, not reported again
    assert events.events == [DraEvent("ResourceClaim", "ml/ghost", REASON, GHOST.reason)]
    assert [r.getMessage() for r in caplog.records] == [f"ResourceClaim ml/ghost: {GHOST.reason}"]
    assert caplog.records[0].levelno == logging.WARNING
    assert len(gauge.values) == 2
    assert gauge.values[-1]["ResourceClaim"] == 1

    # The claim lets go: the problem is gone (one line), and reported again if it comes back.
    scheduler.upsert_resource_claim(resource_claim("ghost", namespace="ml"))
    reporter.check(scheduler, readiness, 21.0)
    assert gauge.values[-1]["ResourceClaim"] == 0
    ghost_claim(scheduler)
    reporter.check(scheduler, readiness, 31.0)
    assert len(events.events) == 2


def test_a_standby_exports_the_gauge_but_neither_logs_nor_posts() -> None:
    scheduler, events, gauge = Scheduler(), RecordedEvents(), Gauge()
    ghost_claim(scheduler)
    reporter = DraProblemReporter(events, gauge)
    readiness = Readiness(synced=True, leading=False)
    reporter.check(scheduler, readiness, 0.0)
    assert events.events == []
    assert gauge.values[-1]["ResourceClaim"] == 1
    readiness.set_leading(True, "me")
    reporter.check(scheduler, readiness, 100.0)
    assert len(events.events) == 1


def post(event: DraEvent) -> httpx.Request:
    """The request the API recorder sends for ``event``."""
    posted: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        posted.append(request)
        return httpx.Response(201, json={})

    async def run() -> None:
        recorder = ApiEventRecorder(FakeApiServer(other=answer).api())
        await recorder.start()
        recorder.record(event)
        for _ in range(200):
            if posted:
                break
            await asyncio.sleep(0.01)
        await recorder.stop()

    asyncio.run(run())
    (request,) = posted
    return request


def test_the_event_is_posted_on_the_claim_in_its_namespace() -> None:
    request = post(DraEvent("ResourceClaim", "ml/ghost", REASON, "why"))
    body = orjson.loads(request.content)
    assert request.url.path == "/api/v1/namespaces/ml/events"
    assert body["involvedObject"] == {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "namespace": "ml",
        "name": "ghost",
        "uid": "",
    }
    assert (body["type"], body["reason"], body["message"]) == ("Warning", REASON, "why")


def test_the_event_on_a_cluster_scoped_slice_lives_in_default() -> None:
    request = post(DraEvent("ResourceSlice", "n1-slice", REASON, "why"))
    body = orjson.loads(request.content)
    assert request.url.path == "/api/v1/namespaces/default/events"
    assert body["involvedObject"] == {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "name": "n1-slice",
        "uid": "",
    }
