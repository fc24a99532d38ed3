"""An API server for the service's api tests: it lists the nodes and pods it is given, and one
watch (``watched``, an API path) sends what the test gives :meth:`WatchedApi.send`; the other
watches stay open and quiet, and the custom resources are not installed."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Sequence
from typing import Any

import httpx

from app.kube.api import KubeApi
from app.kube.config import ClusterConfig
from app.service.cluster import ClusterSource
from tests.handler_transport import HandlerTransport
from tests.unit.kube_fakes import page

__all__ = ["WatchedApi"]


class WatchedApi:
    def __init__(
        self, watched: str, *, nodes: Sequence[dict[str, Any]], pods: Sequence[dict[str, Any]]
    ) -> None:
        self.watched, self.nodes, self.pods = watched, list(nodes), list(pods)
        self._attached = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._queue: asyncio.Queue[bytes] | None = None

    def attach(self, loop: asyncio.AbstractEventLoop, queue: asyncio.Queue[bytes]) -> None:
        self._loop, self._queue = loop, queue
        self._attached.set()

    def send(self, line: bytes) -> None:
        """One watch event for the watched path (waits until the service watches it)."""
        assert self._attached.wait(10), f"schedext never watched {self.watched}"
        assert self._loop is not None
        assert self._queue is not None
        self._loop.call_soon_threadsafe(self._queue.put_nowait, line)

    async def handle(self, request: httpx.Request) -> httpx.Response:
        path, params = request.url.path, request.url.params
        if request.method == "GET" and params.get("watch") == "1":
            if path == self.watched:
                return httpx.Response(200, stream=_Stream(self))
            return httpx.Response(200, stream=_Quiet())
        if request.method == "GET" and path == "/api/v1/nodes":
            return page(self.nodes, "10")
        if request.method == "GET" and path == "/api/v1/pods":
            return page(self.pods, "11")
        if request.method == "GET" and path == "/apis/apps/v1/statefulsets":
            return page([], "12")
        return httpx.Response(404, json={"kind": "Status", "code": 404, "reason": "NotFound"})

    def source(self) -> ClusterSource:
        config = ClusterConfig(server="https://api.test", ssl_context=False, token="t0ken")
        return ClusterSource(
            KubeApi(config, transport=HandlerTransport(self.handle)), server=config.server
        )


class _Stream(httpx.AsyncByteStream):
    """A watch whose events the test sends; it stays open until the client goes away."""

    def __init__(self, api: WatchedApi) -> None:
        self._api = api

    async def __aiter__(self) -> AsyncIterator[bytes]:
        queue: asyncio.Queue[bytes] = asyncio.Queue()
        self._api.attach(asyncio.get_running_loop(), queue)
        while True:
            yield await queue.get()


class _Quiet(httpx.AsyncByteStream):
    async def __aiter__(self) -> AsyncIterator[bytes]:
        await asyncio.Event().wait()
        yield b""  # never reached
