"""The leader's own pod carries the label ``schedext.io/role: leader``; the Service selects it.

This is Patroni's way of routing to one replica among several that are all Ready: pod
readiness says "this replica has synced its inventory" (so a Deployment's rolling update can
complete with a standby), and the label says "this replica holds the Lease" (so the Service
sends kube-scheduler to the one inventory that answers the verbs).

Each replica labels only its own pod (``POD_NAME``/``POD_NAMESPACE`` from the downward API):
the desired state is "labelled while leading", and a reconcile loop patches the pod whenever
the state it last read or wrote differs, retrying failed patches with a capped exponential
backoff. It starts by reading its pod, so a standby removes a label left behind by an earlier
container of the same pod (one that crashed while leading). Every so often it reads the pod
again, so a label edited by hand is put right.

The label only routes: a replica that is labelled but not leading (for a moment, or while the
API server refuses its patches) still refuses every verb, so a stale label can cost a retry,
never a double allocation.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from app.kube.api import KubeApi
from app.kube.errors import ApiError

__all__ = ["LEADER", "ROLE_LABEL", "PodRoleLabel"]

log = logging.getLogger("schedext.leader")

ROLE_LABEL = "schedext.io/role"
LEADER = "leader"


class PodRoleLabel:
    def __init__(
        self,
        api: KubeApi,
        *,
        namespace: str,
        pod: str,
        resync_s: float = 30.0,
        backoff_s: float = 0.5,
        max_backoff_s: float = 30.0,
        idle: Callable[[float], Awaitable[None]] | None = None,
    ) -> None:
        self._api = api
        self._path = f"/api/v1/namespaces/{namespace}/pods/{pod}"
        self.pod = f"{namespace}/{pod}"
        self._resync_s = resync_s
        self._backoff_s = backoff_s
        self._max_backoff_s = max_backoff_s
        self._idle = idle or self._wait_for_change
        self._changed = asyncio.Event()
        self.desired = False  # labelled while leading
        self.actual: bool | None = None  # as last read or written; None: read the pod first

    def set_leading(self, leading: bool) -> None:
        """Leadership changed (the elector's callback): reconcile now."""
        self.desired = leading
        self._changed.set()

    async def reconcile(self) -> None:
        """One pass: read the pod if its label is not known, patch it if it differs.
        Raises ApiError when either call fails."""
        if self.actual is None:
            self.actual = _labelled(await self._api.get(self._path))
        if self.actual == self.desired:
            return
        desired = self.desired
        value = LEADER if desired else None  # null removes the label (JSON merge patch)
        pod = await self._api.merge_patch(self._path, {"metadata": {"labels": {ROLE_LABEL: value}}})
        self.actual = _labelled(pod)
        log.info(
            "labelled own pod" if desired else "unlabelled own pod",
            extra={"pod": self.pod, "label": f"{ROLE_LABEL}={LEADER}", "leading": desired},
        )

    async def run_forever(self) -> None:
        failures = 0
        while True:
            self._changed.clear()  # a change from here on wakes the wait below at once
            try:
                await self.reconcile()
            except ApiError as error:
                failures += 1
                delay = min(self._backoff_s * 2 ** (failures - 1), self._max_backoff_s)
                log.warning(
                    "cannot %s own pod: %s; retrying in %gs",
                    "label" if self.desired else "unlabel",
                    error,
                    delay,
                    extra={"pod": self.pod},
                )
                await self._idle(delay)
                continue
            failures = 0
            await self._idle(self._resync_s)
            if not self._changed.is_set():
                self.actual = None  # nothing happened for a while: read the pod again

    async def clear(self) -> None:
        """At shutdown, after the lease is released: one best-effort patch, no retries (the
        pod is going away; a container that starts in it again clears the label itself)."""
        self.desired = False
        if self.actual is False:
            return
        try:
            self.actual = _labelled(
                await self._api.merge_patch(
                    self._path, {"metadata": {"labels": {ROLE_LABEL: None}}}
                )
            )
        except ApiError as error:
            log.warning("cannot unlabel own pod: %s", error, extra={"pod": self.pod})

    async def _wait_for_change(self, timeout: float) -> None:
        # asyncio.timeout, not wait_for: on Python 3.11, wait_for swallows a cancellation
        # that comes with the event set (the elector's release at shutdown, then the tasks
        # cancelled), and this loop then kept the process from stopping.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self._changed.wait()


def _labelled(pod: dict[str, Any]) -> bool:
    labels = (pod.get("metadata") or {}).get("labels") or {}
    return bool(labels.get(ROLE_LABEL) == LEADER)
