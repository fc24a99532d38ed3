"""``--metrics-port``: a second, plain-HTTP listener on every address that serves only
``GET /metrics`` and ``GET /healthz``, for Prometheus to scrape.

The main listener stays on loopback (sidecar) or behind client certificates (mTLS), because it
serves ``bind``. This one answers nothing else, so it needs neither: no request body is read,
every answer closes its connection, and a client that does not send its request line and
headers (at most 8 KiB) within 5 s is cut off.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from app.metrics import CONTENT_TYPE

__all__ = ["MetricsListener"]

log = logging.getLogger("schedext")

_HEAD_LIMIT = 8192
_HEAD_TIMEOUT_S = 5.0
_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed"}


class MetricsListener:
    def __init__(self, render: Callable[[], bytes], *, port: int, host: str | None = None) -> None:
        self._render = render
        self._host = host  # None: every address, IPv4 and IPv6
        self._port = port
        self._server: asyncio.Server | None = None

    @property
    def ports(self) -> list[int]:
        sockets = self._server.sockets if self._server is not None else ()
        return sorted({int(sock.getsockname()[1]) for sock in sockets})

    async def start(self) -> None:
        self._server = await asyncio.start_server(
            self._handle, host=self._host, port=self._port, limit=_HEAD_LIMIT
        )
        addresses = [sock.getsockname()[0] for sock in self._server.sockets]
        log.info(
            "metrics listener",
            extra={
                "addresses": addresses,
                "port": self.ports[0],
                "paths": ["/metrics", "/healthz"],
            },
        )

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(_HEAD_TIMEOUT_S):
                head = await reader.readuntil(b"\r\n\r\n")
            status, body, content_type = self._answer(head.split(b"\r\n", 1)[0])
            allow = "Allow: GET, HEAD\r\n" if status == 405 else ""
            writer.write(
                f"HTTP/1.1 {status} {_REASONS[status]}\r\nContent-Type: {content_type}\r\n"
                f"Content-Length: {len(body)}\r\n{allow}Connection: close\r\n\r\n".encode()
            )
            if not head.startswith(b"HEAD "):
                writer.write(body)
            await writer.drain()
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, OSError):
            pass  # a slow, oversized or vanished client: just close
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    def _answer(self, request_line: bytes) -> tuple[int, bytes, str]:
        parts = request_line.split(b" ")
        if len(parts) != 3 or not parts[2].startswith(b"HTTP/1."):
            return 400, b"bad request\n", "text/plain"
        method, target, _ = parts
        path = target.split(b"?", 1)[0]
        if path not in (b"/metrics", b"/healthz"):
            return 404, b"this port serves only /metrics and /healthz\n", "text/plain"
        if method not in (b"GET", b"HEAD"):
            return 405, b"GET only\n", "text/plain"
        if path == b"/healthz":
            return 200, b"ok", "text/plain"
        return 200, self._render(), CONTENT_TYPE
