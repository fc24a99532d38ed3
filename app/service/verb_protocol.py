"""schedext's HTTP protocol: uvicorn's httptools protocol, answering filter and prioritize in
place.

uvicorn takes a protocol class (``Config(http=...)``; :func:`protocol_for` makes schedext's).
For every request it stamps the scope with when the event loop read its first bytes and its
last body byte (:data:`app.service.routes.verbs.READ`,
:data:`~app.service.routes.verbs.BODY_READ`), from which the verbs' stages are measured
(``schedext_request_stage_seconds``). Time a request spends in the socket before the event
loop reads it is not seen here: only a client's round trip shows it (``loadtests.bench
--load``).

Filter and prioritize (the verbs with a synchronous handler, ``Verb.handle_now``) sit on
kube-scheduler's serial path, once each per pod. uvicorn serves a request through an ASGI task:
started when the headers are in, woken once per piece of the body (kube-scheduler's client
writes it 4 KiB at a time), run after whatever else the event loop has ready (bind's
continuations, pod watch events), answering in two writes. Here instead the body is gathered in
the parser's callbacks and the verb answered in the callback that completes it, in one write:
no task, no wake-ups, nothing ahead of it once its bytes are read. The answers, errors, limits,
metrics and logs are the ASGI path's (:func:`~app.service.routes.verbs.answer_now` shares its code).

A request is handed to uvicorn's own path, and so to the ASGI app, as if this protocol had not
looked at it, whenever it is not the plain case: another method or path (a query string
included, but prioritize's ``full`` in its usual spellings, ``?full=1``, answered here with
the answer the ASGI path chooses: :func:`~app.service.routes.verbs.queried_routes`), ``Expect:
100-continue``, an upgrade, a declared length over the limit, a request
pipelined behind one still being answered (answers keep their order) or after one that closed
the connection, a client not reading its answers, a replica not ready (whose answers close the
connection), a body that grows past the limit, a filter that must wait for victims
(``VictimWaits.needed``), and a filter or prioritize read while a bind read before it is not
yet planned (see :class:`_BindsInFlight`). A body too slow to
arrive is answered here as the ASGI path would (408, or filter's 200 with the error), and so
is a client that leaves mid-body (counted as rejected). TLS sits under the protocol, so mTLS
is unchanged.

Every request's line and headers must be in within ``server.header_timeout_s`` of its first
byte (a new connection's first request: of the connection's opening), else it is answered 408
and the connection closed (:meth:`VerbProtocol._head_too_slow`): uvicorn's httptools protocol
has no such bound, and a client sending its headers a byte at a time would hold a connection
for ever. Headers that come in one read, as kube-scheduler sends them, arm no timer. Nor has
it a bound on their size: a head over ``server.max_header_bytes`` is answered 431 and the
connection closed (:meth:`VerbProtocol._head_too_large`), counted as it arrives (the reads
while it is incomplete) and, for a head that came whole in one large read, once it is in.

This subclasses uvicorn's internals (its parser callbacks, ``cycle``, ``pipeline``, ``flow``,
keep-alive timer): the api tier drives it over real HTTP, so an uvicorn that changes them
fails there rather than in production.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from time import perf_counter
from typing import Any, ClassVar, cast

import orjson
from uvicorn.protocols.http.httptools_impl import (
    STATUS_LINE,
    HttpToolsProtocol,
    RequestResponseCycle,
)
from uvicorn.protocols.utils import get_client_addr

from app.service.assembly import Service
from app.service.errors import BodyTimeoutError, ClientGoneError
from app.service.routes.verbs import (
    BODY_READ,
    PLANNED,
    READ,
    Verb,
    answer_now,
    queried_routes,
    refuse,
    routes,
    timing_headers,
)

__all__ = ["VerbProtocol", "protocol_for"]

_CONTENT_TYPE = b"content-type: application/json\r\ncontent-length: "


# How long the rest of a head too large is read and dropped before its connection closes.
_LINGER_S = 1.0


class _HeadTooLargeError(Exception):
    """Raised in the parser's callback to stop it: the head was refused (431)."""


