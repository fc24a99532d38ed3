"""KubeApi's transport answered in-process by a handler: an httpx ``Request`` in, an httpx
``Response`` out (sync or async), the shape of ``httpx.MockTransport`` handlers. httpx's
request and response types are only the tests' vocabulary here: what KubeApi sends is turned
into one, and the handler's answer (its status, and its body read or streamed) is what KubeApi
gets. An ``httpx.TransportError`` from the handler, or from its response's stream, is the
transport failing, and so is a request's handler taking longer than its timeout. Each request
carries its timeouts where httpx keeps them, ``request.extensions["timeout"]``. A watch's
body is split into lines as the real stream splits it (app.kube.watch_stream.LineBuffer)."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable, Mapping

import httpx

from app.kube.transport import TransportError
from app.kube.watch_stream import LineBuffer

Handler = Callable[[httpx.Request], httpx.Response | Awaitable[httpx.Response]]


class HandlerTransport:
    def __init__(self, handle: Handler) -> None:
        self._handle = handle

    async def _answer(
        self,
        method: str,
        url: str,
        *,
        params: Mapping[str, str] | None,
        headers: Mapping[str, str],
        body: bytes | None,
        timeout: dict[str, float],
    ) -> httpx.Response:
        request = httpx.Request(method, url, params=params, headers=headers, content=body)
        request.extensions["timeout"] = timeout  # where httpx keeps it, for tests to read
        try:
            answer = self._handle(request)
            return await answer if inspect.isawaitable(answer) else answer
        except httpx.ConnectError as error:  # as aiohttp's connector error: nothing was sent
            raise TransportError(f"{type(error).__name__}: {error}", sent=False) from None
        except httpx.TransportError as error:
            raise TransportError(f"{type(error).__name__}: {error}") from None

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
            async with asyncio.timeout(timeout):  # as the real transport's total limit
                limits = dict.fromkeys(("connect", "read", "write", "pool"), timeout)
                response = await self._answer(
                    method, url, params=params, headers=headers, body=body, timeout=limits
                )
                return response.status_code, await response.aread()
        except httpx.ConnectError as error:  # as aiohttp's connector error: nothing was sent
            raise TransportError(f"{type(error).__name__}: {error}", sent=False) from None
        except httpx.TransportError as error:
            raise TransportError(f"{type(error).__name__}: {error}") from None
        except TimeoutError:
            raise TransportError(f"no answer within {timeout:g}s") from None

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
        # Recorded, not enforced: the tests' watches end by their canned bodies or are cancelled.
        limits = {"connect": connect_timeout, "read": read_timeout}
        response = await self._answer(
            "GET", url, params=params, headers=headers, body=None, timeout=limits
        )
        try:
            if response.status_code >= 300:
                return response.status_code, await response.aread()
            lines = LineBuffer()
            try:
                async for chunk in response.aiter_bytes():
                    for index, line in enumerate(lines.feed(chunk)):
                        if index:
                            await asyncio.sleep(0)  # one line per turn, as the real stream
                        on_line(line)
            except httpx.TransportError as error:
                raise TransportError(f"{type(error).__name__}: {error}", cut=True) from None
            if last := lines.rest():
                on_line(last)
            return response.status_code, b""
        finally:
            await response.aclose()

    async def close(self) -> None:
        return None
