"""uvicorn's server, telling the service the moment a stop begins.

uvicorn handles SIGTERM by closing its listeners and waiting for the requests in flight,
then runs the application's shutdown (where the lease is released). A bind waiting at a
gang's barrier is such a request: it would keep the lease, with no replica answering the
verbs, for up to ``gang.max_wait_s`` (17.9 s measured in the soak). So the service hears of
the signal first (:meth:`~app.service.assembly.Service.begin_stop`) and ends those waits at
once.
"""

from __future__ import annotations

import asyncio
from types import FrameType

import uvicorn

from app.service.assembly import Service

__all__ = ["StoppingServer"]


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
