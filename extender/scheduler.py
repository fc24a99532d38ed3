"""The core's front door: one method per extender verb, and the intake of cluster events.

:class:`Scheduler` is a facade. It owns the books (the inventory, the pending pods, the gang
book, the approved evictions, the StatefulSet identities, the team quotas) and hands each
question to the room that answers it: filter to :mod:`extender.quotas` (a pod over its team's
quota goes no further) and :mod:`extender.policy`, prioritize to :mod:`extender.scoring`,
preempt to :mod:`extender.preemption`, bind to :mod:`extender.binding`, whatever concerns a
gang to :class:`~extender.gang.GangCoordinator`, and cluster events to
:class:`~extender.intake.Intake`. Verbs take decoded values and return values; time is passed
in (``now``), never read.

Three classes it inherits keep it short, each a set of its doors:
:class:`~extender.intake.Intake` (cluster events), :class:`~extender.preempt_verb.PreemptVerb`
(preempt and what its approvals become) and :class:`~extender.shell_reads.ShellReads` (what
the shell reads between verbs, and the effects it collects). Its ``__init__`` creates every
book they use.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

from extender import binding, fields, policy, scoring, shortlist
from extender.capacity_waits import WaitBook
from extender.choices import ChoiceBook
from extender.dra import ClaimsLedger
from extender.dra_asks import held_for, with_dra
from extender.errors import BindRefusedError
from extender.evictions import EvictionBook
from extender.explain import explain_pod
from extender.fields import JSONObject
from extender.gang import OPEN, GangCoordinator, GangEventKind, GangGate
from extender.gang.hold_keeper import HoldKeeper, HoldTimes
from extender.gang.holds import HoldEvent, HoldEventKind
from extender.intake import Books, Intake
from extender.inventory import IdArray, Inventory, InventoryConflictError
from extender.model import (
    BindPlan,
    Explanation,
    FilterVerdict,
    Holding,
    PodRequest,
    QuotaHold,
    Reason,
)
from extender.pending import PendingPods
from extender.pod_marks import PodMarks
from extender.policy import PolicyConfig
from extender.preempt_verb import PreemptVerb
from extender.preemption import GangVictims
from extender.quotas import Departures, QuotaBook, admit
from extender.requests import PodRequestError, pod_request
from extender.scoring import ScoreArray
from extender.shell_reads import ShellReads
from extender.statefulsets import StatefulSetBook
from extender.tally import Amounts, amounts
from extender.wakeups import WakeUps

__all__ = ["Scheduler"]


class Scheduler(Intake, PreemptVerb, ShellReads):
    """The verbs; from :class:`~extender.intake.Intake` the intake of cluster events, from
    :class:`~extender.preempt_verb.PreemptVerb` preempt, from
    :class:`~extender.shell_reads.ShellReads` the shell's reads."""

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
        gang_holds: HoldTimes | None = None,
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
        # What DRA's claims hold, per node (extender.dra): in use, never handed out here.
        self._dra = ClaimsLedger(gpu_drivers=config.dra.gpu_drivers)
        self._gangs = GangCoordinator(
            self._inventory, config, default_timeout_s=gang_timeout_s, max_wait_s=gang_max_wait_s
        )
        # GPUs kept for gangs that waited too long (extender.gang.holds).
        self._holds = HoldKeeper(self._inventory, config, self._gangs, gang_holds or HoldTimes())
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
        # What the intake last applied of each bound pod (extender.pod_marks).
        self._marks = PodMarks()
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
                dra=self._dra,
                marks=self._marks,
            )
        )
        # kube-scheduler sends prioritize exactly the list filter returned; remembering the
        # last one saves the name lookups (filter's own input order varies call to call).
        self._last_passed: tuple[Sequence[str], IdArray, int] | None = None
        # The same pod comes through filter and then prioritize (and again on every retry).
        self._last_request: tuple[str, str, PodRequest] | None = None

    # ------------------------------------------------------------------ verbs

    def filter(self, pod: JSONObject, node_names: Sequence[str]) -> FilterVerdict:
        try:
            request = self._request(pod)
        except PodRequestError as error:
            self._pending.refuse(fields.text(fields.obj(pod, "metadata"), "uid"), error.reason)
            return policy.reject_all(node_names, error.reason, Reason.INVALID_POD)
        if self._inventory.holding(request.uid) is None:
            # A pod that holds its place (bound, or being bound) is not pending: a filter of
            # it (by hand, or a retry racing its bind) must not list it as waiting again.
            self._pending.remember(request)
        verdict = self._filter(request, node_names)
        self._pending.judged(request.uid, verdict.why)  # why it waits, for the views
        return verdict

    def _filter(self, request: PodRequest, node_names: Sequence[str]) -> FilterVerdict:
        """Filter's verdict on a readable request: its gang, its team quota, the nodes."""
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
        else:  # full mode, or none passed: prioritize rates what passed, if anything did
            self._choices.passed(request.uid, passed_ids, self._inventory.layout)
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

    def plan_bind(self, *, uid: str, namespace: str, name: str, node: str, now: float) -> BindPlan:
        """Re-check the pod against the current inventory, choose its GPUs and reserve them.
        The caller performs the bind, then calls :meth:`confirm_bind` or :meth:`abort_bind`."""
        self._inventory.expire(now)
        node_id = int(self._inventory.ids([node])[0]) or None
        offered = self._choices.offered(uid, node_id, self._inventory.layout)
        request = binding.bindable(
            self._inventory, self._pending, self.config,
            uid=uid, namespace=namespace, name=name, node=node, dra=self._dra, offered=offered,
        )  # fmt: skip
        hold = self._quota_hold(request)  # what filter admitted may have been taken since
        if hold is not None:
            raise BindRefusedError(f"pod {request.key}: {hold.message}")
        kept = self._holds.book.refuses(self._inventory, request, node)  # one began since
        if kept is not None:
            raise BindRefusedError(
                f"pod {request.key}: node {node}'s free GPUs are held for gang {kept.group}"
            )
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
        # dra.fence: the DeviceTaintRules the shell publishes before the Binding.
        fence = self.pod_fence(uid, node) if self.config.dra.fence else ()
        choice = self._choices.take(uid, node_id, self._inventory.layout)
        return replace(plan, choice=choice, fence=fence)

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

    def take_over_holds(self, wall_now: float) -> None:
        """This replica answers the verbs from now on: the holds the PodGroups record stand
        at once (extender.gang.hold_keeper, ``take_over``)."""
        self._holds.take_over(wall_now)

    def end_gang_waits(self, reason: str) -> None:
        """End every group's wait at the bind barrier (schedext is stopping): their
        reservations go and their waiting binds fail with ``reason``, so that kube-scheduler
        retries them where they can complete (the next leader)."""
        for group in self._gangs.book.waiting_groups():
            self._gangs.release(group, GangEventKind.RELEASED, reason)

    def review_holds(self, wall_now: float) -> list[HoldEvent]:
        """Start, keep and end the gangs' holds (extender.gang.hold_keeper) at ``wall_now``
        (Unix seconds: holds outlive the process); the holds started and ended, for the shell
        to record on their PodGroups. The pods a hold kept off are sent back when it ends."""
        self._holds.review(wall_now, lambda request: self._quota_hold(request) is None)
        events = self._holds.book.take_events()
        for event in events:
            if event.kind is not HoldEventKind.STARTED:
                self._wakeups.hold_ended(event.hold.gpus)
        return events

    def explain(self, namespace: str, name: str) -> Explanation | None:
        """Per node, whether the pod fits and why not, and the score of each node it fits;
        None for a pod schedext does not know."""
        return explain_pod(
            namespace, name, inventory=self._inventory, pending=self._pending,
            gangs=self._gangs, judge=lambda r, names, gate: self._judge(r, names, gate)[0],
            quota=self._quota_hold,
            score=lambda r, names: self._score(r, self._inventory.ids(names)),
            dra=self, hold=self.gang_hold,
        )  # fmt: skip

    # -------------------------------------------------------------- internals

    def _judge(
        self, request: PodRequest, node_names: Sequence[str], gate: GangGate
    ) -> tuple[FilterVerdict, IdArray]:
        """Filter's judgement once the pod's group let it through: the policy's reasons, then
        (a gang member) the nodes that would strand the rest of its group."""
        ids = self._inventory.ids(node_names)
        verdict, passed = policy.filter_ids(self._inventory, request, node_names, ids, self.config)
        verdict, passed = self._holds.book.keep_off(self._inventory, request, verdict, passed)
        return self._gangs.keep_room(request, verdict, passed, gate)

    def _quota_hold(self, request: PodRequest) -> QuotaHold | None:
        """Why the pod's team quota holds it back (its gang counted whole); None: it does not.
        A pod that holds its place already was counted when it took it."""
        if not len(self._quotas) or self._inventory.holding(request.uid) is not None:
            return None
        # A gang is counted whole: each member with what its claims ask now.
        members = self._gangs.needed(request) if request.group is not None else [request]
        gpu_resource = self.config.gpu_resource
        asked = [_quota_amounts(with_dra(r, self._dra, gpu_resource)) for r in members]
        used: Callable[[str], Amounts] = self.namespace_use
        # The GPUs its claims hold for it alone (kube-scheduler allocates and reserves them in
        # PreBind, before it calls bind): the namespace's use counts them, but they are what
        # this pod takes. A claim another pod uses too was that pod's to take.
        own = held_for(request, self._dra) if request.claims else 0
        if own:
            asked.append(Amounts(gpus=own))
            used = _less_gpus(self.namespace_use, request.namespace, own)
        return admit(self._quotas, request.namespace, asked, used=used, wanted=self._pending.wanted)

    def _score(self, request: PodRequest, ids: IdArray) -> ScoreArray:
        affinity = self._gangs.affinity(request) if request.group is not None else None
        return scoring.score_nodes(self._inventory, request, ids, self._scorers, affinity)

    def _request(self, pod: JSONObject) -> PodRequest:
        """Decode ``pod``, reusing the last decode of the same object version."""
        meta = fields.obj(pod, "metadata")
        uid, version = fields.text(meta, "uid"), fields.text(meta, "resourceVersion")
        last = self._last_request
        if last is not None and version and last[0] == uid and last[1] == version:
            return with_dra(last[2], self._dra, self.config.gpu_resource)
        # The watch's event of the same object version was decoded already (most pods: their
        # ADDED event came before kube-scheduler's first filter of them).
        request = self._pending.decoded(uid, version)
        if request is None:
            request = pod_request(
                pod, gpu_resource=self.config.gpu_resource, shares=self.config.shares
            )
        if version:
            self._last_request = (uid, version, request)
        return with_dra(request, self._dra, self.config.gpu_resource)

    def _ids(self, node_names: Sequence[str]) -> IdArray:
        last = self._last_passed
        if last is not None and last[2] == self._inventory.layout and last[0] == node_names:
            return last[1]
        return self._inventory.ids(node_names)


def _quota_amounts(request: PodRequest) -> Amounts:
    """What the pod takes of its quota: its own GPUs and those its DRA claims ask."""
    asked = amounts(request)
    return asked._replace(gpus=asked.gpus + request.dra_gpus) if request.dra_gpus else asked


def _less_gpus(
    use: Callable[[str], Amounts], namespace: str, gpus: int
) -> Callable[[str], Amounts]:
    """``use``, less ``gpus`` GPUs of ``namespace``'s."""

    def less(of: str) -> Amounts:
        found = use(of)
        return found._replace(gpus=found.gpus - gpus) if of == namespace else found

    return less
