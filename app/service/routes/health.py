"""Probes, metrics and the small informational endpoints."""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any

import orjson
from fastapi import APIRouter, Request, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from app import __version__
from app.kube.readiness import Readiness
from app.service.assembly import Service
from app.service.metrics import CONTENT_TYPE

__all__ = ["CloseWhenNotReady", "HeadAsGet", "router"]

router = APIRouter()


def _service(request: Request) -> Service:
    service: Service = request.app.state.service
    return service


@router.get("/healthz")
async def healthz() -> Response:
    return Response(b"ok", media_type="text/plain")


@router.get("/readyz")
async def readyz(request: Request) -> Response:
    """Whether this replica answers the verbs: synced and, with leader election, leading.
    ``?verbose`` lists each check, as kube-apiserver's /readyz does."""
    readiness = _service(request).readiness
    status = 200 if readiness.ready else 503
    if "verbose" in request.query_params:
        lines = [
            f"[-]{name} failed: {why}" if why else f"[+]{name} ok"
            for name, why in readiness.checks().items()
        ]
        lines.append("readyz check passed" if readiness.ready else "readyz check failed")
        return Response("\n".join(lines).encode(), status_code=status, media_type="text/plain")
    if readiness.ready:
        return Response(b"ok", media_type="text/plain")
    return Response(
        f"not ready: {readiness.reason}".encode(), status_code=status, media_type="text/plain"
    )


@router.get("/readyz/{check}")
async def readyz_check(request: Request, check: str) -> Response:
    """One check of /readyz alone. ``/readyz/synced`` is the pod's readinessProbe with leader
    election: every replica passes it once its inventory is synced, so a rolling update of
    several replicas completes; the Service reaches the leader by its pod's label instead
    (app.kube.role). ``/readyz/leader``: this replica holds the Lease."""
    checks = _service(request).readiness.checks()
    if check not in checks:
        known = ", ".join(f"/readyz/{name}" for name in checks)
        return Response(
            f"no check {check!r}; the checks are {known}".encode(),
            status_code=404,
            media_type="text/plain",
        )
    why = checks[check]
    if why:
        return Response(f"not ready: {why}".encode(), status_code=503, media_type="text/plain")
    return Response(b"ok", media_type="text/plain")


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    return Response(_service(request).metrics.render(), media_type=CONTENT_TYPE)


@router.get("/")
async def root(request: Request) -> Response:
    service = _service(request)
    prefix = service.settings.server.path_prefix
    body = {
        "service": "schedext",
        "version": __version__,
        "inventory": service.description,
        "ready": service.readiness.ready,
        "verbs": [f"{prefix}/{verb}" for verb in ("filter", "prioritize", "preempt", "bind")],
    }
    return Response(orjson.dumps(body), media_type="application/json")


class CloseWhenNotReady:
    """A replica that may not answer the verbs (a standby, one that lost the Lease, one still
    syncing) closes each connection after its answer. kube-scheduler keeps its connections
    alive, and a Service picks an endpoint only when a connection opens: without this, a
    leader that stepped down while alive would go on being asked, and refusing, over the
    connections opened before. A ready replica pays one attribute lookup per request."""

    def __init__(self, app: ASGIApp, readiness: Readiness) -> None:
        self.app = app
        self.readiness = readiness

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self.readiness.ready:
            await self.app(scope, receive, send)
            return

        async def closing(message: MutableMapping[str, Any]) -> None:
            if message["type"] == "http.response.start":
                headers = [*message.get("headers", ()), (b"connection", b"close")]
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, closing)


class HeadAsGet:
    """``HEAD`` of a ``GET`` route (``/healthz``, ``/readyz``, ``/metrics``, ``/ui``,
    ``/inventory``...) answered as the ``GET``, without its body: the same status and headers,
    its Content-Length included (FastAPI's routes answer HEAD 405). The app sees a ``GET``;
    the server, seeing the request's own ``HEAD``, writes no body, and none is passed on."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "HEAD":
            await self.app(scope, receive, send)
            return

        async def headless(message: MutableMapping[str, Any]) -> None:
            if message["type"] == "http.response.body" and message.get("body"):
                message = {**message, "body": b""}
            await send(message)

        # A copy: the server's own scope keeps the HEAD it answers by.
        await self.app({**scope, "method": "GET"}, receive, headless)
