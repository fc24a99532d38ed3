"""Kept-alive HTTP/1.1 connections for the API server's writes: every pod placed costs one
Binding POST, so this path is per pod.

Why not aiohttp's client, which the reads use: over TLS a Binding POST through it cost about
230 µs of CPU (the request and response models, the URL and header objects, the connector's
bookkeeping), 260 through KubeApi. The same request written as bytes on a kept-alive
connection, its answer parsed by httptools, costs 85 µs; through KubeApi and this pool, 124
(``python -m loadtests.apiclient --tls``). A write needs little of a client: its answer is
one small object, never compressed (no compression is asked for), and never redirected.

Each connection carries one request at a time. An idle one is reused, the most recently used
first, for :data:`KEEPALIVE_S`; after that it is closed, before the API server would close it
under a request. At most ``limit`` connections are open per pool; more requests wait for one.
An answer is bounded (:data:`MAX_ANSWER_BYTES`), and so is the wait for it (``timeout``).

A failure is a :class:`ConnectionFailure` that says whether the request may have reached the
server (``sent``): a Binding written on a connection the server then dropped may have bound
the pod, which the binder settles by reading it.
"""

from __future__ import annotations

import asyncio
import collections
import ssl
import time
from collections.abc import Callable, Mapping
from typing import cast

import httptools

from app.kube.request_head import (
    ConnectError,
    HeadError,
    Origin,
    connect,
    describe,
    offers_http1,
    request_head,
    split_url,
)

__all__ = ["KEEPALIVE_S", "MAX_ANSWER_BYTES", "ConnectionFailure", "ConnectionPool"]

# Kept-alive connections to the API server are closed after this long idle (aiohttp's and
# httpx's default too): the server's own idle limit is longer.
KEEPALIVE_S = 5.0
# A write's answer is the object written (a pod is a few KB; the API server refuses objects
# over 1.5 MiB): this bounds what a broken or hostile server can make schedext buffer.
MAX_ANSWER_BYTES = 16 * 1024 * 1024


class ConnectionFailure(Exception):  # noqa: N818 (a failure, not a programming error)
    """No answer: refused, cut, timed out, TLS failed, not HTTP/1.1, too large. ``sent``:
    whether the request may have reached the server."""

    def __init__(self, message: str, *, sent: bool) -> None:
        super().__init__(message)
        self.sent = sent


