"""The list+watch loop against canned API server answers (a HandlerTransport)."""

from __future__ import annotations

import asyncio
import functools
import random

import httpx
import pytest

from app.kube import list_pages
from app.kube.errors import ApiError
from app.kube.shapes import Decoders, _NodeEvent, _NodePage
from app.kube.watch import Backoff, Resource, WatchHooks, watch_forever, watch_once
from app.kube.wire import lists_pb2 as wire
from tests.unit.kube_fakes import (
    BrokenStream,
    FakeApiServer,
    RecordingSink,
    event,
    gone,
    node,
    page,
)

NODES = Resource(name="nodes", path="/api/v1/nodes", page_size=2)


class Sleeps:
    """The test seam for time: records requested delays, sleeps not at all."""

    def __init__(self, stop_after: int | None = None) -> None:
        self.delays: list[float] = []
        self.stop_after = stop_after

    async def __call__(self, delay: float) -> None:
        self.delays.append(delay)
        if self.stop_after is not None and len(self.delays) >= self.stop_after:
            raise asyncio.CancelledError


def run_once(server: FakeApiServer, sink: RecordingSink, sleeps: Sleeps | None = None) -> list[str]:
    listed: list[str] = []
    hooks = WatchHooks(on_listed=lambda: listed.append("listed"))
    asyncio.run(watch_once(server.api(), NODES, sink, hooks=hooks, sleep=sleeps or Sleeps()))
    return listed


def test_list_then_watch_from_the_lists_version_applies_events_in_order() -> None:
    server = FakeApiServer(
        lists=[page([node("n1"), node("n2")], "10")],
        watches=[
            httpx.Response(
                200,
                content=event("ADDED", node("n3", "11"))
                + event("MODIFIED", node("n1", "12"))
                + event("DELETED", node("n2", "13"))
                + gone(),
            )
        ],
    )
    sink = RecordingSink()
    assert run_once(server, sink) == ["listed"]
    assert sorted(sink.state) == ["n1", "n3"]
    assert sink.state["n1"]["metadata"]["resourceVersion"] == "12"
    assert sink.journal == ["page 2", "commit", "upsert n3", "upsert n1", "delete n2"]
    watch = server.watch_params()[0]
    assert watch["resourceVersion"] == "10"
    assert watch["allowWatchBookmarks"] == "true"
    assert server.requests[0].headers["Authorization"] == "Bearer t0ken"


def test_error_410_gone_ends_watch_once_so_the_caller_relists() -> None:
    server = FakeApiServer(
        lists=[page([node("n1")], "5")], watches=[httpx.Response(200, content=gone())]
    )
    sink = RecordingSink()
    assert run_once(server, sink) == ["listed"]
    assert sink.journal == ["page 1", "commit"]


def test_http_410_on_the_watch_request_also_means_relist() -> None:
    server = FakeApiServer(
        lists=[page([], "5")], watches=[httpx.Response(410, json={"message": "gone"})]
    )
    assert run_once(server, RecordingSink()) == ["listed"]


def test_list_is_paginated_and_replaces_the_state_once_at_the_end() -> None:
    server = FakeApiServer(
        lists=[page([node("a"), node("b")], "7", token="next"), page([node("c")], "7")],
        watches=[httpx.Response(200, content=gone())],
    )
    sink = RecordingSink(state={"stale": node("stale")})
    run_once(server, sink)
    assert sink.journal == ["page 2", "page 3", "commit"]
    assert sorted(sink.state) == ["a", "b", "c"]  # the stale node is gone: a delete by absence
    list_requests = [r for r in server.requests if "limit" in r.url.params]
    assert list_requests[1].url.params["continue"] == "next"


def test_bookmark_advances_the_version_without_touching_state() -> None:
    server = FakeApiServer(
        lists=[page([node("n1")], "10")],
        watches=[
            httpx.Response(200, content=event("BOOKMARK", {"metadata": {"resourceVersion": "50"}})),
            httpx.Response(200, content=gone()),
        ],
    )
    sink = RecordingSink()
    run_once(server, sink)
    assert sink.journal == ["page 1", "commit"]
    assert [w["resourceVersion"] for w in server.watch_params()] == ["10", "50"]


