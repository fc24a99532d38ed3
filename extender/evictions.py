"""The victims preempt approved, per preemptor, until the preemptor is placed or gone.

kube-scheduler picks one of the nodes preempt answered, deletes the victims listed for it,
and schedules the preemptor again as soon as it sees them go. Its informers and schedext's
run apart. When kube-scheduler's run ahead, its own filters already find the node free while
schedext still sees the victims on it, and schedext's filter rejects the node. A node that
only an extender rejects is never offered for preemption (kubernetes issue #139270), so
kube-scheduler preempts again on another node: pods evicted for nothing, and the preemptor
left waiting in the unschedulable queue. The end-to-end tests saw exactly that under load.

This book lets filter recognise the moment: the preemptor is offered a node whose approved
victims schedext still holds. The shell then waits, briefly, for the watch to catch up
(``app.service.victims``). One wait per approval: whatever ends it (the victims seen gone, or the
wait's bound), the entry is settled, so that a node kube-scheduler offers for another reason
(victims it does not need gone, still terminating) costs at most one short wait.

It also tells when a preemptor's room is made: every victim approved on one of its nodes is
seen gone (:meth:`EvictionBook.cleared`). kube-scheduler retries a preemptor on the deletions
it sees, but its asynchronous preemption can nominate two preemptors on one node; the room
then goes to one, the other's retry finds the node full, and later deletions are no event
it waits for. The end-to-end tests saw such a pod wait, with a GPU free, for kube-scheduler's
five-minute flush. The shell nudges a cleared preemptor that is still pending, and again
when schedext next sees something freed, a few times at most (``retries``).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

__all__ = ["EvictionBook"]


@dataclass(frozen=True, slots=True)
class _Approval:
    victims: Mapping[str, frozenset[str]]  # node name -> victim UIDs approved there
    expires_at: float


class EvictionBook:
    """Bounded in size and time: an approval outlives neither ``ttl_s`` nor ``capacity``
    newer ones."""

    def __init__(self, *, ttl_s: float = 120.0, capacity: int = 10_000, retries: int = 3) -> None:
        if ttl_s <= 0 or capacity < 1:
            raise ValueError("ttl_s must be > 0 and capacity >= 1")
        self._ttl_s = ttl_s
        self._capacity = capacity
        self._retries = retries
        self._approvals: dict[str, _Approval] = {}
        # Cleared preemptors, still to be nudged when something is freed: nudges left.
        self._retry: OrderedDict[str, int] = OrderedDict()

    def __len__(self) -> int:
        return len(self._approvals) + len(self._retry)

    def knows(self, preemptor: str) -> bool:
        """Whether an approval or a nudge of ``preemptor`` is kept."""
        return preemptor in self._approvals or preemptor in self._retry

    def record(self, preemptor: str, victims: Mapping[str, Iterable[str]], now: float) -> None:
        """Preempt approved ``victims`` (per node) for ``preemptor``: replaces any earlier
        approval for it (kube-scheduler acts on the latest answer only)."""
        approved = {node: frozenset(uids) for node, uids in victims.items() if uids}
        self._approvals.pop(preemptor, None)
        if not approved:
            return
        self._approvals[preemptor] = _Approval(approved, now + self._ttl_s)
        while len(self._approvals) > self._capacity:
            del self._approvals[next(iter(self._approvals))]  # the oldest approval

    def awaited(
        self,
        preemptor: str,
        node_names: Sequence[str],
        still_held: Callable[[str], bool],
        now: float,
    ) -> tuple[str, ...]:
        """The approved victims, on the nodes offered in ``node_names``, that schedext still
        holds: what filter should wait for before judging those nodes. Sorted; empty when
        there is nothing to wait for."""
        approval = self._approvals.get(preemptor)
        if approval is None:
            return ()
        if now >= approval.expires_at:
            del self._approvals[preemptor]
            return ()
        nodes = approval.victims
        offered = {name for name in node_names if name in nodes}
        return tuple(sorted(uid for node in offered for uid in nodes[node] if still_held(uid)))

    def cleared(self, still_held: Callable[[str], bool], *, freed: bool) -> list[str]:
        """The preemptors to nudge: those with a node whose approved victims are all gone
        (settled: their approval is forgotten), and, when ``freed`` (a pod was seen gone
        since the last call), those cleared before, while they have nudges left. The caller
        passes on only those still pending; :meth:`settle` ends a preemptor's nudges."""
        again = []
        if freed:
            for preemptor in list(self._retry):
                again.append(preemptor)
                self._retry[preemptor] -= 1
                if not self._retry[preemptor]:
                    del self._retry[preemptor]
        done = [
            preemptor
            for preemptor, approval in self._approvals.items()
            if any(not any(map(still_held, uids)) for uids in approval.victims.values())
        ]
        for preemptor in done:
            del self._approvals[preemptor]
            if self._retries:
                self._retry[preemptor] = self._retries
        while len(self._retry) > self._capacity:
            self._retry.popitem(last=False)
        return again + done

    def retry(self, preemptor: str) -> None:
        """Nudge ``preemptor`` when something is next freed (a few times at most): preempt
        found no victims for it while others were still leaving (see
        :mod:`extender.quotas.departures`), so their going may make its room."""
        if self._retries and preemptor not in self._retry:
            self._retry[preemptor] = self._retries
            while len(self._retry) > self._capacity:
                self._retry.popitem(last=False)

    def settle(self, preemptor: str) -> None:
        """Forget the preemptor's approval: its wait ended, it was placed, or it is gone."""
        self._approvals.pop(preemptor, None)

    def placed(self, preemptor: str) -> None:
        """The preemptor was placed or is gone: forget it, nudges included."""
        self.settle(preemptor)
        self._retry.pop(preemptor, None)
