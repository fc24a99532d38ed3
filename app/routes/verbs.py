"""The four extender verbs. Each decodes, calls one method of the core, and encodes.

Errors never surface as FastAPI's 422/500 pages: filter and bind answer HTTP 200 with the
protocol's ``Error`` field (what kube-scheduler reads), prioritize and preempt a 4xx/5xx
status with ``{"Error": ...}``. Unexpected failures are logged in one line, without a
traceback, and answered the same way; the service keeps serving.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from time import perf_counter

from fastapi import APIRouter, Request, Response

from app import openapi, wire
from app.binder import BindError
from app.errors import RequestRejectedError
from app.events import PodEvent
from app.service import Service
from extender.errors import BindRefusedError

__all__ = ["router"]

log = logging.getLogger("schedext.verbs")
router = APIRouter()

JSON = "application/json"
Handler = Callable[[Service, bytes], Awaitable[tuple[bytes, str]]]


def _service(request: Request) -> Service:
    service: Service = request.app.state.service
    return service


async def _answer(
    request: Request,
    verb: str,
    handle: Handler,
    error_payload: Callable[[str], bytes],
    *,
    error_in_body: bool,
) -> Response:
    """Run ``handle`` with the body and time it; turn every failure into a protocol answer.
    ``error_in_body``: the verb's result type has an ``Error`` field (answer 200 with it)."""
    service = _service(request)
    started = perf_counter()
    status = 200
    try:
        body = await service.read_body(request)
        service.require_ready()
        payload, outcome = await handle(service, body)
    except RequestRejectedError as error:
        payload, outcome = error_payload(str(error)), "rejected"
        status = 200 if error_in_body else error.status
    except Exception as error:  # noqa: BLE001 - kube-scheduler must get an answer, not a trace
        log.error("%s failed: %s: %s", verb, type(error).__name__, error)
        message = f"schedext internal error in {verb} ({type(error).__name__}); see its logs"
        payload, outcome = error_payload(message), "error"
        status = 200 if error_in_body else 500
    service.metrics.observe(verb, outcome, perf_counter() - started)
    return Response(payload, status_code=status, media_type=JSON)


async def _filter(service: Service, body: bytes) -> tuple[bytes, str]:
    args = wire.extender_args(body)
    service.metrics.mode("filter", names_only=args.nodes is None)
    verdict = service.scheduler.filter(args.pod, args.node_names)
    busy = sum(len(r.nodes) for r in verdict.rejections if r.resolvable)
    unresolvable = sum(len(r.nodes) for r in verdict.rejections if not r.resolvable)
    service.metrics.filtered(fits=len(verdict.passed), busy=busy, unresolvable=unresolvable)
    for rejection in verdict.rejections:
        service.metrics.rejected(rejection.reason.name.lower(), len(rejection.nodes))
    return wire.filter_result(verdict, args), "feasible" if verdict.passed else "infeasible"


async def _prioritize(service: Service, body: bytes) -> tuple[bytes, str]:
    args = wire.extender_args(body)
    service.metrics.mode("prioritize", names_only=args.nodes is None)
    scores = service.scheduler.prioritize(args.pod, args.node_names)
    return wire.host_priorities(args.node_names, scores), "scored"


async def _preempt(service: Service, body: bytes) -> tuple[bytes, str]:
    args = wire.preemption_args(body)
    chosen = service.scheduler.preempt(
        args.pod, {node: entry.victims for node, entry in args.candidates.items()}
    )
    return wire.preemption_result(args, chosen), "candidates" if chosen else "no_candidates"


async def _bind(service: Service, body: bytes) -> tuple[bytes, str]:
    args = wire.binding_args(body)
    try:
        plan = service.scheduler.plan_bind(
            uid=args.uid,
            namespace=args.namespace,
            name=args.name,
            node=args.node,
            now=service.clock(),
        )
    except BindRefusedError as error:
        service.gangs.dispatch(service.scheduler.take_gang_events())
        log.info("bind refused: %s", error)
        return wire.binding_result(str(error)), "refused"
    service.gangs.dispatch(service.scheduler.take_gang_events())
    try:
        if plan.group is not None:
            failure = await service.gangs.wait(plan, service.scheduler, service.clock)
            if failure is not None:  # the core released the group's reservations
                service.scheduler.abort_bind(plan)  # and this one's, for certain
                return wire.binding_result(failure), "gang_released"
        await service.binder.bind(plan)
    except BindError as error:
        service.scheduler.abort_bind(plan)
        log.warning("bind of %s to %s failed: %s", plan.key, plan.node, error)
        return wire.binding_result(str(error)), "failed"
    except BaseException:
        service.scheduler.abort_bind(plan)  # cancelled or crashed: give the GPUs back
        raise
    service.scheduler.confirm_bind(plan, awaiting_watch=service.binder.confirmed_by_watch)
    if plan.claim is not None and not plan.claim.exists:
        message = (
            f"schedext: address {plan.ip} of pool {plan.ip_pool} claimed for {plan.claim.owner}"
        )
        service.events.record(PodEvent(plan.key, "IPClaimed", message, uid=plan.uid))
    log.info("bound %s to %s gpus=%s", plan.key, plan.node, list(plan.gpu_ids))
    return wire.binding_result(), "bound"


@router.post("/filter", openapi_extra=openapi.EXTENDER_ARGS)
async def filter_verb(request: Request) -> Response:
    return await _answer(request, "filter", _filter, wire.filter_error, error_in_body=True)


@router.post("/prioritize", openapi_extra=openapi.EXTENDER_ARGS)
async def prioritize_verb(request: Request) -> Response:
    return await _answer(request, "prioritize", _prioritize, wire.error_body, error_in_body=False)


@router.post("/preempt", openapi_extra=openapi.PREEMPTION_ARGS)
async def preempt_verb(request: Request) -> Response:
    return await _answer(request, "preempt", _preempt, wire.error_body, error_in_body=False)


@router.post("/bind", openapi_extra=openapi.BIND)
async def bind_verb(request: Request) -> Response:
    return await _answer(request, "bind", _bind, wire.binding_result, error_in_body=True)
