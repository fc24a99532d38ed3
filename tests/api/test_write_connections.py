"""KubeApi's writes over kept-alive connections (app/kube/connections.py) against a real HTTP
server on a loopback port: reuse and its limits, answers however they are framed, every way an
exchange can fail and whether it says the request may have reached the server, and the bounds.
Each test runs on asyncio's own event loop and on uvloop's (the service's)."""

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

from app.kube import connections
from app.kube.api import KubeApi
from app.kube.connections import ConnectionPool
from app.kube.errors import ApiError, ApiTransientError
from app.kube.request_head import tls_context
from testbed.pki import CertAuthority
from tests.api.test_kube_transport import api_server, config

Run = Callable[[Coroutine[Any, Any, Any]], Any]  # asyncio.run, uvloop.run
PATH = "/api/v1/namespaces/ns/pods/p/binding"


@pytest.fixture(params=["asyncio", "uvloop"])
def run(request: pytest.FixtureRequest) -> Run:
    return asyncio.run if request.param == "asyncio" else uvloop.run


def peer(request: web.Request) -> object:
    return request.transport.get_extra_info("peername") if request.transport else None


def test_writes_reuse_one_connection_and_each_method_sends_its_body(run: Run) -> None:
    seen: list[tuple[str, object, bytes, str | None]] = []

    async def record(request: web.Request) -> web.Response:
        body = await request.read()
        seen.append((request.method, peer(request), body, request.headers.get("Content-Length")))
        return web.json_response({"kind": "Status", "code": 201}, status=201)

    async def main() -> None:
        routes = {(method, PATH): record for method in ("POST", "PUT", "PATCH", "DELETE")}
        async with api_server(routes) as url:
            api = KubeApi(config(url))
            try:
                await api.post(PATH, {"n": 1})
                await api.put(PATH, {"n": 2})
                await api.merge_patch(PATH, {"n": 3})
                await api.delete(PATH)
            finally:
                await api.close()

    run(main())
    assert [method for method, *_ in seen] == ["POST", "PUT", "PATCH", "DELETE"]
    assert len({address for _, address, _, _ in seen}) == 1  # one connection, kept
    assert [orjson.loads(body) for _, _, body, _ in seen[:3]] == [{"n": 1}, {"n": 2}, {"n": 3}]
    assert seen[3][2:] == (b"", "0")  # a DELETE says its body is empty


def test_concurrent_writes_take_a_connection_each_up_to_the_limit(run: Run) -> None:
    in_flight: list[int] = [0, 0]  # now, most

    async def slow(request: web.Request) -> web.Response:
        in_flight[0] += 1
        in_flight[1] = max(in_flight)
        await asyncio.sleep(0.05)
        in_flight[0] -= 1
        return web.json_response({"n": request.query["n"]})

    async def main() -> list[bytes]:
        async with api_server({("POST", PATH): slow}) as url:
            pool = ConnectionPool(lambda: tls_context(False), limit=3)
            try:
                answers = await asyncio.gather(
                    *(
                        pool.request(
                            "POST",
                            url + PATH,
                            params={"n": str(n)},
                            headers={},
                            body=b"{}",
                            timeout=5,
                        )
                        for n in range(8)
                    )
                )
            finally:
                await pool.close()
        assert {status for status, _ in answers} == {200}
        return [body for _, body in answers]

    bodies = run(main())
    assert [orjson.loads(body)["n"] for body in bodies] == [str(n) for n in range(8)]
    assert in_flight[1] == 3


def test_an_idle_connection_is_not_reused_after_the_keepalive(run: Run) -> None:
    peers: list[object] = []
    now = [0.0]

    async def answer(request: web.Request) -> web.Response:
        peers.append(peer(request))
        return web.json_response({})

    async def main() -> None:
        async with api_server({("POST", PATH): answer}) as url:
            pool = ConnectionPool(lambda: tls_context(False), keepalive_s=5, clock=lambda: now[0])
            try:
                for at in (0.0, 4.9, 10.0):  # within 5 s of the last use, then not
                    now[0] = at
                    await pool.request(
                        "POST", url + PATH, params=None, headers={}, body=b"{}", timeout=5
                    )
            finally:
                await pool.close()

    run(main())
    assert peers[0] == peers[1] != peers[2]


def test_a_connection_the_server_closes_is_replaced(run: Run) -> None:
    """Closed by the server's answer (``Connection: close``), and closed idle by the server
    between two writes: the next write goes on a new connection and succeeds."""
    peers: list[object] = []

    async def closing(request: web.Request) -> web.Response:
        peers.append(peer(request))
        return web.json_response({}, headers={"Connection": "close"})

    async def kept(request: web.Request) -> web.Response:
        peers.append(peer(request))
        return web.json_response({})

    async def main() -> None:
        routes = {("POST", "/closing"): closing, ("POST", "/kept"): kept}
        async with api_server(routes) as url:
            api = KubeApi(config(url))
            try:
                await api.post("/closing", {})
                await api.post("/kept", {})
                await api.post("/kept", {})
            finally:
                await api.close()

    run(main())
    assert peers[0] != peers[1] == peers[2]