def test_only_events_that_changed_what_the_sink_keeps_are_heard_as_changes() -> None:
    """Every event and bookmark is progress; only an event the sink took as a change (not a
    version alone, not a bookmark) may have freed room, and is heard as one."""
    labelled = {**node("n1", "12"), "labels": {"a": "b"}}
    server = FakeApiServer(
        lists=[page([node("n1")], "10")],
        watches=[
            httpx.Response(
                200,
                content=event("MODIFIED", node("n1", "11"))  # the version alone moved
                + event("MODIFIED", labelled)
                + event("BOOKMARK", {"metadata": {"resourceVersion": "13"}})
                + event("ADDED", node("n2", "14"))
                + event("DELETED", node("n2", "15"))
                + gone(),
            )
        ],
    )
    heard: list[str] = []
    sink = RecordingSink()
    hooks = WatchHooks(
        on_event=lambda: heard.append(f"event {len(sink.journal)}"),
        on_change=lambda: heard.append(f"change {sink.journal[-1]}"),
    )
    asyncio.run(watch_once(server.api(), NODES, sink, hooks=hooks, sleep=Sleeps()))
    assert heard == [
        "event 2",  # listed
        "event 3",
        "event 4",
        "change upsert n1",
        "event 4",  # the bookmark
        "event 5",
        "change upsert n2",
        "event 6",
        "change delete n2",
    ]


def test_a_watch_that_ends_normally_is_resumed_from_the_last_version() -> None:
    server = FakeApiServer(
        lists=[page([], "1")],
        watches=[
            httpx.Response(200, content=event("ADDED", node("n1", "2"))),  # server timeout
            httpx.Response(200, content=gone()),
        ],
    )
    run_once(server, RecordingSink())
    assert [w["resourceVersion"] for w in server.watch_params()] == ["1", "2"]


def test_disconnect_resumes_the_watch_from_the_last_version_after_a_backoff() -> None:
    server = FakeApiServer(
        lists=[page([node("n1")], "10")],
        watches=[
            httpx.Response(200, stream=BrokenStream([event("ADDED", node("n2", "11"))])),
            httpx.Response(200, content=event("DELETED", node("n1", "12")) + gone()),
        ],
    )
    sink = RecordingSink()
    sleeps = Sleeps()
    run_once(server, sink, sleeps)
    assert [w["resourceVersion"] for w in server.watch_params()] == ["10", "11"]
    assert sorted(sink.state) == ["n2"]
    assert len(sleeps.delays) == 1  # no relist: the watch resumed


def test_a_watch_answered_503_backs_off_and_resumes() -> None:
    server = FakeApiServer(
        lists=[page([], "3")],
        watches=[
            httpx.Response(503, json={"message": "starting"}),
            httpx.Response(200, content=gone()),
        ],
    )
    sleeps = Sleeps()
    run_once(server, RecordingSink(), sleeps)
    assert [w["resourceVersion"] for w in server.watch_params()] == ["3", "3"]
    assert len(sleeps.delays) == 1


def test_other_errors_propagate_from_watch_once() -> None:
    server = FakeApiServer(
        lists=[httpx.Response(403, json={"message": "forbidden", "reason": "Forbidden"})]
    )
    with pytest.raises(ApiError, match="403 forbidden") as caught:
        run_once(server, RecordingSink())
    assert caught.value.status == 403


def test_watch_forever_relists_after_410_and_backs_off_on_errors() -> None:
    server = FakeApiServer(
        lists=[
            page([node("a")], "1"),
            httpx.Response(500, json={"message": "etcd unavailable"}),
            page([node("b")], "9"),
        ],
        watches=[httpx.Response(200, content=gone()), httpx.Response(200, content=gone())],
    )
    sink = RecordingSink()
    sleeps = Sleeps(stop_after=1)
    listed: list[int] = []

    async def main() -> None:
        task = asyncio.create_task(
            watch_forever(
                server.api(),
                NODES,
                sink,
                hooks=WatchHooks(on_listed=lambda: listed.append(1)),
                sleep=sleeps,
            )
        )
        with pytest.raises(asyncio.CancelledError):
            await task

    # The 500 makes watch_forever sleep once; that sleep is the end of the canned script.
    asyncio.run(main())
    assert len(listed) == 1
    assert sink.state == {"a": node("a")}
    assert len([r for r in server.requests if "limit" in r.url.params]) == 2  # relisted after 410
    assert len(sleeps.delays) == 1


