"""schedext's HTTP protocol (app.service.verb_protocol) over real HTTP: filter and prioritize
answered in place, exactly as the ASGI path answers them, and every case it leaves to that path (the
server notes which requests reached the ASGI app: ``RunningServer.asgi``)."""

from __future__ import annotations

import logging
import socket
import ssl
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from app.service.main import create_app
from app.service.settings import load_settings
from testbed.builders import gang_pod, make_node, make_pod, make_pod_group, name_of, uid_of
from testbed.pki import CertAuthority
from testbed.waiting import wait_for
from tests.api.conftest import Serve, fixture
from tests.api.server import RunningServer, running

FILTER = orjson.dumps(fixture("filter_request_nodecache_true.json"))
PRIORITIZE = orjson.dumps(fixture("prioritize_request_nodecache_true.json"))
PREEMPT = orjson.dumps(fixture("preempt_request_nodecache_true.json"))


# --- raw HTTP/1.1 on a socket -------------------------------------------------------------


def request(path: str, body: bytes, *, headers: str = "") -> bytes:
    """A POST as kube-scheduler sends it (Content-Length, keep-alive)."""
    head = (
        f"POST {path} HTTP/1.1\r\nHost: schedext\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n{headers}\r\n"
    )
    return head.encode() + body


class Response:
    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status, self.headers, self.body = status, headers, body

    def json(self) -> Any:
        return orjson.loads(self.body)


class Reader:
    """Whole responses (Content-Length bodies) from a socket, one after the other."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock, self._data = sock, b""

    def _more(self) -> None:
        chunk = self._sock.recv(65536)
        assert chunk, "connection closed before the whole response"
        self._data += chunk

    def next(self) -> Response:
        while b"\r\n\r\n" not in self._data:
            self._more()
        head, _, self._data = self._data.partition(b"\r\n\r\n")
        status_line, *lines = head.decode().split("\r\n")
        headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
        length = int(headers["content-length"])
        while len(self._data) < length:
            self._more()
        body, self._data = self._data[:length], self._data[length:]
        return Response(int(status_line.split()[1]), headers, body)

    def closed(self) -> bool:
        """The server closed the connection (and sent nothing more)."""
        return not self._data and self._sock.recv(1) == b""


@pytest.fixture
def connect() -> Iterator[Any]:
    sockets: list[socket.socket] = []

    def open_to(server: RunningServer) -> tuple[socket.socket, Reader]:
        sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sockets.append(sock)
        return sock, Reader(sock)

    yield open_to
    for sock in sockets:
        sock.close()


def metric(server: RunningServer, name: str) -> float:
    """One sample by its full name with labels; 0 when absent."""
    with server.client() as client:
        for line in client.get("/metrics").text.splitlines():
            if line.startswith(name + " "):
                return float(line.split()[-1])
    return 0.0


# --- answered in place, as the ASGI path answers ------------------------------------------


def test_filter_and_prioritize_are_answered_in_place_everything_else_by_the_app(
    serve: Serve,
) -> None:
    server = serve(settings={"server": {"path_prefix": "/schedext", "bench_endpoints": True}})
    with server.client() as client:
        for path, body in [
            ("/filter", FILTER),
            ("/prioritize", PRIORITIZE),
            ("/schedext/filter", FILTER),
            ("/schedext/prioritize", PRIORITIZE),
            ("/bench/constant", FILTER),
        ]:
            assert client.post(path, content=body).status_code == 200, path
        assert server.asgi == []
        client.post("/preempt", content=PREEMPT)
        client.post("/bind", content=orjson.dumps(fixture("bind_request.json")))
        client.get("/healthz")
        client.get("/filter")  # 405 there
    assert server.asgi == ["/preempt", "/bind", "/healthz", "/filter"]


BODIES = {
    "kube-scheduler's": FILTER,
    "another key order": orjson.dumps(
        {"NodeNames": ["gpu-node-a", "gpu-node-c"], "Pod": fixture("pod.json")}
    ),
    "node objects": orjson.dumps(fixture("filter_request_nodecache_false.json")),
    "not json": b"{not json",
    "not an object": b"[1, 2]",
    "no pod": b'{"NodeNames": ["gpu-node-a"]}',
    "empty": b"",
}


# (verb, the query string answered in place, server.prioritize_full)
ANSWERED_IN_PLACE = [
    ("filter", "", False),
    ("prioritize", "", False),
    ("prioritize", "full=1", False),
    ("prioritize", "full=true", False),
    ("prioritize", "full", False),
    ("prioritize", "full=0", False),
    ("prioritize", "", True),
    ("prioritize", "full=false", True),
]


@pytest.mark.parametrize(
    "case", ANSWERED_IN_PLACE, ids=[f"{v}?{q} full={f}" for v, q, f in ANSWERED_IN_PLACE]
)
@pytest.mark.parametrize("body", BODIES.values(), ids=BODIES.keys())
def test_answers_in_place_are_the_asgi_paths_byte_for_byte(
    serve: Serve, connect: Any, case: tuple[str, str, bool], body: bytes
) -> None:
    """A query string the protocol does not answer sends the same request down the ASGI
    path: same status, headers (the same, in the same order) and body, errors included;
    prioritize's ``full`` read the same on both."""
    verb, query, full = case
    server = serve(settings={"server": {"prioritize_full": full}})
    sock, reader = connect(server)
    answers = []
    in_place = f"/{verb}?{query}" if query else f"/{verb}"
    for path in (in_place, f"/{verb}?{query + '&' if query else ''}via=asgi"):
        sock.sendall(request(path, body))
        answers.append(reader.next())
    in_place, asgi = answers
    assert server.asgi == [f"/{verb}"]  # the second only
    assert (in_place.status, in_place.body) == (asgi.status, asgi.body)
    assert list(in_place.headers) == list(asgi.headers)  # uvicorn's default headers first
    for name in ("content-type", "content-length"):
        assert in_place.headers[name] == asgi.headers[name]


