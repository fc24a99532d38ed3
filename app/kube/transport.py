"""How KubeApi's requests reach the API server: aiohttp's client, used directly.

Every scheduled pod costs schedext one Binding POST and two pod watch events, so this path is
per pod. Through httpx's ``AsyncClient`` (even over an aiohttp transport) a POST cost about
500 µs of CPU, against 180 µs for aiohttp alone (``python -m loadtests.apiclient``): URL
merging, cookie extraction, redirect and auth flows and the response model, none of which
talking to one API server needs. ``Transport`` is the seam: KubeApi maps statuses and errors
and decodes JSON; a transport only moves bytes (tests pass one that answers in-process).
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Protocol

import aiohttp

__all__ = ["AiohttpTransport", "Transport", "TransportError"]

# Kept-alive connections to the API server are closed after this long idle (httpx's default,
# which schedext used before): the server's own idle limit is longer.
KEEPALIVE_S = 5.0


class TransportError(Exception):
    """No answer: the connection was refused, cut or timed out, or TLS failed. ``sent``:
    whether the request may have reached the server (False only when no connection was
    made), which decides whether a write may have happened."""

    def __init__(self, message: str, *, sent: bool = True) -> None:
        super().__init__(message)
        self.sent = sent


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

    def stream(
        self,
        url: str,
        *,
        params: Mapping[str, str],
        headers: Mapping[str, str],
        connect_timeout: float,
        read_timeout: float,
    ) -> AbstractAsyncContextManager[tuple[int, AsyncIterator[bytes]]]:
        """A GET whose body is read as it arrives: the status and the body's chunks. Raises
        TransportError, also from the chunks; ``read_timeout`` bounds each wait for data."""

    async def close(self) -> None:
        """Close kept-alive connections; the transport may not be used after."""


class AiohttpTransport:
    def __init__(self, ssl_context: ssl.SSLContext | bool) -> None:
        self._ssl = ssl_context
        self._session: aiohttp.ClientSession | None = None

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

    @asynccontextmanager
    async def stream(
        self,
        url: str,
        *,
        params: Mapping[str, str],
        headers: Mapping[str, str],
        connect_timeout: float,
        read_timeout: float,
    ) -> AsyncIterator[tuple[int, AsyncIterator[bytes]]]:
        # ``connect`` covers taking a pooled connection or opening one, TLS included.
        timeout = aiohttp.ClientTimeout(total=None, connect=connect_timeout, sock_read=read_timeout)
        try:
            response = await self._client().get(
                url, params=params, headers=headers, allow_redirects=False, timeout=timeout
            )
        except TimeoutError:
            raise TransportError(f"not connected within {connect_timeout:g}s") from None
        except (aiohttp.ClientError, OSError) as error:
            raise TransportError(_describe(error)) from None
        try:
            yield response.status, _chunks(response, read_timeout)
        finally:
            response.close()  # a watch is never read to its end: the connection goes too

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


async def _chunks(response: aiohttp.ClientResponse, read_timeout: float) -> AsyncIterator[bytes]:
    try:
        while chunk := await response.content.readany():
            yield chunk
    except TimeoutError:
        raise TransportError(f"nothing received for {read_timeout:g}s") from None
    except (aiohttp.ClientError, OSError) as error:
        raise TransportError(_describe(error)) from None


def _describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
