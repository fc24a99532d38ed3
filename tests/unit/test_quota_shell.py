"""The shell's side of ElasticQuotas: the watch's sink (bad and shadowed quotas skipped, each
reported once per object version with a log line and a Warning event) and the ``status.used``
write-back (only on change, only while ready)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import httpx
import orjson
import pytest

from app.kube.events import QuotaEvent
from app.kube.readiness import Readiness
from app.kube.status import QuotaStatusWriter
from app.service.quotas import INVALID, SHADOWED, QuotaSink
from extender import names
from extender.scheduler import Scheduler
from testbed.builders import elastic_quota, make_node, make_pod
from tests.recorded_events import RecordedEvents
from tests.unit.kube_fakes import FakeApiServer

GPU = names.GPU_RESOURCE


def quota(namespace: str, version: str = "1", **kwargs: Any) -> dict[str, Any]:
    obj = elastic_quota(namespace, **kwargs)
    obj["metadata"]["resourceVersion"] = version
    return obj


def relist(sink: QuotaSink, objs: list[dict[str, Any]]) -> None:
    batch = sink.relist()
    batch.add(objs)
    batch.commit()


def warnings(events: RecordedEvents) -> list[tuple[str, str]]:
    return [(e.quota, e.reason) for e in events.events if isinstance(e, QuotaEvent) and e.warning]


def new_sink() -> tuple[Scheduler, RecordedEvents, QuotaSink]:
    scheduler, events = Scheduler(), RecordedEvents()
    return scheduler, events, QuotaSink(scheduler, events)


BAD = [
    ("min over max", {GPU: "8"}, {GPU: "4"}, "min 8 is over max 4 for nvidia.com/gpu"),
    ("negative", {GPU: "-1"}, None, "spec.min.nvidia.com/gpu is negative"),
    ("unknown resource", {"example.com/fpga": "1"}, None, "names example.com/fpga"),
]


@pytest.mark.parametrize(("low", "high", "why"), [c[1:] for c in BAD], ids=[c[0] for c in BAD])
def test_a_bad_quota_is_skipped_with_one_warning_and_one_log_line_per_version(
    low: dict[str, Any], high: dict[str, Any] | None, why: str, caplog: pytest.LogCaptureFixture
) -> None:
    scheduler, events, sink = new_sink()
    caplog.set_level(logging.WARNING, logger="schedext.quotas")
    bad = quota("team-b", min=low, max=high)
    relist(sink, [quota("team-a", min={GPU: 4}), bad])
    sink.upsert(bad)  # a resync of the same version
    relist(sink, [quota("team-a", min={GPU: 4}), bad])  # a relist
    assert [q.key for q in scheduler.quotas()] == ["team-a/team-a"]  # the rest keeps working
    assert warnings(events) == [("team-b/team-b", INVALID)]
    (event,) = events.events
    assert isinstance(event, QuotaEvent)
    assert why in event.message
    assert event.uid == "eq-uid-team-b-team-b"
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1
    assert why in lines[0]
    assert "team-b/team-b" in lines[0]
    sink.upsert(quota("team-b", "2", min=low, max=high))  # edited, still bad: news
    assert warnings(events) == [("team-b/team-b", INVALID)] * 2


def test_a_quota_edited_into_a_bad_one_stops_applying_and_a_fix_applies_again() -> None:
    scheduler, events, sink = new_sink()
    sink.upsert(quota("team-a", min={GPU: 4}))
    sink.upsert(quota("team-a", "2", min={GPU: 8}, max={GPU: 4}))
    assert scheduler.quotas() == []
    sink.upsert(quota("team-a", "3", min={GPU: 4}))
    assert [q.key for q in scheduler.quotas()] == ["team-a/team-a"]
    sink.upsert(quota("team-a", "4", min={GPU: 8}, max={GPU: 4}))  # broken again: news again
    assert warnings(events) == [("team-a/team-a", INVALID)] * 2


def test_a_second_quota_in_a_namespace_is_shadowed_with_a_warning_until_the_first_goes() -> None:
    scheduler, events, sink = new_sink()
    first = quota("team-a", min={GPU: 4}, created="2026-01-01T00:00:00Z")
    second = quota("team-a", name="late", min={GPU: 8}, created="2026-02-01T00:00:00Z")
    relist(sink, [first])
    sink.upsert(second)
    sink.upsert(first)  # nothing new about the shadowed one
    relist(sink, [first, second])
    assert warnings(events) == [("team-a/late", SHADOWED)]
    assert "team-a/team-a is older" in events.events[0].message
    sink.delete(first)
    assert [q.key for q in scheduler.quotas()] == ["team-a/late"]
    sink.upsert(first)  # back (a new object: it is the oldest again by its timestamp)
    assert warnings(events) == [("team-a/late", SHADOWED)] * 2


def test_a_missing_crd_is_an_empty_relist() -> None:
    scheduler, events, sink = new_sink()
    sink.upsert(quota("team-a", min={GPU: 4}))
    relist(sink, [])
    assert scheduler.quotas() == []
    assert events.events == []


def status_server() -> tuple[FakeApiServer, list[tuple[str, Any]]]:
    patches: list[tuple[str, Any]] = []

    def answer(request: httpx.Request) -> httpx.Response:
        assert request.method == "PATCH"
        assert request.headers["content-type"] == "application/merge-patch+json"
        patches.append((request.url.path, orjson.loads(request.content)))
        if "gone" in request.url.path:
            return httpx.Response(404, json={"kind": "Status", "code": 404})
        return httpx.Response(200, json={})

    return FakeApiServer(other=answer), patches


def test_status_used_is_written_per_applying_quota_only_when_it_changes() -> None:
    scheduler = Scheduler()
    scheduler.upsert_node(make_node("n1", gpus=8))
    scheduler.upsert_quota(elastic_quota("team-a", min={GPU: 4, "cpu": 2}, max={GPU: 8}))
    scheduler.upsert_quota(elastic_quota("team-b", min={GPU: 4}))
    scheduler.upsert_pod(make_pod("a1", namespace="team-a", gpus=2, cpu="500m", node="n1"))
    server, patches = status_server()
    writer = QuotaStatusWriter(server.api(), scheduler, Readiness(synced=True))

    asyncio.run(writer.write_once())
    path = "/apis/scheduling.x-k8s.io/v1alpha1/namespaces/{0}/elasticquotas/{0}/status"
    assert sorted(patches) == [
        (path.format("team-a"), {"status": {"used": {GPU: "2", "cpu": "500m"}}}),
        (path.format("team-b"), {"status": {"used": {GPU: "0"}}}),
    ]
    patches.clear()
    asyncio.run(writer.write_once())
    assert patches == []  # nothing changed
    scheduler.upsert_pod(make_pod("a2", namespace="team-a", gpus=1, cpu="1", node="n1"))
    asyncio.run(writer.write_once())
    assert patches == [(path.format("team-a"), {"status": {"used": {GPU: "3", "cpu": "1500m"}}})]


def test_a_resource_dropped_from_the_quota_is_removed_from_status_used() -> None:
    scheduler = Scheduler()
    scheduler.upsert_quota(elastic_quota("team-a", min={GPU: 4, "cpu": 2}))
    server, patches = status_server()
    writer = QuotaStatusWriter(server.api(), scheduler, Readiness(synced=True))
    asyncio.run(writer.write_once())
    scheduler.upsert_quota(elastic_quota("team-a", min={GPU: 4}))
    patches.clear()
    asyncio.run(writer.write_once())
    assert [body for _, body in patches] == [{"status": {"used": {GPU: "0", "cpu": None}}}]


def test_a_quota_gone_from_the_api_server_is_not_retried_until_it_changes() -> None:
    scheduler = Scheduler()
    scheduler.upsert_quota(elastic_quota("gone", min={GPU: 4}))
    server, patches = status_server()
    writer = QuotaStatusWriter(server.api(), scheduler, Readiness(synced=True))
    asyncio.run(writer.write_once())
    asyncio.run(writer.write_once())
    assert len(patches) == 2  # not remembered as written: tried again


def test_a_replica_that_is_not_ready_writes_nothing_until_it_leads() -> None:
    scheduler = Scheduler()
    scheduler.upsert_quota(elastic_quota("team-a", min={GPU: 4}))
    server, patches = status_server()
    readiness = Readiness(synced=True, leading=False)
    writer = QuotaStatusWriter(server.api(), scheduler, readiness)

    async def run() -> None:
        task = asyncio.create_task(writer.run_forever(interval_s=0.001))
        for _ in range(20):  # passes of the loop as a standby
            await asyncio.sleep(0.001)
        assert patches == []
        readiness.set_leading(True, "me")
        async with asyncio.timeout(5):
            while not patches:
                await asyncio.sleep(0.001)
        task.cancel()

    asyncio.run(run())
    assert len(patches) == 1
