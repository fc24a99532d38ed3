"""extender.asks: a pod template's sums are kept, and the answer is the one summing gives."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pytest

from extender import asks, mig
from extender.errors import PodRequestError
from extender.resource_totals import effective_requests
from testbed.builders import container

RESOURCES = ("cpu", "memory", "nvidia.com/gpu")


@dataclass
class Case:
    name: str
    spec: dict[str, Any]


CASES = [
    Case(
        "one container",
        {"containers": [container("a", requests={"cpu": "1", "nvidia.com/gpu": 2})]},
    ),
    Case(
        "a sidecar and a regular init container",
        {
            "containers": [container("a", requests={"cpu": "500m", "memory": "1Gi"})],
            "initContainers": [
                container("side", requests={"cpu": "1"}, restart="Always"),
                container("init", requests={"cpu": "4", "memory": "64Mi"}),
            ],
        },
    ),
    Case(
        "pod-level resources and overhead",
        {
            "containers": [container("a", requests={"cpu": "1"})],
            "resources": {"requests": {"cpu": "3", "memory": "2Gi"}},
            "overhead": {"cpu": "250m"},
        },
    ),
    Case("a limit alone", {"containers": [container("a", limits={"nvidia.com/gpu": "1"})]}),
    Case(
        "MIG profiles",
        {"containers": [container("a", requests={"nvidia.com/mig-1g.10gb": 2})]},
    ),
    Case("no containers", {}),
]


@pytest.fixture(autouse=True)
def empty_book() -> Iterator[None]:
    asks.forget_all()
    yield
    asks.forget_all()


def summed(spec: Mapping[str, Any]) -> tuple[tuple[str, ...], dict[str, int]]:
    mig_names = mig.resource_names(spec)
    return mig_names, effective_requests(spec, RESOURCES + mig_names)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_the_answer_is_the_sum_first_and_kept(case: Case) -> None:
    first = asks.asked(case.spec, RESOURCES)
    again = asks.asked(case.spec, RESOURCES)
    assert first == summed(case.spec) == again


def test_pods_of_one_template_share_one_entry_and_other_templates_get_their_own() -> None:
    one = {"containers": [container("a", requests={"nvidia.com/gpu": "1"})]}
    two = {"containers": [container("a", requests={"nvidia.com/gpu": "2"})]}
    copies = [{**one, "nodeName": f"n{i}", "containers": [dict(c) for c in one["containers"]]}
              for i in range(5)]  # fmt: skip
    for spec in copies:
        assert asks.asked(spec, RESOURCES)[1]["nvidia.com/gpu"] == 1_000_000_000
    assert asks.asked(two, RESOURCES)[1]["nvidia.com/gpu"] == 2_000_000_000
    assert len(asks._book) == 2
    # The counted resources are part of the key: another set is summed for itself.
    assert "example.com/x" in asks.asked(one, (*RESOURCES, "example.com/x"))[1]
    assert len(asks._book) == 3


def test_a_caller_changing_its_totals_does_not_change_the_next_pods() -> None:
    spec = {"containers": [container("a", requests={"nvidia.com/gpu": "1"})]}
    _, totals = asks.asked(spec, RESOURCES)
    totals["nvidia.com/gpu"] = 0
    assert asks.asked(spec, RESOURCES)[1]["nvidia.com/gpu"] == 1_000_000_000


@pytest.mark.parametrize(
    "spec",
    [
        {"containers": [container("a", requests={"cpu": "lots"})]},
        {"containers": [container("a", requests={"cpu": "-1"})]},
        {"containers": "not a list"},
    ],
    ids=["not a quantity", "negative", "containers a string"],
)
def test_a_refusal_is_raised_every_time_and_never_kept(spec: dict[str, Any]) -> None:
    for _ in range(2):
        with pytest.raises(PodRequestError):
            asks.asked(spec, RESOURCES)
    assert not asks._book


def test_the_book_is_bounded_and_drops_the_oldest_first() -> None:
    count = asks.CAPACITY + 8
    specs = [{"containers": [container("a", requests={"cpu": f"{i + 1}m"})]} for i in range(count)]
    for spec in specs:
        asks.asked(spec, RESOURCES)
    assert len(asks._book) == asks.CAPACITY
    keys = [key for _, key in asks._book]
    assert b'"9m"' in keys[0]  # the first eight went
    # Still the right answer for a template that was dropped.
    assert asks.asked(specs[0], RESOURCES)[1]["cpu"] == 1_000_000


class Frozen(Mapping[str, Any]):
    """A spec that is a Mapping but not a dict (orjson does not encode it)."""

    def __init__(self, data: dict[str, Any]) -> None:
        self._data = data

    def __getitem__(self, key: str) -> Any:
        return self._data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)


@pytest.mark.parametrize(
    "spec",
    [
        {"containers": [container("a", requests={"cpu": "1", "nvidia.com/gpu": Frozen({})})]},
        {"containers": [container(f"c{i}", requests={"x" * 40: "1" * 40}) for i in range(80)]},
    ],
    ids=["does not encode", "larger than a key may be"],
)
def test_a_spec_that_cannot_be_a_key_is_summed_every_time(spec: dict[str, Any]) -> None:
    try:
        expected: Any = summed(spec)
    except PodRequestError as error:
        expected = str(error)
    for _ in range(2):
        try:
            got: Any = asks.asked(spec, RESOURCES)
        except PodRequestError as error:
            got = str(error)
        assert got == expected
    assert not asks._book