async def drops(request: web.Request) -> web.Response:
    assert request.transport is not None
    request.transport.abort()  # the request was read; no answer comes
    return web.json_response({})


@pytest.mark.parametrize(
    ("path", "timeout", "message"),
    [
        ("/drops", 5.0, r"POST /drops: the server closed the connection"),
        ("/hangs", 0.2, r"POST /hangs: no answer within 0.2s"),
        ("/huge", 5.0, r"POST /huge: the answer is not HTTP/1.1 \(an answer over the bound\)"),
    ],
    ids=["dropped", "timed-out", "too-large"],
)
def test_a_failed_exchange_says_the_write_may_have_happened_and_the_next_one_works(
    run: Run, monkeypatch: pytest.MonkeyPatch, path: str, timeout: float, message: str
) -> None:
    monkeypatch.setattr(connections, "MAX_ANSWER_BYTES", 10_000)
    release = asyncio.Event()

    async def hangs(_: web.Request) -> web.Response:
        await release.wait()
        return web.json_response({})

    async def huge(_: web.Request) -> web.Response:
        return web.Response(body=b"x" * 20_000)

    async def ok(_: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    async def main() -> None:
        routes = {
            ("POST", "/drops"): drops,
            ("POST", "/hangs"): hangs,
            ("POST", "/huge"): huge,
            ("POST", "/ok"): ok,
        }
        async with api_server(routes) as url:
            api = KubeApi(config(url))
            try:
                await api.post("/ok", {})  # a kept connection, for the failure to break
                with pytest.raises(ApiTransientError, match=message) as failed:
                    await api.post(path, {}, timeout=timeout)
                assert failed.value.sent is True  # it went out: the server may have it
                assert await api.post("/ok", {}) == {"ok": True}
            finally:
                release.set()
                await api.close()

    run(main())


@pytest.mark.parametrize(
    ("server", "token", "message"),
    [
        ("", "a\r\nX-Injected: 1", r"POST /w: a request header or the URL holds a line break"),
        ("ftp://127.0.0.1:1", "t", r"POST /w: cannot send to ftp:// URLs"),
        ("closed", "t", r"POST /w: \w+"),
    ],
    ids=["header-line-break", "scheme", "refused"],
)
def test_a_write_that_never_left_says_so(run: Run, server: str, token: str, message: str) -> None:
    requests: list[str] = []

    async def answer(request: web.Request) -> web.Response:
        requests.append(request.path)
        return web.json_response({})

    async def main() -> None:
        async with api_server({("POST", "/w"): answer}) as url:
            pass  # closed again: nothing listens there now
        async with api_server({("POST", "/w"): answer}) as live:
            settings = config({"": live, "closed": url}.get(server, server))
            settings.token = token
            api = KubeApi(settings)
            try:
                with pytest.raises(ApiTransientError, match=message) as failed:
                    await api.post("/w", {})
                assert failed.value.sent is False
            finally:
                await api.close()

    run(main())
    assert requests == []


def test_an_answer_in_chunks_and_an_error_status_come_back_whole(run: Run) -> None:
    async def chunked(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(status=409)
        response.enable_chunked_encoding()
        await response.prepare(request)
        body = orjson.dumps({"kind": "Status", "code": 409, "message": "x" * 5000})
        for start in range(0, len(body), 700):
            await response.write(body[start : start + 700])
        await response.write_eof()
        return response

    async def main() -> None:
        async with api_server({("POST", PATH): chunked}) as url:
            api = KubeApi(config(url))
            try:
                with pytest.raises(ApiError, match=r"POST .*: 409 x{5000}") as conflict:
                    await api.post(PATH, {})
                assert conflict.value.status == 409
            finally:
                await api.close()

    run(main())


def test_writes_trust_the_clusters_ca_and_no_other(run: Run, tmp_path: Path) -> None:
    ca = CertAuthority.create(tmp_path / "pki", "api-ca")
    cert, key = ca.issue_cert("kube-apiserver", sans=["127.0.0.1"])
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(cert, key)

    async def answer(_: web.Request) -> web.Response:
        return web.json_response({"bound": True}, status=201)

    async def main() -> None:
        async with api_server({("POST", PATH): answer}, server) as url:
            good = KubeApi(config(url, ssl.create_default_context(cafile=str(ca.cert_path))))
            other = KubeApi(config(url, ssl.create_default_context()))
            try:
                assert await good.post(PATH, {}) == {"bound": True}
                with pytest.raises(ApiTransientError, match="certificate verify failed") as no:
                    await other.post(PATH, {})
                assert no.value.sent is False
            finally:
                await good.close()
                await other.close()

    run(main())
