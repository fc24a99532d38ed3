"""A watch's body as lines, handed over where they land: one HTTP/1.1 GET on a connection of
its own, its answer parsed by httptools (the C parser uvicorn serves with), each whole line
passed to a callback from the protocol's own ``data_received``.

Why not aiohttp's client, which every other call uses: schedext reads two pod watch events per
pod placed, and at a few hundred events a second each one arrives in a read of its own. Through
aiohttp a read cost about 85 µs of CPU (TLS, the parser, a timer rescheduled per read, the
stream reader's future, the task's wake-up and three generators); here it costs about 48,
against 44 for a bare protocol that only counts the lines (``python -m loadtests.apiclient
--tls --event-gap-ms 1``). A watch needs little of a client: no pool, no redirects, no cookies,
no compression (none is asked for, so the API server sends none), one request per connection.

Lines are still applied one per turn of the event loop: when a read holds several, reading is
paused and the rest follow by ``call_soon``, so a verb that arrived meanwhile is answered
before the next event is applied rather than after a whole burst (a Job's pods deleted at
once). A line is bounded (:data:`MAX_LINE_BYTES`); an error answer's body is kept up to
:data:`MAX_ERROR_BYTES`. Nothing is read for ``read_timeout`` seconds: the stream is cut.
"""

from __future__ import annotations

import asyncio
import collections
import ssl
from collections.abc import Callable, Mapping
from typing import cast

import httptools

from app.kube.request_head import (
    ConnectError,
    HeadError,
    connect,
    describe,
    offers_http1,
    request_head,
    split_url,
)

__all__ = ["MAX_ERROR_BYTES", "MAX_LINE_BYTES", "LineBuffer", "StreamError", "watch_lines"]

# The API server refuses objects over 1.5 MiB (etcd's limit, in JSON rather more); a line
# this long is no watch event.
MAX_LINE_BYTES = 32 * 1024 * 1024
MAX_ERROR_BYTES = 64 * 1024

OnLine = Callable[[bytes], None]


class StreamError(Exception):
    """No answer, or the answer broke off: refused, timed out, TLS failed, not HTTP/1.1, a
    line over the bound. ``begun``: whether the answer's head had arrived."""

    def __init__(self, message: str, *, begun: bool) -> None:
        super().__init__(message)
        self.begun = begun


class LineBuffer:
    """Bytes in as they arrive, whole lines out (blank ones dropped). The unfinished line is
    kept as pieces and joined once, so a long line cut into many reads is copied once."""

    def __init__(self, limit: int = MAX_LINE_BYTES) -> None:
        self._limit = limit
        self._pieces: list[bytes] = []
        self._size = 0

    def feed(self, data: bytes) -> list[bytes]:
        if b"\n" not in data:
            self._keep(data)
            return []
        if self._pieces:
            data = b"".join(self._pieces) + data
            self._pieces, self._size = [], 0
        *complete, rest = data.split(b"\n")
        if rest:
            self._keep(rest)
        return [line for line in complete if line.strip()]

    def rest(self) -> bytes:
        """What came after the last line break: a last line without one, or nothing."""
        rest = b"".join(self._pieces)
        self._pieces, self._size = [], 0
        return rest if rest.strip() else b""

    def _keep(self, piece: bytes) -> None:
        self._size += len(piece)
        if self._size > self._limit:
            raise ValueError(f"a line over {self._limit} bytes")
        self._pieces.append(piece)


async def watch_lines(
    url: str,
    *,
    params: Mapping[str, str],
    headers: Mapping[str, str],
    tls: ssl.SSLContext | None,
    connect_timeout: float,
    read_timeout: float,
    on_line: OnLine,
) -> tuple[int, bytes]:
    """GET ``url`` and hand each line of a 2xx answer's body to ``on_line`` until the server
    ends it: returns ``(status, b"")``. An answer of 300 or more is not streamed: returns its
    status and (bounded) body. What ``on_line`` raises ends the stream and propagates; so does
    :class:`StreamError`. ``tls``: for an https URL, the context to verify the server with."""
    try:
        origin, path = split_url(url)
        head = request_head("GET", origin, path, params, headers)
    except HeadError as error:
        raise StreamError(str(error), begun=False) from None
    stream = _WatchStream(asyncio.get_running_loop(), on_line, read_timeout)
    try:
        await connect(stream, origin, tls, connect_timeout)
    except ConnectError as error:
        stream.abort()
        raise StreamError(str(error), begun=False) from None
    try:
        stream.send(head)
        return await stream.outcome
    finally:
        stream.abort()  # the answer was read to its end, failed or is no longer wanted