def protocol_for(service: Service) -> type[VerbProtocol]:
    """The protocol class for uvicorn's ``Config(http=...)``, answering ``service``'s verbs
    at the paths the ASGI layer serves them at."""
    server = service.settings.server
    verbs = routes(
        server.path_prefix, bench=server.bench_endpoints, prioritize_full=server.prioritize_full
    )
    # With the query strings a verb takes, in their usual spellings: answered here as the
    # ASGI path answers them (any other query string goes there).
    verbs |= queried_routes(verbs)
    served = _Served(
        service,
        answered={p.encode(): v for p, v in verbs.items() if v.handle_now is not None},
        reserving=frozenset(p.encode() for p, v in verbs.items() if v.reserves),
        limit=server.max_body_bytes,
        timeout_s=server.body_timeout_s,
        header_timeout_s=server.header_timeout_s,
        head_limit=server.max_header_bytes,
        timing=server.bench_endpoints,
    )

    class SchedextProtocol(VerbProtocol):
        _served = served

    return SchedextProtocol


class _BindsInFlight:
    """Binds whose body is in and whose plan is not made yet, on every connection.

    A bind read before a filter is planned before it on the ASGI path (its task is ahead in
    the event loop's queue), so that the filter sees the GPUs it reserves; kube-scheduler
    binds one pod while it filters the next. A filter answered in place would pass it by:
    while one is waiting, filter and prioritize take the ASGI path too. A bind is forgotten
    once planned (``PLANNED`` in its scope, called by the verbs) or answered without a plan."""

    def __init__(self) -> None:
        self._cycles: set[RequestResponseCycle] = set()

    def add(self, cycle: RequestResponseCycle) -> functools.partial[None]:
        self._cycles.add(cycle)
        return functools.partial(self._cycles.discard, cycle)

    def waiting(self) -> bool:
        if not self._cycles:
            return False
        self._cycles = {c for c in self._cycles if not (c.response_complete or c.disconnected)}
        return bool(self._cycles)


@dataclass(frozen=True, slots=True)
class _Served:
    """What one schedext's protocol answers, shared by all its connections."""

    service: Service
    answered: Mapping[bytes, Verb]  # paths answered in place
    reserving: frozenset[bytes]  # paths of the verbs filters must not pass (bind)
    limit: int  # server.max_body_bytes
    timeout_s: float  # server.body_timeout_s
    header_timeout_s: float  # server.header_timeout_s
    head_limit: int  # server.max_header_bytes
    timing: bool  # the benchmark's timing headers (see app.service.routes.verbs.timing_headers)
    binds: _BindsInFlight = field(default_factory=_BindsInFlight)


