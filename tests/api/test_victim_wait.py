"""Filter waits for the victims preempt approved when kube-scheduler offers their node while
schedext's watch still shows them (extender.evictions, app.service.victims), over real HTTP with the
cluster source reading a canned API server whose pod watch the test drives."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import httpx
import orjson
import pytest

from testbed.builders import H100, make_node, make_pod
from testbed.waiting import wait_for
from tests.api.conftest import Serve
from tests.api.server import RunningServer
from tests.api.watched_api import WatchedApi
from tests.unit.kube_fakes import event

NODE = make_node("n1", gpus=4, model=H100)
VICTIM = make_pod("victim", uid="victim", gpus=4, node="n1", gpu_ids=[0, 1, 2, 3], priority=10)
URGENT = make_pod("urgent", uid="urgent", gpus=4, priority=1000)


def pod_watch_api() -> WatchedApi:
    """Lists one GPU node and the pod holding its GPUs; the pod watch sends what the test
    gives."""
    return WatchedApi("/api/v1/pods", nodes=[NODE], pods=[VICTIM])


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(max_workers=1) as executor:
        yield executor


def start(serve: Serve, fake: WatchedApi, wait_s: float) -> RunningServer:
    server = serve(source=fake.source(), settings={"preemption": {"victim_wait_s": wait_s}})
    with server.client() as client:
        wait_for(lambda: client.get("/readyz").status_code == 200, timeout=10, message="ready")
    return server


def metric(client: httpx.Client, name: str) -> float:
    """The value of one sample, by its full name with labels; 0 when absent."""
    for line in client.get("/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return 0.0


def preempt_urgent(client: httpx.Client) -> None:
    """kube-scheduler proposes the victim on n1; schedext approves it."""
    body = {"Pod": URGENT, "NodeNameToMetaVictims": {"n1": {"Pods": [{"UID": "victim"}]}}}
    answer = client.post("/preempt", content=orjson.dumps(body)).json()
    assert answer["NodeNameToMetaVictims"]["n1"]["Pods"] == [{"UID": "victim"}]


def filter_urgent(client: httpx.Client) -> dict[str, Any]:
    body = {"Pod": URGENT, "NodeNames": ["n1"]}
    result: dict[str, Any] = client.post("/filter", content=orjson.dumps(body)).json()
    return result


def filter_on_own_connection(server: RunningServer) -> dict[str, Any]:
    with server.client() as client:
        return filter_urgent(client)


def test_filter_waits_for_the_watch_to_show_the_victims_gone(
    serve: Serve, pool: ThreadPoolExecutor
) -> None:
    fake = pod_watch_api()
    server = start(serve, fake, wait_s=10.0)
    with server.client() as client:
        preempt_urgent(client)
        # kube-scheduler offers n1 (it saw the victim go); schedext's watch has not shown it.
        filtered: Future[dict[str, Any]] = pool.submit(filter_on_own_connection, server)
        wait_for(
            lambda: metric(client, "schedext_victim_waits_in_progress") == 1,
            timeout=10,
            message="filter did not wait for the victim",
        )
        assert not filtered.done()
        fake.send(event("DELETED", VICTIM))
        answer = filtered.result(timeout=10)
        assert answer["NodeNames"] == ["n1"]
        assert answer["FailedNodes"] == {}
        assert metric(client, 'schedext_victim_waits_total{outcome="gone"}') == 1
        assert metric(client, "schedext_victim_waits_in_progress") == 0
    assert "/filter" in server.asgi  # a filter that waits leaves the protocol for a task


def test_a_wait_ends_at_its_bound_and_is_not_repeated(serve: Serve) -> None:
    fake = pod_watch_api()
    server = start(serve, fake, wait_s=0.2)
    with server.client() as client:
        preempt_urgent(client)
        for _ in range(2):
            answer = filter_urgent(client)
            assert answer["NodeNames"] == []
            assert answer["FailedNodes"] == {"n1": "schedext: fewer than 4 free GPUs"}
        # One wait, cut at its bound; the second filter judged the node at once.
        assert metric(client, 'schedext_victim_waits_total{outcome="timeout"}') == 1
        assert metric(client, 'schedext_victim_waits_total{outcome="gone"}') == 0


def test_a_pod_preempt_never_approved_victims_for_waits_for_nothing(serve: Serve) -> None:
    fake = pod_watch_api()
    server = start(serve, fake, wait_s=10.0)
    with server.client() as client:
        answer = filter_urgent(client)
        assert answer["FailedNodes"] == {"n1": "schedext: fewer than 4 free GPUs"}
        assert "schedext_victim_waits_total{" not in client.get("/metrics").text
    assert "/filter" not in server.asgi  # nothing to wait for: answered in place


def test_a_zero_bound_switches_the_wait_off(serve: Serve) -> None:
    fake = pod_watch_api()
    server = start(serve, fake, wait_s=0.0)
    with server.client() as client:
        preempt_urgent(client)
        assert filter_urgent(client)["FailedNodes"] == {"n1": "schedext: fewer than 4 free GPUs"}
        assert "schedext_victim_waits_total{" not in client.get("/metrics").text


# (node, victim's UID, preemptor, its reason on the node while the victim stays)
WITHOUT_A_WATCH = {
    "snapshot": ("n1", "victim", URGENT, "schedext: fewer than 4 free GPUs"),
    # gpu-node-b: GPU 2 free, GPU 3 held by research/notebook-alice at priority 0
    "demo": ("gpu-node-b", "demo-pod-0002", make_pod("urgent", uid="urgent", gpus=2,
             priority=500), "schedext: fewer than 2 free GPUs"),
}  # fmt: skip


@pytest.mark.parametrize("source", WITHOUT_A_WATCH)
def test_without_a_pod_watch_filter_never_waits_for_victims(serve: Serve, source: str) -> None:
    """Nothing would ever show the victims gone: the wait would always run to its bound."""
    node, victim, pod, reason = WITHOUT_A_WATCH[source]
    settings = {"preemption": {"victim_wait_s": 10.0}}
    server = serve(settings=settings, **({"nodes": [NODE], "pods": [VICTIM]} if source ==
                   "snapshot" else {}))  # fmt: skip
    with server.client() as client:
        victims = {node: {"Pods": [{"UID": victim}], "NumPDBViolations": 0}}
        body = {"Pod": pod, "NodeNameToMetaVictims": victims}
        approved = client.post("/preempt", content=orjson.dumps(body)).json()
        assert approved["NodeNameToMetaVictims"] == victims
        started = time.monotonic()
        answer = client.post("/filter", content=orjson.dumps({"Pod": pod, "NodeNames": [node]}))
        assert time.monotonic() - started < 5  # not the 10 s bound
        assert answer.json()["FailedNodes"] == {node: reason}
        assert "schedext_victim_waits_total{" not in client.get("/metrics").text
    assert "/filter" not in server.asgi  # answered in place: no wait
