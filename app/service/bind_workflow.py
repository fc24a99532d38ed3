"""The bind of one pod, from the core's plan to the Binding.

Bind is the one verb that is a workflow rather than one decision: the core plans it (and
reserves the GPUs and the address), a gang member waits at the barrier for its group, the
binder writes the Binding (with ``dra.fence``, after the plan's DeviceTaintRules: a fence that
cannot be published fails the bind like a refused Binding), and the core then hears how it
ended: confirmed once bound, aborted on every failure (cancellation included) so that no
reservation outlives its bind. Here, apart from the route, the order of those steps is in one
place with no HTTP in it; the route only decodes the request and encodes the outcome.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Literal

from app.kube.binding import BindError, BindOutcomeUnknownError
from app.kube.events import PodEvent
from app.service.assembly import Service
from extender.errors import BindRefusedError
from extender.model import BindPlan

__all__ = ["BindOutcome", "bind_pod"]

# The bind decisions keep the verbs' logger name: log queries and tests select on it.
log = logging.getLogger("schedext.verbs")


@dataclass(frozen=True, slots=True)
class BindOutcome:
    """How one bind ended."""

    error: str  # the protocol's Error field for kube-scheduler; "" once bound
    label: Literal["refused", "gang_released", "failed", "bound"]  # the verb's metrics outcome


async def bind_pod(
    service: Service, *, uid: str, namespace: str, name: str, node: str
) -> BindOutcome:
    """Bind the pod to ``node`` as the core plans it. Failures the protocol reports come back
    as an outcome; anything else (a cancelled call, a crash) gives the reservation back and
    propagates."""
    try:
        plan = service.core(
            lambda core: core.plan_bind(
                uid=uid, namespace=namespace, name=name, node=node, now=service.clock()
            )
        )
    except BindRefusedError as error:
        log.info(
            "bind refused",
            extra={
                "pod": f"{namespace}/{name}",
                "node": node,
                "decision": "refused",
                "reason": str(error),
            },
        )
        return BindOutcome(str(error), "refused")
    writing = False
    try:
        if plan.group is not None:
            failure = await service.gangs.wait(plan, service.scheduler, service.clock)
            if failure is not None:  # the core released the group's reservations
                service.scheduler.abort_bind(plan)  # and this one's, for certain
                log.warning(
                    "bind released with its gang",
                    extra={
                        "pod": plan.key,
                        "node": plan.node,
                        "decision": "gang_released",
                        "reason": failure,
                    },
                )
                return BindOutcome(failure, "gang_released")
        writing = True  # from here a Binding may go out
        await service.binder.bind(plan)
    except BindError as error:
        unknown = isinstance(error, BindOutcomeUnknownError)
        _give_back(service, plan, keep=unknown)
        log.warning(
            "bind outcome unknown" if unknown else "bind failed",
            extra={"pod": plan.key, "node": plan.node, "decision": "failed", "reason": str(error)},
        )
        return BindOutcome(str(error), "failed")
    except asyncio.CancelledError:
        # kube-scheduler gave up on the call: a Binding already sent may still be written.
        _give_back(service, plan, keep=writing)
        raise
    except BaseException:
        service.scheduler.abort_bind(plan)  # crashed: give the GPUs back
        raise
    service.scheduler.confirm_bind(plan, awaiting_watch=service.binder.confirmed_by_watch)
    service.metrics.placed(plan.choice.value)
    if plan.claim is not None and not plan.claim.exists:
        message = (
            f"schedext: address {plan.ip} of pool {plan.ip_pool} claimed for {plan.claim.owner}"
        )
        service.events.record(PodEvent(plan.key, "IPClaimed", message, uid=plan.uid))
    log.info(
        "bound",
        extra={
            "pod": plan.key,
            "node": plan.node,
            "decision": "bound",
            "gpus": list(plan.gpu_ids),
            "ip": plan.ip,
        },
    )
    return BindOutcome("", "bound")


def _give_back(service: Service, plan: BindPlan, *, keep: bool) -> None:
    """After a failed bind: what it reserved goes back, or (``keep``: a Binding may have been
    written) stays for the watch to settle (see app.kube.binding.BindOutcomeUnknownError)."""
    if keep:
        service.scheduler.doubt_bind(plan, now=service.clock())
    else:
        service.scheduler.abort_bind(plan)
