"""What pods take, summed per namespace: the figures team quotas are judged on.

:class:`Amounts` names the kinds a quota can count, in the core's integer units.
:class:`NamespaceTally` keeps their sums per namespace as pods come and go, so that a
question about one namespace costs a dictionary lookup, never a pass over every pod: the
inventory keeps one for what pods hold (bound or reserved), the pending pods one for what
waits to be placed.
"""

from __future__ import annotations

from typing import NamedTuple

from extender.model import Demand

__all__ = ["ZERO", "Amounts", "NamespaceTally", "amounts"]


class Amounts(NamedTuple):
    """What a pod takes, or a namespace's pods together, by kind."""

    gpus: int = 0  # whole GPUs
    share_memory_mib: int = 0  # GPU shares: MiB of device memory, over all their devices
    share_cores: int = 0  # GPU shares: percent of a device's SMs, over all their devices
    cpu_milli: int = 0
    memory_bytes: int = 0

    def plus(self, other: Amounts) -> Amounts:
        return Amounts(*(a + b for a, b in zip(self, other, strict=True)))


ZERO = Amounts()


def amounts(demand: Demand) -> Amounts:
    """What ``demand`` takes. A share counts on each of its devices; MIG devices are not
    counted (no quota kind names them)."""
    return Amounts(
        demand.gpus,
        demand.shares * demand.share_memory_mib,
        demand.shares * demand.share_cores,
        demand.cpu_milli,
        demand.memory_bytes,
    )


class NamespaceTally:
    """Per namespace, the sum of what the demands added and not removed take. The caller
    removes exactly the value it added (the same holding, the same request)."""

    def __init__(self) -> None:
        # namespace -> [how many demands, then one sum per kind of Amounts]
        self._sums: dict[str, list[int]] = {}

    def add(self, demand: Demand) -> None:
        sums = self._sums.get(demand.namespace)
        if sums is None:
            sums = self._sums[demand.namespace] = [0] * (len(ZERO) + 1)
        sums[0] += 1
        for i, amount in enumerate(amounts(demand), 1):
            sums[i] += amount

    def remove(self, demand: Demand) -> None:
        sums = self._sums.get(demand.namespace)
        if sums is None:
            return
        sums[0] -= 1
        if sums[0] <= 0:
            del self._sums[demand.namespace]
            return
        for i, amount in enumerate(amounts(demand), 1):
            sums[i] -= amount

    def of(self, namespace: str) -> Amounts:
        sums = self._sums.get(namespace)
        return ZERO if sums is None else Amounts(*sums[1:])
