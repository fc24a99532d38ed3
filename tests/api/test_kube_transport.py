"""KubeApi over its real transport (aiohttp) against a real HTTP server on a loopback port:
what goes on the wire, how answers and failures come back, TLS. Watches:
test_watch_stream.py."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp import web

from app.kube.api import KubeApi
from app.kube.config import ClusterConfig
from app.kube.errors import ApiConflictError, ApiTransientError
from testbed.pki import CertAuthority

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@asynccontextmanager
async def api_server(
    routes: dict[tuple[str, str], Handler],
    tls: ssl.SSLContext | None = None,
    host: str = "127.0.0.1",
) -> AsyncIterator[str]:
    """Serve ``routes`` ({(method, path): handler}) on 127.0.0.1; yields the base URL, with
    ``host`` as its host name."""
    app = web.Application()
    for (method, path), handler in routes.items():
        app.router.add_route(method, path, handler)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=tls)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"{'https' if tls else 'http'}://{host}:{port}"
    finally:
        await runner.cleanup()


def config(server: str, context: ssl.SSLContext | bool = False) -> ClusterConfig:
    return ClusterConfig(server=server, ssl_context=context, token="t0ken")


def test_a_post_sends_method_path_headers_and_body_and_decodes_the_answer() -> None:
    seen: list[dict[str, Any]] = []

    async def binding(request: web.Request) -> web.Response:
        seen.append(
            {
                "path": request.path,
                "query": dict(request.query),
                "headers": dict(request.headers),
                "body": await request.read(),
                "peer": request.transport.get_extra_info("peername") if request.transport else None,
            }
        )
        # The API server sets no cookie; if one came, it must not be sent back. (A cookie jar
        # keeps none for an IP address: the test server is called by a host name.)
        response = web.json_response({"kind": "Status", "code": 201}, status=201)
        response.set_cookie("session", "x")
        return response

    async def main() -> list[dict[str, Any]]:
        path = "/api/v1/namespaces/ns/pods/p/binding"
        async with api_server({("POST", path): binding}, host="localhost") as url:
            api = KubeApi(config(url))
            try:
                first = await api.post(path, {"target": {"name": "n1"}})
                assert first == {"kind": "Status", "code": 201}
                await api.post(path, {"target": {"name": "n2"}})
            finally:
                await api.close()
        return seen

    first, second = asyncio.run(main())
    assert first["path"] == "/api/v1/namespaces/ns/pods/p/binding"
    assert orjson.loads(first["body"]) == {"target": {"name": "n1"}}
    assert first["headers"]["Authorization"] == "Bearer t0ken"
    assert first["headers"]["Content-Type"] == "application/json"
    assert first["headers"]["Accept"] == "application/json"
    assert first["headers"]["User-Agent"] == "schedext"
    assert "Cookie" not in second["headers"]
    assert first["peer"] == second["peer"]  # the connection was kept and reused


def test_a_get_sends_its_query_and_no_content_type() -> None:
    seen: list[web.Request] = []

    async def nodes(request: web.Request) -> web.Response:
        seen.append(request)
        return web.json_response({"kind": "NodeList", "items": []})

    async def main() -> None:
        async with api_server({("GET", "/api/v1/nodes"): nodes}) as url:
            api = KubeApi(config(url))
            try:
                got = await api.get("/api/v1/nodes", {"limit": "500", "continue": "a b/c"})
            finally:
                await api.close()
        assert got == {"kind": "NodeList", "items": []}

    asyncio.run(main())
    assert dict(seen[0].query) == {"limit": "500", "continue": "a b/c"}
    assert "Content-Type" not in seen[0].headers


def test_a_compressed_answer_is_decoded() -> None:
    nodes = {"kind": "NodeList", "items": [{"metadata": {"name": f"n{i}"}} for i in range(3000)]}

    async def big_list(request: web.Request) -> web.Response:
        assert "gzip" in request.headers.get("Accept-Encoding", "")
        response = web.json_response(nodes)
        # kube-apiserver compresses a list answer over 128 KiB for a client that accepts gzip
        response.enable_compression(web.ContentCoding.gzip)
        return response

    async def main() -> dict[str, Any]:
        async with api_server({("GET", "/api/v1/nodes"): big_list}) as url:
            api = KubeApi(config(url))
            try:
                return await api.get("/api/v1/nodes")
            finally:
                await api.close()

    assert asyncio.run(main()) == nodes


def test_an_error_status_is_mapped_with_the_servers_message() -> None:
    async def conflict(_: web.Request) -> web.Response:
        body = {"kind": "Status", "code": 409, "reason": "Conflict", "message": "pod is bound"}
        return web.json_response(body, status=409)

    async def main() -> None:
        async with api_server({("POST", "/x"): conflict}) as url:
            api = KubeApi(config(url))
            try:
                with pytest.raises(ApiConflictError, match=r"POST /x: 409 pod is bound"):
                    await api.post("/x", {})
            finally:
                await api.close()

    asyncio.run(main())


def test_a_refused_connection_is_a_transient_error() -> None:
    async def main() -> None:
        async with api_server({}) as url:
            pass  # the port is closed again: nothing listens there now
        api = KubeApi(config(url))
        try:
            with pytest.raises(ApiTransientError, match=r"GET /api/v1/nodes: ClientConnectorError"):
                await api.get("/api/v1/nodes")
        finally:
            await api.close()

    asyncio.run(main())


def test_a_call_past_its_timeout_is_a_transient_error() -> None:
    release = asyncio.Event()

    async def slow(_: web.Request) -> web.Response:
        await release.wait()
        return web.json_response({})

    async def main() -> None:
        async with api_server({("GET", "/slow"): slow}) as url:
            api = KubeApi(config(url))
            try:
                with pytest.raises(ApiTransientError, match=r"GET /slow: no answer within 0.2s"):
                    await api.get("/slow", timeout=0.2)
            finally:
                release.set()
                await api.close()

    asyncio.run(main())


def test_tls_trusts_the_clusters_ca_and_no_other(tmp_path: Path) -> None:
    ca = CertAuthority.create(tmp_path / "pki", "api-ca")
    cert, key = ca.issue_cert("kube-apiserver", sans=["127.0.0.1"])
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(cert, key)

    async def version(_: web.Request) -> web.Response:
        return web.json_response({"major": "1"})

    async def main() -> None:
        async with api_server({("GET", "/version"): version}, tls) as url:
            trusting = KubeApi(config(url, ssl.create_default_context(cafile=str(ca.cert_path))))
            other = KubeApi(config(url, ssl.create_default_context()))
            try:
                assert await trusting.get("/version") == {"major": "1"}
                with pytest.raises(ApiTransientError, match="certificate verify failed"):
                    await other.get("/version")
            finally:
                await trusting.close()
                await other.close()

    asyncio.run(main())