def test_the_stages_and_latency_of_answers_in_place_are_measured(serve: Serve) -> None:
    server = serve()
    with server.client() as client:
        for _ in range(3):
            client.post("/filter", content=FILTER)
    count = 'schedext_request_stage_seconds_count{stage="%s",verb="filter"}'
    for stage in ("body", "queue", "handler", "total"):
        assert metric(server, count % stage) == 3, stage
    assert metric(server, 'schedext_request_duration_seconds_count{verb="filter"}') == 3
    assert metric(server, 'schedext_decisions_total{outcome="feasible",verb="filter"}') == 3
    total = metric(server, 'schedext_request_stage_seconds_sum{stage="total",verb="filter"}')
    handler = metric(server, 'schedext_request_stage_seconds_sum{stage="handler",verb="filter"}')
    assert 0 < handler <= total


def test_the_access_log_has_the_line_of_an_answer_in_place(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    access = logging.getLogger("uvicorn.access")
    lines: list[str] = []
    collect = logging.Handler()
    collect.emit = lambda record: lines.append(record.getMessage())  # type: ignore[method-assign]
    monkeypatch.setattr(access, "handlers", [collect])
    level = access.level
    access.setLevel(logging.INFO)  # not the attribute alone: the logger caches its levels
    try:
        app = create_app(load_settings())
        with running(app, access_log=True) as server, server.client() as client:
            client.post("/filter", content=FILTER)
    finally:
        access.setLevel(level)
    assert len(lines) == 1
    assert lines[0].endswith('"POST /filter HTTP/1.1" 200')
    assert server.asgi == []


# --- how the bytes come ---------------------------------------------------------------------


@pytest.mark.parametrize("piece", [1, 7, 4096], ids=["1 byte", "7 bytes", "4 KiB as Go"])
def test_a_request_split_across_many_writes_is_answered_in_place(
    serve: Serve, connect: Any, piece: int
) -> None:
    server = serve()
    expected = _one_shot(server, "/filter", FILTER)
    sock, reader = connect(server)
    whole = request("/filter", FILTER)
    for start in range(0, len(whole), piece):
        sock.sendall(whole[start : start + piece])
        if piece < 4096 and start % (piece * 50) == 0:
            time.sleep(0.001)  # some pieces apart: several reads, whatever the timing
    answer = reader.next()
    assert (answer.status, answer.body) == (200, expected)
    assert server.asgi == []


def test_several_requests_on_one_kept_alive_connection(serve: Serve, connect: Any) -> None:
    server = serve(nodes=[make_node("n1", gpus=8)], pods=[make_pod("p", uid="p", gpus=1)])
    pod = {"Pod": make_pod("p", uid="p", gpus=1), "NodeNames": ["n1"]}
    sock, reader = connect(server)
    for _ in range(20):
        sock.sendall(request("/filter", orjson.dumps(pod)))
        assert reader.next().json()["NodeNames"] == ["n1"]
        sock.sendall(request("/prioritize", orjson.dumps(pod)))
        assert reader.next().status == 200
    bind = {"PodName": "p", "PodNamespace": "default", "PodUID": "p", "Node": "n1"}
    sock.sendall(request("/bind", orjson.dumps(bind)))
    assert reader.next().json() == {"Error": ""}
    # answered in place after the bind, with its GPU held
    whole_node = {"Pod": make_pod("q", uid="q", gpus=8), "NodeNames": ["n1"]}
    sock.sendall(request("/filter", orjson.dumps(whole_node)))
    assert reader.next().json()["FailedNodes"] == {"n1": "schedext: fewer than 8 free GPUs"}
    assert server.asgi == ["/bind"]


def test_pipelined_requests_are_answered_in_order(serve: Serve, connect: Any) -> None:
    """Those behind a request the app answers wait their turn on its path."""
    server = serve()
    sequence = [
        ("/filter", FILTER),
        ("/prioritize", PRIORITIZE),
        ("/preempt", PREEMPT),
        ("/filter", FILTER),
        ("/prioritize", PRIORITIZE),
    ]
    expected = [_one_shot(server, path, body) for path, body in sequence]
    server.asgi.clear()
    sock, reader = connect(server)
    sock.sendall(b"".join(request(path, body) for path, body in sequence))
    assert [reader.next().body for _ in sequence] == expected
    # In place until the preempt; then each behind an answer not yet given, or given in turn.
    assert server.asgi[0] == "/preempt"


def test_an_http_1_0_request_is_answered_and_its_connection_closed(
    serve: Serve, connect: Any
) -> None:
    server = serve()
    sock, reader = connect(server)
    sock.sendall(request("/filter", FILTER).replace(b"HTTP/1.1", b"HTTP/1.0", 1))
    answer = reader.next()
    assert answer.status == 200
    assert answer.headers["connection"] == "close"
    assert reader.closed()
    assert server.asgi == []


def test_a_request_pipelined_after_connection_close_gets_no_answer(
    serve: Serve, connect: Any
) -> None:
    server = serve()
    sock, reader = connect(server)
    closing = request("/filter", FILTER, headers="Connection: close\r\n")
    sock.sendall(closing + request("/filter", FILTER))
    answer = reader.next()
    assert answer.status == 200
    assert answer.headers["connection"] == "close"
    assert reader.closed()


def test_expect_100_continue_is_left_to_uvicorn(serve: Serve, connect: Any) -> None:
    server = serve()
    sock, reader = connect(server)
    head = request("/filter", FILTER, headers="Expect: 100-continue\r\n")
    sock.sendall(head[: -len(FILTER)])
    while b"100 Continue" not in (seen := sock.recv(4096)):
        assert seen, "no 100 Continue"
    sock.sendall(FILTER)
    assert reader.next().status == 200
    assert "/filter" in server.asgi


# --- limits -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("verb", "status"), [("filter", 200), ("prioritize", 413)])
def test_a_chunked_body_growing_past_the_limit_is_refused(
    serve: Serve, connect: Any, verb: str, status: int
) -> None:
    """No length to refuse it by: gathered in place until it is too large, then refused by the
    ASGI path as it grows; the connection goes on."""
    server = serve(settings={"server": {"max_body_bytes": 4096}})
    sock, reader = connect(server)
    head = (
        f"POST /{verb} HTTP/1.1\r\nHost: schedext\r\nContent-Type: application/json\r\n"
        "Transfer-Encoding: chunked\r\n\r\n"
    ).encode()
    chunks = b"".join(b"400\r\n" + b" " * 1024 + b"\r\n" for _ in range(6)) + b"0\r\n\r\n"
    sock.sendall(head + chunks)
    answer = reader.next()
    assert answer.status == status
    assert "exceeds the 4096-byte limit" in answer.json()["Error"]
    sock.sendall(request(f"/{verb}", FILTER if verb == "filter" else PRIORITIZE))
    assert reader.next().status == 200


@pytest.mark.parametrize(("verb", "status"), [("filter", 200), ("prioritize", 408)])
def test_a_body_too_slow_is_cut_at_the_timeout_and_the_connection_goes_on(
    serve: Serve, connect: Any, verb: str, status: int
) -> None:
    server = serve(settings={"server": {"body_timeout_s": 0.3}})
    body = FILTER if verb == "filter" else PRIORITIZE
    whole = request(f"/{verb}", body)
    sock, reader = connect(server)
    sock.sendall(whole[:-10])
    started = time.monotonic()
    answer = reader.next()
    assert time.monotonic() - started < 5  # the server's timeout, not the client's
    assert answer.status == status
    assert "not received within 0.3s" in answer.json()["Error"]
    # The rest of that body is dropped; the next request on the connection is answered.
    sock.sendall(whole[-10:] + whole)
    assert reader.next().status == 200
    assert server.asgi == []
    rejected = f'schedext_decisions_total{{outcome="rejected",verb="{verb}"}}'
    assert metric(server, rejected) == 1


def dribble(sock: socket.socket, data: bytes, *, every_s: float, until: float) -> int:
    """Send ``data`` a byte at a time, one every ``every_s``, until it is all sent, the server
    closes, or ``until`` (monotonic) passes; how many bytes went."""
    sent = 0
    while sent < len(data) and time.monotonic() < until:
        try:
            sock.sendall(data[sent : sent + 1])
        except OSError:  # closed by the server
            break
        sent += 1
        time.sleep(every_s)
    return sent


@pytest.mark.parametrize("first", [b"", b"P", b"POST /filter HTTP/1.1\r\nHost: schedext\r\n"])
def test_headers_too_slow_get_a_408_and_the_connection_closed(
    serve: Serve, connect: Any, first: bytes
) -> None:
    """A client sending its headers a byte at a time (or nothing at all) does not hold its
    connection for ever, and the server keeps serving others meanwhile."""
    server = serve(settings={"server": {"header_timeout_s": 0.5}})
    sock, reader = connect(server)
    started = time.monotonic()
    sock.sendall(first)
    rest = request("/filter", FILTER)[len(first) :]
    sent = dribble(sock, rest[:200], every_s=0.05, until=started + 10)
    answer = reader.next()
    assert time.monotonic() - started < 5  # the server's bound, not the client's patience
    assert sent < 200  # it was cut while still sending
    assert answer.status == 408
    assert answer.json() == {"Error": "request headers not received within 0.5s"}
    assert answer.headers["connection"] == "close"
    assert reader.closed()
    with server.client() as client:
        assert client.post("/filter", content=FILTER).status_code == 200


def test_headers_in_pieces_within_the_bound_are_answered_and_a_slow_body_is_not_cut_by_it(
    serve: Serve, connect: Any
) -> None:
    server = serve(settings={"server": {"header_timeout_s": 0.5, "body_timeout_s": 5}})
    whole = request("/filter", FILTER)
    head = whole.index(b"\r\n\r\n") + 4
    sock, reader = connect(server)
    for start in range(0, head, 20):  # the head in pieces, well within its bound
        sock.sendall(whole[start : min(start + 20, head)])
    time.sleep(1.0)  # twice the head's bound: the body has its own
    sock.sendall(whole[head:])
    assert reader.next().status == 200
    time.sleep(1.0)  # kept alive, idle: the keep-alive timer's business, not the head's
    sock.sendall(whole)
    assert reader.next().status == 200


def test_a_client_that_leaves_mid_body_is_counted_as_rejected(serve: Serve, connect: Any) -> None:
    server = serve()
    sock, _ = connect(server)
    sock.sendall(request("/prioritize", PRIORITIZE)[:-10])
    sock.close()
    rejected = 'schedext_decisions_total{outcome="rejected",verb="prioritize"}'
    wait_for(lambda: metric(server, rejected) == 1, timeout=5, message="never counted")
    assert "/prioritize" not in server.asgi


# --- left to the ASGI path ---------------------------------------------------------------------


def test_a_replica_not_ready_answers_through_the_app_and_closes(serve: Serve, connect: Any) -> None:
    server = serve()
    server.app.state.service.readiness.set_not_ready("inventory not synced: nodes not listed yet")
    sock, reader = connect(server)
    sock.sendall(request("/filter", FILTER))
    answer = reader.next()
    assert "not synced" in answer.json()["Error"]
    assert answer.headers["connection"] == "close"
    assert reader.closed()
    assert server.asgi == ["/filter"]


def test_a_bind_read_and_not_yet_planned_keeps_filters_behind_it(
    serve: Serve, connect: Any
) -> None:
    """A bind read and not yet planned (held so here: pipelined behind a gang member waiting at
    the barrier) sends filters to the ASGI path, where they queue behind a bind task already
    scheduled and so see the GPUs it reserves (kube-scheduler binds one pod while it filters
    the next). Once it is planned, filters are answered in place again."""
    members = [gang_pod(f"m{i}", "train", gpus=2) for i in range(2)]
    loner = make_pod("loner", uid="loner", gpus=2)
    server = serve(
        nodes=[make_node("g", gpus=8)],
        pods=[*members, loner],
        groups=[make_pod_group("train", min_member=2, timeout_s=30)],
    )

    def bind(pod: dict[str, Any]) -> bytes:
        args = {"PodName": name_of(pod), "PodNamespace": "default", "PodUID": uid_of(pod)}
        return request("/bind", orjson.dumps({**args, "Node": "g"}))

    def filtered(count: int) -> None:
        before = server.asgi.count("/filter")
        with server.client() as client:
            body = {"Pod": make_pod("x", uid="x", gpus=2), "NodeNames": ["g"]}
            assert client.post("/filter", content=orjson.dumps(body)).json()["NodeNames"] == ["g"]
        assert server.asgi.count("/filter") - before == count

    waiting, waiting_reader = connect(server)
    waiting.sendall(bind(members[0]) + bind(loner))  # the loner's bind queued behind m0's
    wait_for(
        lambda: metric(server, "schedext_gangs_waiting") == 1,
        timeout=10,
        message="the gang member never waited",
    )
    filtered(1)  # the loner's bind is read, not planned: this filter is not let past it
    with ThreadPoolExecutor(max_workers=1) as pool:
        last, last_reader = connect(server)
        last.sendall(bind(members[1]))
        done = pool.submit(last_reader.next)
        assert waiting_reader.next().json() == {"Error": ""}  # m0, with its gang
        assert waiting_reader.next().json() == {"Error": ""}  # the loner, planned now
        assert done.result(timeout=10).json() == {"Error": ""}
    filtered(0)  # in place again


def test_mtls_answers_in_place_under_tls(tmp_path: Path) -> None:
    ca = CertAuthority.create(tmp_path / "pki")
    cert, key = ca.issue_cert("schedext", sans=("127.0.0.1",), server=True)
    client_cert = ca.issue_cert("kube-scheduler", client=True, server=False)
    settings = load_settings(
        server={"tls_cert_file": cert, "tls_key_file": key, "tls_client_ca_file": ca.cert_path}
    )
    app = create_app(settings)
    with running(app, **settings.server.uvicorn_tls()) as server:
        trusted = ssl.create_default_context(cafile=str(ca.cert_path))
        stranger = ssl.create_default_context(cafile=str(ca.cert_path))
        trusted.load_cert_chain(*client_cert)
        with server.client(verify=trusted) as client:
            for _ in range(3):
                answer = client.post("/filter", content=FILTER)
                assert answer.json()["NodeNames"] == ["gpu-node-a"]
                assert client.post("/prioritize", content=PRIORITIZE).status_code == 200
        with server.client(verify=stranger) as client, pytest.raises(httpx.TransportError):
            client.post("/filter", content=FILTER)
    assert server.asgi == []


def _one_shot(server: RunningServer, path: str, body: bytes) -> bytes:
    with server.client() as client:
        return client.post(path, content=body).content


@pytest.mark.parametrize("bench", [True, False], ids=["bench endpoints", "plain"])
def test_timing_headers_come_with_the_benchmark_endpoints_only(serve: Serve, bench: bool) -> None:
    """On both paths: when the request was first read and its answer handed to the socket,
    on this machine's monotonic clock (the benchmark's client reads the same)."""
    server = serve(settings={"server": {"bench_endpoints": bench}})
    with server.client() as client:
        paths = [("/filter", FILTER), ("/filter?via=asgi", FILTER), ("/preempt", PREEMPT)]
        for path, body in paths:
            sent = time.perf_counter()
            answer = client.post(path, content=body)
            received = time.perf_counter()
            if not bench:
                assert "x-schedext-read" not in answer.headers
                continue
            read = float(answer.headers["x-schedext-read"])
            answered = float(answer.headers["x-schedext-answered"])
            assert sent < read <= answered < received, path
    assert server.asgi == ["/filter", "/preempt"]
