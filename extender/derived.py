"""A small cache of values derived from the inventory, valid while a version stands
(:class:`Derived`): filter judges the same few pod shapes again and again, and prioritize
reads what filter derived for the same pod."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import TypeVar

__all__ = ["Derived"]

_T = TypeVar("_T")


class Derived:
    """Values under keys, all forgotten when the version they were derived at changes, and
    at most ``capacity`` of them (pod shapes are few, but pods are not trusted)."""

    def __init__(self, capacity: int = 64) -> None:
        self._capacity = capacity
        self._version: int | None = None
        self._values: dict[Hashable, object] = {}

    def get(self, version: int, key: Hashable, compute: Callable[[], _T]) -> _T:
        """``compute()``, kept under ``key`` while ``version`` stands."""
        if self._version != version:
            self._values.clear()
            self._version = version
        if key in self._values:
            return self._values[key]  # type: ignore[return-value]  # stored by compute
        if len(self._values) >= self._capacity:
            self._values.clear()
        value = self._values[key] = compute()
        return value
