"""What schedext's own HTTP/1.1 paths to the API server share (the watch stream, the kept-alive
writes): where a URL points, a request's head, opening a connection, the TLS context a
``ssl=`` value stands for, and how a failure is described.

A head is refused, before anything is sent, if a header or the URL holds a line break or a
NUL: a token read from a file must not be able to add headers of its own.
"""

from __future__ import annotations

import asyncio
import ssl
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = [
    "ConnectError",
    "HeadError",
    "Origin",
    "connect",
    "describe",
    "offers_http1",
    "request_head",
    "split_url",
    "tls_context",
]


class HeadError(ValueError):
    """The request cannot be sent as asked: an unsupported scheme, a line break in a header."""


class ConnectError(Exception):
    """No connection: refused, unreachable, timed out, TLS refused; nothing was sent."""


@dataclass(frozen=True, slots=True)
class Origin:
    """Where requests go: one kept-alive connection serves one origin."""

    host: str
    port: int
    secure: bool
    netloc: str  # the Host header: the host as written, with its port if one was given


def split_url(url: str) -> tuple[Origin, str]:
    """The origin and the path of ``url``; HeadError for a scheme other than http(s)."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise HeadError(f"cannot send to {parts.scheme}:// URLs")
    secure = parts.scheme == "https"
    port = parts.port or (443 if secure else 80)
    netloc = parts.netloc.rpartition("@")[2]
    return Origin(parts.hostname, port, secure, netloc), parts.path or "/"


def request_head(
    method: str,
    origin: Origin,
    path: str,
    params: Mapping[str, str] | None,
    headers: Mapping[str, str],
    *,
    body_length: int | None = None,
) -> bytes:
    """The request line and headers, ending in the blank line; ``body_length``: the body's
    Content-Length, None for a request without one."""
    target = path + ("?" + urllib.parse.urlencode(params) if params else "")
    fields = [target, origin.netloc, *headers.keys(), *headers.values()]
    if any(ch in field for field in fields for ch in "\r\n\0"):
        raise HeadError("a request header or the URL holds a line break")
    lines = [f"{method} {target} HTTP/1.1", f"Host: {origin.netloc}"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    if body_length is not None:
        lines.append(f"Content-Length: {body_length}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


async def connect(
    protocol: asyncio.Protocol, origin: Origin, tls: ssl.SSLContext | None, timeout: float
) -> None:
    """Open ``protocol``'s connection to ``origin`` within ``timeout`` (TLS with ``tls``, or
    the default context, for https), or ConnectError."""
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout(timeout):
            await loop.create_connection(
                lambda: protocol,
                origin.host,
                origin.port,
                ssl=(tls or ssl.create_default_context()) if origin.secure else None,
                server_hostname=origin.host if origin.secure else None,
            )
    except TimeoutError:
        raise ConnectError(f"not connected within {timeout:g}s") from None
    except OSError as error:  # refused, unreachable, TLS refused (ssl.SSLError is an OSError)
        raise ConnectError(describe(error)) from None


def offers_http1(transport: asyncio.BaseTransport) -> bool:
    """Whether the server speaks HTTP/1.1 here: over TLS, ALPN chose nothing else (neither
    path offers HTTP/2, so another choice is a broken server)."""
    tls = transport.get_extra_info("ssl_object")
    return tls is None or tls.selected_alpn_protocol() in (None, "http/1.1")


def tls_context(value: ssl.SSLContext | bool) -> ssl.SSLContext:
    """The context aiohttp's ``ssl=`` value stands for: the one given, the default (True), or
    one that verifies nothing (False: a kubeconfig's insecure-skip-tls-verify)."""
    if isinstance(value, ssl.SSLContext):
        return value
    context = ssl.create_default_context()
    if not value:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context


def describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
