"""Which pods preempt may choose, by their namespaces' quotas (see :mod:`extender.quotas`).

* A namespace **within its min** (its quota states a min, and its use is at most its min in
  every kind with one) is never a victim of another namespace's preemptor: its guarantee
  holds whatever the priorities. Nor is a borrower taken below its min: another namespace's
  preemptor may take from it at most what it holds over its min, in each kind it is over
  in (:meth:`VictimRule.affordable`), so a team with one GPU borrowed loses one GPU, not
  the two a preemptor may need.
* **Reclaim**: a preemptor whose namespace stays within its min with the pod (in every kind
  its quota states a min for, and the pod asks for one of them) takes back what others
  borrowed: its
  victims come first from the namespaces over their min (borrowers), lowest priority first;
  only when borrowers alone cannot free enough do others (its own namespace's lower-priority
  pods, namespaces without a quota) come in.
* Without quotas, and for a preemptor that does not reclaim, the victims are chosen by
  priority as before, within-min namespaces aside.

kube-scheduler proposes only pods of lower priority than the preemptor and calls the
extender on nodes where those could make room, so a reclaim takes back only what
lower-priority pods borrowed: a borrower of equal or higher priority keeps its place.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from extender.model import Holding
from extender.quotas.admission import Use
from extender.quotas.book import QuotaBook
from extender.quotas.spec import Kind
from extender.tally import ZERO, Amounts, amounts

__all__ = ["VictimRule", "victim_rule"]


@dataclass(frozen=True, slots=True)
class VictimRule:
    """Which pods may be victims for one preemptor, and which go first."""

    protected: frozenset[str]  # namespaces whose pods are never victims
    borrowers: frozenset[str]  # namespaces over their min
    reclaim: bool  # the preemptor takes back borrowed capacity: borrowers go first
    # Other namespaces over their min: what each holds over it, in the kinds it is over in.
    excess: Mapping[str, tuple[tuple[Kind, int], ...]] = field(default_factory=dict)
    # Victims already approved for other preemptors and maybe leaving (Departures.leaving):
    # a pod that goes makes room for one preemptor, so it is not offered to a second.
    taken: frozenset[str] = frozenset()

    def allows(self, holding: Holding) -> bool:
        return holding.namespace not in self.protected and holding.uid not in self.taken

    def first(self, holding: Holding) -> bool:
        return self.reclaim and holding.namespace in self.borrowers

    def affordable(self, victims: Iterable[Holding]) -> bool:
        """Whether evicting ``victims`` leaves every other namespace at or over its min."""
        if not self.excess:
            return True
        taken: dict[str, Amounts] = {}
        for holding in victims:
            if holding.namespace in self.excess:
                total = taken.get(holding.namespace, ZERO)
                taken[holding.namespace] = total.plus(amounts(holding))
        return all(
            total[kind] <= room
            for namespace, total in taken.items()
            for kind, room in self.excess[namespace]
        )


def victim_rule(
    book: QuotaBook,
    namespace: str,
    asked: Amounts,
    *,
    used: Use,
    taken: frozenset[str] = frozenset(),
) -> VictimRule | None:
    """The rule for a preemptor of ``namespace`` that asks for ``asked``; None without quotas
    (preemption as it always was). ``taken``: victims other preemptors may be taking."""
    if not len(book):
        return None
    protected: set[str] = set()
    borrowers: set[str] = set()
    excess: dict[str, tuple[tuple[Kind, int], ...]] = {}
    for quota in book.quotas():
        guarantees = quota.guarantees
        if not guarantees:
            continue  # a ceiling alone guarantees nothing
        use = used(quota.namespace)
        over = tuple(
            (limit.kind, use[limit.kind] - limit.min)
            for limit in guarantees
            if use[limit.kind] > limit.min
        )
        if over:
            borrowers.add(quota.namespace)
            if quota.namespace != namespace:
                excess[quota.namespace] = over
        elif quota.namespace != namespace:
            protected.add(quota.namespace)
    own = book.applying(namespace)
    reclaim = False
    if own is not None and any(asked[limit.kind] for limit in own.guarantees):
        use = used(namespace)
        reclaim = all(use[limit.kind] + asked[limit.kind] <= limit.min for limit in own.guarantees)
    return VictimRule(frozenset(protected), frozenset(borrowers), reclaim, excess, taken)
