from decimal import Decimal
from fractions import Fraction

import pytest
from kubernetes.utils import parse_quantity as client_parse_quantity

from extender.quantity import NANO, QuantityError, parse_quantity, to_milli, to_nano, to_units

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


@pytest.mark.parametrize(
    "text", ["", "abc", "1.2.3", "5Kb", "1ki", "Gi", "1e", "--1", "1e999999", "1 Gi"]
)
def test_malformed_quantity_is_rejected(text: str) -> None:
    with pytest.raises(QuantityError):
        parse_quantity(text)


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
