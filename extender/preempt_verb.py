"""The preempt verb, and what its approvals become until the preemptor is placed.

preempt answers kube-scheduler with victims (:mod:`extender.preemption` chooses them) and, with
``now``, records what it approved: in the eviction book (:mod:`extender.evictions`), so that
filter can tell its own watch lagging from a full node and the shell can send back a
preemptor whose room is made; and in the departures (:mod:`extender.quotas`), so that reclaim
counts the victims as leaving. The methods here are the doors for those: the victims filter
waits for, the wait settled, the preemptors to retry.

Why a class of its own: these methods share two books (the approvals and the departures) that
no other verb touches, and moving them here keeps :class:`~extender.scheduler.Scheduler`
readable as a list of verbs. It is a mixin: ``Scheduler`` creates the books declared below
(its ``__init__``) and inherits these methods, so callers see one class.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from extender import fields
from extender.dra import ClaimsLedger
from extender.dra_asks import claimed_use
from extender.evictions import EvictionBook
from extender.fields import JSONObject
from extender.gang import GangCoordinator
from extender.inventory import Inventory
from extender.model import Victim
from extender.pending import PendingPods
from extender.policy import PolicyConfig
from extender.preemption import GangVictims, NodeVictims, select_victims
from extender.quotas import Departures, QuotaBook, victim_rule
from extender.requests import pod_request
from extender.tally import Amounts, amounts

__all__ = ["PreemptVerb"]


class PreemptVerb:
    """preempt, and the approvals it leaves: mixed into :class:`~extender.scheduler.Scheduler`,
    which owns the books declared here."""

    config: PolicyConfig
    _inventory: Inventory
    _pending: PendingPods
    _gangs: GangCoordinator
    _quotas: QuotaBook
    _evictions: EvictionBook
    _departures: Departures
    _gang_victims: GangVictims
    _removals_seen: int
    _dra: ClaimsLedger

    def preempt(
        self,
        pod: JSONObject,
        candidates: Mapping[str, Sequence[Victim]],
        *,
        now: float | None = None,
    ) -> dict[str, NodeVictims]:
        """Victims per candidate node worth preempting on (see :mod:`extender.preemption`).
        With ``now`` the answer is remembered for :meth:`awaited_victims` (an empty answer
        replaces an earlier one). Raises :class:`~extender.errors.PodRequestError` for a
        pod whose request cannot be read."""
        chosen = self._victims(pod, candidates, now)
        if now is not None and (uid := fields.text(fields.obj(pod, "metadata"), "uid")):
            approved = {n: v.uids for n, v in chosen.items()}
            self._evictions.record(uid, approved, now)
            if len(self._quotas):
                self._departures.record(uid, approved, now)
                if not approved and len(self._departures):
                    self._evictions.retry(uid)  # the leaving may make its room
        return chosen

    def awaited_victims(
        self, pod: JSONObject, node_names: Sequence[str], now: float
    ) -> tuple[str, ...]:
        """Victims preempt approved for ``pod`` on nodes now offered to it that the
        inventory still holds: kube-scheduler, offering those nodes, has seen them go, and
        schedext's watch is behind. Call :meth:`victims_settled` once the wait ends."""
        if not len(self._evictions):  # the common case, on every filter call
            return ()
        uid = fields.text(fields.obj(pod, "metadata"), "uid")
        if not uid:
            return ()
        held = self._inventory.holding
        return self._evictions.awaited(uid, node_names, lambda v: held(v) is not None, now)

    def victims_settled(self, pod: JSONObject) -> None:
        """The wait for ``pod``'s victims ended (they went, or the wait's bound passed):
        never wait for them again."""
        self._evictions.settle(fields.text(fields.obj(pod, "metadata"), "uid"))

    def take_preemptor_requeues(self) -> list[tuple[str, str]]:
        """(namespace/name, uid) of the preemptors, still pending, whose victims on some node
        schedext has seen all go: the shell has kube-scheduler retry them, which it may not
        do on its own (see extender.evictions)."""
        # Something freed: a pod gone, or approvals forgotten that held others' victims back.
        removals = self._inventory.removals + self._departures.forgotten
        freed = removals != self._removals_seen
        self._removals_seen = removals
        if not len(self._evictions):
            return []
        held = self._inventory.holding
        cleared = self._evictions.cleared(lambda uid: held(uid) is not None, freed=freed)
        return [(r.key, uid) for uid in cleared if (r := self._pending.get(uid)) is not None]

    def _victims(
        self, pod: JSONObject, candidates: Mapping[str, Sequence[Victim]], now: float | None
    ) -> dict[str, NodeVictims]:
        # An unreadable pod raises PodRequestError: filter refused it on every node, and the
        # answer says why (prioritize's words), not an empty list that hides it.
        request = pod_request(pod, gpu_resource=self.config.gpu_resource, shares=self.config.shares)
        group_can_fit = None
        if request.group is not None:
            group_can_fit = self._gangs.eviction_check(request)
            if group_can_fit is None:
                return {}  # its group is unknown: no node is worth preempting on for it
        held = self._inventory.holding
        use = self._departures.deduct(self._namespace_use, held, now)
        taken = (
            self._departures.leaving(held, now, besides=request.uid)
            if now is not None and len(self._departures)
            else frozenset()
        )
        rule = victim_rule(self._quotas, request.namespace, amounts(request), used=use, taken=taken)
        return select_victims(
            self._inventory,
            request,
            candidates,
            self.config,
            gang_victims=self._gang_victims,
            group_can_fit=group_can_fit,
            rule=rule,
        )

    def _namespace_use(self, namespace: str) -> Amounts:
        """What the namespace's quota counts it holds: its pods, and its DRA claims."""
        return claimed_use(self._inventory.namespace_use(namespace), self._dra, namespace)