class _WatchStream(asyncio.Protocol):
    """One watch request's connection. ``outcome`` is resolved once: with (status, body)
    when the answer ends, or with the first failure (the callback's included)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, on_line: OnLine, timeout: float) -> None:
        self._loop = loop
        self._on_line = on_line
        self._timeout = timeout
        self._parser = httptools.HttpResponseParser(self)
        self._transport: asyncio.Transport | None = None
        self._buffer = LineBuffer(MAX_LINE_BYTES)
        self._lines: collections.deque[bytes] = collections.deque()
        self._status = 0
        self._overlong = ""  # LineBuffer's refusal of a line over the bound
        self._error_body: list[bytes] = []
        self._error_size = 0
        self._delimited = False  # the body's end is marked (chunked, or a length given)
        self._ended = False  # the answer's last byte has arrived
        self._draining = False  # a line is scheduled with call_soon
        self._paused = False
        self._heard = loop.time()
        self._watchdog: asyncio.TimerHandle | None = None
        self.outcome: asyncio.Future[tuple[int, bytes]] = loop.create_future()

    # ------------------------------------------------------------- driven by the caller

    def send(self, head: bytes) -> None:
        assert self._transport is not None
        if not self.outcome.done():
            self._heard = self._loop.time()
            self._watchdog = self._loop.call_at(self._heard + self._timeout, self._watch_dog)
            self._transport.write(head)

    def abort(self) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()
        if self._transport is not None:
            self._transport.abort()
        if not self.outcome.done():
            self.outcome.cancel()

    # ------------------------------------------------------------- asyncio's protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but have its methods.
        self._transport = cast(asyncio.Transport, transport)
        if not offers_http1(transport):
            self._fail(StreamError("the server chose a protocol other than HTTP/1.1", begun=False))

    def data_received(self, data: bytes) -> None:
        self._heard = self._loop.time()
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as error:
            problem = self._overlong or f"the answer is not HTTP/1.1 ({error})"
            self._fail(StreamError(problem, begun=self._begun))
            return
        if self._lines and not self._draining:
            self._next_line()
        elif self._ended and not self._draining:
            self._end()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.outcome.done() or self._ended:
            return
        if exc is None and self._begun and not self._delimited:
            # A body that runs to the connection's close (no length, not chunked): ended.
            self._ended = True
            if not self._draining:
                self._end()
            return
        reason = describe(exc) if exc is not None else "the server closed the connection"
        self._fail(StreamError(reason, begun=self._begun))

    # ------------------------------------------------------------- httptools' callbacks

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        if name == b"content-length" or (name == b"transfer-encoding" and b"chunked" in value):
            self._delimited = True

    def on_headers_complete(self) -> None:
        self._status = self._parser.get_status_code()

    def on_body(self, body: bytes) -> None:
        if self._status >= 300:
            if self._error_size < MAX_ERROR_BYTES:
                self._error_body.append(body[: MAX_ERROR_BYTES - self._error_size])
                self._error_size += len(body)
            return
        try:
            self._lines.extend(self._buffer.feed(body))
        except ValueError as error:  # raised through httptools, which stops parsing
            self._overlong = str(error)
            raise

    def on_message_complete(self) -> None:
        self._ended = True
        if self._status < 300 and (last := self._buffer.rest()):
            self._lines.append(last)

    # ------------------------------------------------------------- the lines

    @property
    def _begun(self) -> bool:
        return self._status != 0

    def _next_line(self) -> None:
        """Hand over one line; if more wait, come back after the loop has run once."""
        self._draining = False
        if self.outcome.done():
            return
        try:
            self._on_line(self._lines.popleft())
        except Exception as error:  # noqa: BLE001 (the caller's: it ends the stream, and propagates)
            self._fail(error)
            return
        if self._lines:
            self._draining = True
            if not self._paused and self._transport is not None:
                self._transport.pause_reading()
                self._paused = True
            self._loop.call_soon(self._next_line)
            return
        if self._paused and self._transport is not None:
            self._paused = False
            self._heard = self._loop.time()  # the wait for data starts now, not at the pause
            self._transport.resume_reading()
        if self._ended:
            self._end()

    def _end(self) -> None:
        if not self.outcome.done():
            self.outcome.set_result((self._status, b"".join(self._error_body)))

    def _fail(self, error: BaseException) -> None:
        if not self.outcome.done():
            self.outcome.set_exception(error)
        if self._transport is not None:
            self._transport.abort()

    def _watch_dog(self) -> None:
        """One timer per ``timeout`` of silence, not one rescheduled per read."""
        if self.outcome.done():
            return
        now = self._loop.time()
        if self._draining:  # lines are being handed over: that is no silence
            self._heard = now
        elif now - self._heard >= self._timeout:
            self._fail(StreamError(f"nothing received for {self._timeout:g}s", begun=self._begun))
            return
        self._watchdog = self._loop.call_at(self._heard + self._timeout, self._watch_dog)
