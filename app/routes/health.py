"""Probes, metrics and the small informational endpoints."""

from __future__ import annotations

import orjson
from fastapi import APIRouter, Request, Response

from app import __version__
from app.metrics import CONTENT_TYPE
from app.service import Service

__all__ = ["router"]

router = APIRouter()


def _service(request: Request) -> Service:
    service: Service = request.app.state.service
    return service


@router.get("/healthz")
async def healthz() -> Response:
    return Response(b"ok", media_type="text/plain")


@router.get("/readyz")
async def readyz(request: Request) -> Response:
    readiness = _service(request).readiness
    if readiness.ready:
        return Response(b"ok", media_type="text/plain")
    return Response(
        f"not ready: {readiness.reason}".encode(), status_code=503, media_type="text/plain"
    )


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
