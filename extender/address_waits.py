"""The pods filter turned away for want of an address, to be retried when their pool frees one.

kube-scheduler retries a pod that an extender rejected on the next cluster event it sees (it
files the rejection under a stand-in plugin, "Extender", that every event requeues), and with
an empty active queue it does not wait for the pod's backoff (SchedulerPopFromBackoffQ, on
since 1.33). When a pod holding an address is deleted, kube-scheduler and schedext each learn
it from their own watch: kube-scheduler retries the waiting pods within a millisecond, and
schedext, a step behind, still finds the pool exhausted. Unless another event comes (another
pod bound, updated or deleted, a node changed), they then wait, with the address free, for
kube-scheduler's flush of unschedulable pods (``podMaxInUnschedulablePodsDuration``, five
minutes). kube-scheduler does not watch IPPools at all: a pool made larger, or created after
the pods that ask for it, is no event to it.

So filter records the pods it turned away for an address, under the pools they ask for. When
schedext's own books see an address of such a pool freed (a pod that held it gone, a claim
released) or the pool itself changed, the shell nudges those pods (an update of the pod is an
event kube-scheduler requeues it on), and their retry meets books that already have the
address free. Each rejection is nudged at most once: a nudged pod is forgotten until filter
turns it away again.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

__all__ = ["AddressWaits"]


class AddressWaits:
    """Per pool, the pods waiting for one of its addresses; what freed since the last take."""

    def __init__(self) -> None:
        self._waiting: dict[str, dict[str, str]] = {}  # pool -> uid -> namespace/name
        # Only for pools that have waiters, until the next take: an address a pod stopped
        # holding (by pool), and the pools whose spec changed.
        self._vacated: dict[int, str] = {}
        self._changed: set[str] = set()

    def __len__(self) -> int:
        """How many pods wait."""
        return len({uid for waiters in self._waiting.values() for uid in waiters})

    def wait(self, pools: Iterable[str], uid: str, pod: str) -> None:
        """Filter turned pod ``uid`` (``pod``: namespace/name) away for an address of
        ``pools``."""
        for pool in pools:
            self._waiting.setdefault(pool, {})[uid] = pod

    def forget(self, uid: str) -> None:
        for pool in [p for p, waiters in self._waiting.items() if uid in waiters]:
            waiters = self._waiting[pool]
            del waiters[uid]
            if not waiters:
                del self._waiting[pool]

    def vacated(self, pool: str, address: int) -> None:
        """A pod no longer holds ``address``, or no claim keeps it (``pool``: its pool)."""
        if pool in self._waiting:
            self._vacated[address] = pool

    def changed(self, pool: str) -> None:
        """The pool's spec was created or changed: it may have addresses for its waiters."""
        if pool in self._waiting:
            self._changed.add(pool)

    def take(self, held: Callable[[int], bool]) -> list[tuple[str, str]]:
        """(namespace/name, uid) of the pods waiting on a pool that freed an address or
        changed since the last call, forgotten here. An address vacated and then ``held``
        again (a pod's holding rewritten, or another pod taking it) frees nothing."""
        if not self._vacated and not self._changed:
            return []
        pools = {pool for address, pool in self._vacated.items() if not held(address)}
        pools |= self._changed
        self._vacated.clear()
        self._changed.clear()
        due: dict[str, str] = {}
        for pool in pools:
            due.update(self._waiting.pop(pool, {}))
        for uid in due:
            self.forget(uid)  # it may wait on other pools as well: one nudge is enough
        return sorted((pod, uid) for uid, pod in due.items())
