"""Run the real app under uvicorn on a free loopback port, in a thread, for API tests."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import httpx
import uvicorn
from fastapi import FastAPI

from app.verb_protocol import VerbProtocol


@dataclass
class RunningServer:
    app: FastAPI
    url: str
    port: int

    def client(self, **kwargs: object) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=10.0, **kwargs)  # type: ignore[arg-type]


@contextmanager
def running(app: FastAPI) -> Iterator[RunningServer]:
    # IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on sockets whose proto says TCP, and
    # without it every response waits out a delayed ACK (about 40 ms a request).
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(
        app, log_config=None, access_log=False, http=VerbProtocol, loop="asyncio", lifespan="on"
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("uvicorn did not start within 10 s")
        time.sleep(0.01)
    try:
        yield RunningServer(app=app, url=f"http://127.0.0.1:{port}", port=port)
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()
