"""Which ResourceClaims a pod uses, read from the pod: :class:`PodClaims`.

A claim is charged to its pods through ``status.reservedFor`` (read with the claim), and
through the pod itself, which names its claims before, and while, they are reserved for it
(``core/v1/types.go`` in kubernetes/api):

* ``spec.resourceClaims[]``: {name, resourceClaimName} names a claim directly; {name,
  resourceClaimTemplateName} has one generated, whose name the pod's
  ``status.resourceClaimStatuses[]`` {name, resourceClaimName} gives (unset: none was needed).
* ``status.extendedResourceClaimStatus`` (KEP-5004, DRA serving extended resources):
  {resourceClaimName, requestMappings[] {containerName, resourceName, requestName}}: a pod's
  ``nvidia.com/gpu`` served from a DeviceClass's devices through a claim that kube-scheduler,
  not schedext, wrote; the pod status names it.
"""

from __future__ import annotations

from dataclasses import dataclass

from extender import fields
from extender.dra import api
from extender.fields import JSONObject

__all__ = ["PodClaims", "decode_pod_claims"]


@dataclass(frozen=True, slots=True)
class PodClaims:
    uid: str
    namespace: str
    name: str
    claims: tuple[str, ...] = ()  # the claims' names, in the pod's namespace, sorted
    extended_claim: str = ""  # extendedResourceClaimStatus.resourceClaimName
    extended_resources: tuple[str, ...] = ()  # the resources it serves, sorted

    @property
    def keys(self) -> tuple[str, ...]:
        """Every claim the pod uses, as "namespace/name", sorted."""
        names = set(self.claims)
        if self.extended_claim:
            names.add(self.extended_claim)
        return tuple(f"{self.namespace}/{name}" for name in sorted(names))


def decode_pod_claims(obj: JSONObject) -> PodClaims | None:
    """The claims ``obj`` (a pod) uses; None for a pod with no UID. Never raises."""
    meta = fields.obj(obj, "metadata")
    uid = fields.text(meta, "uid")
    if not uid:
        return None
    spec, status = fields.obj(obj, "spec"), fields.obj(obj, "status")
    generated = {
        fields.text(item, "name"): fields.text(item, "resourceClaimName")
        for item in fields.objects(status, "resourceClaimStatuses")[: api.MAX_POD_CLAIMS]
    }
    claims = set()
    for item in fields.objects(spec, "resourceClaims")[: api.MAX_POD_CLAIMS]:
        named = fields.text(item, "resourceClaimName")
        claim = named or generated.get(fields.text(item, "name"), "")
        if claim:
            claims.add(claim)
    extended = fields.obj(status, "extendedResourceClaimStatus")
    mappings = fields.objects(extended, "requestMappings")[: api.MAX_POD_CLAIMS]
    return PodClaims(
        uid=uid,
        namespace=fields.text(meta, "namespace") or "default",
        name=fields.text(meta, "name"),
        claims=tuple(sorted(claims)),
        extended_claim=fields.text(extended, "resourceClaimName"),
        extended_resources=tuple(
            sorted({r for m in mappings if (r := fields.text(m, "resourceName"))})
        ),
    )
