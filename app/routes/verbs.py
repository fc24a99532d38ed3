"""The four extender verbs. Each decodes, calls one method of the core (bind: the bind
workflow of :mod:`app.bind_workflow`, which holds the gang wait and the Binding), and encodes.

They are served by :class:`VerbEndpoints`, a bare ASGI layer in front of FastAPI: kube-scheduler
calls filter and prioritize serially for every pod, and FastAPI's routing, request objects
and middleware would add a fifth of a millisecond to each call for nothing the verbs use. The
OpenAPI document still describes them (``app/openapi.py``); every other path goes on to
FastAPI.

Errors never surface as FastAPI's 422/500 pages: filter and bind answer HTTP 200 with the
protocol's ``Error`` field (what kube-scheduler reads), prioritize and preempt a 4xx/5xx
status with ``{"Error": ...}``. Unexpected failures are logged in one line, without a
traceback, and answered the same way; the service keeps serving.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from time import perf_counter
from typing import Any

import orjson

from app import bind_workflow, wire
from app.errors import RequestRejectedError
from app.service import Service
from extender.model import FilterVerdict

__all__ = ["BODY_READ", "READ", "VERBS", "VerbEndpoints"]

log = logging.getLogger("schedext.verbs")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
Handler = Callable[[Service, bytes], Awaitable[tuple[bytes, str]]]

_HEADERS = [(b"content-type", b"application/json")]

# Scope keys set by the HTTP protocol (app.verb_protocol): the perf_counter times at which the
# event loop read the request's first bytes and its last body byte. Absent under another
# server; the stages are then not measured.
READ = "schedext.read"
BODY_READ = "schedext.body_read"


@dataclass(frozen=True, slots=True)
class _Verb:
    name: str
    handle: Handler
    error_payload: Callable[[str], bytes]
    # The verb's result type has an ``Error`` field: failures answer 200 with it.
    error_in_body: bool
    measured: bool = True  # counted in the verbs' metrics (the benchmark floor is not)


async def _answer(
    service: Service, verb: _Verb, scope: Scope, receive: Receive
) -> tuple[int, bytes, float]:
    """Run the verb on the body and time it; turn every failure into a protocol answer. Also
    returns when the handler started, the body read."""
    started = handling = perf_counter()
    status = 200
    try:
        body = await service.read_body(scope, receive)
        handling = perf_counter()
        service.require_ready()
        payload, outcome = await verb.handle(service, body)
    except RequestRejectedError as error:
        payload, outcome = verb.error_payload(str(error)), "rejected"
        status = 200 if verb.error_in_body else error.status
    except Exception as error:  # noqa: BLE001 - kube-scheduler must get an answer, not a trace
        log.error(
            "%s failed",
            verb.name,
            extra={"verb": verb.name, "error": f"{type(error).__name__}: {error}"},
        )
        message = f"schedext internal error in {verb.name} ({type(error).__name__}); see its logs"
        payload, outcome = verb.error_payload(message), "error"
        status = 200 if verb.error_in_body else 500
    if verb.measured:
        service.metrics.observe(verb.name, outcome, perf_counter() - started)
    return status, payload, handling


async def _filter(service: Service, body: bytes) -> tuple[bytes, str]:
    args = wire.extender_args(body)
    service.metrics.mode("filter", names_only=args.nodes is None)
    await service.victims.wait(service.scheduler, args.pod, args.node_names)
    verdict = service.scheduler.filter(args.pod, args.node_names)
    busy = sum(len(r.nodes) for r in verdict.rejections if r.resolvable)
    unresolvable = sum(len(r.nodes) for r in verdict.rejections if not r.resolvable)
    service.metrics.filtered(fits=len(verdict.passed), busy=busy, unresolvable=unresolvable)
    for rejection in verdict.rejections:
        service.metrics.rejected(rejection.reason.name.lower(), len(rejection.nodes))
    _log_filter(args, verdict)
    return wire.filter_result(verdict, args), "feasible" if verdict.passed else "infeasible"


def _log_filter(args: wire.ExtenderArgs, verdict: FilterVerdict) -> None:
    """One line per call, with counts only (filter is on the scheduling path): a pod that fits
    nowhere at info, one that fits somewhere at debug."""
    level = logging.DEBUG if verdict.passed else logging.INFO
    if not log.isEnabledFor(level):
        return
    rejected: dict[str, int] = {}
    for rejection in verdict.rejections:
        reason = rejection.reason.name.lower()
        rejected[reason] = rejected.get(reason, 0) + len(rejection.nodes)
    meta = args.pod.get("metadata") or {}
    log.log(
        level,
        "filtered",
        extra={
            "pod": f"{meta.get('namespace', '')}/{meta.get('name', '')}",
            "decision": "feasible" if verdict.passed else "infeasible",
            "feasible": len(verdict.passed),
            "rejected": rejected,
        },
    )


async def _prioritize(service: Service, body: bytes) -> tuple[bytes, str]:
    args = wire.extender_args(body)
    service.metrics.mode("prioritize", names_only=args.nodes is None)
    scores = service.scheduler.prioritize(args.pod, args.node_names)
    return wire.host_priorities(args.node_names, scores), "scored"


async def _preempt(service: Service, body: bytes) -> tuple[bytes, str]:
    args = wire.preemption_args(body)
    chosen = service.scheduler.preempt(
        args.pod,
        {node: entry.victims for node, entry in args.candidates.items()},
        now=service.clock(),
    )
    return wire.preemption_result(args, chosen), "candidates" if chosen else "no_candidates"


async def _bind(service: Service, body: bytes) -> tuple[bytes, str]:
    args = wire.binding_args(body)
    outcome = await bind_workflow.bind_pod(
        service, uid=args.uid, namespace=args.namespace, name=args.name, node=args.node
    )
    return wire.binding_result(outcome.error), outcome.label


async def _constant(_service: Service, _body: bytes) -> tuple[bytes, str]:
    """The latency floor for benchmarks: same server, same path, same body read, no decision."""
    return _CONSTANT_FILTER_ANSWER, "constant"


_CONSTANT_FILTER_ANSWER = orjson.dumps(
    {
        "Nodes": None,
        "NodeNames": [],
        "FailedNodes": {},
        "FailedAndUnresolvableNodes": {},
        "Error": "",
    }
)

VERBS = {
    "filter": _Verb("filter", _filter, wire.filter_error, error_in_body=True),
    "prioritize": _Verb("prioritize", _prioritize, wire.error_body, error_in_body=False),
    "preempt": _Verb("preempt", _preempt, wire.error_body, error_in_body=False),
    "bind": _Verb("bind", _bind, wire.binding_result, error_in_body=True),
}
_BENCH = {
    "/bench/constant": _Verb(
        "constant", _constant, wire.filter_error, error_in_body=True, measured=False
    )
}


class VerbEndpoints:
    """``POST /<verb>`` (and ``<prefix>/<verb>``) answered here; everything else goes on to
    ``app``."""

    def __init__(
        self, app: ASGIApp, service: Service, *, prefix: str = "", bench: bool = False
    ) -> None:
        self._app = app
        self._service = service
        self._routes = {f"/{name}": verb for name, verb in VERBS.items()}
        if prefix:
            self._routes |= {f"{prefix}/{name}": verb for name, verb in VERBS.items()}
        if bench:
            self._routes |= _BENCH

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        verb = self._routes.get(scope["path"]) if scope["type"] == "http" else None
        if verb is None:
            await self._app(scope, receive, send)
            return
        headers = list(_HEADERS)
        handling = None
        if scope["method"] == "POST":
            status, payload, handling = await _answer(self._service, verb, scope, receive)
        else:
            status, payload = 405, wire.error_body(f"{scope['method']} not allowed: use POST")
            headers.append((b"allow", b"POST"))
        headers.append((b"content-length", str(len(payload)).encode()))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": payload})
        read = scope.get(READ)
        if handling is not None and read is not None and verb.measured:
            self._service.metrics.stages(
                verb.name,
                read=read,
                # absent where the answer came before the whole body (too large, too slow)
                body_read=scope.get(BODY_READ, handling),
                handling=handling,
                written=perf_counter(),
            )
