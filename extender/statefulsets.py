"""StatefulSet replicas, and the identity of every StatefulSet pod: what the release of sticky
address claims is decided on (an identity ``sts/<namespace>/<name>/<ordinal>`` is gone for
good once its StatefulSet is deleted or scaled below its ordinal, and no pod of it exists)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from extender import fields
from extender.ipam import IPClaimSpec
from extender.model import ClaimPolicy

__all__ = ["StatefulSetBook"]


class StatefulSetBook:
    def __init__(self) -> None:
        self._replicas: dict[str, int] = {}  # "namespace/name" -> spec.replicas
        self._identities: dict[str, str] = {}  # pod uid -> its StatefulSet identity

    def set_replicas(self, key: str, replicas: int | None) -> None:
        """A StatefulSet's replica count ("namespace/name"); None when it is gone."""
        if replicas is None:
            self._replicas.pop(key, None)
        else:
            self._replicas[key] = replicas

    def replace_replicas(self, replicas: Mapping[str, int]) -> None:
        self._replicas = dict(replicas)

    def set_identity(self, uid: str, identity: str) -> None:
        self._identities[uid] = identity

    def forget_pod(self, uid: str) -> None:
        self._identities.pop(uid, None)

    def replace_identities(self, identities: Mapping[str, str]) -> None:
        self._identities = dict(identities)

    def claims_to_release(self, claims: Iterable[IPClaimSpec]) -> list[IPClaimSpec]:
        """Of ``claims``, the sticky ones whose identity is gone for good; never-release
        claims stay."""
        live = set(self._identities.values())
        released = []
        for claim in claims:
            if claim.policy is not ClaimPolicy.STICKY or claim.owner in live:
                continue
            parts = claim.owner.split("/")
            ordinal = fields.whole_number(parts[3]) if len(parts) == 4 else None
            if parts[0] != "sts" or ordinal is None:
                continue
            replicas = self._replicas.get(f"{parts[1]}/{parts[2]}")
            if replicas is None or ordinal >= replicas:
                released.append(claim)
        return released
