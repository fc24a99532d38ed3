"""Sticky address claims: created before the Binding that uses them, and released when their
StatefulSet identity is gone for good (after re-checking with the API server)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from app.kube.api import Deadline, KubeApi
from app.kube.binding import BindError
from app.kube.errors import ApiConflictError, ApiError, ApiNotFoundError
from app.kube.readiness import Readiness
from app.kube.status import SCHEDEXT_PATH
from extender.model import ClaimPlan
from extender.scheduler import Scheduler

__all__ = ["ClaimReleaser", "delete_claim", "ensure_claim"]

log = logging.getLogger("schedext.claims")

CLAIMS = f"{SCHEDEXT_PATH}/ipclaims"


async def ensure_claim(api: KubeApi, claim: ClaimPlan, deadline: Deadline | None = None) -> bool:
    """Make the claim exist and point at the binding pod; True when it was created now (so a
    failed bind deletes it again). Raises BindError when another identity holds the address.
    With ``deadline`` (the bind's), each call takes only the time left of it."""

    def timeout() -> float | None:
        return deadline.left() if deadline is not None else None

    spec = {
        "pool": claim.pool,
        "address": claim.address,
        "owner": claim.owner,
        "releasePolicy": claim.policy.value,
        "holderUID": claim.holder_uid,
    }
    if not claim.exists:
        body = {
            "apiVersion": "schedext.io/v1alpha1",
            "kind": "IPClaim",
            "metadata": {"name": claim.name},
            "spec": spec,
        }
        try:
            await api.post(CLAIMS, body, timeout=timeout())
            return True
        except ApiConflictError:
            current = await api.get(f"{CLAIMS}/{claim.name}", timeout=timeout())
            owner = (current.get("spec") or {}).get("owner")
            if owner != claim.owner:
                raise BindError(
                    f"address {claim.address} is claimed by {owner} (IPClaim {claim.name})"
                ) from None
        except ApiError as error:
            raise BindError(f"cannot create IPClaim {claim.name}: {error}") from None
    try:
        await api.merge_patch(
            f"{CLAIMS}/{claim.name}", {"spec": {"holderUID": claim.holder_uid}}, timeout=timeout()
        )
    except ApiError as error:
        raise BindError(f"cannot update IPClaim {claim.name}: {error}") from None
    return False


async def delete_claim(
    api: KubeApi, name: str, *, uid: str = "", timeout: float | None = None
) -> None:
    body: dict[str, Any] = {"apiVersion": "v1", "kind": "DeleteOptions"}
    if uid:
        body["preconditions"] = {"uid": uid}
    with contextlib.suppress(ApiNotFoundError):  # already gone is what we wanted
        await api.delete(f"{CLAIMS}/{name}", body, timeout=timeout)


class ClaimReleaser:
    """Periodically releases sticky claims whose identity is gone: the StatefulSet deleted or
    scaled below the ordinal, and no pod of that identity. Each candidate is re-checked against
    the API server first, so nothing is released for a pod or StatefulSet that still exists."""

    def __init__(self, api: KubeApi, scheduler: Scheduler, readiness: Readiness) -> None:
        self._api = api
        self._scheduler = scheduler
        self._readiness = readiness

    async def run_forever(self, *, interval_s: float) -> None:
        while True:
            await asyncio.sleep(interval_s)
            if self._readiness.ready:
                await self.release_once()

    async def release_once(self) -> list[str]:
        released = []
        for claim in self._scheduler.claims_to_release():
            _, namespace, statefulset, ordinal = claim.owner.split("/")
            try:
                if await self._identity_lives(namespace, statefulset, int(ordinal)):
                    continue
                await delete_claim(self._api, claim.name, uid=claim.uid)
            except ApiError as error:
                log.warning("cannot release IPClaim %s: %s", claim.name, error)
                continue
            log.info("released IPClaim", extra={"claim": claim.name, "owner": claim.owner})
            released.append(claim.name)
        return released

    async def _identity_lives(self, namespace: str, statefulset: str, ordinal: int) -> bool:
        try:
            await self._api.get(f"/api/v1/namespaces/{namespace}/pods/{statefulset}-{ordinal}")
            return True  # a pod of this identity exists (perhaps being re-created)
        except ApiNotFoundError:
            pass
        try:
            sts = await self._api.get(
                f"/apis/apps/v1/namespaces/{namespace}/statefulsets/{statefulset}"
            )
        except ApiNotFoundError:
            return False
        replicas = (sts.get("spec") or {}).get("replicas", 1)
        return isinstance(replicas, int) and ordinal < replicas
