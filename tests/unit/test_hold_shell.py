"""The shell's side of gangs' holds: each hold written on its PodGroup (HoldRecords: once per
change, removed when it ends, nothing while the watch lags, a PodGroup gone skipped, another
failure logged and retried), and what each review tells (HoldReporter: the PodGroup's events,
Normal when a hold starts or ends, Warning when it expires; the metrics)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson
import pytest

from app.kube.events import PodGroupEvent
from app.kube.hold_records import HoldRecords
from app.service.gang_holds import HoldReporter
from app.service.metrics import Metrics
from extender import names
from extender.gang.holds import hold_record
from extender.scheduler import Scheduler
from testbed.builders import gang_pod, make_pod_group, uid_of
from tests.recorded_events import RecordedEvents
from tests.unit.kube_fakes import FakeApiServer
from tests.unit.test_gang_holds import BUSY, T0, gang, scheduler_of, waited

PATH = "/apis/scheduling.x-k8s.io/v1alpha1/namespaces/default/podgroups"


def holding() -> Scheduler:
    """Gang default/g (2 x 8) held on n1 and n2 since T0 + 61."""
    scheduler = scheduler_of([*BUSY, *gang(2, 8)])
    waited(scheduler, 61)
    assert scheduler.gang_holds()
    return scheduler


def recorded(scheduler: Scheduler, group: str = "g") -> None:
    """The watch shows the PodGroup carrying the hold's record as it stands."""
    (hold,) = scheduler.gang_holds()
    annotations = {names.GANG_HOLD: hold_record(hold)}
    scheduler.upsert_pod_group(make_pod_group(group, min_member=2, annotations=annotations))


@dataclass
class Patches:
    """The API server's side: the merge patches it got (path, body), and its answer to each."""

    answer: Callable[[str], int] = lambda _path: 200
    got: list[tuple[str, Any]] = field(default_factory=list)

    def handle(self, request: httpx.Request) -> httpx.Response:
        assert request.method == "PATCH"
        assert request.headers["content-type"] == "application/merge-patch+json"
        path = request.url.path
        self.got.append((path, orjson.loads(request.content)))
        status = self.answer(path)
        return httpx.Response(status, json={"kind": "Status", "code": status} if status >= 300
                              else {"metadata": {}})  # fmt: skip

    def records(self, scheduler: Scheduler) -> HoldRecords:
        return HoldRecords(FakeApiServer(other=self.handle).api(), scheduler)


def body(record: str | None) -> dict[str, Any]:
    return {"metadata": {"annotations": {names.GANG_HOLD: record}}}


def test_a_hold_that_starts_is_written_on_its_podgroup_once_while_the_watch_lags() -> None:
    scheduler, patches = holding(), Patches()
    records = patches.records(scheduler)
    asyncio.run(records.write_once())
    asyncio.run(records.write_once())  # the watch has not shown the annotation yet
    (hold,) = scheduler.gang_holds()
    assert patches.got == [(f"{PATH}/g", body(hold_record(hold)))]
    recorded(scheduler)  # now it has
    asyncio.run(records.write_once())
    assert len(patches.got) == 1


def test_a_podgroup_that_carries_the_record_already_gets_nothing() -> None:
    scheduler, patches = holding(), Patches()
    recorded(scheduler)
    asyncio.run(patches.records(scheduler).write_once())
    assert patches.got == []


def test_a_hold_that_ends_has_its_record_removed() -> None:
    scheduler, patches = holding(), Patches()
    recorded(scheduler)
    scheduler.review_holds(T0 + 61 + 600)  # it expires
    assert not scheduler.gang_holds()
    asyncio.run(patches.records(scheduler).write_once())
    assert patches.got == [(f"{PATH}/g", body(None))]  # null: merge patch removes it


def test_a_podgroup_gone_is_skipped_and_another_failure_logged_and_retried(
    caplog: pytest.LogCaptureFixture,
) -> None:
    scheduler = scheduler_of([*BUSY, *gang(2, 8), make_pod_group("h", min_member=1,
                              annotations={names.GANG_HOLD: "left over"})])  # fmt: skip
    waited(scheduler, 61)
    patches = Patches(answer=lambda path: 404 if path.endswith("/g") else 403)
    records = patches.records(scheduler)
    with caplog.at_level(logging.WARNING, logger="schedext.holds"):
        asyncio.run(records.write_once())  # raises nothing
    assert [path for path, _ in patches.got] == [f"{PATH}/g", f"{PATH}/h"]
    (warning,) = caplog.records
    assert warning.getMessage().startswith("cannot record the hold on default/h: ")
    asyncio.run(records.write_once())  # neither was written: both are tried again
    assert [path for path, _ in patches.got][2:] == [f"{PATH}/g", f"{PATH}/h"]


# ----------------------------------------------------------------------- reporter


@dataclass(frozen=True)
class Told:
    id: str
    then: Callable[[Scheduler], float]  # changes the cluster; the time of the next review
    reason: str
    warning: bool
    message: str
    event: str


def placed(scheduler: Scheduler) -> float:
    """The small pods finish and the members are bound where their GPUs were held."""
    for pod in BUSY[3:11]:
        scheduler.delete_pod(uid_of(pod))
    for i, on in enumerate(["n1", "n2"]):
        scheduler.upsert_pod(gang_pod(f"m{i}", "g", gpus=8, node=on, phase="Running"))
    return T0 + 72


TOLD = [
    Told("expired at its maximum age", lambda _s: T0 + 61 + 600, "GangHoldExpired", True,
         "hold of 16 GPUs on n1, n2 expired: it reached its maximum age (600s): the gang "
         "waits afresh", "expired"),
    Told("ended: the gang is placed", placed, "GangHoldEnded", False,
         "hold of 16 GPUs on n1, n2 ended: its members are placed", "ended"),
]  # fmt: skip


@pytest.mark.parametrize("case", TOLD, ids=lambda c: c.id)
def test_the_reporter_tells_each_hold_on_its_podgroup_and_counts_it(case: Told) -> None:
    scheduler = scheduler_of([*BUSY, *gang(2, 8)])
    events, metrics = RecordedEvents(), Metrics(lambda: scheduler)
    reporter = HoldReporter(events, metrics.holds)
    value = metrics.registry.get_sample_value
    reporter.review(scheduler, T0)
    assert reporter.review(scheduler, T0 + 61)
    assert events.events == [
        PodGroupEvent(
            "default/g", "GangHoldStarted",
            "holding 16 GPUs on n1, n2 for the gang (it has waited 61s for 16 GPUs); pods of "
            "no higher priority go elsewhere until it is placed",
            warning=False, uid="pg-uid-g",
        )
    ]  # fmt: skip
    assert value("schedext_gang_hold_events_total", {"event": "started"}) == 1
    assert value("schedext_gang_holds") == 1
    # n1 has 2 GPUs free and n2 6, all kept for the gang: 8, for 10 s.
    reporter.review(scheduler, T0 + 71)
    assert value("schedext_gang_hold_idle_gpus") == 8
    assert value("schedext_gang_hold_idle_gpu_seconds_total") == 80
    reporter.review(scheduler, case.then(scheduler))
    last = events.events[-1]
    assert isinstance(last, PodGroupEvent)
    assert (last.group, last.reason, last.warning, last.uid) == (
        "default/g",
        case.reason,
        case.warning,
        "pg-uid-g",
    )
    assert last.message == case.message
    assert value("schedext_gang_hold_events_total", {"event": case.event}) == 1
    assert value("schedext_gang_holds") == 0
