"""A small async API client: JSON in, JSON out, errors mapped by status."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from app.kube import list_pages
from app.kube.config import ClusterConfig
from app.kube.errors import ApiError, ApiTransientError, error_for
from app.kube.transport import NetworkTransport, Transport, TransportError

__all__ = ["Deadline", "KubeApi"]

JSON = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Deadline:
    """One deadline shared by several API calls: each call may take only what is left."""

    at: float
    clock: Callable[[], float] = time.monotonic

    @classmethod
    def after(cls, seconds: float, clock: Callable[[], float] = time.monotonic) -> Deadline:
        return cls(clock() + seconds, clock)

    def left(self) -> float:
        """Seconds left; raises TimeoutError when none are."""
        left = self.at - self.clock()
        if left <= 0:
            raise TimeoutError("deadline passed")
        return left


class KubeApi:
    def __init__(
        self,
        config: ClusterConfig,
        *,
        transport: Transport | None = None,
        timeout: float = 10.0,
    ) -> None:
        """``transport``: tests pass one that answers in-process; by default the network's
        (app/kube/transport.py: aiohttp for reads, schedext's own for writes and watches)."""
        self._config = config
        self._transport = transport or NetworkTransport(config.ssl_context)
        self._timeout = timeout
        self._fixed = {"Accept": "application/json", "User-Agent": "schedext"}

    async def close(self) -> None:
        await self._transport.close()

    def _headers(
        self, content_type: str | None = None, accept: str | None = None
    ) -> dict[str, str]:
        headers = dict(self._fixed)
        if accept is not None:
            headers["Accept"] = accept
        # Read per call: an in-cluster token is rotated under us.
        authorization = self._config.authorization()
        if authorization:
            headers["Authorization"] = authorization
        if content_type is not None:
            headers["Content-Type"] = content_type
        return headers

    # ``timeout``: this call's limit in seconds, instead of the client's default.

    async def get(
        self, path: str, params: Mapping[str, str] | None = None, *, timeout: float | None = None
    ) -> JSON:
        return await self._request("GET", path, params=params, timeout=timeout)

    async def get_bytes(
        self, path: str, params: Mapping[str, str] | None = None, *, accept: str | None = None
    ) -> bytes:
        """The answer's body undecoded, for callers that decode only what they use; ``accept``:
        the media types they read (app/kube/list_pages.py: protobuf first), JSON by default."""
        return await self._send("GET", path, params=params, accept=accept)

    async def get_answer(
        self, path: str, params: Mapping[str, str] | None = None, *, timeout: float | None = None
    ) -> tuple[int, bytes]:
        """The status and body as answered, whatever the status: for what answers behind the
        API server (its service proxy), whose error bodies are not the API server's. Only an
        exchange that fails raises (ApiTransientError)."""
        try:
            return await self._transport.request(
                "GET",
                self._config.server + path,
                params=params,
                headers=self._headers(),
                body=None,
                timeout=self._timeout if timeout is None else timeout,
            )
        except TransportError as error:
            raise ApiTransientError(f"GET {path}: {error}") from None

    async def post(
        self, path: str, body: Mapping[str, Any], *, timeout: float | None = None
    ) -> JSON:
        return await self._request("POST", path, content=orjson.dumps(body), timeout=timeout)

    async def put(
        self, path: str, body: Mapping[str, Any], *, timeout: float | None = None
    ) -> JSON:
        return await self._request("PUT", path, content=orjson.dumps(body), timeout=timeout)

    async def delete(
        self, path: str, body: Mapping[str, Any] | None = None, *, timeout: float | None = None
    ) -> JSON:
        content = orjson.dumps(body) if body is not None else None
        return await self._request("DELETE", path, content=content, timeout=timeout)

    async def merge_patch(
        self, path: str, body: Mapping[str, Any], *, timeout: float | None = None
    ) -> JSON:
        return await self._request(
            "PATCH",
            path,
            content=orjson.dumps(body),
            content_type="application/merge-patch+json",
            timeout=timeout,
        )

    async def _request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        content: bytes | None = None,
        content_type: str = "application/json",
        timeout: float | None = None,
    ) -> JSON:
        body = await self._send(
            method, path, params=params, content=content, content_type=content_type, timeout=timeout
        )
        try:
            document = orjson.loads(body)
        except orjson.JSONDecodeError:
            raise ApiError(f"{method} {path}: answer is not JSON", status=200) from None
        if not isinstance(document, dict):
            raise ApiError(f"{method} {path}: answer is not an object", status=200)
        return document

    async def _send(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        content: bytes | None = None,
        content_type: str = "application/json",
        timeout: float | None = None,
        accept: str | None = None,
    ) -> bytes:
        try:
            status, body = await self._transport.request(
                method,
                self._config.server + path,
                params=params,
                headers=self._headers(content_type if content is not None else None, accept),
                body=content,
                timeout=self._timeout if timeout is None else timeout,
            )
        except TransportError as error:
            raise ApiTransientError(f"{method} {path}: {error}", sent=error.sent) from None
        if status >= 300:
            raise _status_error(method, path, status, body)
        return body

    async def watch_lines(
        self,
        path: str,
        params: Mapping[str, str],
        *,
        read_timeout: float,
        on_line: Callable[[bytes], None],
    ) -> None:
        """A watch: each line of the answer (one JSON event) goes to ``on_line`` as it
        arrives, one per turn of the event loop, so that a verb which arrived meanwhile is
        answered before the next event is applied rather than after a whole burst (a relist
        of every pod on a node, a Job's pods deleted at once). Returns when the API server
        ends the watch; what ``on_line`` raises ends it too, and propagates."""
        try:
            status, body = await self._transport.watch(
                self._config.server + path,
                params=params,
                headers=self._headers(),
                connect_timeout=self._timeout,
                read_timeout=read_timeout,
                on_line=on_line,
            )
        except TransportError as error:
            cut = " cut" if error.cut else ""
            raise ApiTransientError(f"watch {path}{cut}: {error}") from None
        if status >= 300:
            raise _status_error("GET", path, status, body)


def _status_error(method: str, path: str, status: int, body: bytes) -> ApiError:
    message, reason = "", ""
    if (fields := list_pages.status_fields(body)) is not None:  # asked for protobuf first
        message, reason = fields
        return error_for(status, f"{method} {path}: {status} {message}".strip(), reason)
    try:
        document = orjson.loads(body)
        if isinstance(document, dict):
            message = str(document.get("message", ""))
            reason = str(document.get("reason", ""))
    except orjson.JSONDecodeError:
        message = body[:200].decode(errors="replace")
    return error_for(status, f"{method} {path}: {status} {message}".strip(), reason)