def test_watch_forever_keeps_going_after_an_error() -> None:
    server = FakeApiServer(
        lists=[httpx.Response(500, json={"message": "etcd unavailable"}), page([node("b")], "9")],
        watches=[httpx.Response(200, content=gone())],
    )
    sink = RecordingSink()
    sleeps = Sleeps()
    listed: list[int] = []

    async def main() -> None:
        def on_listed() -> None:
            listed.append(1)
            raise asyncio.CancelledError  # stop the endless loop once the relist happened

        with pytest.raises(asyncio.CancelledError):
            await watch_forever(
                server.api(), NODES, sink, hooks=WatchHooks(on_listed=on_listed), sleep=sleeps
            )

    asyncio.run(main())
    assert listed == [1]
    assert sorted(sink.state) == ["b"]
    assert len(sleeps.delays) == 1


def test_backoff_grows_with_jitter_up_to_a_cap_and_resets() -> None:
    backoff = Backoff(initial=0.5, cap=4.0, rng=random.Random(1))
    delays = [backoff.next_delay() for _ in range(8)]
    assert all(0.25 <= d <= 4.0 for d in delays)
    assert max(delays[5:]) <= 4.0
    assert delays[-1] >= 2.0  # at the cap, jitter keeps it within [cap/2, cap]
    backoff.reset()
    assert backoff.next_delay() <= 0.5


def _protobuf_nodes(names: list[str], version: str) -> httpx.Response:
    items = [wire.Node(metadata=wire.ObjectMeta(name=n, resourceVersion=version)) for n in names]
    node_list = wire.NodeList(metadata=wire.ListMeta(resourceVersion=version), items=items)
    body = b"k8s\x00" + wire.Unknown(raw=node_list.SerializeToString()).SerializeToString()
    return httpx.Response(200, content=body)


def _nodes_read_in_protobuf() -> Resource:
    decoders = Decoders("nodes", _NodePage, _NodeEvent, protobuf=list_pages.node_page)
    return Resource(name="nodes", path="/api/v1/nodes", page_size=2, decoders=decoders)


def test_a_list_asks_for_protobuf_first_and_applies_what_it_answers_the_watch_json() -> None:
    server = FakeApiServer(
        lists=[_protobuf_nodes(["n1", "n2"], "10")],
        watches=[httpx.Response(200, content=event("ADDED", node("n3", "11")) + gone())],
    )
    sink = RecordingSink()
    resource = _nodes_read_in_protobuf()
    asyncio.run(watch_once(server.api(), resource, sink, hooks=WatchHooks(), sleep=Sleeps()))
    assert sorted(sink.state) == ["n1", "n2", "n3"]
    assert sink.state["n1"] == {"metadata": {"name": "n1", "resourceVersion": "10"}, "status": {}}
    list_request, watch_request = server.requests
    assert list_request.headers["Accept"] == list_pages.ACCEPT
    assert watch_request.headers["Accept"] == "application/json"
    assert server.watch_params()[0]["resourceVersion"] == "10"


def test_a_protobuf_page_that_does_not_decode_fails_the_list_and_the_next_asks_json() -> None:
    broken = httpx.Response(200, content=b"k8s\x00\xff\xff")
    server = FakeApiServer(
        lists=[broken, page([node("n1")], "5")], watches=[httpx.Response(200, content=gone())]
    )
    sink = RecordingSink()
    resource = _nodes_read_in_protobuf()
    run = functools.partial(watch_once, server.api(), resource, sink, hooks=WatchHooks())
    with pytest.raises(ApiError, match=r"list of nodes: .*protobuf"):
        asyncio.run(run(sleep=Sleeps()))
    asyncio.run(run(sleep=Sleeps()))
    assert sorted(sink.state) == ["n1"]
    assert [r.headers["Accept"] for r in server.requests[:2]] == [
        list_pages.ACCEPT,
        "application/json",
    ]
