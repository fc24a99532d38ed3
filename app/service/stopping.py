"""uvicorn's server, telling the service the moment a stop begins.

uvicorn handles SIGTERM by closing its listeners and waiting for the requests in flight,
then runs the application's shutdown (where the lease is released). A bind waiting at a
gang's barrier is such a request: it would keep the lease, with no replica answering the
verbs, for up to ``gang.max_wait_s`` (17.9 s measured in the soak). So the service hears of
the signal first (:meth:`~app.service.assembly.Service.begin_stop`) and ends those waits at
once.

It also says where it listens, once it does: one "listening" line per bound socket, with the
real address (``--port 0`` binds a port the system picks), after the application's startup
and the bind. A port already in use gets uvicorn's one error line, and no "listening" line.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from types import FrameType

import uvicorn

from app.service.assembly import Service

__all__ = ["StoppingServer", "address_url"]

log = logging.getLogger("schedext")


class StoppingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, service: Service) -> None:
        super().__init__(config)
        self._service = service

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        # A signal handler (uvicorn installs it with signal.signal): it may run between any
        # two bytecodes of the loop's own work, so the service hears of it on its next turn.
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        if loop is not None:
            loop.call_soon_threadsafe(self._service.begin_stop)
        super().handle_exit(sig, frame)

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if not self.started or self.should_exit:
            return
        scheme = "https" if self.config.is_ssl else "http"
        for server in self.servers:
            for sock in server.sockets:
                log.info(
                    "listening",
                    extra={
                        "url": address_url(scheme, sock.getsockname()),
                        "inventory": self._service.description,
                    },
                )


def address_url(scheme: str, address: object) -> str:
    """``scheme://host:port`` for a bound socket's address (IPv6 hosts in brackets)."""
    if isinstance(address, tuple) and len(address) >= 2:
        host, port = str(address[0]), int(address[1])
        return f"{scheme}://[{host}]:{port}" if ":" in host else f"{scheme}://{host}:{port}"
    return f"{scheme}://{address}"
