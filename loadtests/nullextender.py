"""The protocol's floor: an extender that decides nothing, on schedext's serving stack.

kube-scheduler pays for an extender twice: in the extender, and in its own HTTP client
(encoding the pod and the names for every call, decoding the answers, waiting). This process
answers the same three calls as schedext with no scheduling work at all, so the throughput
benchmark can measure what the protocol costs whatever the extender does (its phase P):

- ``filter``: every node it was given passes, or with ``--shortlist K`` the first K (the call
  pattern of schedext's shortlist mode: kube-scheduler decodes K names and, for one, skips its
  Score phase);
- ``prioritize``: no node is scored;
- ``bind``: one Binding POST to the API server, carrying a GPU-ids annotation as schedext's
  does, and the API server's refusal as the answer's Error.

It serves with what schedext serves with (uvicorn on uvloop and httptools, a bare ASGI app,
orjson) and posts with aiohttp, one kept-alive connection pool; it keeps no inventory and
watches nothing. ``loadtests/goextender`` is the same in Go, with the standard library only.

    python -m loadtests.nullextender --port 8888 --server https://127.0.0.1:6443 \\
        --ca-file ca.crt --token-file token
"""

from __future__ import annotations

import argparse
import ssl
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import uvicorn

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

GPU_IDS = "schedext.io/gpu-ids"
MAX_BODY = 8 << 20  # kube-scheduler's largest ask (5,000 full Node objects) is well below
NOT_FOUND = b'{"Error":"no such path"}'


class NullExtender:
    """The ASGI app. ``server``: the API server's URL; ``token``: its bearer token;
    ``context``: TLS trust for an https server (None: plain HTTP, for tests)."""

    def __init__(
        self, server: str, token: str, context: ssl.SSLContext | None, *, shortlist: int = 0
    ) -> None:
        self._shortlist = shortlist  # 0: every node passes
        self._server = server.rstrip("/")
        self._headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        self._context = context
        self._session: aiohttp.ClientSession | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        body = await _body(receive)
        path = scope["path"]
        if path == "/filter":
            answer = _filter(body, self._shortlist)
        elif path == "/prioritize":
            answer = b"[]"
        elif path == "/bind":
            answer = await self._bind(body)
        elif path in ("/readyz", "/healthz", "/metrics"):
            answer = b""
        else:
            await _answer(send, NOT_FOUND, status=404)
            return
        await _answer(send, answer)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                connector = aiohttp.TCPConnector(ssl=self._context if self._context else False)
                self._session = aiohttp.ClientSession(
                    connector=connector, cookie_jar=aiohttp.DummyCookieJar()
                )
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if self._session is not None:
                    await self._session.close()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _bind(self, body: bytes) -> bytes:
        try:
            args = _object(body)
            name, namespace = str(args["PodName"]), str(args["PodNamespace"])
            uid, node = str(args["PodUID"]), str(args["Node"])
        except (ValueError, KeyError) as error:
            return _error(f"bad bind arguments: {error}")
        binding = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "uid": uid,
                "annotations": {GPU_IDS: "0"},
            },
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        url = f"{self._server}/api/v1/namespaces/{namespace}/pods/{name}/binding"
        if self._session is None:
            return _error("not started")
        try:
            async with self._session.post(
                url, data=orjson.dumps(binding), headers=self._headers
            ) as response:
                text = await response.read()
                if response.status >= 300:
                    return _error(f"binding refused: {response.status} {text[:200]!r}")
        except aiohttp.ClientError as error:
            return _error(f"binding failed: {error}")
        return b'{"Error":""}'


def _filter(body: bytes, shortlist: int) -> bytes:
    try:
        names = _object(body).get("NodeNames")
    except ValueError as error:
        return _filter_error(str(error))
    if not isinstance(names, list):
        return _filter_error("names only: this floor needs nodeCacheCapable: true")
    if shortlist:
        names = names[:shortlist]
    return orjson.dumps(
        {
            "Nodes": None,
            "NodeNames": names,
            "FailedNodes": {},
            "FailedAndUnresolvableNodes": {},
            "Error": "",
        }
    )


def _filter_error(message: str) -> bytes:
    return orjson.dumps({"Nodes": None, "NodeNames": None, "FailedNodes": {}, "Error": message})


def _error(message: str) -> bytes:
    return orjson.dumps({"Error": message})


def _object(body: bytes) -> dict[str, Any]:
    try:
        value = orjson.loads(body)
    except orjson.JSONDecodeError as error:
        raise ValueError(f"not JSON: {error}") from None
    if not isinstance(value, dict):
        raise ValueError("not a JSON object")
    return value


async def _body(receive: Receive) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        chunk = message.get("body", b"")
        size += len(chunk)
        if size <= MAX_BODY:
            chunks.append(chunk)
        if not message.get("more_body"):
            return b"".join(chunks) if size <= MAX_BODY else b""


async def _answer(send: Send, body: bytes, status: int = 200) -> None:
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True, help="port on 127.0.0.1")
    parser.add_argument("--server", required=True, help="the API server's URL")
    parser.add_argument("--ca-file", type=Path, help="CA of an https API server")
    parser.add_argument("--token-file", type=Path, required=True, help="bearer token")
    parser.add_argument(
        "--shortlist", type=int, default=0, help="filter passes the first K nodes (0: all)"
    )
    args = parser.parse_args(argv)
    if args.shortlist < 0:
        parser.error("--shortlist must be >= 0")
    context = ssl.create_default_context(cafile=str(args.ca_file)) if args.ca_file else None
    app = NullExtender(
        args.server, args.token_file.read_text().strip(), context, shortlist=args.shortlist
    )
    uvicorn.run(
        app,
        host="127.0.0.1",
        port=args.port,
        loop="uvloop",
        http="httptools",
        lifespan="on",
        log_level="warning",
        access_log=False,
        server_header=False,
        proxy_headers=False,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