class VerbProtocol(HttpToolsProtocol):
    """uvicorn's protocol with the stage stamps; bound to a service by :func:`protocol_for`,
    it also answers filter and prioritize in place (the class alone only stamps)."""

    _served: ClassVar[_Served | None] = None

    _read_at = 0.0  # when data_received was last called
    _answered = False  # answered in place during this data_received
    _discarding = False  # the rest of a body answered before it was all in
    # The request being answered in place: its verb, body so far, start and connection.
    _verb: Verb | None = None
    _chunks: list[bytes]
    _size = 0
    _started = 0.0
    _keep_alive = True
    _http_version = "1.1"
    _body_timer: asyncio.TimerHandle | None = None
    _in_head = False  # a request's first bytes are in, and not yet all its headers
    _head_timer: asyncio.TimerHandle | None = None
    # The bytes of the reads a head came in, from the one it began in (at most its size plus
    # that read's bytes before it), and of that first read.
    _head_bytes = 0
    _head_first = 0
    _read_size = 0  # bytes of the read being parsed
    _refused = False  # a head too large was refused: what comes after it is dropped

    # -- asyncio.Protocol

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if self._served is not None:
            # A new connection has until then to send its first request's headers.
            self._head_timer = self.loop.call_later(
                self._served.header_timeout_s, self._head_too_slow
            )

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return  # the rest of a head too large, read until the connection closes
        self._read_at = perf_counter()
        self._read_size = len(data)
        if self._in_head:  # a head under way since an earlier read
            self._head_bytes += len(data)
        super().data_received(data)
        if self._in_head and self._served is not None:
            # Still incomplete: over the limit counting only the reads after the first (whose
            # bytes may be the end of the request before), it is too large already.
            if self._head_bytes - self._head_first > self._served.head_limit:
                self._head_too_large()
                return
            if self._head_timer is None:
                # Only headers that did not come whole in one read pay for a timer.
                self._head_timer = self.loop.call_later(
                    self._served.header_timeout_s, self._head_too_slow
                )
        if self._verb is not None and self._body_timer is None and self._served is not None:
            # Only a body that did not come with its head pays for a timer.
            self._body_timer = self.loop.call_later(self._served.timeout_s, self._body_too_slow)
        if self._answered:
            self._answered = False
            self._wait_for_next()

    def connection_lost(self, exc: Exception | None) -> None:
        self._end_head()
        verb, served = self._verb, self._served
        if verb is not None and served is not None:
            self._end_body()
            gone = ClientGoneError("client disconnected before sending the whole body")
            refuse(served.service, verb, gone, started=self._started)
        super().connection_lost(exc)

    # -- the parser's callbacks

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_head = True
        self._head_bytes = self._head_first = self._read_size
        cast(dict[str, Any], self.scope)[READ] = self._read_at

    def on_headers_complete(self) -> None:
        if self._head_timer is not None:
            self._end_head()
        self._in_head = False
        served = self._served
        if (
            served is not None
            and self._head_bytes > served.head_limit  # it may be: count it
            and self._head_size() > served.head_limit
        ):
            self._head_too_large()
            # Stops the parser: uvicorn answers its errors with a 400, which
            # send_400_response leaves out once this one is refused.
            raise _HeadTooLargeError
        verb = self._answerable()
        if verb is None:
            super().on_headers_complete()
            return
        self._verb, self._chunks, self._size = verb, [], 0
        self._started = self._read_at
        self._http_version = self.parser.get_http_version()
        self._keep_alive = self._http_version != "1.0" and self.parser.should_keep_alive()

    def on_body(self, body: bytes) -> None:
        if self._verb is None:
            if not self._discarding:
                super().on_body(body)
            return
        self._chunks.append(body)
        self._size += len(body)
        if self._served is not None and self._size > self._served.limit:
            self._hand_over(complete=False)  # the ASGI path refuses it as it grows

    def on_message_complete(self) -> None:
        if self._discarding:
            self._discarding = False
            return
        scope = cast(dict[str, Any], self.scope)
        scope[BODY_READ] = self._read_at
        verb, served = self._verb, self._served
        if verb is None or served is None:
            if served is not None and self.url in served.reserving:
                self._in_flight(served.binds, scope)
            super().on_message_complete()
            return
        if not served.service.readiness.ready:
            self._hand_over(complete=True)  # answered there, closing the connection
            return
        if served.binds.waiting():
            self._hand_over(complete=True)  # after the bind read before it
            return
        chunks = self._chunks
        body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        handling = perf_counter()
        answered = answer_now(served.service, verb, body)
        if answered is None:
            self._hand_over(complete=True)  # it must wait: the ASGI path awaits
            return
        self._end_body()
        self._respond(verb, *answered, handling=handling)
        if self._keep_alive:
            self._answered = True  # the keep-alive timer once this data is parsed
        else:
            self.transport.close()

    def _in_flight(self, binds: _BindsInFlight, scope: dict[str, Any]) -> None:
        """A bind's body is in: filters wait for its plan (see :class:`_BindsInFlight`)."""
        cycle = self.cycle
        if scope.get("method") == "POST" and cycle is not None and not cycle.response_complete:
            scope[PLANNED] = binds.add(cycle)

    # -- answering in place

    def _answerable(self) -> Verb | None:
        """The verb to answer in place, or None to leave the request to uvicorn."""
        served = self._served
        verb = served.answered.get(self.url) if served is not None else None
        if verb is None or served is None:
            return None
        parser = self.parser
        if (
            parser.get_method() != b"POST"
            or self.expect_100_continue
            or parser.should_upgrade()
            or (self.cycle is not None and not self.cycle.response_complete)
            or self.pipeline
            or self.flow.write_paused
            or self.transport.is_closing()  # pipelined after a "Connection: close"
            or self.limit_concurrency is not None
        ):
            return None
        for name, value in self.headers:
            if name == b"content-length" and (not value.isdigit() or int(value) > served.limit):
                return None  # refused from its header there, before any of it is read
            if name == b"content-encoding" and value.lower() != b"identity":
                return None  # refused from its header there (415)
        return verb

    def _respond(self, verb: Verb, status: int, payload: bytes, *, handling: float) -> None:
        """The whole answer in one write; counted and logged as uvicorn and the verbs do."""
        parts = [STATUS_LINE[status]]
        for name, value in self.server_state.default_headers:
            parts += [name, b": ", value, b"\r\n"]
        parts += [_CONTENT_TYPE, str(len(payload)).encode(), b"\r\n"]
        scope = cast(dict[str, Any], self.scope)
        if self._served is not None and self._served.timing:
            for name, value in timing_headers(scope[READ]):
                parts += [name, b": ", value, b"\r\n"]
        if not self._keep_alive:
            parts.append(b"connection: close\r\n")
        parts += [b"\r\n", payload]
        self.transport.write(b"".join(parts))
        written = perf_counter()
        self.server_state.total_requests += 1
        if verb.measured and self._served is not None:
            self._served.service.metrics.stages(
                verb.name,
                read=scope[READ],
                body_read=scope.get(BODY_READ, handling),
                handling=handling,
                written=written,
            )
        if self.access_log:
            path = self.url.decode("ascii", "replace")
            self.access_logger.info(
                '%s - "%s %s HTTP/%s" %d',
                get_client_addr(self.scope),
                "POST",
                path,
                self._http_version,
                status,
            )

    def _body_too_slow(self) -> None:
        """The body timer fired: answered here, as the ASGI path answers a body not in by
        ``server.body_timeout_s``; what still comes of it is dropped."""
        self._body_timer = None
        verb, served = self._verb, self._served
        if verb is None or served is None:
            return
        self._end_body()
        error = BodyTimeoutError(f"request body not received within {served.timeout_s}s")
        status, payload = refuse(served.service, verb, error, started=self._started)
        self._discarding = True
        self._respond(verb, status, payload, handling=perf_counter())
        if self._keep_alive:
            self._wait_for_next()
        else:
            self.transport.close()

    def _head_too_slow(self) -> None:
        """The head timer fired: the request's line and headers are not all in (or a new
        connection sent none). Answered 408 and closed; with an answer still being made for
        the request before it, closed after that answer instead (nothing may cut into it)."""
        self._head_timer = None
        served = self._served
        if served is None or self.transport.is_closing():
            return
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            cycle.keep_alive = False
            self.flow.pause_reading()  # the rest of these headers is not wanted
            return
        self._refuse(408, f"request headers not received within {served.header_timeout_s}s")
        self.transport.close()

    def _head_size(self) -> int:
        """The request line and headers as parsed (give or take their separators)."""
        return len(self.url) + 16 + sum(len(n) + len(v) + 4 for n, v in self.headers)

    def _head_too_large(self) -> None:
        """The head is over ``server.max_header_bytes``: answered 431 and closed (after the
        answer being made for the request before it, if any). What the client sends after
        is read and dropped for a moment first: closing with it unread would reset the
        connection, and the client could lose the answer."""
        self._end_head()
        self._refused = True
        served = self._served
        assert served is not None
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            cycle.keep_alive = False  # closed once that answer is out
            return
        self._refuse(
            431,
            f"request line and headers larger than {served.head_limit} bytes "
            "(server.max_header_bytes)",
        )
        self.loop.call_later(_LINGER_S, self.transport.close)

    def _refuse(self, status: int, message: str) -> None:
        """An error answer that ends the connection (the caller closes it), in one write."""
        payload = orjson.dumps({"Error": message})
        parts = [STATUS_LINE[status]]
        for name, value in self.server_state.default_headers:
            parts += [name, b": ", value, b"\r\n"]
        parts += [_CONTENT_TYPE, str(len(payload)).encode(), b"\r\nconnection: close\r\n\r\n"]
        self.transport.write(b"".join([*parts, payload]))

    def send_400_response(self, msg: str) -> None:
        if not self._refused:  # else: the parser stopped for a head too large, answered 431
            super().send_400_response(msg)

    def _end_head(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _hand_over(self, *, complete: bool) -> None:
        """Give the request to uvicorn's own path as if it had had it from its headers: the
        ASGI task starts (or queues) with the body read so far."""
        chunks = self._chunks
        self._end_body()
        super().on_headers_complete()
        for chunk in chunks:
            super().on_body(chunk)
        if complete:
            super().on_message_complete()

    def _end_body(self) -> None:
        self._verb, self._chunks = None, []
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None

    def _wait_for_next(self) -> None:
        """After an answer given in place: the keep-alive timer, as uvicorn arms it after an
        answer, unless a request is under way (a body gathered here has its own timer; an ASGI
        request's answer arms it)."""
        if (
            self.transport.is_closing()
            or self._verb is not None
            or (self.cycle is not None and not self.cycle.response_complete)
            or self.pipeline
            or self.timeout_keep_alive_task is not None
        ):
            return
        self.timeout_keep_alive_task = self.loop.call_later(
            self.timeout_keep_alive, self.timeout_keep_alive_handler
        )
