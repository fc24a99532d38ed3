"""Reading Kubernetes JSON the way Go's ``encoding/json`` does.

Go matches struct field names case-insensitively, so ``{"metadata": ...}`` and
``{"Metadata": ...}`` decode alike on kube-scheduler's side; we accept the same. Map keys
(labels, annotations, resource names) stay case-sensitive, as in Go.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

JSONObject = Mapping[str, Any]

_EMPTY: JSONObject = {}


def get(obj: object, name: str) -> Any:
    """The value of struct field ``name`` in ``obj``, matched exactly first, then ignoring case."""
    # ``type() is dict`` first: decoded JSON is always a dict, and the ABC check is slow.
    if type(obj) is not dict and not isinstance(obj, Mapping):
        return None
    value = obj.get(name)
    if value is not None or name in obj:
        return value
    # Go's EqualFold only matches names of equal length (simple case folding), and comparing
    # lengths first keeps a miss cheap: most lookups are of fields that are simply absent.
    size = len(name)
    folded = name.casefold()
    for key, candidate in obj.items():
        if isinstance(key, str) and len(key) == size and key.casefold() == folded:
            return candidate
    return None


def obj(parent: object, name: str) -> JSONObject:
    """A nested object field, or an empty mapping when absent or not an object."""
    value = get(parent, name)
    return value if type(value) is dict or isinstance(value, Mapping) else _EMPTY


def objects(parent: object, name: str) -> list[JSONObject]:
    """A list-of-objects field; entries that are not objects are skipped."""
    value = get(parent, name)
    if not isinstance(value, list):
        return []
    return [item for item in value if type(item) is dict or isinstance(item, Mapping)]


def string_map(parent: object, name: str) -> dict[str, str]:
    """A ``map[string]string`` field (labels, annotations); non-string values are dropped."""
    value = get(parent, name)
    if not isinstance(value, Mapping):
        return {}
    return {k: v for k, v in value.items() if isinstance(k, str) and isinstance(v, str)}


def text(parent: object, name: str) -> str:
    value = get(parent, name)
    return value if isinstance(value, str) else ""
