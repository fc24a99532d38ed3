"""A request line and headers over ``server.max_header_bytes`` (64 KiB by default) get a 431
on every listener, the verbs' (once a 200, whatever their size) and the metrics and views
ports' (once a reset connection), and the connection is closed. Over real HTTP on loopback;
every client read is bounded."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

from app.service.metrics_listener import MetricsListener
from app.service.plain_listener import PlainListener
from app.service.views_listener import ViewsListener
from tests.api.conftest import Serve
from tests.api.server import RunningServer

LIMIT = 64 * 1024


def exchange(port: int, request: bytes) -> bytes:
    """Send ``request`` whole (what the server does not read is its own business), then read
    the answer until the server closes; bounded by a 10 s timeout."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        # the server may refuse before reading it all: its answer is still there
        with contextlib.suppress(OSError):
            sock.sendall(request)
        answer = b""
        try:
            while chunk := sock.recv(65536):
                answer += chunk
        except ConnectionResetError:
            pass
    return answer


def head_of(size: int, method: bytes = b"GET", path: bytes = b"/healthz") -> bytes:
    """A request whose line and headers come to about ``size`` bytes."""
    padding = b"x" * max(0, size - 64)
    return method + b" " + path + b" HTTP/1.1\r\nHost: a\r\nX-Padding: " + padding + b"\r\n\r\n"


def status(answer: bytes) -> int:
    assert answer.startswith(b"HTTP/1.1 "), answer[:80]
    return int(answer[9:12])


@contextmanager
def listening(make: Callable[[], PlainListener]) -> Iterator[int]:
    """A plain listener served on loopback by an event loop of its own, in a thread."""
    loop = asyncio.new_event_loop()
    listener = make()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    asyncio.run_coroutine_threadsafe(listener.start(), loop).result(timeout=10)
    try:
        yield listener.ports[0]
    finally:
        asyncio.run_coroutine_threadsafe(_stop(listener), loop).result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        loop.close()


async def _stop(listener: PlainListener) -> None:
    """Stop the listener, and end the connections it is still answering or lingering on."""
    await listener.stop()
    tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


@pytest.fixture
def metrics_port() -> Iterator[int]:
    with listening(lambda: MetricsListener(lambda: b"m 1\n", port=0, host="127.0.0.1")) as port:
        yield port


@pytest.fixture
def views_port(demo: RunningServer) -> Iterator[int]:
    service = demo.app.state.service
    with listening(lambda: ViewsListener(service, port=0, host="127.0.0.1")) as port:
        yield port


# (id, the request, the status): in one write; the kernel may hand it over in pieces
REQUESTS = [
    ("a head under the limit", head_of(LIMIT - 1024), 200),
    ("a head just over the limit", head_of(LIMIT + 1024), 431),
    ("a head of 4 MiB", head_of(4 * 2**20), 431),
]


@pytest.mark.parametrize(
    ("request_", "expected"), [c[1:] for c in REQUESTS], ids=[c[0] for c in REQUESTS]
)
@pytest.mark.parametrize("listener", ["main", "metrics", "views"])
def test_a_head_over_the_limit_gets_a_431_on_every_listener(
    request: pytest.FixtureRequest, listener: str, request_: bytes, expected: int
) -> None:
    port = (
        request.getfixturevalue("demo").port
        if listener == "main"
        else request.getfixturevalue(f"{listener}_port")
    )
    answer = exchange(port, request_)
    assert status(answer) == expected
    if expected == 431:
        assert b"larger than 65536 bytes" in answer
        assert b"connection: close" in answer.lower()


@pytest.mark.parametrize("path", [b"/filter", b"/prioritize", b"/bind"])
def test_a_verb_with_a_head_over_the_limit_gets_a_431(demo: RunningServer, path: bytes) -> None:
    request = head_of(LIMIT * 2, b"POST", path).replace(
        b"\r\n\r\n", b"\r\nContent-Length: 2\r\n\r\n{}"
    )
    answer = exchange(demo.port, request)
    assert status(answer) == 431
    assert answer.endswith(
        b'{"Error":"request line and headers larger than 65536 bytes (server.max_header_bytes)"}'
    )


def test_a_head_sent_in_pieces_is_refused_once_over_the_limit(demo: RunningServer) -> None:
    # the head never ends: refused as it grows, not held until it does
    with socket.create_connection(("127.0.0.1", demo.port), timeout=10) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: a\r\n")
        answer = b""
        try:
            for _ in range(64):
                sock.sendall(b"X-More: " + b"y" * 4088 + b"\r\n")
        except OSError:
            pass
        try:
            while chunk := sock.recv(65536):
                answer += chunk
        except ConnectionResetError:
            pass
    assert status(answer) == 431


def test_the_limit_is_a_setting(serve: Serve) -> None:
    server = serve(settings={"server": {"max_header_bytes": 4096}})
    assert status(exchange(server.port, head_of(2048))) == 200
    answer = exchange(server.port, head_of(8192))
    assert status(answer) == 431
    assert b"larger than 4096 bytes" in answer
    with server.client() as client:  # and the service goes on serving
        assert client.get("/healthz").status_code == 200


@pytest.mark.parametrize("listener", ["metrics", "views"])
def test_head_on_a_plain_listener_answers_as_get(
    request: pytest.FixtureRequest, listener: str
) -> None:
    port = request.getfixturevalue(f"{listener}_port")
    got = exchange(port, b"GET /healthz HTTP/1.1\r\nHost: a\r\n\r\n")
    head = exchange(port, b"HEAD /healthz HTTP/1.1\r\nHost: a\r\n\r\n")
    assert (status(head), status(got)) == (200, 200)
    assert head == got[: -len(b"ok")]  # the same head, no body
