"""schedext's HTTP protocol: uvicorn's httptools protocol, with the times the verbs' stages
are measured from.

uvicorn takes a protocol class (``Config(http=...)``); this one stamps each request's scope
with when the event loop read its first bytes and its last body byte
(:data:`app.routes.verbs.READ`, :data:`~app.routes.verbs.BODY_READ`), so that the verbs can
tell how long a request waited before its handler ran
(``schedext_request_stage_seconds``). Time a request spends in the socket before the event
loop gets to read it is not seen here: only a client's round trip shows it
(``loadtests.bench --load``).
"""

from __future__ import annotations

from time import perf_counter
from typing import Any, cast

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from app.routes.verbs import BODY_READ, READ

__all__ = ["VerbProtocol"]


class VerbProtocol(HttpToolsProtocol):
    _read_at = 0.0  # when data_received was last called

    def data_received(self, data: bytes) -> None:
        self._read_at = perf_counter()
        super().data_received(data)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        cast(dict[str, Any], self.scope)[READ] = self._read_at

    def on_message_complete(self) -> None:
        cast(dict[str, Any], self.scope)[BODY_READ] = self._read_at
        super().on_message_complete()
