"""A plain-HTTP listener for read-only answers, on every address: the shape of
``--metrics-port`` (app.service.metrics_listener) and ``--views-port`` (app.service.views_listener).

The main listener stays on loopback (sidecar) or behind client certificates (mTLS), because it
serves ``bind``. A plain listener answers ``GET`` and ``HEAD`` of the paths its subclass
routes and nothing else, so it needs neither: no request body is read, every answer closes
its connection, and a client that does not send its request line and headers within 5 s is
cut off. A head over ``server.max_header_bytes`` (64 KiB by default) is answered 431, and
what the client sends after it is read and dropped for a moment before the connection
closes (closing with it unread would reset the connection, and the client could lose the
answer).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

__all__ = ["Answer", "PlainListener"]

log = logging.getLogger("schedext")

# status, body, Content-Type
Answer = tuple[int, bytes, str]

HEAD_LIMIT = 64 * 1024  # server.max_header_bytes's default
_HEAD_TIMEOUT_S = 5.0
_LINGER_S = 1.0  # how long the rest of a head too large is read and dropped
_REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    431: "Request Header Fields Too Large",
}


class PlainListener:
    """Subclasses name themselves (``kind``, for the log line) and route paths to answers."""

    kind = "plain"
    paths: tuple[str, ...] = ()  # what the log line and the 404 say the port serves

    def __init__(
        self, *, port: int, host: str | None = None, max_header_bytes: int = HEAD_LIMIT
    ) -> None:
        self._host = host  # None: every address, IPv4 and IPv6
        self._port = port
        self._head_limit = max_header_bytes
        self._server: asyncio.Server | None = None

    def route(self, path: bytes) -> Callable[[], Answer] | None:
        """What answers a GET of ``path`` (no query string); None: this port serves nothing
        there."""
        raise NotImplementedError

    @property
    def ports(self) -> list[int]:
        sockets = self._server.sockets if self._server is not None else ()
        return sorted({int(sock.getsockname()[1]) for sock in sockets})

    async def start(self) -> None:
        self._server = await asyncio.start_server(
            self._handle, host=self._host, port=self._port, limit=self._head_limit
        )
        addresses = [sock.getsockname()[0] for sock in self._server.sockets]
        log.info(
            f"{self.kind} listener",
            extra={"addresses": addresses, "port": self.ports[0], "paths": list(self.paths)},
        )

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(_HEAD_TIMEOUT_S):
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except asyncio.LimitOverrunError:  # no end of head within the limit
                    await self._refuse_head(reader, writer)
                    return
            status, body, content_type = self._answer(head.split(b"\r\n", 1)[0])
            self._write(writer, status, body, content_type, head=head.startswith(b"HEAD "))
            await writer.drain()
        except (TimeoutError, asyncio.IncompleteReadError, OSError):
            pass  # a slow or vanished client: just close
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    @staticmethod
    def _write(
        writer: asyncio.StreamWriter, status: int, body: bytes, content_type: str, *, head: bool
    ) -> None:
        allow = "Allow: GET, HEAD\r\n" if status == 405 else ""
        writer.write(
            f"HTTP/1.1 {status} {_REASONS[status]}\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(body)}\r\n{allow}Connection: close\r\n\r\n".encode()
        )
        if not head:
            writer.write(body)

    async def _refuse_head(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        """431 for a head over the limit; then what follows is read and dropped, for at most
        ``_LINGER_S``, until the client closes."""
        message = f"request line and headers larger than {self._head_limit} bytes\n"
        self._write(writer, 431, message.encode(), "text/plain", head=False)
        await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(_LINGER_S):
                while await reader.read(65536):
                    pass

    def _answer(self, request_line: bytes) -> Answer:
        parts = request_line.split(b" ")
        if len(parts) != 3 or not parts[2].startswith(b"HTTP/1."):
            return 400, b"bad request\n", "text/plain"
        method, target, _ = parts
        answer = self.route(target.split(b"?", 1)[0])
        if answer is None:
            served = " and ".join(", ".join(self.paths).rsplit(", ", 1))
            return 404, f"this port serves only {served}\n".encode(), "text/plain"
        if method not in (b"GET", b"HEAD"):
            return 405, b"GET only\n", "text/plain"
        return answer()
