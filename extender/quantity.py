"""Exact parsing of Kubernetes resource quantities ("100m", "8Gi", "1e3", "194633128Ki").

Kubernetes compares quantities as exact decimals and rounds *up* when it needs an integer
(``Quantity.Value()`` / ``MilliValue()``), so parsing goes through :class:`fractions.Fraction`
and never through ``float``.

Arithmetic on many quantities (a pod's containers, 100,000 pods at start) uses
:func:`to_nano` instead: whole nano-units, which is exactly what the API server keeps (it rounds
every parsed quantity up to a multiple of 10^-9), as plain integers, cached per string
because the same few strings ("500m", "16Gi", "2") repeat across every pod.
"""

from __future__ import annotations

import re
from fractions import Fraction
from functools import lru_cache
from math import ceil

__all__ = [
    "MAX_MAGNITUDE",
    "NANO",
    "QuantityError",
    "QuantityRangeError",
    "parse_quantity",
    "to_milli",
    "to_nano",
    "to_units",
]

NANO = 10**9  # nano-units per unit

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 10**3),
    "": Fraction(1),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
}
# The exponent form is tried before the bare "E" (exa) suffix: "1E3" is 1000, "1E" is 10**18.
# ASCII digits only, as Kubernetes reads them ("\\d" would also take "٣" or "²").
_QUANTITY = re.compile(
    r"^(?P<sign>[+-]?)(?P<number>\d+(?:\.\d*)?|\.\d+)"
    r"(?:(?P<exp>[eE][+-]?\d+)|(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]))?$",
    re.ASCII,
)
# Bounds that keep hostile input cheap and every error a QuantityError. A quantity the API
# server writes is a few dozen characters; a longer one would also meet Python's limit on
# converting long digit strings to int (4300 digits), a ValueError of its own.
_MAX_LENGTH = 100
# A bound on exponents keeps "1e999999999" from building a gigantic integer.
_MAX_EXPONENT = 30
# Kubernetes: "no quantity may represent a number greater than 2^63-1 in magnitude". Within
# it, every whole count (GPUs, bytes) fits the inventory's int64 columns.
MAX_MAGNITUDE = 2**63 - 1


class QuantityError(ValueError):
    """A string that is not a Kubernetes quantity."""


class QuantityRangeError(QuantityError):
    """A quantity beyond what Kubernetes counts: over 2^63-1 in magnitude."""


def parse_quantity(value: str | int | float) -> Fraction:
    """Return the exact value of a quantity; raise :class:`QuantityError` if it is not one."""
    if isinstance(value, bool):
        raise QuantityError(f"not a quantity: {value!r}")
    if isinstance(value, int):
        if abs(value) > MAX_MAGNITUDE:
            raise QuantityRangeError(f"quantity out of range (over 2^63-1): {value}")
        return Fraction(value)
    if isinstance(value, float):
        # YAML/JSON numbers such as 0.5 arrive as floats; their shortest repr is what was written.
        return parse_quantity(repr(value))
    if not isinstance(value, str):
        raise QuantityError(f"not a quantity: {value!r}")
    if len(value) > _MAX_LENGTH:
        raise QuantityError(f"not a quantity: {len(value)} characters, at most {_MAX_LENGTH}")
    match = _QUANTITY.match(value.strip())
    if match is None:
        raise QuantityError(f"not a quantity: {value!r}")
    number = Fraction(match["number"])
    if match["exp"] is not None:
        exponent = int(match["exp"][1:])
        if abs(exponent) > _MAX_EXPONENT:
            raise QuantityRangeError(f"quantity exponent out of range: {value!r}")
        number *= Fraction(10) ** exponent
    else:
        suffix = match["suffix"] or ""
        number *= _BINARY[suffix] if suffix in _BINARY else _DECIMAL[suffix]
    if number > MAX_MAGNITUDE:
        raise QuantityRangeError(f"quantity out of range (over 2^63-1): {value!r}")
    return -number if match["sign"] == "-" else number


def to_milli(value: str | int | float) -> int:
    """Milli-units, rounded up like ``Quantity.MilliValue()`` (CPU: "100m" -> 100, "2" -> 2000)."""
    return ceil(parse_quantity(value) * 1000)


def to_units(value: str | int | float) -> int:
    """Whole units, rounded up like ``Quantity.Value()`` (memory: "1Ki" -> 1024)."""
    return ceil(parse_quantity(value))


def to_nano(value: str | int | float) -> int:
    """Whole nano-units, rounded away from zero as the API server rounds a parsed quantity
    ("100m" -> 100_000_000, "1Ki" -> 1024 * NANO); raise :class:`QuantityError`."""
    if isinstance(value, str):
        return _nano_of_text(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return int(parse_quantity(value)) * NANO
    return _nano(parse_quantity(value))


@lru_cache(maxsize=4096)
def _nano_of_text(text: str) -> int:
    # Bounded: a hostile stream of distinct strings only evicts, never grows memory.
    return _nano(parse_quantity(text))


def _nano(value: Fraction) -> int:
    scaled = value * NANO
    return ceil(scaled) if scaled >= 0 else -ceil(-scaled)
