"""How KubeApi's requests reach the API server: aiohttp's client, used directly, and for
watches a lean stream of lines (app/kube/watch_stream.py says why).

Every scheduled pod costs schedext one Binding POST and two pod watch events, so this path is
per pod. Through httpx's ``AsyncClient`` (even over an aiohttp transport) a POST cost about
500 µs of CPU, against 180 µs for aiohttp alone (``python -m loadtests.apiclient``): URL
merging, cookie extraction, redirect and auth flows and the response model, none of which
talking to one API server needs. ``Transport`` is the seam: KubeApi maps statuses and errors
and decodes JSON; a transport only moves bytes (tests pass one that answers in-process).
"""

from __future__ import annotations

import ssl
from collections.abc import Callable, Mapping
from typing import Protocol

import aiohttp

from app.kube.watch_stream import StreamError, watch_lines

__all__ = ["AiohttpTransport", "Transport", "TransportError"]

# Kept-alive connections to the API server are closed after this long idle (httpx's default,
# which schedext used before): the server's own idle limit is longer.
KEEPALIVE_S = 5.0


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


class AiohttpTransport:
    def __init__(self, ssl_context: ssl.SSLContext | bool) -> None:
        self._ssl = ssl_context
        self._session: aiohttp.ClientSession | None = None
        self._watch_tls: ssl.SSLContext | None = None

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
            raise TransportError(_describe(error), sent=False) from None
        except (aiohttp.ClientError, OSError) as error:
            raise TransportError(_describe(error)) from None

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

    def _tls(self) -> ssl.SSLContext:
        """The context aiohttp's ``ssl=`` value stands for: the one given, the default
        (True), or one that verifies nothing (False: a kubeconfig's insecure-skip-tls-verify)."""
        if isinstance(self._ssl, ssl.SSLContext):
            return self._ssl
        if self._watch_tls is None:
            self._watch_tls = ssl.create_default_context()
            if not self._ssl:
                self._watch_tls.check_hostname = False
                self._watch_tls.verify_mode = ssl.CERT_NONE
        return self._watch_tls

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


def _describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
