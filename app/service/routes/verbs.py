"""The four extender verbs. Each decodes, calls one method of the core (bind: the bind
workflow of :mod:`app.service.bind_workflow`, which holds the gang wait and the Binding), and
encodes.

They are served by :class:`VerbEndpoints`, a bare ASGI layer in front of FastAPI: kube-scheduler
calls filter and prioritize serially for every pod, and FastAPI's routing, request objects
and middleware would add a fifth of a millisecond to each call for nothing the verbs use. The
OpenAPI document still describes them (``app/service/openapi.py``); every other path goes on to
FastAPI. Filter and prioritize (and the benchmark's constant answer) have a synchronous
handler too (``_Verb.handle_now``): schedext's HTTP protocol (:mod:`app.service.verb_protocol`)
answers them with it inside its parser's callback once the body is in, without an ASGI task,
and hands them here only when that handler cannot answer at once (filter waiting for
victims) or the request is unusual (see there).

prioritize has two answers (:data:`_FORMS`): the compact one kube-scheduler gets by default
(the hosts above the lowest score, lowered by it: :func:`app.service.wire.host_priorities`) and the
full one (every host, its absolute score: :func:`app.service.wire.host_scores`), chosen by the query
parameter ``full`` (:func:`with_query`) or, for a request without it, by
``server.prioritize_full``. Other query parameters are ignored.

Errors never surface as FastAPI's 422/500 pages: filter and bind answer HTTP 200 with the
protocol's ``Error`` field (what kube-scheduler reads), prioritize and preempt a 4xx/5xx
status with ``{"Error": ...}``. Unexpected failures are logged in one line, without a
traceback, and answered the same way; the service keeps serving.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from dataclasses import dataclass
from time import perf_counter
from typing import Any
from urllib.parse import parse_qsl

import orjson

from app.service import bind_workflow, wire
from app.service.assembly import Service
from app.service.errors import EncodingError, InvalidPodError, RequestRejectedError
from extender.model import FilterVerdict
from extender.requests import PodRequestError
from extender.scoring import ScoreArray

__all__ = [
    "BODY_READ",
    "PLANNED",
    "READ",
    "VERBS",
    "Verb",
    "VerbEndpoints",
    "answer_now",
    "queried_routes",
    "refuse",
    "routes",
    "timing_headers",
    "with_query",
]

log = logging.getLogger("schedext.verbs")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
Handler = Callable[[Service, bytes], Awaitable[tuple[bytes, str]]]
# Answers at once, or None where it cannot (it would have to wait): the async handler then.
HandlerNow = Callable[[Service, bytes], tuple[bytes, str] | None]

_HEADERS = [(b"content-type", b"application/json")]

# Scope keys set by the HTTP protocol (app.service.verb_protocol): the perf_counter times at
# which the event loop read the request's first bytes and its last body byte. Absent under
# another server; the stages are then not measured.
READ = "schedext.read"
BODY_READ = "schedext.body_read"
# Set by the protocol on a bind whose body is in: called once its plan is made (its GPUs
# reserved), so that filters read after it and answered in place do not pass it by.
PLANNED = "schedext.planned"


def timing_headers(read: float) -> list[tuple[bytes, bytes]]:
    """With the benchmark endpoints, every verb's answer says when its request was first read
    and when the answer was handed to the socket (``perf_counter``, the system's monotonic
    clock on Linux): with its own send and receive times, a benchmark on the same machine
    tells the wait before the event loop read the request from the time after the answer."""
    return [
        (b"x-schedext-read", repr(read).encode()),
        (b"x-schedext-answered", repr(perf_counter()).encode()),
    ]


@dataclass(frozen=True, slots=True)
class _Verb:
    name: str
    handle: Handler
    error_payload: Callable[[str], bytes]
    # The verb's result type has an ``Error`` field: failures answer 200 with it.
    error_in_body: bool
    measured: bool = True  # counted in the verbs' metrics (the benchmark floor is not)
    handle_now: HandlerNow | None = None  # a verb with no await on its way answers in place
    # Reserves what the filters after it must see (bind): they are not answered ahead of it.
    reserves: bool = False


Verb = _Verb  # for the HTTP protocol, which answers some verbs itself


def routes(
    prefix: str = "", *, bench: bool = False, prioritize_full: bool = False
) -> dict[str, _Verb]:
    """The verbs by path: ``/<verb>``, also ``<prefix>/<verb>``, and with ``bench`` the
    benchmark's constant answer; with ``prioritize_full``, prioritize's full answer unless
    the query asks otherwise (``server.prioritize_full``)."""
    verbs = dict(VERBS)
    if prioritize_full:
        verbs["prioritize"] = _FORMS["prioritize"][True]
    found = {f"/{name}": verb for name, verb in verbs.items()}
    if prefix:
        found |= {f"{prefix}/{name}": verb for name, verb in verbs.items()}
    if bench:
        found |= _BENCH
    return found


_FULL = {"1": True, "true": True, "": True, "0": False, "false": False}
# The spellings of ``full`` answered in place too (app.service.verb_protocol): any other query
# string goes the ASGI path, which reads it with the same function.
_QUERIES = ("full=1", "full=0", "full=true", "full=false", "full")


def queried_routes(found: Mapping[str, _Verb]) -> dict[str, _Verb]:
    """``found``'s paths of verbs that take a query string, with it in its usual spellings
    (``/prioritize?full=1``...), each to the answer :func:`with_query` chooses for it."""
    return {
        f"{path}?{query}": with_query(verb, query.encode())
        for path, verb in found.items()
        if verb.name in _FORMS
        for query in _QUERIES
    }


def with_query(verb: _Verb, query: bytes) -> _Verb:
    """The verb's answer that ``query`` (the URL's query string) asks for: ``full`` (``1``,
    ``true`` or bare) or ``full=0`` (``false``) picks prioritize's full or compact answer;
    other parameters, and ``full`` on the other verbs, are ignored. A ``full`` of another
    value raises :class:`~app.service.wire.WireError`."""
    forms = _FORMS.get(verb.name)
    if forms is None or not query:
        return verb
    for key, value in parse_qsl(query.decode("latin-1"), keep_blank_values=True):
        if key == "full":
            full = _FULL.get(value.lower())
            if full is None:
                raise wire.WireError(
                    f"query parameter full must be 1 or 0 (or true or false), not {value!r:.40}"
                )
            verb = forms[full]
    return verb


async def _answer(
    service: Service,
    verb: _Verb,
    scope: Scope,
    receive: Receive,
    refused: RequestRejectedError | None = None,
) -> tuple[int, bytes, float]:
    """Run the verb on the body and time it; turn every failure into a protocol answer. Also
    returns when the handler started, the body read. ``refused``: the request is refused
    for it once its body is read (a query string the verb does not take)."""
    started = handling = perf_counter()
    try:
        try:
            body = await service.read_body(scope, receive)
        finally:
            # Nothing awaits from here to the bind's plan: it is as good as made.
            planned = scope.pop(PLANNED, None)
            if planned is not None:
                planned()
        handling = perf_counter()
        if refused is not None:
            raise refused
        service.require_ready()
        payload, outcome = await verb.handle(service, body)
        status = 200
    except Exception as error:  # noqa: BLE001 - kube-scheduler must get an answer, not a trace
        status, payload, outcome = _failure(verb, error)
    if verb.measured:
        service.metrics.observe(verb.name, outcome, perf_counter() - started)
    return status, payload, handling


def answer_now(service: Service, verb: _Verb, body: bytes) -> tuple[int, bytes] | None:
    """:func:`_answer` for a body already read, with the verb's synchronous handler: the
    status and the answer, or None where the verb must wait (then nothing was counted)."""
    assert verb.handle_now is not None
    started = perf_counter()
    try:
        service.require_ready()
        answered = verb.handle_now(service, body)
        if answered is None:
            return None
        payload, outcome = answered
        status = 200
    except Exception as error:  # noqa: BLE001 - kube-scheduler must get an answer, not a trace
        status, payload, outcome = _failure(verb, error)
    if verb.measured:
        service.metrics.observe(verb.name, outcome, perf_counter() - started)
    return status, payload


def refuse(
    service: Service, verb: _Verb, error: RequestRejectedError, *, started: float
) -> tuple[int, bytes]:
    """A request refused before its body was in (too slow, the client gone), answered and
    counted as :func:`_answer` does; ``started``: when its body began to be read."""
    status, payload, outcome = _failure(verb, error)
    if verb.measured:
        service.metrics.observe(verb.name, outcome, perf_counter() - started)
    return status, payload


def _failure(verb: _Verb, error: Exception) -> tuple[int, bytes, str]:
    """A failure as the verb's protocol answers it: status, answer and metrics outcome. A
    refused request as such; anything else logged in one line, without a traceback."""
    if isinstance(error, RequestRejectedError):
        status = 200 if verb.error_in_body else error.status
        return status, verb.error_payload(str(error)), "rejected"
    log.error(
        "%s failed",
        verb.name,
        extra={"verb": verb.name, "error": f"{type(error).__name__}: {error}"},
    )
    message = f"schedext internal error in {verb.name} ({type(error).__name__}); see its logs"
    return 200 if verb.error_in_body else 500, verb.error_payload(message), "error"


async def _filter(service: Service, body: bytes) -> tuple[bytes, str]:
    args = wire.extender_args(body)
    service.metrics.mode("filter", names_only=args.nodes is None)
    await service.victims.wait(service.scheduler, args.pod, args.node_names)
    return _filter_verdict(service, args)


def _filter_now(service: Service, body: bytes) -> tuple[bytes, str] | None:
    args = wire.extender_args(body)
    if service.victims.needed(service.scheduler, args.pod, args.node_names):
        return None  # the async handler waits for them
    service.metrics.mode("filter", names_only=args.nodes is None)
    return _filter_verdict(service, args)


def _filter_verdict(service: Service, args: wire.ExtenderArgs) -> tuple[bytes, str]:
    verdict = service.scheduler.filter(args.pod, args.node_names)
    busy = sum(len(r.nodes) for r in verdict.rejections if r.resolvable)
    unresolvable = sum(len(r.nodes) for r in verdict.rejections if not r.resolvable)
    service.metrics.filtered(fits=verdict.feasible, busy=busy, unresolvable=unresolvable)
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
            "feasible": verdict.feasible,
            "rejected": rejected,
        },
    )


async def _prioritize(service: Service, body: bytes) -> tuple[bytes, str]:
    return _prioritize_now(service, body)


def _prioritize_now(service: Service, body: bytes) -> tuple[bytes, str]:
    args, scores = _scores(service, body)
    return wire.host_priorities(args.node_names, scores), "scored"


async def _prioritize_full(service: Service, body: bytes) -> tuple[bytes, str]:
    return _prioritize_full_now(service, body)


def _prioritize_full_now(service: Service, body: bytes) -> tuple[bytes, str]:
    args, scores = _scores(service, body)
    return wire.host_scores(args.node_names, scores), "scored"


def _scores(service: Service, body: bytes) -> tuple[wire.ExtenderArgs, ScoreArray]:
    args = wire.extender_args(body)
    service.metrics.mode("prioritize", names_only=args.nodes is None)
    try:
        return args, service.scheduler.prioritize(args.pod, args.node_names)
    except PodRequestError as error:
        raise InvalidPodError(error.reason) from None


async def _preempt(service: Service, body: bytes) -> tuple[bytes, str]:
    args = wire.preemption_args(body)
    try:
        chosen = service.scheduler.preempt(
            args.pod,
            {node: entry.victims for node, entry in args.candidates.items()},
            now=service.clock(),
        )
    except PodRequestError as error:
        raise InvalidPodError(error.reason) from None
    for node, victims in chosen.items():
        if victims.frees:  # GPUs DRA's claims (or containers) of the victims hold: say which
            log.info(
                "preempt frees GPUs held outside schedext",
                extra={"node": node, "gpus": victims.frees},
            )
    return wire.preemption_result(args, chosen), "candidates" if chosen else "no_candidates"


async def _bind(service: Service, body: bytes) -> tuple[bytes, str]:
    args = wire.binding_args(body)
    outcome = await bind_workflow.bind_pod(
        service, uid=args.uid, namespace=args.namespace, name=args.name, node=args.node
    )
    return wire.binding_result(outcome.error), outcome.label


async def _constant(service: Service, body: bytes) -> tuple[bytes, str]:
    return _constant_now(service, body)


def _constant_now(_service: Service, _body: bytes) -> tuple[bytes, str]:
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

# Preempt and bind make API calls (bind) or may (preempt, in time): the ASGI path alone.
VERBS = {
    "filter": _Verb(
        "filter", _filter, wire.filter_error, error_in_body=True, handle_now=_filter_now
    ),
    "prioritize": _Verb(
        "prioritize",
        _prioritize,
        wire.error_body,
        error_in_body=False,
        handle_now=_prioritize_now,
    ),
    "preempt": _Verb("preempt", _preempt, wire.error_body, error_in_body=False),
    "bind": _Verb("bind", _bind, wire.binding_result, error_in_body=True, reserves=True),
}
# By verb name, its answers by ``full`` (see with_query): prioritize's compact and full ones.
_FORMS = {
    "prioritize": {
        False: VERBS["prioritize"],
        True: _Verb(
            "prioritize",
            _prioritize_full,
            wire.error_body,
            error_in_body=False,
            handle_now=_prioritize_full_now,
        ),
    }
}
_BENCH = {
    "/bench/constant": _Verb(
        "constant",
        _constant,
        wire.filter_error,
        error_in_body=True,
        measured=False,
        handle_now=_constant_now,
    )
}


def _encoding_refused(scope: Scope) -> EncodingError | None:
    """A request whose body comes with a Content-Encoding other than identity (gzip...):
    refused, 415 (filter and bind: in the Error field), rather than read as bytes."""
    for name, value in scope["headers"]:
        if name == b"content-encoding" and value.lower() != b"identity":
            encoding = value.decode("latin-1")[:40]
            return EncodingError(
                f"Content-Encoding {encoding} is not supported: send the body as plain JSON"
            )
    return None


class VerbEndpoints:
    """``POST /<verb>`` (and ``<prefix>/<verb>``) answered here; everything else goes on to
    ``app``."""

    def __init__(
        self, app: ASGIApp, service: Service, *, prefix: str = "", bench: bool = False
    ) -> None:
        self._app = app
        self._service = service
        full = service.settings.server.prioritize_full
        self._routes = routes(prefix, bench=bench, prioritize_full=full)
        self._bench = bench

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        verb = self._routes.get(scope["path"]) if scope["type"] == "http" else None
        if verb is None:
            await self._app(scope, receive, send)
            return
        headers = list(_HEADERS)
        handling = None
        if scope["method"] == "POST":
            refused: RequestRejectedError | None = _encoding_refused(scope)
            query = scope.get("query_string")
            if query:
                try:
                    verb = with_query(verb, query)
                except wire.WireError as error:
                    refused = refused or error
            status, payload, handling = await _answer(self._service, verb, scope, receive, refused)
        else:
            status, payload = 405, wire.error_body(f"{scope['method']} not allowed: use POST")
            headers.append((b"allow", b"POST"))
        headers.append((b"content-length", str(len(payload)).encode()))
        read = scope.get(READ)
        if self._bench and read is not None:
            headers += timing_headers(read)
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": payload})
        if handling is not None and read is not None and verb.measured:
            self._service.metrics.stages(
                verb.name,
                read=read,
                # absent where the answer came before the whole body (too large, too slow)
                body_read=scope.get(BODY_READ, handling),
                handling=handling,
                written=perf_counter(),
            )
