"""``--metrics-port``: a second, plain-HTTP listener on every address that serves only
``GET /metrics`` and ``GET /healthz``, for Prometheus to scrape (see app.service.plain_listener for
what every such listener refuses)."""

from __future__ import annotations

from collections.abc import Callable

from app.service.metrics import CONTENT_TYPE
from app.service.plain_listener import HEAD_LIMIT, Answer, PlainListener

__all__ = ["MetricsListener"]


class MetricsListener(PlainListener):
    kind = "metrics"
    paths = ("/metrics", "/healthz")

    def __init__(
        self,
        render: Callable[[], bytes],
        *,
        port: int,
        host: str | None = None,
        max_header_bytes: int = HEAD_LIMIT,
    ) -> None:
        super().__init__(port=port, host=host, max_header_bytes=max_header_bytes)
        self._render = render

    def route(self, path: bytes) -> Callable[[], Answer] | None:
        if path == b"/healthz":
            return lambda: (200, b"ok", "text/plain")
        if path == b"/metrics":
            return lambda: (200, self._render(), CONTENT_TYPE)
        return None
