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


_MAX_DIGITS = 18  # below 2^63: every whole number read here fits an int64 column


def whole_number(value: str, *, max_digits: int = _MAX_DIGITS) -> int | None:
    """A plain decimal whole number ("40960") as an int; None for anything else. ASCII
    digits only and at most ``max_digits`` of them: ``str.isdigit`` also takes "²" and "٣",
    which ``int`` refuses or reads otherwise, and ``int`` refuses more than 4300 digits
    with a ValueError of its own."""
    if not (0 < len(value) <= max_digits and value.isascii() and value.isdigit()):
        return None
    return int(value)


_SHOWN = 40  # characters of a raw value quoted in a message


def quoted(value: object) -> str:
    """``repr(value)`` for a message, cut short when long: a 5,000-character quantity would
    otherwise be copied into the reason of every node."""
    if isinstance(value, str) and len(value) > _SHOWN:
        return f"{value[:_SHOWN] + '...'!r} ({len(value)} characters)"
    text = repr(value)
    return text if len(text) <= _SHOWN else f"{text[:_SHOWN]}... ({len(text)} characters)"
