"""``GET /explain/{namespace}/{pod}``: per node, whether the pod fits and why not, and the
score schedext gives each node it fits.

:func:`answer` is also what the read-only views port serves (app.service.views_listener)."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import orjson
from fastapi import APIRouter, Request, Response

from app.service.assembly import Service
from extender.model import QuotaHold, Reason

__all__ = ["answer", "router"]

router = APIRouter()


# What the path must name: a namespace (a DNS label), a pod name (a DNS subdomain).
NAMESPACE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
POD = re.compile(r"[a-z0-9]([-.a-z0-9]{0,251}[a-z0-9])?")
NOT_A_POD = "not a pod: give /explain/NAMESPACE/NAME, Kubernetes names"


@router.get("/explain/{namespace}/{name}")
async def explain(request: Request, namespace: str, name: str) -> Response:
    service: Service = request.app.state.service
    if not NAMESPACE.fullmatch(namespace) or not POD.fullmatch(name):
        return _json(400, {"Error": NOT_A_POD})
    status, body = answer(service, namespace, name)
    return _json(status, body)


@router.get("/explain", include_in_schema=False)
@router.get("/explain/{rest:path}", include_in_schema=False)
async def not_a_pod() -> Response:
    """``/explain/a/b/c``, ``/explain/a``: not fastapi's "Not Found", but what to give."""
    return _json(400, {"Error": NOT_A_POD})


def _json(status: int, body: dict[str, Any]) -> Response:
    return Response(orjson.dumps(body), status_code=status, media_type="application/json")


def answer(service: Service, namespace: str, name: str) -> tuple[int, dict[str, Any]]:
    """The status and body of ``GET /explain/{namespace}/{name}``: 404 for a pod schedext
    does not know, 503 before the inventory is synced (every pod would be unknown then)."""
    unsynced = service.not_synced()
    if unsynced:
        return 503, {"Error": f"{unsynced}: cannot explain pod {namespace}/{name} yet"}
    explanation = service.scheduler.explain(namespace, name)
    if explanation is None:
        error = f"pod {namespace}/{name} is unknown to schedext: not pending here, not bound"
        return 404, {"Error": error}
    body: dict[str, Any] = {
        "pod": explanation.pod,
        "uid": explanation.uid,
        "state": explanation.state,
        "node": explanation.node,
        "request": dict(explanation.request),
        "group": dataclasses.asdict(explanation.group) if explanation.group else None,
        "groupReason": explanation.group_reason or None,
        # A gang member's: the GPUs held for its group, in words, or why it has none.
        "groupHold": explanation.group_hold or None,
        # The team quota that holds the pod back (the nodes still say where it would go).
        "quota": _quota(explanation.quota),
        "fits": [n.node for n in explanation.nodes if n.fits],
        # score: prioritize's 0-10 for a node the pod fits, absolute (prioritize's compact
        # answer lowers every score by the lowest; POST /prioritize?full=1 gives these).
        "nodes": [
            {
                "node": n.node,
                "fits": n.fits,
                "reason": n.reason or None,
                "resolvable": n.resolvable,
                "score": n.score,
                # Where the node's kubelet disagrees with schedext (its agent's drift).
                "drift": list(n.drift),
                # What DRA says of the node: its owner (when not the device plugin alone),
                # and which claims hold which of its devices.
                "dra": list(n.dra),
            }
            for n in explanation.nodes
        ],
    }
    return 200, body


def _quota(hold: QuotaHold | None) -> dict[str, str] | None:
    if hold is None:
        return None
    return {
        "quota": hold.quota,
        "resource": hold.resource,
        "rule": "max" if hold.reason is Reason.QUOTA_MAX else "borrowing",
        "overBy": hold.over_by,
        "message": hold.message,
    }
