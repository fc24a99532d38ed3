"""Run the real app under uvicorn on a free loopback port, in a thread, for API tests."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx
import uvicorn
from fastapi import FastAPI
from starlette.types import Receive, Scope, Send

from app.service.verb_protocol import protocol_for


@dataclass
class RunningServer:
    app: FastAPI
    url: str
    port: int
    # HTTP requests that reached the ASGI app: those the protocol did not answer in place.
    asgi: list[str] = field(default_factory=list)

    def client(self, **kwargs: object) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=10.0, **kwargs)  # type: ignore[arg-type]


class _Counted:
    """The app as uvicorn calls it, noting the path of every HTTP request it is given."""

    def __init__(self, app: FastAPI, seen: list[str]) -> None:
        self._app, self._seen = app, seen

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            self._seen.append(scope["path"])
        await self._app(scope, receive, send)


@contextmanager
def running(app: FastAPI, **uvicorn_config: Any) -> Iterator[RunningServer]:
    """``uvicorn_config``: more of uvicorn's Config (TLS: ``ServerSettings.uvicorn_tls()``).
    schedext's app is served by its own protocol, as `schedext serve` serves it; an app
    without a service (a page's test double) by uvicorn's."""
    service = getattr(app.state, "service", None)
    protocol = protocol_for(service) if service is not None else "httptools"
    # IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on sockets whose proto says TCP, and
    # without it every response waits out a delayed ACK (about 40 ms a request).
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    asgi: list[str] = []
    config = uvicorn.Config(
        _Counted(app, asgi),
        **{
            "log_config": None,
            "access_log": False,
            "http": protocol,
            "loop": "asyncio",
            "lifespan": "on",
            **uvicorn_config,
        },
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("uvicorn did not start within 10 s")
        time.sleep(0.01)
    scheme = "https" if "ssl_certfile" in uvicorn_config else "http"
    try:
        yield RunningServer(app=app, url=f"{scheme}://127.0.0.1:{port}", port=port, asgi=asgi)
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()
