"""What the shell reads of the core's books between verbs, and the effects it collects.

The views (the inventory, the pending pods, the quotas, each gang's wait and status, what DRA
says of each node and what its ledger could not read) and the effects the core leaves for the
shell to perform (gang events to dispatch, pods to send back to kube-scheduler once what they
wait for is freed, sticky claims to release). None of them decides anything: each is one
book's answer, handed out as a value.

Why a class of its own: they are many and small, they are not verbs, and apart from the
verbs they leave :class:`~extender.scheduler.Scheduler` a list of the questions kube-scheduler
asks. It is a mixin: ``Scheduler`` creates the books declared below (its ``__init__``) and
inherits these methods, so callers see one class.
"""

from __future__ import annotations

from extender.capacity_waits import Nudge
from extender.dra import (
    ClaimsLedger,
    FenceRule,
    NodeDra,
    Ownership,
    Problem,
    held_gpus,
    ownership,
)
from extender.dra_asks import claimed_use
from extender.fencing import FencePlan, fence_plan, pod_fence
from extender.gang import GangCoordinator, GangEvent, PodGroupSpec
from extender.gang.hold_keeper import HoldKeeper
from extender.gang.holds import Hold
from extender.inventory import Inventory
from extender.ipam import IPClaimSpec
from extender.model import GroupStatus, PodRequest
from extender.pending import PendingPods
from extender.pod_marks import PodMarks
from extender.quotas import QuotaBook, QuotaSpec, Shadowed
from extender.statefulsets import StatefulSetBook
from extender.tally import Amounts
from extender.wakeups import WakeUps

__all__ = ["ShellReads"]


