"""The API binder: one ``pods/binding`` write carries the node and the GPU annotations.

The Binding's ``metadata.uid`` is a precondition (a re-created pod with the same name is never
bound by mistake) and its ``metadata.annotations`` are merged into the pod by the API server
in the same update that sets ``spec.nodeName``: no window where a bound pod lacks its GPU ids.

Everything a bind writes (the fence's DeviceTaintRules with ``dra.fence``, the sticky address
claim, the Binding, its retries and the reads that explain a conflict) runs under one deadline,
``bind.api_deadline_s``, kept below kube-scheduler's extender ``httpTimeout`` together with the
gang wait: each API call may take only what is left of it, and the whole is cancelled when it
runs out, so kube-scheduler always gets the answer. Retries are decided by error type. A 409 is
explained by reading the pod: deleted, re-created, bound elsewhere (an error), already bound
here by our earlier attempt whose answer was lost (success), or a passing write conflict
(retried).

A failure is one of two kinds. :class:`BindError`: the Binding was certainly not written
(refused, the pod gone, bound elsewhere, or never sent). :class:`BindOutcomeUnknownError`: a
Binding went out and no answer settled it (the deadline passed, the connection dropped, the
server answered 5xx); the caller then keeps the reservation for the watch to settle.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from app.kube.api import Deadline, KubeApi
from app.kube.binding import BindError, BindOutcomeUnknownError
from app.kube.claims import delete_claim, ensure_claim
from app.kube.errors import ApiConflictError, ApiError, ApiNotFoundError, ApiTransientError
from app.kube.fence import Fences
from extender.model import BindPlan

__all__ = ["ApiBinder"]

log = logging.getLogger("schedext.binder")


class ApiBinder:
    # The reservation stays until the pod watch shows the pod bound.
    confirmed_by_watch = True

    def __init__(
        self,
        api: KubeApi,
        *,
        attempts: int = 4,
        deadline_s: float = 8.0,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        clock: Callable[[], float] = time.monotonic,
        fences: Fences | None = None,
    ) -> None:
        self._api = api
        self._fences = fences
        self._attempts = attempts
        self._deadline_s = deadline_s
        self._sleep = sleep
        self._clock = clock

    async def bind(self, plan: BindPlan) -> None:
        """Publish the plan's fence rules first (dra.fence: DRA's allocator must not pick
        the pod's GPUs once it is bound), then create/point the sticky address claim (so the
        address is durably held before the pod carries it), then the Binding; a claim created
        here goes if the bind fails (fence rules go with the next fence pass). All of it
        within ``deadline_s``, or BindError."""
        deadline = Deadline.after(self._deadline_s, self._clock)
        sent = [False]  # whether a Binding has gone out
        try:
            async with asyncio.timeout(self._deadline_s):
                await self._bind_with_claim(plan, deadline, sent)
        except TimeoutError:
            # A claim created by now stays: it names this pod's identity, the retried bind
            # reuses it, and it is released if the identity goes away (see ClaimReleaser).
            error = (
                BindOutcomeUnknownError(
                    f"binding {plan.key} to {plan.node} got no answer within "
                    f"{self._deadline_s:g}s (bind.api_deadline_s); it may have been written, "
                    "so its GPUs and address stay reserved until the pod is seen"
                )
                if sent[0]
                else BindError(
                    f"binding {plan.key} to {plan.node} did not finish within "
                    f"{self._deadline_s:g}s (bind.api_deadline_s); kube-scheduler will retry"
                )
            )
            raise error from None

    async def _bind_with_claim(self, plan: BindPlan, deadline: Deadline, sent: list[bool]) -> None:
        if plan.fence and self._fences is not None:
            await self._fences.before_bind(plan.fence, deadline, plan=plan)
        claim = plan.claim
        created = await ensure_claim(self._api, claim, deadline) if claim is not None else False
        try:
            await self._bind(plan, deadline, sent)
        except BindError as error:
            # A Binding that may have been written keeps the claim its pod may carry.
            if created and claim is not None and not isinstance(error, BindOutcomeUnknownError):
                try:
                    await delete_claim(self._api, claim.name, timeout=deadline.left())
                except ApiError as error:
                    log.warning("could not delete IPClaim %s: %s", claim.name, error)
            raise

    async def _bind(self, plan: BindPlan, deadline: Deadline, sent: list[bool]) -> None:
        path = f"/api/v1/namespaces/{plan.namespace}/pods/{plan.name}/binding"
        body = _binding(plan)
        delay = 0.1
        last: ApiError | None = None
        errors: list[ApiError] = []  # every failed attempt: any may have written the Binding
        for _ in range(self._attempts):
            try:
                sent[0] = True
                await self._api.post(path, body, timeout=deadline.left())
                return
            except ApiNotFoundError:
                raise BindError(f"pod {plan.key} was deleted before it could be bound") from None
            except ApiConflictError as error:
                if await self._already_done(plan, deadline):
                    return
                last = error
            except ApiTransientError as error:
                last = error
                errors.append(error)
            except ApiError as error:
                raise BindError(f"binding {plan.key} to {plan.node} was refused: {error}") from None
            if self._clock() + delay > deadline.at:
                break
            log.info("bind of %s: %s; retrying in %.1fs", plan.key, last, delay)
            await self._sleep(delay)
            delay *= 2
        # Only transient errors and unexplained conflicts get here. An answer lost after
        # sending, or a 500/504, may hide a Binding the server wrote; a refused connection, a
        # 429 or a 503 did not write it, nor did a conflict read back as not ours.
        if any(error.maybe_written for error in errors):
            raise BindOutcomeUnknownError(
                f"binding {plan.key} to {plan.node} failed: {last}; it may have been written, "
                "so its GPUs and address stay reserved until the pod is seen"
            )
        raise BindError(f"binding {plan.key} to {plan.node} failed: {last}")

    async def _already_done(self, plan: BindPlan, deadline: Deadline) -> bool:
        """Explain a 409 by the pod's state: True when it is bound as planned; raises
        BindError when binding cannot succeed; False for a conflict worth retrying."""
        try:
            pod = await self._api.get(
                f"/api/v1/namespaces/{plan.namespace}/pods/{plan.name}", timeout=deadline.left()
            )
        except ApiNotFoundError:
            raise BindError(f"pod {plan.key} was deleted before it could be bound") from None
        except ApiError:
            return False
        meta: dict[str, Any] = pod.get("metadata") or {}
        node = (pod.get("spec") or {}).get("nodeName") or ""
        if meta.get("uid") != plan.uid:
            raise BindError(
                f"pod {plan.key} was re-created (uid {meta.get('uid')}); not binding it"
            )
        if meta.get("deletionTimestamp"):
            raise BindError(f"pod {plan.key} is being deleted")
        annotations = meta.get("annotations") or {}
        if node == plan.node and all(annotations.get(k) == v for k, v in plan.annotations.items()):
            return True  # our earlier attempt went through; its answer was lost
        if node:
            raise BindError(f"pod {plan.key} is already bound to node {node}")
        return False


def _binding(plan: BindPlan) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {
            "name": plan.name,
            "namespace": plan.namespace,
            "uid": plan.uid,
            "annotations": dict(plan.annotations),
        },
        "target": {"apiVersion": "v1", "kind": "Node", "name": plan.node},
    }
