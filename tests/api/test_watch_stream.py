"""Watches through KubeApi's real transport (app/kube/watch_stream.py) against a real HTTP
server on a loopback port, plain and TLS: what the request carries, lines however the body is
cut, one line per turn of the event loop, the read timeout, error answers, an answer cut off,
the bound on a line, and the connection closed whenever the watch stops. Each test runs on
asyncio's own event loop and on uvloop's (the service's), whose transports differ."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import orjson
import pytest
import uvloop
from aiohttp import web

from app.kube import watch_stream
from app.kube.api import KubeApi
from app.kube.errors import ApiError, ApiTransientError
from testbed.pki import CertAuthority
from tests.api.test_kube_transport import Handler, api_server, config

Run = Callable[[Coroutine[Any, Any, Any]], Any]  # asyncio.run, uvloop.run


@pytest.fixture(params=["asyncio", "uvloop"])
def run(request: pytest.FixtureRequest) -> Run:
    return asyncio.run if request.param == "asyncio" else uvloop.run


def server_tls(tmp_path: Path) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """The server's context, and a client's that trusts its CA."""
    ca = CertAuthority.create(tmp_path / "pki", "api-ca")
    cert, key = ca.issue_cert("kube-apiserver", sans=["127.0.0.1"])
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(cert, key)
    return server, ssl.create_default_context(cafile=str(ca.cert_path))


def streaming(wire: bytes, *, piece: int, end: bool = True) -> Handler:
    """A watch answer: ``wire`` written in pieces of ``piece`` bytes, then ended (or cut)."""

    async def watch(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        await response.prepare(request)
        for start in range(0, len(wire), piece):
            await response.write(wire[start : start + piece])
            await asyncio.sleep(0)
        if not end:
            assert request.transport is not None
            request.transport.abort()  # mid-answer: no last chunk
        return response

    return watch


async def collect(api: KubeApi, path: str, **params: str) -> list[bytes]:
    got: list[bytes] = []
    await api.watch_lines(path, params, read_timeout=5, on_line=got.append)
    return got


@pytest.mark.parametrize("secure", [False, True], ids=["http", "https"])
def test_a_watch_hands_over_whole_lines_however_the_body_is_cut(
    run: Run, tmp_path: Path, secure: bool
) -> None:
    events = [
        orjson.dumps({"type": "ADDED", "object": {"n": i, "pad": "x" * 3000}}) for i in range(5)
    ]
    # Blank lines are dropped; the last line needs no line break.
    wire = b"\n".join(events[:3]) + b"\n\n  \n" + b"\n".join(events[3:])
    seen: list[dict[str, Any]] = []
    watch = streaming(wire, piece=1777)  # pieces that cut lines anywhere

    async def recorded(request: web.Request) -> web.StreamResponse:
        seen.append({"query": dict(request.query), "headers": dict(request.headers)})
        return await watch(request)

    server, client = server_tls(tmp_path) if secure else (None, None)

    async def main() -> list[bytes]:
        async with api_server({("GET", "/api/v1/pods"): recorded}, server) as url:
            api = KubeApi(config(url, client or False))
            try:
                return await collect(api, "/api/v1/pods", watch="1", fieldSelector="a!=b c")
            finally:
                await api.close()

    assert run(main()) == events
    [request] = seen
    assert request["query"] == {"watch": "1", "fieldSelector": "a!=b c"}
    assert request["headers"]["Authorization"] == "Bearer t0ken"
    assert request["headers"]["Accept"] == "application/json"
    assert request["headers"]["Host"].startswith("127.0.0.1:")
    assert "Accept-Encoding" not in request["headers"]  # so the answer is never compressed


def test_the_loop_runs_between_the_lines_of_one_read(run: Run) -> None:
    """A burst of events in one read is not applied in one go: whatever became ready
    meanwhile (a verb, here a task started at the first line) runs before the next line."""
    wire = b"".join(orjson.dumps({"n": i}) + b"\n" for i in range(4))

    async def main() -> list[object]:
        order: list[object] = []

        async def verb() -> None:
            order.append("verb")

        def apply(line: bytes) -> None:
            order.append(orjson.loads(line)["n"])
            if len(order) == 1:
                asyncio.get_running_loop().create_task(verb())

        async with api_server({("GET", "/api/v1/pods"): streaming(wire, piece=len(wire))}) as url:
            api = KubeApi(config(url))
            try:
                await api.watch_lines("/api/v1/pods", {}, read_timeout=5, on_line=apply)
            finally:
                await api.close()
        return order

    assert run(main()) == [0, "verb", 1, 2, 3]


def test_a_silent_watch_ends_at_its_read_timeout_and_a_refused_one_says_why(run: Run) -> None:
    release = asyncio.Event()

    async def silent(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        await response.prepare(request)
        await response.write(b'{"type": "ADDED"}\n')
        await release.wait()
        return response

    async def forbidden(_: web.Request) -> web.Response:
        body = {"kind": "Status", "code": 403, "reason": "Forbidden", "message": "no watch"}
        return web.json_response(body, status=403)

    async def main() -> list[bytes]:
        routes: dict[tuple[str, str], Handler] = {
            ("GET", "/silent"): silent,
            ("GET", "/forbidden"): forbidden,
        }
        got: list[bytes] = []
        async with api_server(routes) as url:
            api = KubeApi(config(url))
            try:
                with pytest.raises(ApiTransientError, match=r"watch /silent cut: nothing .* 0.2s"):
                    await api.watch_lines("/silent", {}, read_timeout=0.2, on_line=got.append)
                with pytest.raises(ApiError, match=r"GET /forbidden: 403 no watch") as refused:
                    await api.watch_lines("/forbidden", {}, read_timeout=5, on_line=got.append)
                assert refused.value.status == 403
            finally:
                release.set()
                await api.close()
        return got

    assert run(main()) == [b'{"type": "ADDED"}']


def test_an_answer_cut_off_is_a_transient_error_after_the_lines_before_it(run: Run) -> None:
    wire = b'{"n": 0}\n{"n": 1}\n{"n": 2'  # the server goes before the last line is whole

    async def main() -> list[bytes]:
        got: list[bytes] = []
        async with api_server({("GET", "/cut"): streaming(wire, piece=9, end=False)}) as url:
            api = KubeApi(config(url))
            try:
                with pytest.raises(ApiTransientError, match=r"^watch /cut cut: "):
                    await api.watch_lines("/cut", {}, read_timeout=5, on_line=got.append)
            finally:
                await api.close()
        return got

    assert run(main()) == [b'{"n": 0}', b'{"n": 1}']


def closes_when_left(gone: asyncio.Event) -> Handler:
    """A watch that sends a line every turn until the client goes (bounded)."""

    async def endless(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        await response.prepare(request)
        try:
            for n in range(100_000):
                await response.write(orjson.dumps({"n": n}) + b"\n")
                await asyncio.sleep(0.001)
        except (ConnectionError, RuntimeError):
            gone.set()
        return response

    return endless


def test_what_the_callback_raises_ends_the_watch_and_its_connection(run: Run) -> None:
    class EnoughError(Exception):
        pass

    async def main() -> int:
        gone = asyncio.Event()
        got: list[bytes] = []

        def apply(line: bytes) -> None:
            got.append(line)
            if len(got) == 3:
                raise EnoughError

        async with api_server({("GET", "/endless"): closes_when_left(gone)}) as url:
            api = KubeApi(config(url))
            try:
                with pytest.raises(EnoughError):
                    await api.watch_lines("/endless", {}, read_timeout=5, on_line=apply)
                await asyncio.wait_for(gone.wait(), 5)
            finally:
                await api.close()
        return len(got)

    assert run(main()) == 3  # nothing handed over after the failure


def test_a_cancelled_watch_closes_its_connection(run: Run) -> None:
    async def main() -> None:
        gone = asyncio.Event()
        got: list[bytes] = []
        async with api_server({("GET", "/endless"): closes_when_left(gone)}) as url:
            api = KubeApi(config(url))
            try:
                task = asyncio.create_task(
                    api.watch_lines("/endless", {}, read_timeout=5, on_line=got.append)
                )
                while len(got) < 3:
                    await asyncio.sleep(0.001)
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
                await asyncio.wait_for(gone.wait(), 5)
            finally:
                await api.close()

    run(main())


def test_a_line_over_the_bound_cuts_the_watch(run: Run, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(watch_stream, "MAX_LINE_BYTES", 10_000)
    wire = b'{"n": 0}\n' + b"x" * 20_000 + b"\n"

    async def main() -> list[bytes]:
        got: list[bytes] = []
        async with api_server({("GET", "/huge"): streaming(wire, piece=4096)}) as url:
            api = KubeApi(config(url))
            try:
                with pytest.raises(ApiTransientError, match=r"cut: .*a line over 10000 bytes"):
                    await api.watch_lines("/huge", {}, read_timeout=5, on_line=got.append)
            finally:
                await api.close()
        return got

    assert run(main()) == [b'{"n": 0}']


@pytest.mark.parametrize(
    ("server", "token", "error"),
    [
        ("", "a\r\nX-Injected: 1", r"watch /w: a request header or the URL holds a line break"),
        ("ftp://127.0.0.1:1", "t", r"watch /w: cannot send to ftp:// URLs"),
    ],
    ids=["header-line-break", "scheme"],
)
def test_a_request_that_cannot_be_sent_safely_is_refused_before_connecting(
    run: Run, server: str, token: str, error: str
) -> None:
    requests: list[str] = []

    async def watch(request: web.Request) -> web.Response:
        requests.append(request.path)
        return web.Response(text="")

    async def main() -> None:
        async with api_server({("GET", "/w"): watch}) as url:
            settings = config(server or url)
            settings.token = token
            api = KubeApi(settings)
            try:
                with pytest.raises(ApiTransientError, match=error):
                    await api.watch_lines("/w", {}, read_timeout=5, on_line=lambda _: None)
            finally:
                await api.close()

    run(main())
    assert requests == []


def test_a_watch_trusts_the_clusters_ca_and_no_other(run: Run, tmp_path: Path) -> None:
    server, trusting = server_tls(tmp_path)
    watch = streaming(b'{"n": 0}\n', piece=64)

    async def main() -> None:
        async with api_server({("GET", "/w"): watch}, server) as url:
            good = KubeApi(config(url, trusting))
            other = KubeApi(config(url, ssl.create_default_context()))
            try:
                assert await collect(good, "/w") == [b'{"n": 0}']
                with pytest.raises(ApiTransientError, match=r"^watch /w: .*certificate verify"):
                    await collect(other, "/w")
            finally:
                await good.close()
                await other.close()

    run(main())
