"""Leader election on a ``coordination.k8s.io/v1`` Lease, as client-go does it.

Several schedext replicas keep their informers warm; only the leader answers the verbs
(``/readyz`` is true only there) and its pod carries the label a Service selects, so that
kube-scheduler reaches it (app.kube.role). Expiry is judged on
this process's own monotonic clock, from when it last saw the lease record change, never by
comparing timestamps written by other machines, so clock skew cannot make two leaders.

Safety margin: a leader that cannot renew within ``renew_deadline_s`` stops leading (its
verbs refuse at once). A bind it had already started may still write to the API server for up
to ``bind.api_deadline_s``. Another replica takes over only after ``lease_duration_s`` without
renewal. The settings therefore require renew_deadline_s + bind.api_deadline_s <
lease_duration_s, so that two leaders never bind at once.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from app.kube.api import KubeApi
from app.kube.errors import ApiConflictError, ApiError, ApiNotFoundError

__all__ = ["LeaderElector"]

log = logging.getLogger("schedext.leader")


class LeaderElector:
    def __init__(
        self,
        api: KubeApi,
        *,
        namespace: str,
        name: str,
        identity: str,
        lease_duration_s: float = 15.0,
        renew_deadline_s: float = 5.0,
        retry_period_s: float = 2.0,
        on_change: Callable[[bool, str], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._api = api
        self._path = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"
        self._name = name
        self.identity = identity
        self._duration = lease_duration_s
        self._renew_deadline = renew_deadline_s
        self._retry = retry_period_s
        self._on_change = on_change
        self._clock = clock
        self._sleep = sleep
        self.leading = False
        self.holder = ""
        self._reported: tuple[bool, str] | None = None
        self._observed: dict[str, Any] | None = None
        self._observed_at = 0.0
        self._renewed_at = 0.0

    async def run_forever(self) -> None:
        while True:
            try:
                acquired = await self.try_acquire_or_renew()
            except ApiError as error:
                log.warning("lease %s: %s", self._name, error)
                acquired = False
            now = self._clock()
            if acquired:
                self._renewed_at = now
                self._set(leading=True, holder=self.identity)
            elif self.leading and now - self._renewed_at >= self._renew_deadline:
                log.error(
                    "lost the lease %s: could not renew within %gs",
                    self._name,
                    self._renew_deadline,
                )
                self._set(leading=False, holder=self.holder)
            elif not self.leading:
                self._set(leading=False, holder=self.holder)  # who leads, for readiness
            await self._sleep(self._retry)

    async def try_acquire_or_renew(self) -> bool:
        now = self._clock()
        try:
            lease = await self._api.get(f"{self._path}/{self._name}")
        except ApiNotFoundError:
            await self._api.post(self._path, self._lease_body(transitions=0, acquired=True))
            return True
        spec = lease.get("spec") or {}
        record = {k: spec.get(k) for k in ("holderIdentity", "renewTime", "leaseTransitions")}
        if record != self._observed:
            self._observed, self._observed_at = record, now
        holder = str(spec.get("holderIdentity") or "")
        duration = float(spec.get("leaseDurationSeconds") or self._duration)
        if holder and holder != self.identity and now < self._observed_at + duration:
            self.holder = holder
            return False  # someone else holds a lease that has not expired as we see it
        transitions = int(spec.get("leaseTransitions") or 0)
        new_holder = holder != self.identity
        body = self._lease_body(
            transitions=transitions + 1 if new_holder else transitions,
            acquired=new_holder,
            previous=spec,
        )
        body["metadata"]["resourceVersion"] = (lease.get("metadata") or {}).get("resourceVersion")
        try:
            await self._api.put(f"{self._path}/{self._name}", body)
        except ApiConflictError:
            return False  # another replica wrote first
        return True

    async def release(self) -> None:
        """Give the lease up at shutdown, so that a standby takes over at once."""
        if not self.leading:
            return
        try:
            lease = await self._api.get(f"{self._path}/{self._name}")
            spec = lease.get("spec") or {}
            if spec.get("holderIdentity") != self.identity:
                return
            body = self._lease_body(
                transitions=int(spec.get("leaseTransitions") or 0), acquired=False, previous=spec
            )
            body["spec"]["holderIdentity"] = ""
            body["spec"]["leaseDurationSeconds"] = 1
            body["metadata"]["resourceVersion"] = (lease.get("metadata") or {}).get(
                "resourceVersion"
            )
            await self._api.put(f"{self._path}/{self._name}", body)
        except ApiError as error:
            log.warning("could not release the lease %s: %s", self._name, error)
        self._set(leading=False, holder="")

    def _set(self, *, leading: bool, holder: str) -> None:
        changed = leading != self.leading
        reported = (leading, holder) != self._reported
        self.leading, self.holder, self._reported = leading, holder, (leading, holder)
        if changed:
            log.info("leadership changed", extra={"leading": leading, "lease": self._name})
        if reported and self._on_change is not None:
            self._on_change(leading, holder)

    def _lease_body(
        self, *, transitions: int, acquired: bool, previous: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        now = _micro_time()
        spec: dict[str, Any] = {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": max(1, round(self._duration)),
            "acquireTime": now if acquired else (previous or {}).get("acquireTime", now),
            "renewTime": now,
            "leaseTransitions": transitions,
        }
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": self._name},
            "spec": spec,
        }


def _micro_time() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
