"""Reading Kubernetes JSON the way Go's ``encoding/json`` does.

Go matches struct field names case-insensitively, so ``{"metadata": ...}`` and
``{"Metadata": ...}`` decode alike on kube-scheduler's side; we accept the same. Map keys
(labels, annotations, resource names) stay case-sensitive, as in Go.

Two ways to read a field of the wrong JSON type (``annotations`` a list, ``spec`` a string):
:func:`obj`, :func:`objects`, :func:`string_map` and :func:`text` read it as absent, as a
bound pod or a node needs (counted as well as it can be); :func:`strict_obj`,
:func:`strict_objects`, :func:`strict_string_map` and :func:`strict_text` raise
:class:`ShapeError` naming the field, as Go's decoder would refuse it, for a pod asking to
be placed: a rule it states is never silently dropped. ``null`` is absent in both, as in Go.
Both cost the same for a well-formed object: the strict ones only differ where the lenient
ones give up.
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


class ShapeError(ValueError):
    """A field of the wrong JSON type; the message names it (the decoder of pods makes it a
    PodRequestError)."""


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


def kind(value: object) -> str:
    """What JSON value ``value`` is, for a message: "a list", "a string", "null"..."""
    if value is None:
        return "null"
    if isinstance(value, int) and not isinstance(value, bool) and value < 0:
        return "a negative number"
    return _KINDS.get(type(value), "a number")


_KINDS = {
    dict: "an object",
    list: "a list",
    str: "a string",
    bool: "a boolean",
    float: "a floating-point number",
}


def text(parent: object, name: str) -> str:
    value = get(parent, name)
    return value if isinstance(value, str) else ""


def strict_obj(parent: object, name: str, where: str) -> JSONObject:
    """:func:`obj`, raising :class:`ShapeError` for a value that is not an object."""
    value = get(parent, name)
    if type(value) is dict or isinstance(value, Mapping):
        return value
    if value is None:
        return _EMPTY
    raise ShapeError(wrong(_path(where, name), "an object", value))


def strict_objects(parent: object, name: str, where: str) -> list[JSONObject]:
    """:func:`objects`, raising :class:`ShapeError` for a value that is not a list of objects."""
    value = get(parent, name)
    if value is None:
        return []
    if type(value) is not list:
        raise ShapeError(wrong(_path(where, name), "a list of objects", value))
    for index, item in enumerate(value):
        if type(item) is not dict and not isinstance(item, Mapping):
            raise ShapeError(wrong(f"{_path(where, name)}[{index}]", "an object", item))
    return value


def strict_string_map(parent: object, name: str, where: str) -> Mapping[str, str]:
    """:func:`string_map`, raising :class:`ShapeError` for a value that is not a map of
    strings; the map itself, not a copy."""
    value = get(parent, name)
    if value is None:
        return _EMPTY
    if type(value) is not dict and not isinstance(value, Mapping):
        raise ShapeError(wrong(_path(where, name), "a map of strings", value))
    for key, item in value.items():
        if type(item) is not str:
            raise ShapeError(wrong(f"{_path(where, name)}[{quoted(key)}]", "a string", item))
    return value


def strict_text(parent: object, name: str, where: str) -> str:
    """:func:`text`, raising :class:`ShapeError` for a value that is not a string."""
    value = get(parent, name)
    if type(value) is str:
        return value
    if value is None:
        return ""
    raise ShapeError(wrong(_path(where, name), "a string", value))


def _path(where: str, name: str) -> str:
    """``where``: the path of the parent for a message ("spec"; "" at the top)."""
    return f"{where}.{name}" if where else name


def wrong(where: str, expected: str, value: object) -> str:
    """The message for a field of the wrong type: "<where> must be <expected>, got ..."."""
    shown = "" if value is None or type(value) in (dict, list) else f" ({quoted(value)})"
    return f"{where} must be {expected}, got {kind(value)}{shown}"


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
