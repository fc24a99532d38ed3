"""The core's front door: one method per extender verb, and the intake of cluster events.

:class:`Scheduler` is a facade. It owns the books (the inventory, the pending pods, the gang
book, the approved evictions, the StatefulSet identities, the team quotas) and hands each
question to the room that answers it: filter to :mod:`extender.quotas` (a pod over its team's
quota goes no further) and :mod:`extender.policy`, prioritize to :mod:`extender.scoring`,
preempt to :mod:`extender.preemption`, bind to :mod:`extender.binding`, whatever concerns a
gang to :class:`~extender.gang.GangCoordinator`, and cluster events to
:class:`~extender.intake.Intake`. Verbs take decoded values and return values; time is passed
in (``now``), never read.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from extender import binding, fields, policy, scoring, shortlist
from extender.capacity_waits import Nudge, WaitBook
from extender.choices import ChoiceBook
from extender.errors import BindRefusedError
from extender.evictions import EvictionBook
from extender.explain import explain_pod
from extender.fields import JSONObject
from extender.gang import OPEN, GangCoordinator, GangEvent, GangGate, PodGroupSpec
from extender.intake import Books, Intake
from extender.inventory import IdArray, Inventory, InventoryConflictError
from extender.ipam import IPClaimSpec
from extender.model import (
    BindPlan,
    Explanation,
    FilterVerdict,
    GroupStatus,
    Holding,
    PodRequest,
    QuotaHold,
    Reason,
    Victim,
)
from extender.pending import PendingPods
from extender.policy import PolicyConfig
from extender.preemption import GangVictims, NodeVictims, select_victims
from extender.quotas import Departures, QuotaBook, QuotaSpec, Shadowed, admit, victim_rule
from extender.requests import PodRequestError, pod_request
from extender.scoring import ScoreArray
from extender.statefulsets import StatefulSetBook
from extender.tally import amounts
from extender.wakeups import WakeUps

__all__ = ["Scheduler"]


class Scheduler(Intake):
    """The verbs, and (from :class:`~extender.intake.Intake`) the intake of cluster events."""

    def __init__(
        self,
        config: PolicyConfig | None = None,
        *,
        pending_capacity: int = 10_000,
        reservation_ttl: float = 60.0,
        gang_timeout_s: float = 20.0,
        gang_max_wait_s: float = 20.0,
        gang_victims: GangVictims = GangVictims.PROTECT,
        victim_memory_s: float = 120.0,
    ) -> None:
        if reservation_ttl <= 0:
            raise ValueError("reservation_ttl must be > 0")
        self.config = config = config or PolicyConfig()
        # The weighted scorers, resolved once (a scorer named that does not exist fails here).
        self._scorers = scoring.weights(config)
        self._reservation_ttl = reservation_ttl
        self._gang_victims = gang_victims
        self._quotas = QuotaBook()
        # The pods filter turned away, sent back when what they wait for is freed (see
        # extender.capacity_waits): the inventory tells it what it frees.
        book = WaitBook(per_event=config.requeue_per_event, capacity=pending_capacity)
        self._wakeups = WakeUps(book, self._quotas)
        self._inventory = Inventory(
            rack_label=config.rack_label,
            zone_label=config.zone_label,
            use_stale_s=config.live_use_stale_s,
            vacancies=self._wakeups,
        )
        self._pending = PendingPods(pending_capacity)
        self._gangs = GangCoordinator(
            self._inventory, config, default_timeout_s=gang_timeout_s, max_wait_s=gang_max_wait_s
        )
        # What preempt approved, so that filter can tell its own watch lagging behind
        # kube-scheduler's from a node that is really full (see extender.evictions).
        self._evictions = EvictionBook(ttl_s=victim_memory_s, capacity=pending_capacity)
        # The inventory's removals and the approvals forgotten when preemptors were last nudged.
        self._removals_seen = 0
        self._statefulsets = StatefulSetBook()
        # How the pods schedext rated were placed: offers are made at filter or prioritize
        # and taken at bind, so the few in flight matter, not every pending pod.
        self._choices = ChoiceBook(capacity=min(pending_capacity, 1024))
        # What reclaim's earlier approvals may be taking away while the watch lags.
        self._departures = Departures(ttl_s=victim_memory_s, capacity=pending_capacity)
        super().__init__(
            Books(
                inventory=self._inventory,
                pending=self._pending,
                gangs=self._gangs.book,
                evictions=self._evictions,
                departures=self._departures,
                statefulsets=self._statefulsets,
                gpu_resource=config.gpu_resource,
                shares=config.shares,
                quotas=self._quotas,
                wakeups=self._wakeups,
            )
        )
        # kube-scheduler sends prioritize exactly the list filter returned; remembering the
        # last one saves the name lookups (filter's own input order varies call to call).
        self._last_passed: tuple[Sequence[str], IdArray, int] | None = None
        # The same pod comes through filter and then prioritize (and again on every retry).
        self._last_request: tuple[str, str, PodRequest] | None = None

    @property
    def inventory(self) -> Inventory:
        return self._inventory

    @property
    def pending_count(self) -> int:
        return len(self._pending)

    def pending_pods(self, limit: int) -> tuple[PodRequest, ...]:
        """The first ``limit`` pending pods, by namespace and name."""
        return self._pending.listing(limit)

    @property
    def reservation_count(self) -> int:
        return self._inventory.reservation_count

    # ------------------------------------------------------------------ verbs

    def filter(self, pod: JSONObject, node_names: Sequence[str]) -> FilterVerdict:
        try:
            request = self._request(pod)
        except PodRequestError as error:
            self._pending.refuse(fields.text(fields.obj(pod, "metadata"), "uid"), error.reason)
            return policy.reject_all(node_names, error.reason, Reason.INVALID_POD)
        self._pending.remember(request)
        gate = self._gangs.filter(request, node_names) if request.group is not None else OPEN
        if gate.verdict is not None:
            return gate.verdict
        hold = self._quota_hold(request)
        if hold is not None:
            self._wakeups.held_back(request, hold)
            return policy.reject_all(node_names, hold.message, hold.reason)
        verdict, passed_ids = self._judge(request, node_names, gate)
        size = self.config.shortlist_size(soft_preferences=request.soft_preferences)
        if size and verdict.passed:
            scores = self._score(request, passed_ids)
            ties = self.config.shortlist_preferred
            verdict, passed_ids, scores = shortlist.cut(
                verdict, passed_ids, scores, size, ties=ties
            )
            self._choices.offer(request.uid, passed_ids, scores, self._inventory.layout)
        self._last_passed = (verdict.passed, passed_ids, self._inventory.layout)
        if not verdict.passed:
            self._wakeups.turned_away(self._inventory, request, verdict)
        return verdict

    def prioritize(self, pod: JSONObject, node_names: Sequence[str]) -> ScoreArray:
        """Scores aligned with ``node_names``; raises :class:`PodRequestError` for a pod
        whose request cannot be read (filter rejected it everywhere, with the same words)."""
        request = self._request(pod)
        ids = self._ids(node_names)
        scores = self._score(request, ids)
        self._choices.offer(request.uid, ids, scores, self._inventory.layout)
        return scores

    def preempt(
        self,
        pod: JSONObject,
        candidates: Mapping[str, Sequence[Victim]],
        *,
        now: float | None = None,
    ) -> dict[str, NodeVictims]:
        """Victims per candidate node worth preempting on (see :mod:`extender.preemption`).
        With ``now`` the answer is remembered for :meth:`awaited_victims` (an empty answer
        replaces an earlier one)."""
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

    def plan_bind(self, *, uid: str, namespace: str, name: str, node: str, now: float) -> BindPlan:
        """Re-check the pod against the current inventory, choose its GPUs and reserve them.
        The caller performs the bind, then calls :meth:`confirm_bind` or :meth:`abort_bind`."""
        self._inventory.expire(now)
        request = binding.bindable(
            self._inventory, self._pending, self.config,
            uid=uid, namespace=namespace, name=name, node=node,
        )  # fmt: skip
        hold = self._quota_hold(request)  # what filter admitted may have been taken since
        if hold is not None:
            raise BindRefusedError(f"pod {request.key}: {hold.message}")
        expires_at = now + self._reservation_ttl
        holding = binding.reservation(
            self._inventory,
            request,
            node,
            expires_at=expires_at,
            placement=self.config.share_placement,
        )
        try:
            self._inventory.reserve(holding)
        except InventoryConflictError as error:
            raise BindRefusedError(f"pod {request.key}: {error}") from None
        if request.group is not None:
            self._gangs.admit(request, holding, now)
        plan = binding.plan(self._inventory, request, holding)
        node_id = int(self._inventory.ids([node])[0]) or None
        return replace(plan, choice=self._choices.take(uid, node_id, self._inventory.layout))

    def confirm_bind(self, plan: BindPlan, *, awaiting_watch: bool = False) -> None:
        """The bind went through (see :func:`extender.binding.confirm`)."""
        self._pending.forget(plan.uid)
        binding.confirm(self._inventory, plan, awaiting_watch=awaiting_watch)

    def abort_bind(self, plan: BindPlan) -> None:
        """The bind failed: give the reserved resources back."""
        binding.abort(self._inventory, plan)

    def doubt_bind(self, plan: BindPlan, *, now: float) -> None:
        """The bind's outcome is unknown: keep what it reserved until the watch settles it, or
        for the reservation's time (see :func:`extender.binding.doubt`)."""
        binding.doubt(self._inventory, plan, expires_at=now + self._reservation_ttl)

    def age_live_use(self, wall_now: float) -> None:
        """Ignore node agents' live-use samples older than ``live_use_stale_s`` at
        ``wall_now`` (Unix seconds: samples carry the agent's wall-clock time)."""
        self._inventory.age_use(wall_now)

    def expire(self, now: float) -> list[Holding]:
        """Drop stale reservations and end the waits of gangs past their timeout."""
        self._gangs.expire(now)
        return self._inventory.expire(now)

    def time_out_group(self, group: str) -> None:
        """End the group's wait at the bind barrier (see GangCoordinator.time_out). The shell
        calls this when a waiting bind's own timer fires, even if ``now`` has not yet reached
        the deadline by the core's clock."""
        self._gangs.time_out(group)

    def explain(self, namespace: str, name: str) -> Explanation | None:
        """Per node, whether the pod fits and why not, and the score of each node it fits;
        None for a pod schedext does not know."""
        return explain_pod(
            namespace, name, inventory=self._inventory, pending=self._pending,
            gangs=self._gangs, judge=lambda r, names, gate: self._judge(r, names, gate)[0],
            quota=self._quota_hold,
            score=lambda r, names: self._score(r, self._inventory.ids(names)),
        )  # fmt: skip

    def quotas(self) -> list[QuotaSpec]:
        """The team quotas that apply, one per namespace (what each uses:
        ``inventory.namespace_use``)."""
        return self._quotas.quotas()

    def shadowed_quotas(self) -> list[Shadowed]:
        """Second quotas of a namespace, which do not apply (see extender.quotas.book)."""
        return self._quotas.shadowed()

    # ------------------------------------------------------------ gang reads

    def waiting_groups(self) -> list[str]:
        return self._gangs.book.waiting_groups()

    def gang_deadline(self, group: str) -> float | None:
        """When the group's wait at the bind barrier ends; None when it is not waiting."""
        return self._gangs.book.deadline(group)

    def gang_failure(self, group: str) -> GangEvent | None:
        """How the group's last wait at the bind barrier ended without completing (timed out
        or released, with the reason); None when it has not since it last completed."""
        return self._gangs.book.failure(group)

    def take_gang_events(self) -> list[GangEvent]:
        """Effects for the shell: wake (COMPLETE) or fail (RELEASED, TIMED_OUT) waiting binds,
        have kube-scheduler retry the members turned away for missing ones (QUORUM)."""
        return self._gangs.book.take_events()

    def group_status(self, group: str) -> GroupStatus | None:
        return self._gangs.status(group)

    def pod_groups(self) -> list[PodGroupSpec]:
        return self._gangs.book.specs()

    def take_capacity_requeues(self, now: float) -> list[Nudge]:
        """The pods filter turned away, still pending, whose wait schedext has since seen
        end: an address, GPUs, a share's room, a MIG device or quota headroom freed. The
        shell has kube-scheduler retry them, which it may not do on its own (see
        extender.capacity_waits), and calls again at :meth:`next_requeue_at`."""
        return self._wakeups.take(now, self._inventory, self._pending)

    def next_requeue_at(self) -> float | None:
        """When a retry held back (one per pod per second) is due; None when none is."""
        return self._wakeups.next_at()

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

    def claims_to_release(self) -> list[IPClaimSpec]:
        """Sticky claims whose identity is gone for good (see extender.statefulsets)."""
        return self._statefulsets.claims_to_release(self._inventory.addresses.claims())

    # -------------------------------------------------------------- internals

    def _judge(
        self, request: PodRequest, node_names: Sequence[str], gate: GangGate
    ) -> tuple[FilterVerdict, IdArray]:
        """Filter's judgement once the pod's group let it through: the policy's reasons, then
        (a gang member) the nodes that would strand the rest of its group."""
        ids = self._inventory.ids(node_names)
        verdict, passed = policy.filter_ids(self._inventory, request, node_names, ids, self.config)
        return self._gangs.keep_room(request, verdict, passed, gate)

    def _victims(
        self, pod: JSONObject, candidates: Mapping[str, Sequence[Victim]], now: float | None
    ) -> dict[str, NodeVictims]:
        try:
            request = pod_request(
                pod, gpu_resource=self.config.gpu_resource, shares=self.config.shares
            )
        except PodRequestError:
            return {}
        group_can_fit = None
        if request.group is not None:
            group_can_fit = self._gangs.eviction_check(request)
            if group_can_fit is None:
                return {}  # its group is unknown: no node is worth preempting on for it
        held = self._inventory.holding
        use = self._departures.deduct(self._inventory.namespace_use, held, now)
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

    def _quota_hold(self, request: PodRequest) -> QuotaHold | None:
        """Why the pod's team quota holds it back (its gang counted whole); None: it does not.
        A pod that holds its place already was counted when it took it."""
        if not len(self._quotas) or self._inventory.holding(request.uid) is not None:
            return None
        asked = self._gangs.needed(request) if request.group is not None else [request]
        return admit(
            self._quotas, request.namespace, [amounts(r) for r in asked],
            used=self._inventory.namespace_use, wanted=self._pending.wanted,
        )  # fmt: skip

    def _score(self, request: PodRequest, ids: IdArray) -> ScoreArray:
        affinity = self._gangs.affinity(request) if request.group is not None else None
        return scoring.score_nodes(self._inventory, request, ids, self._scorers, affinity)

    def _request(self, pod: JSONObject) -> PodRequest:
        """Decode ``pod``, reusing the last decode of the same object version."""
        meta = fields.obj(pod, "metadata")
        uid, version = fields.text(meta, "uid"), fields.text(meta, "resourceVersion")
        last = self._last_request
        if last is not None and version and last[0] == uid and last[1] == version:
            return last[2]
        request = pod_request(pod, gpu_resource=self.config.gpu_resource, shares=self.config.shares)
        if version:
            self._last_request = (uid, version, request)
        return request

    def _ids(self, node_names: Sequence[str]) -> IdArray:
        last = self._last_passed
        if last is not None and last[2] == self._inventory.layout and last[0] == node_names:
            return last[1]
        return self._inventory.ids(node_names)
