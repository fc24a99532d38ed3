"""Readiness as a standby replica sees it: every check of /readyz by name, so that a pod's
readinessProbe can ask "synced" (both replicas pass) while the verbs need "leader" too; and
the same two facts as gauges of /metrics, for the alerts."""

from __future__ import annotations

import socket

import httpx
import orjson
import pytest

from app.service.assembly import Service
from tests.api.conftest import Serve, fixture

NOT_LEADER = "not the leader (the leader is schedext-0_ab12)"


class StandbySource:
    """A synced inventory whose replica does not hold the lease."""

    description = "a standby replica"
    watches_pods = True

    async def start(self, service: Service) -> None:
        service.readiness.set_ready()
        service.readiness.set_leading(False, "schedext-0_ab12")

    async def stop(self) -> None:
        return None


def test_a_standby_is_synced_but_not_ready_to_answer_verbs(serve: Serve) -> None:
    with serve(source=StandbySource()).client() as client:
        ready = client.get("/readyz")
        assert (ready.status_code, ready.text) == (503, f"not ready: {NOT_LEADER}")
        synced = client.get("/readyz/synced")
        assert (synced.status_code, synced.text) == (200, "ok")
        leader = client.get("/readyz/leader")
        assert (leader.status_code, leader.text) == (503, f"not ready: {NOT_LEADER}")
        verbose = client.get("/readyz", params={"verbose": ""})
        assert verbose.status_code == 503
        assert verbose.text.splitlines() == [
            "[+]synced ok",
            f"[-]leader failed: {NOT_LEADER}",
            "[+]stopping ok",
            "readyz check failed",
        ]
        unknown = client.get("/readyz/etcd")
        assert unknown.status_code == 404
        assert "/readyz/synced, /readyz/leader, /readyz/stopping" in unknown.text


def test_a_replica_that_leads_passes_every_check(serve: Serve) -> None:
    with serve().client() as client:
        assert client.get("/readyz/synced").text == "ok"
        assert client.get("/readyz/leader").text == "ok"
        assert client.get("/readyz?verbose").text.splitlines() == [
            "[+]synced ok",
            "[+]leader ok",
            "[+]stopping ok",
            "readyz check passed",
        ]


def test_every_verb_of_a_standby_answers_that_it_is_not_the_leader(serve: Serve) -> None:
    filter_args = orjson.dumps(fixture("filter_request_nodecache_true.json"))
    with serve(source=StandbySource()).client() as client:
        filtered = client.post("/filter", content=filter_args)
        assert (filtered.status_code, filtered.json()["Error"]) == (200, NOT_LEADER)
        for verb in ("prioritize", "preempt"):
            body = orjson.dumps(fixture(f"{verb}_request_nodecache_true.json"))
            answer = client.post(f"/{verb}", content=body)
            assert (answer.status_code, answer.json()) == (503, {"Error": NOT_LEADER})
        bound = client.post("/bind", content=orjson.dumps(fixture("bind_request.json")))
        assert (bound.status_code, bound.json()) == (200, {"Error": NOT_LEADER})


def _exchange(sock: socket.socket, path: str) -> bytes:
    """One keep-alive HTTP/1.1 request over a raw socket; the answer's head (body read)."""
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: schedext\r\n\r\n".encode())
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    fields = dict(line.lower().split(b": ", 1) for line in head.split(b"\r\n")[1:])
    while len(body) < int(fields[b"content-length"]):
        body += sock.recv(65536)
    return head.lower()


def test_a_standby_closes_each_connection_so_that_callers_reconnect_to_the_leader(
    serve: Serve,
) -> None:
    """A Service picks the endpoint when a connection opens; kube-scheduler keeps its
    connections alive. A replica that cannot answer the verbs closes them."""
    standby, leader = serve(source=StandbySource()), serve()
    with socket.create_connection(("127.0.0.1", standby.port), timeout=5) as sock:
        assert b"connection: close" in _exchange(sock, "/readyz")
        assert sock.recv(1) == b""  # closed by the server
    with socket.create_connection(("127.0.0.1", leader.port), timeout=5) as sock:
        assert b"connection: close" not in _exchange(sock, "/readyz")
        assert _exchange(sock, "/readyz").startswith(b"http/1.1 200")  # the same connection


class UnsyncedSource:
    """An inventory whose informers have not all listed yet."""

    description = "a replica still listing"
    watches_pods = True  # a cluster's source: a watch would end victim waits

    async def start(self, service: Service) -> None:
        service.readiness.set_not_ready("inventory not synced: pods not listed yet")

    async def stop(self) -> None:
        return None


def _readiness_gauges(client: httpx.Client) -> dict[str, float]:
    samples = (
        line.split(" ") for line in client.get("/metrics").text.splitlines() if line[:1] != "#"
    )
    wanted = ("schedext_inventory_synced", "schedext_leader")
    return {name: float(value) for name, value in samples if name in wanted}


@pytest.mark.parametrize(
    ("source", "gauges"),
    [
        pytest.param(None, {"synced": 1.0, "leader": 1.0}, id="leading-and-synced"),
        pytest.param(StandbySource(), {"synced": 1.0, "leader": 0.0}, id="standby"),
        pytest.param(UnsyncedSource(), {"synced": 0.0, "leader": 1.0}, id="still-listing"),
    ],
)
def test_metrics_say_whether_the_replica_is_synced_and_leads(
    serve: Serve, source: object, gauges: dict[str, float]
) -> None:
    server = serve(source=source) if source is not None else serve()
    with server.client() as client:
        assert _readiness_gauges(client) == {
            "schedext_inventory_synced": gauges["synced"],
            "schedext_leader": gauges["leader"],
        }
