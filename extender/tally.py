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
        return Amounts(
            self[0] + other[0],
            self[1] + other[1],
            self[2] + other[2],
            self[3] + other[3],
            self[4] + other[4],
        )

    def minus(self, other: Amounts) -> Amounts:
        return Amounts(
            self[0] - other[0],
            self[1] - other[1],
            self[2] - other[2],
            self[3] - other[3],
            self[4] - other[4],
        )


ZERO = Amounts()


def amounts(demand: Demand) -> Amounts:
    """What ``demand`` takes. A share counts on each of its devices; MIG devices are not
    counted (no quota kind names them)."""
    return Amounts(
        demand.gpus,
        demand.share.devices * demand.share.memory_mib,
        demand.share.devices * demand.share.cores,
        demand.cpu_milli,
        demand.memory_bytes,
    )


class NamespaceTally:
    """Per namespace, the sum of what the demands added and not removed take. The caller
    removes exactly the value it added (the same holding, the same request). The sums are
    rebuilt on each change so that reading one (filter, every call) builds nothing."""

    def __init__(self) -> None:
        self._sums: dict[str, tuple[int, Amounts]] = {}  # namespace -> (how many, their sum)

    def add(self, demand: Demand) -> None:
        count, total = self._sums.get(demand.namespace, (0, ZERO))
        self._sums[demand.namespace] = (count + 1, total.plus(amounts(demand)))

    def remove(self, demand: Demand) -> None:
        entry = self._sums.get(demand.namespace)
        if entry is None:
            return
        count, total = entry
        if count <= 1:
            del self._sums[demand.namespace]
        else:
            self._sums[demand.namespace] = (count - 1, total.minus(amounts(demand)))

    def of(self, namespace: str) -> Amounts:
        entry = self._sums.get(namespace)
        return ZERO if entry is None else entry[1]
