"""What the DRA modules share: the API versions read, the bounds kept, and small readers.

Dynamic Resource Allocation is ``resource.k8s.io``, GA as ``v1`` since Kubernetes 1.34. The
shapes read here are those of ``resource/v1/types.go`` in kubernetes/api (ResourceSlice,
ResourceClaim, DeviceClass), which ``v1beta2`` has as well (v1 was copied from it); ``v1beta1``
wraps a device's fields in ``basic:`` and is not read. DeviceTaintRule is ``v1beta2`` (and
``v1`` in the newest API, the same shape). An object names its ``apiVersion`` on a watch
event; a list's items may not, and the shell knows which version it listed, so an absent one
is read. Any other version is an object schedext cannot read: kept, with a reason, never
guessed at.

Every list is read only up to the API server's own bound (the constants below, from the same
file), so that a hostile or corrupt object costs no more than a valid one; what lies beyond is
ignored and said so in the object's ``problem``.
"""

from __future__ import annotations

from typing import Any, Final, TypeVar

from extender import fields
from extender.fields import JSONObject

_K = TypeVar("_K")
_V = TypeVar("_V")

__all__ = [
    "GROUP",
    "MAX_ATTRIBUTES",
    "MAX_DEVICES",
    "MAX_POD_CLAIMS",
    "MAX_RESERVED_FOR",
    "MAX_RESULTS",
    "MAX_SELECTORS",
    "MAX_TAINTS",
    "READ",
    "TAINT_RULES_READ",
    "discard",
    "flag",
    "integer",
    "qualified",
    "version_problem",
]

GROUP: Final = "resource.k8s.io"
READ: Final = (f"{GROUP}/v1", f"{GROUP}/v1beta2")
TAINT_RULES_READ: Final = (f"{GROUP}/v1beta2", f"{GROUP}/v1")

# The API server's bounds (resource/v1/types.go): ResourceSliceMaxDevices,
# ResourceSliceMaxAttributesAndCapacitiesPerDevice (read here for each map apart),
# DeviceTaintsMaxLength, AllocationResultsMaxSize, ResourceClaimReservedForMaxSize,
# DeviceSelectorsMaxSize.
MAX_DEVICES: Final = 128
MAX_ATTRIBUTES: Final = 32
MAX_TAINTS: Final = 16
MAX_RESULTS: Final = 32
MAX_RESERVED_FOR: Final = 256
MAX_SELECTORS: Final = 32
# A pod's spec.resourceClaims: the API server allows 32 (core/v1 validation); so do we.
MAX_POD_CLAIMS: Final = 32


def version_problem(obj: JSONObject, read: tuple[str, ...] = READ) -> str:
    """Why ``obj``'s apiVersion is not one schedext reads; "" when it is (or absent)."""
    version = fields.get(obj, "apiVersion")
    if version is None or version in read:
        return ""
    return f"apiVersion {fields.quoted(version)} is not one schedext reads ({', '.join(read)})"


def flag(parent: object, name: str) -> bool:
    """A ``*bool`` field: True only when it is the JSON ``true``."""
    return fields.get(parent, name) is True


def integer(parent: object, name: str) -> int | None:
    """An ``int64`` field as JSON sends it; None when absent or not a whole number."""
    value = fields.get(parent, name)
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value


def qualified(raw: JSONObject, driver: str) -> list[tuple[str, Any]]:
    """A map keyed by attribute or capacity names (``QualifiedName``), each name with its
    domain: a bare name ("uuid") is in the driver's ("gpu.nvidia.com/uuid"), as
    resource/v1 says. A key that is no string (JSON has none) is skipped."""
    return [
        (name if "/" in name else f"{driver}/{name}", value)
        for name, value in raw.items()
        if isinstance(name, str)
    ]


def discard(index: dict[_K, set[_V]], key: _K, value: _V) -> None:
    """Take ``value`` out of ``index[key]``, and the key with its last value: an index of
    sets never keeps an empty one."""
    members = index.get(key)
    if members is not None:
        members.discard(value)
        if not members:
            del index[key]
