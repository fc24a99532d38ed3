"""How KubeApi's requests reach the API server, three ways by what they are:

- **reads** (lists, gets): aiohttp's client, used directly. It asks for gzip, which the API
  server applies to answers over 128 KiB (a page of a large list), and decodes it. Through
  httpx's ``AsyncClient`` (even over an aiohttp transport) a call cost about 500 µs of CPU,
  against 180 µs for aiohttp alone: URL merging, cookie extraction, redirect and auth flows
  and the response model, none of which talking to one API server needs;
- **writes** (the Binding POST of every pod placed, patches, events): bytes on kept-alive
  connections (app/kube/connections.py): a Binding POST through KubeApi costs 124 µs of CPU
  over TLS, against 229 for aiohttp alone;
- **watches**: a lean stream of lines (app/kube/watch_stream.py): 57 µs per event read over
  TLS, against 80 for aiohttp alone.

(``python -m loadtests.apiclient`` measures them.) ``Transport`` is the seam: KubeApi maps
statuses and errors and decodes JSON; a transport only moves bytes (tests pass one that
answers in-process).
"""

from __future__ import annotations

import ssl
from collections.abc import Callable, Mapping
from typing import Protocol

import aiohttp

from app.kube.connections import KEEPALIVE_S, ConnectionFailure, ConnectionPool
from app.kube.request_head import describe, tls_context
from app.kube.watch_stream import StreamError, watch_lines

__all__ = ["NetworkTransport", "Transport", "TransportError"]


class TransportError(Exception):
    """No answer: the connection was refused, cut or timed out, or TLS failed. ``sent``:
    whether the request may have reached the server (False only when no connection was
    made), which decides whether a write may have happened. ``cut``: a watch's answer had
    begun and broke off."""

    def __init__(self, message: str, *, sent: bool = True, cut: bool = False) -> None:
        super().__init__(message)
        self.sent = sent
        self.cut = cut


class Transport(Protocol):
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
        """The status and whole body; raises TransportError."""

    async def watch(
        self,
        url: str,
        *,
        params: Mapping[str, str],
        headers: Mapping[str, str],
        connect_timeout: float,
        read_timeout: float,
        on_line: Callable[[bytes], None],
    ) -> tuple[int, bytes]:
        """A GET whose body is lines: each whole line goes to ``on_line`` as it arrives, one
        per turn of the event loop, until the body ends; then returns ``(status, b"")``. An
        answer of 300 or more is returned whole instead, ``(status, body)``. Raises
        TransportError (``read_timeout`` bounds each wait for data) and what ``on_line``
        raises."""

    async def close(self) -> None:
        """Close kept-alive connections; the transport may not be used after."""


class NetworkTransport:
    def __init__(self, ssl_context: ssl.SSLContext | bool) -> None:
        self._ssl = ssl_context
        self._session: aiohttp.ClientSession | None = None
        self._tls_context: ssl.SSLContext | None = None
        self._writes: ConnectionPool | None = None

    def _client(self) -> aiohttp.ClientSession:
        # Made on first use: aiohttp binds a session to the running event loop.
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(ssl=self._ssl, keepalive_timeout=KEEPALIVE_S),
                # The API server sets no cookies; a jar would parse every answer for them.
                cookie_jar=aiohttp.DummyCookieJar(),
                # aiohttp asks for gzip, and kube-apiserver compresses answers over 128 KiB
                # (a page of a large list): decoded here, as client-go does.
                auto_decompress=True,
            )
        return self._session

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
        if method != "GET":
            return await self._write(
                method, url, params=params, headers=headers, body=body, timeout=timeout
            )
        try:
            async with self._client().request(
                method,
                url,
                params=params,
                headers=headers,
                data=body,
                allow_redirects=False,
                timeout=aiohttp.ClientTimeout(total=timeout),
            ) as response:
                return response.status, await response.read()
        except TimeoutError:  # before OSError, its base class
            raise TransportError(f"no answer within {timeout:g}s") from None
        except aiohttp.ClientConnectorError as error:  # no connection: nothing was sent
            raise TransportError(describe(error), sent=False) from None
        except (aiohttp.ClientError, OSError) as error:
            raise TransportError(describe(error)) from None

    async def watch(
        self,
        url: str,
        *,
        params: Mapping[str, str],
        headers: Mapping[str, str],
        connect_timeout: float,
        read_timeout: float,
        on_line: Callable[[bytes], None],
    ) -> tuple[int, bytes]:
        try:
            return await watch_lines(
                url,
                params=params,
                headers=headers,
                tls=self._tls(),
                connect_timeout=connect_timeout,
                read_timeout=read_timeout,
                on_line=on_line,
            )
        except StreamError as error:
            raise TransportError(str(error), cut=error.begun) from None

    async def _write(
        self,
        method: str,
        url: str,
        *,
        params: Mapping[str, str] | None,
        headers: Mapping[str, str],
        body: bytes | None,
        timeout: float,
    ) -> tuple[int, bytes]:
        if self._writes is None:  # made on first use, as the session: on the running loop
            self._writes = ConnectionPool(self._tls)
        try:
            return await self._writes.request(
                method, url, params=params, headers=headers, body=body, timeout=timeout
            )
        except ConnectionFailure as error:
            raise TransportError(str(error), sent=error.sent) from None

    def _tls(self) -> ssl.SSLContext:
        if self._tls_context is None:
            self._tls_context = tls_context(self._ssl)
        return self._tls_context

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
        if self._writes is not None:
            await self._writes.close()
            self._writes = None