class ConnectionPool:
    """Requests to one API server over kept-alive connections (one per request in flight)."""

    def __init__(
        self,
        tls: Callable[[], ssl.SSLContext],
        *,
        limit: int = 32,
        keepalive_s: float = KEEPALIVE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._tls = tls  # asked once per connection opened over https
        self._slots = asyncio.Semaphore(limit)
        self._keepalive_s = keepalive_s
        self._clock = clock
        self._idle: dict[Origin, collections.deque[_Connection]] = {}
        self._open: set[_Connection] = set()

    async def request(
        self,
        method: str,
        url: str,
        *,
        params: Mapping[str, str] | None,
        headers: Mapping[str, str],
        body: bytes | None,
        timeout: float,
    ) -> tuple[int, bytes]:
        """The status and whole body; raises ConnectionFailure. ``timeout`` bounds the whole
        exchange, a connection opened for it included; a wait for a free slot before it is
        bounded by the requests in flight, each by its own timeout."""
        try:
            origin, path = split_url(url)
            length = len(body) if body is not None else (0 if method != "GET" else None)
            head = request_head(method, origin, path, params, headers, body_length=length)
        except HeadError as error:
            raise ConnectionFailure(str(error), sent=False) from None
        loop = asyncio.get_running_loop()
        async with self._slots:
            deadline = loop.time() + timeout
            connection = self._idle_connection(origin) or await self._connect(loop, origin, timeout)
            try:
                status, answer = await connection.exchange(
                    head + body if body else head, deadline, timeout
                )
            except BaseException:
                self._discard(connection)
                raise
            if connection.reusable:
                connection.idle_since = self._clock()
                self._idle.setdefault(origin, collections.deque()).append(connection)
            else:
                self._discard(connection)
            return status, answer

    async def close(self) -> None:
        for connection in list(self._open):
            self._discard(connection)
        self._idle.clear()

    def _idle_connection(self, origin: Origin) -> _Connection | None:
        idle = self._idle.get(origin)
        now = self._clock()
        while idle:
            connection = idle.pop()  # the most recently used: the least likely to be stale
            if connection.reusable and now - connection.idle_since < self._keepalive_s:
                return connection
            self._discard(connection)
        return None

    async def _connect(
        self, loop: asyncio.AbstractEventLoop, origin: Origin, timeout: float
    ) -> _Connection:
        connection = _Connection(loop)
        try:
            await connect(connection, origin, self._tls() if origin.secure else None, timeout)
        except ConnectError as error:
            connection.abort()
            raise ConnectionFailure(str(error), sent=False) from None
        self._open.add(connection)
        return connection

    def _discard(self, connection: _Connection) -> None:
        self._open.discard(connection)
        connection.abort()


class _Connection(asyncio.Protocol):
    """One kept-alive connection; one exchange at a time."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._transport: asyncio.Transport | None = None
        self._parser = httptools.HttpResponseParser(self)
        self._answer: asyncio.Future[tuple[int, bytes]] | None = None
        self._body: list[bytes] = []
        self._size = 0
        self._closed = False
        self._done = False  # the last exchange's answer is complete
        self._keep_alive = False  # and its server will take another request after it
        self.idle_since = 0.0

    @property
    def reusable(self) -> bool:
        return not self._closed and self._done and self._keep_alive

    async def exchange(self, request: bytes, deadline: float, timeout: float) -> tuple[int, bytes]:
        """Write ``request`` and wait for its answer until ``deadline`` (loop time)."""
        if self._closed or self._transport is None:
            raise ConnectionFailure("the connection closed before the request", sent=False)
        answer: asyncio.Future[tuple[int, bytes]] = self._loop.create_future()
        self._answer = answer
        self._body, self._size, self._done = [], 0, False
        timer = self._loop.call_at(deadline, self._expire, timeout)
        try:
            self._transport.write(request)
            return await answer
        finally:
            timer.cancel()
            self._answer = None

    def abort(self) -> None:
        self._closed = True
        if self._transport is not None:
            self._transport.abort()

    # ------------------------------------------------------------- asyncio's protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but have its methods.
        self._transport = cast(asyncio.Transport, transport)
        if not offers_http1(transport):
            self.abort()  # the server chose HTTP/2, which was not offered: a broken server

    def data_received(self, data: bytes) -> None:
        if self._answer is None:
            self.abort()  # bytes nobody asked for: the connection cannot be trusted again
            return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as error:
            problem = "an answer over the bound" if self._size > MAX_ANSWER_BYTES else str(error)
            self._fail(f"the answer is not HTTP/1.1 ({problem})")

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        reason = describe(exc) if exc is not None else "the server closed the connection"
        self._fail(reason)

    # ------------------------------------------------------------- httptools' callbacks

    def on_body(self, body: bytes) -> None:
        self._size += len(body)
        if self._size > MAX_ANSWER_BYTES:
            raise ValueError("over the bound")  # httptools stops, and raises HttpParserError
        self._body.append(body)

    def on_message_complete(self) -> None:
        # Read here: llhttp forgets it once the next message begins.
        self._done, self._keep_alive = True, self._parser.should_keep_alive()
        answer = self._answer
        if answer is not None and not answer.done():
            answer.set_result((self._parser.get_status_code(), b"".join(self._body)))
        self._body = []

    # ------------------------------------------------------------- failures

    def _expire(self, timeout: float) -> None:
        self._fail(f"no answer within {timeout:g}s")

    def _fail(self, reason: str) -> None:
        answer = self._answer
        if answer is not None and not answer.done():
            answer.set_exception(ConnectionFailure(reason, sent=True))
        self.abort()