class ShellReads:
    """The shell's reads and the effects it collects: mixed into
    :class:`~extender.scheduler.Scheduler`, which owns the books declared here."""

    _inventory: Inventory
    _pending: PendingPods
    _gangs: GangCoordinator
    _quotas: QuotaBook
    _wakeups: WakeUps
    _statefulsets: StatefulSetBook
    _dra: ClaimsLedger
    _holds: HoldKeeper
    _marks: PodMarks

    # ----------------------------------------------------------------- views

    @property
    def inventory(self) -> Inventory:
        return self._inventory

    def gpu_owner(self, node: str) -> Ownership:
        """Who hands out ``node``'s GPUs: the device plugin, DRA, or both (mixed; filter
        refuses it to schedext's GPU pods unless fenced)."""
        spec = self._inventory.spec(node)
        return ownership(self._dra.node(node), spec.gpu_count if spec is not None else 0)

    def dra_owners(self) -> dict[str, Ownership]:
        """The nodes whose GPUs DRA offers, DRA's alone or mixed, by name: a pass over the
        nodes DRA knows, for the shell's Warning events and metrics."""
        owners = {}
        for name in self._dra.node_names():
            spec = self._inventory.spec(name)
            if spec is not None and spec.dra is not None:
                owners[name] = spec.dra.owner
        return owners

    @property
    def pending_count(self) -> int:
        return len(self._pending)

    def pending_pods(self, limit: int) -> tuple[PodRequest, ...]:
        """The first ``limit`` pending pods, by namespace and name."""
        return self._pending.listing(limit)

    def pending_why(self, uid: str) -> str:
        """Why the last filter turned pending pod ``uid`` away ("" when none did)."""
        return self._pending.why(uid)

    @property
    def reservation_count(self) -> int:
        return self._inventory.reservation_count

    @property
    def pod_events_skipped(self) -> int:
        """Pod events the intake skipped, ever: they changed nothing it reads."""
        return self._marks.skipped

    @property
    def pod_marks(self) -> int:
        """Bound pods the intake keeps a mark of (one small entry each)."""
        return len(self._marks)

    def quotas(self) -> list[QuotaSpec]:
        """The team quotas that apply, one per namespace (what each uses:
        :meth:`namespace_use`)."""
        return self._quotas.quotas()

    def namespace_use(self, namespace: str) -> Amounts:
        """What the namespace holds, as its quota counts it: its pods' holdings, and the GPUs
        its DRA claims hold (a claim kube-scheduler made for a pod's ``nvidia.com/gpu`` is
        counted with the pod, once)."""
        return claimed_use(self._inventory.namespace_use(namespace), self._dra, namespace)

    def shadowed_quotas(self) -> list[Shadowed]:
        """Second quotas of a namespace, which do not apply (see extender.quotas.book)."""
        return self._quotas.shadowed()

    def dra_node(self, name: str) -> NodeDra:
        """What DRA says of node ``name``: the devices advertised, those claims hold and for
        whom (empty for a node DRA does not know)."""
        return self._dra.node(name)

    def dra_pod_key(self, uid: str) -> str:
        """A pod's "namespace/name" by UID, as the claims ledger knows it; "" if it does not."""
        return self._dra.pod_key(uid)

    def dra_problems(self) -> tuple[Problem, ...]:
        """What the claims ledger could not read or refused (:meth:`ClaimsLedger.problems`),
        and on each node whose GPUs schedext counts, the devices claims hold that it cannot
        map to a GPU index (no agent UUIDs, a UUID the agent does not list): those are not
        counted in use, so each claim holding one is a problem. Sorted; a pass over the
        ledger, for the shell to report now and then, not for the verbs."""
        found = set(self._dra.problems())
        for name in self._dra.node_names():
            summary, spec = self._dra.node(name), self._inventory.spec(name)
            if not summary.held or spec is None or not (spec.gpu_indices or spec.mig_slices):
                continue  # a node where schedext counts no GPUs hands none out twice
            for unmapped in held_gpus(summary, spec.gpu_uuids).unmapped:
                if unmapped.held.unknown:
                    continue  # the ledger's own problem (a device no slice has, unreadable)
                why = (
                    f"holds {unmapped.held.ref} on node {name}, which schedext cannot map to "
                    f"a GPU ({unmapped.why}): not counted in use"
                )
                found.update(Problem("ResourceClaim", c, why) for c in unmapped.held.claims)
        return tuple(sorted(found))

    def fence_plan(self) -> FencePlan:
        """``dra.fence``: the DeviceTaintRules wanted on the GPUs schedext's pods hold (bound
        or reserved) where a GPU driver advertises them too, and the writes that make the
        published ones match (extender.fencing): the shell's fence pass."""
        nodes = set(self._dra.node_names())
        holdings = [h for h in self._inventory.holdings() if h.node in nodes] if nodes else []
        return fence_plan(
            holdings, self._inventory.spec, self._dra.node, tuple(self._dra.rules.values())
        )

    def pod_fence(self, uid: str, node: str) -> tuple[FenceRule, ...]:
        """The fence rules for the GPUs pod ``uid`` holds on ``node``: what its bind publishes
        before the Binding (those that cannot be fenced, the pass reports)."""
        view = self._inventory.node(node)
        if view is None:
            return ()
        return pod_fence(uid, view.holdings, view.spec, self._dra.node(node))[0]

    def dra_clash(self, uid: str, node: str, gpu_ids: tuple[int, ...]) -> str:
        """Why one of ``gpu_ids``, which bind reserved for pod ``uid`` on ``node``, is in use
        outside schedext now (a DRA claim allocated while the bind's fence went up); "" when
        none is. Bind asks once its fence is published, before the Binding."""
        spec = self._inventory.spec(node)
        holding = self._inventory.holding(uid)
        own = holding.key if holding is not None else ""
        taken = (
            [u.why for u in spec.gpu_in_use if u.gpu in gpu_ids and u.pod != own] if spec else []
        )
        return "; ".join(sorted(set(taken)))

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

    def gang_topology_problems(self) -> dict[str, tuple[str, str]]:
        """Per PodGroup ("namespace/name"), its UID and why one of its topology annotations
        is not followed (a level not configured, annotations that disagree): for the shell's
        Warning event. A pass over the groups."""
        found = {}
        for spec in self._gangs.book.specs():
            problem = self._gangs.topology(spec).problem
            if problem:
                found[spec.key] = (spec.uid, problem)
        return found

    def gang_holds(self) -> list[Hold]:
        """The holds that stand (extender.gang.holds), by gang."""
        return self._holds.book.holds()

    def gang_hold(self, group: str) -> tuple[Hold | None, str]:
        """The group's hold, or why it has none while it waits ("" when that is not known:
        it has not waited long enough, or does not wait)."""
        return self._holds.book.get(group), self._holds.why_not.get(group, "")

    def hold_idle(self, group: str | None = None) -> float:
        """GPU-seconds the group's hold has kept idle so far; with no group, the free GPUs
        every hold keeps idle now (their cost)."""
        if group is None:
            return float(self._holds.book.idle_now)
        return self._holds.book.idle_gpu_s.get(group, 0.0)

    def hold_idle_total(self) -> float:
        """GPU-seconds every hold has kept idle so far (the metric's counter)."""
        return self._holds.book.idle_total

    def gang_waited(self, group: str, wall_now: float) -> float:
        """How long the group waited for room before it completed at ``wall_now`` (the gang
        wait histogram); it waits no more."""
        return self._holds.waited(group, wall_now)

    # ------------------------------------------------------ requeues, claims

    def take_capacity_requeues(self, now: float) -> list[Nudge]:
        """The pods filter turned away, still pending, whose wait schedext has since seen
        end: an address, GPUs, a share's room, a MIG device or quota headroom freed. The
        shell has kube-scheduler retry them, which it may not do on its own (see
        extender.capacity_waits), and calls again at :meth:`next_requeue_at`."""
        return self._wakeups.take(now, self._inventory, self._pending)

    def next_requeue_at(self) -> float | None:
        """When a retry held back (one per pod per second) is due; None when none is."""
        return self._wakeups.next_at()

    def claims_to_release(self) -> list[IPClaimSpec]:
        """Sticky claims whose identity is gone for good (see extender.statefulsets)."""
        return self._statefulsets.claims_to_release(self._inventory.addresses.claims())
