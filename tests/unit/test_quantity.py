import contextlib
from decimal import Decimal
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kubernetes.utils import parse_quantity as client_parse_quantity

from extender.quantity import (
    NANO,
    QuantityError,
    QuantityRangeError,
    parse_quantity,
    to_milli,
    to_nano,
    to_units,
)

CASES = [
    ("2", Fraction(2)),
    ("100m", Fraction(1, 10)),
    ("1.5", Fraction(3, 2)),
    ("0.5", Fraction(1, 2)),
    (".5", Fraction(1, 2)),
    ("8Gi", Fraction(8 * 2**30)),
    ("194633128Ki", Fraction(194633128 * 1024)),
    ("187149698618", Fraction(187149698618)),
    ("1e3", Fraction(1000)),
    ("1E3", Fraction(1000)),
    ("2E", Fraction(2 * 10**18)),
    ("5k", Fraction(5000)),
    ("1M", Fraction(10**6)),
    ("250u", Fraction(250, 10**6)),
    ("7n", Fraction(7, 10**9)),
    ("1.5Gi", Fraction(3 * 2**29)),
    ("+3", Fraction(3)),
    ("-1", Fraction(-1)),
    ("1e-3", Fraction(1, 1000)),
]


@pytest.mark.parametrize(("text", "expected"), CASES, ids=[c[0] for c in CASES])
def test_quantity_parses_exactly(text: str, expected: Fraction) -> None:
    assert parse_quantity(text) == expected


@pytest.mark.parametrize("text", [c[0] for c in CASES if c[0] != ".5"])
def test_quantity_agrees_with_the_kubernetes_client(text: str) -> None:
    assert Decimal(parse_quantity(text).numerator) / Decimal(
        parse_quantity(text).denominator
    ) == client_parse_quantity(text)


MALFORMED = ["", "abc", "1.2.3", "5Kb", "1ki", "Gi", "1e", "--1", "1e999999", "1 Gi"]
# Python's int() refuses more than 4300 digits with a ValueError of its own, and reads
# digits that are not ASCII ("\u0663" is 3): neither may leak past the parser.
HOSTILE = ["1" * 5000, "1e" + "1" * 5000, "0." + "1" * 5000, "\u0663", "1\u00b2", "\uff11"]
OUT_OF_RANGE = ["9223372036854775808", "8Ei", "1e30", "-1e30", 2**63, -(2**63), 1e300]


@pytest.mark.parametrize("text", MALFORMED + HOSTILE, ids=lambda text: repr(text)[:20])
def test_malformed_quantity_is_rejected(text: str) -> None:
    with pytest.raises(QuantityError):
        parse_quantity(text)


@pytest.mark.parametrize("value", OUT_OF_RANGE, ids=repr)
def test_a_quantity_over_kubernetes_range_is_refused_as_such(value: str | int | float) -> None:
    with pytest.raises(QuantityRangeError):
        to_nano(value)


def test_the_edge_of_kubernetes_range_is_a_quantity() -> None:
    assert parse_quantity("9223372036854775807") == 2**63 - 1
    assert to_nano(-(2**63) + 1) == (-(2**63) + 1) * NANO


@given(st.text(max_size=200) | st.integers() | st.floats())
def test_any_value_is_a_quantity_or_a_quantity_error(value: str | int | float) -> None:
    """Never another exception: callers catch QuantityError alone."""
    with contextlib.suppress(QuantityError):
        to_nano(value)


@pytest.mark.parametrize(
    ("value", "milli"), [("100m", 100), ("2", 2000), ("0.0001", 1), (3, 3000), (0.25, 250)]
)
def test_milli_rounds_up_like_kubernetes(value: str | int | float, milli: int) -> None:
    assert to_milli(value) == milli


@pytest.mark.parametrize(("value", "units"), [("1Ki", 1024), ("1500m", 2), ("10", 10)])
def test_units_round_up_like_kubernetes(value: str, units: int) -> None:
    assert to_units(value) == units


def test_booleans_are_not_quantities() -> None:
    with pytest.raises(QuantityError):
        parse_quantity(True)


@pytest.mark.parametrize(
    ("value", "nano"),
    [
        ("100m", 100_000_000),
        ("2", 2 * NANO),
        ("1Ki", 1024 * NANO),
        ("7n", 7),
        ("1.5n", 2),  # the API server keeps nano precision, rounding up
        ("1e-12", 1),
        ("-1.5n", -2),  # away from zero, as the API server rounds
        (3, 3 * NANO),
        (0.25, 250_000_000),
    ],
)
def test_nano_is_the_api_servers_own_precision(value: str | int | float, nano: int) -> None:
    assert to_nano(value) == nano


@pytest.mark.parametrize("text", ["abc", "1e999999", True])
def test_nano_refuses_what_is_not_a_quantity(text: str | bool) -> None:
    with pytest.raises(QuantityError):
        to_nano(text)
