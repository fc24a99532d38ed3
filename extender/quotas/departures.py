"""The victims preempt approved that may be on their way out, counted per namespace, so that
reclaim does not take a team below its min twice over while schedext's watch lags.

Preempt approves victims per candidate node; kube-scheduler picks one node, deletes its
victims and goes on. Until schedext's watch sees them go, they still count in their
namespace's use. Meanwhile kube-scheduler may preempt again: its asynchronous preemption can
nominate two preemptors on one node, so that one of them preempts a second time, or another
preemptor comes along. If the victims' namespace still looks over its min, preempt approves a
second round that takes it below. The end-to-end tests saw exactly that under load: team-a
evicted down to 2 pods with a min of 4.

So :meth:`Departures.going` tells, per namespace, how much of its use may be leaving. For
each approval it counts the victims still held on the node kube-scheduler is taking them
from. Once some victim of the approval is seen gone, that node is known, and a victim that
several approvals named there counts once. Before that, the node with the most of the
namespace is assumed, for each approval apart: two preemptors offered the same victims may
be taking from two different nodes. The count errs towards protecting a namespace, which
costs a preemptor a retry at worst, never a pod: kube-scheduler deletes a chosen node's
victims at once, so the node is soon known, and an approval it never acted on (it found no
node worth it after all) is forgotten after ``ttl_s``. A preemptor turned away meanwhile
is sent back once its victims are seen gone (:mod:`extender.evictions`).

An approval kube-scheduler did not act on (it asked again for the same pod, or placed it
elsewhere) would count until ``ttl_s``, and so hold other preemptors back for two minutes.
But once a preemptor is seen placed, every victim deleted for it has been seen gone before:
kube-scheduler deletes the victims before it binds the pod, and one watch brings a pod's
events in the order they were written. So :meth:`Departures.placed` forgets all of a placed
(or deleted) preemptor's approvals at once: those it acted on count nothing more, and the
rest never will.

Only the victim rule reads this. Admission goes on counting a leaving pod until it is gone,
which never lets a namespace past its max.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from extender.model import Holding
from extender.quotas.admission import Use
from extender.tally import ZERO, Amounts, amounts

__all__ = ["Departures"]


@dataclass(frozen=True, slots=True)
class _Approval:
    preemptor: str  # its UID
    victims: Mapping[str, frozenset[str]]  # node name -> victim UIDs approved there
    expires_at: float


class Departures:
    """Bounded in size and time: an approval outlives neither ``ttl_s`` nor ``capacity``
    newer ones, and is dropped as soon as none of its victims is held."""

    def __init__(self, *, ttl_s: float = 120.0, capacity: int = 10_000) -> None:
        if ttl_s <= 0 or capacity < 1:
            raise ValueError("ttl_s must be > 0 and capacity >= 1")
        self._ttl_s = ttl_s
        self._capacity = capacity
        self._approvals: list[_Approval] = []
        self.forgotten = 0  # approvals dropped by :meth:`placed`, ever: room may have come

    def __len__(self) -> int:
        return len(self._approvals)

    def knows(self, preemptor: str) -> bool:
        """Whether an approval of ``preemptor`` is kept (a scan of the few there are)."""
        return any(a.preemptor == preemptor for a in self._approvals)

    def record(self, preemptor: str, victims: Mapping[str, Iterable[str]], now: float) -> None:
        """Preempt approved ``victims`` (per node) for ``preemptor``. Unlike the eviction
        book, a later answer for the same preemptor does not replace this one: kube-scheduler
        may already be deleting what it approved."""
        approved = {node: frozenset(uids) for node, uids in victims.items() if uids}
        if not approved:
            return
        self._approvals.append(_Approval(preemptor, approved, now + self._ttl_s))
        if len(self._approvals) > self._capacity:
            del self._approvals[: len(self._approvals) - self._capacity]  # the oldest

    def placed(self, preemptor: str) -> bool:
        """``preemptor`` was seen bound, or gone: forget its approvals (see the module's
        docstring); whether there were any."""
        kept = [a for a in self._approvals if a.preemptor != preemptor]
        dropped = len(self._approvals) - len(kept)
        self._approvals = kept
        self.forgotten += dropped
        return bool(dropped)

    def deduct(self, use: Use, held: Callable[[str], Holding | None], now: float | None) -> Use:
        """``use`` less what may be leaving (:meth:`going`): the victim rule's view of which
        namespaces are within their min. ``use`` itself when nothing is (or no ``now``)."""
        if now is None or not self._approvals:
            return use
        going = self.going(held, now)
        if not going:
            return use
        return lambda namespace: use(namespace).minus(going.get(namespace, ZERO))

    def leaving(
        self, held: Callable[[str], Holding | None], now: float, *, besides: str
    ) -> frozenset[str]:
        """The victims still held that other preemptors than ``besides`` may be taking: on
        the node kube-scheduler chose, once known, else on every node approved. kube-
        scheduler's asynchronous preemption can pick a victim already being deleted for
        another preemptor (its cache lags its own deletions), and one pod going makes room
        for one preemptor: offered again, it leaves the second without room, and with a
        team at its min, without any other victim either (the lagging reclaim test saw the
        four preemptors of team-b get three victims, and wait)."""
        taken: set[str] = set()
        for approval in self._approvals:
            if approval.preemptor == besides or now >= approval.expires_at:
                continue
            still = _still_held(approval, held)
            if still is not None:
                taken.update(h.uid for holdings in still[0].values() for h in holdings)
        return frozenset(taken)

    def going(self, held: Callable[[str], Holding | None], now: float) -> dict[str, Amounts]:
        """Per namespace, what its pods still held but approved as victims may add up to:
        the part of its use that may be leaving. Where the node is known, a victim counts
        once however many approvals named it; where it is not, each approval counts its
        worst case (two preemptors may be taking from two nodes)."""
        known: dict[str, Holding] = {}  # uid -> holding, on nodes known to be chosen
        guessed: dict[str, Amounts] = {}  # namespace -> worst cases, summed
        live: list[_Approval] = []
        for approval in self._approvals:
            if now >= approval.expires_at:
                continue
            still = _still_held(approval, held)
            if still is None:
                continue  # every victim went: settled
            live.append(approval)
            nodes, chosen = still
            if chosen:
                known.update((h.uid, h) for hs in nodes.values() for h in hs)
                continue
            for namespace, total in _worst(nodes).items():
                guessed[namespace] = guessed.get(namespace, ZERO).plus(total)
        self._approvals = live
        totals = dict(guessed)
        for holding in known.values():
            totals[holding.namespace] = totals.get(holding.namespace, ZERO).plus(amounts(holding))
        return totals


def _still_held(
    approval: _Approval, held: Callable[[str], Holding | None]
) -> tuple[dict[str, list[Holding]], bool] | None:
    """The victims still held, per node kube-scheduler may be taking them from, and whether
    that node is known; None when none is held. A node where a victim is already gone is the
    one it chose (the others' victims stay), so only such nodes remain once there is one."""
    still: dict[str, list[Holding]] = {}
    chosen: set[str] = set()
    for node, uids in approval.victims.items():
        holdings = [h for uid in uids if (h := held(uid)) is not None]
        if len(holdings) < len(uids):
            chosen.add(node)
        if holdings:
            still[node] = holdings
    if chosen:
        still = {node: hs for node, hs in still.items() if node in chosen}
    return (still, bool(chosen)) if still else None


def _worst(nodes: Mapping[str, list[Holding]]) -> dict[str, Amounts]:
    """Per namespace among the victims, what the node taking the most of it takes."""
    worst: dict[str, Amounts] = {}
    for holdings in nodes.values():
        per_namespace: dict[str, Amounts] = {}
        for holding in holdings:
            total = per_namespace.get(holding.namespace, ZERO)
            per_namespace[holding.namespace] = total.plus(amounts(holding))
        for namespace, total in per_namespace.items():
            if namespace not in worst or total > worst[namespace]:
                worst[namespace] = total
    return worst
