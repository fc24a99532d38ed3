"""The quota book: the ElasticQuotas by namespace, and which one applies where.

scheduler-plugins allows one ElasticQuota per namespace and leaves a second one undefined.
Here every quota is kept, and the **oldest** of a namespace applies (creationTimestamp, then
name): a new quota never silently replaces the one a team has been living under, and
deleting the one that applies lets the next oldest take over. The others are *shadowed*
(:meth:`QuotaBook.shadowed`), for the shell to warn about.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

from extender.quotas.spec import Kind, Limit, QuotaSpec

__all__ = ["QuotaBook", "Shadowed"]


class Shadowed(NamedTuple):
    """A quota that does not apply, because ``by`` (older) applies to its namespace."""

    quota: QuotaSpec
    by: QuotaSpec


class QuotaBook:
    def __init__(self) -> None:
        self._specs: dict[str, dict[str, QuotaSpec]] = {}  # namespace -> name -> spec
        self._applying: dict[str, QuotaSpec] = {}  # namespace -> the oldest of its quotas
        self.version = 0  # bumped on every change
        # Per kind, the applying quotas that state a min for it (filter asks on every call of
        # a borrowing pod): kept until the quotas change.
        self._guarantors: dict[Kind, tuple[tuple[QuotaSpec, Limit], ...]] = {}

    def __len__(self) -> int:
        """How many namespaces have a quota."""
        return len(self._applying)

    # ------------------------------------------------------------------ reads

    def applying(self, namespace: str) -> QuotaSpec | None:
        """The quota that applies to ``namespace``; None: it has none."""
        return self._applying.get(namespace)

    def quotas(self) -> list[QuotaSpec]:
        """The quotas that apply, one per namespace, by namespace."""
        return [self._applying[ns] for ns in sorted(self._applying)]

    def guarantors(self, kind: Kind) -> tuple[tuple[QuotaSpec, Limit], ...]:
        """The quotas that apply and state a min for ``kind``, each with that limit: those
        that take part in borrowing it."""
        cached = self._guarantors.get(kind)
        if cached is None:
            cached = self._guarantors[kind] = tuple(
                (spec, limit)
                for spec in self.quotas()
                if (limit := spec.limit(kind)) is not None and limit.guarantees
            )
        return cached

    def shadowed(self) -> list[Shadowed]:
        """The quotas that do not apply, each with the one that applies in its namespace."""
        return [
            Shadowed(spec, self._applying[ns])
            for ns in sorted(self._specs)
            for name, spec in sorted(self._specs[ns].items())
            if spec is not self._applying[ns]
        ]

    # ---------------------------------------------------------------- changes

    def upsert(self, spec: QuotaSpec) -> None:
        self._specs.setdefault(spec.namespace, {})[spec.name] = spec
        self._settle(spec.namespace)

    def delete(self, namespace: str, name: str) -> None:
        specs = self._specs.get(namespace)
        if specs is not None and specs.pop(name, None) is not None:
            self._settle(namespace)

    def replace(self, specs: Iterable[QuotaSpec]) -> None:
        """Make the quotas exactly ``specs`` (a relist)."""
        self._specs = {}
        for spec in specs:
            self._specs.setdefault(spec.namespace, {})[spec.name] = spec
        self._applying = {}
        for namespace in list(self._specs):
            self._settle(namespace)

    def _settle(self, namespace: str) -> None:
        self.version += 1
        self._guarantors.clear()
        specs = self._specs.get(namespace)
        if not specs:
            self._specs.pop(namespace, None)
            self._applying.pop(namespace, None)
            return
        self._applying[namespace] = min(specs.values(), key=lambda s: s.age_key)
