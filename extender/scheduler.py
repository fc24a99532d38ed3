"""The core's front door: one method per extender verb, and the intake of cluster events.

:class:`Scheduler` owns the inventory and the pending-pod memory. Verb methods take decoded
values and return values; event methods are the one path by which the inventory changes.
Time is passed in (``now``), never read.
"""

from __future__ import annotations

import dataclasses
import ipaddress
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Generic, TypeVar

import numpy as np

from extender import fields, names, policy
from extender.addressing import choose_address, ip_context
from extender.errors import BindRefusedError
from extender.evictions import EvictionBook
from extender.fields import JSONObject
from extender.gang import (
    FitCache,
    GangBook,
    GangEvent,
    GangEventKind,
    PodGroupSpec,
    fits_all,
    member_nodes,
    min_resources_gap,
    pod_group_spec,
)
from extender.inventory import BoolArray, IdArray, Inventory, InventoryConflictError
from extender.ipam import IPClaimSpec, IPPoolSpec, claim_name, ip_claim_spec, ip_pool_spec
from extender.model import (
    BindPlan,
    ClaimPlan,
    ClaimPolicy,
    Explanation,
    FilterVerdict,
    GroupStatus,
    Holding,
    HoldingKind,
    NodeExplanation,
    NodeSpec,
    PodRequest,
    Reason,
    Rejection,
    Victim,
)
from extender.nodes import node_spec
from extender.pending import PendingPods
from extender.policy import GroupAffinity, PolicyConfig, ScoreArray
from extender.preemption import GangVictims, NodeVictims, select_victims
from extender.requests import (
    PodRequestError,
    group_key,
    holding_from_pod,
    pod_request,
    statefulset_identity,
)

__all__ = ["Scheduler"]

Spec = TypeVar("Spec")


class Scheduler:
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
        self.config = config or PolicyConfig()
        self._gang_victims = gang_victims
        self._inventory = Inventory(
            rack_label=self.config.rack_label, zone_label=self.config.zone_label
        )
        self._gangs = GangBook(default_timeout_s=gang_timeout_s, max_wait_s=gang_max_wait_s)
        # Whole-group fit answers for the current inventory state (every member's filter asks).
        self._fits = FitCache()
        # StatefulSet replicas, and the identity of every existing StatefulSet pod: what the
        # release of sticky address claims is decided on.
        self._statefulsets: dict[str, int] = {}
        self._identities: dict[str, str] = {}
        self._pending = PendingPods(pending_capacity)
        self._reservation_ttl = reservation_ttl
        # What preempt approved, so that filter can tell its own watch lagging behind
        # kube-scheduler's from a node that is really full (see extender.evictions).
        self._evictions = EvictionBook(ttl_s=victim_memory_s, capacity=pending_capacity)
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

    @property
    def reservation_count(self) -> int:
        return self._inventory.reservation_count

    # ------------------------------------------------------------------ verbs

    def filter(self, pod: JSONObject, node_names: Sequence[str]) -> FilterVerdict:
        try:
            request = self._request(pod)
        except PodRequestError as error:
            return policy.reject_all(
                node_names, f"schedext: invalid pod: {error}", Reason.INVALID_POD
            )
        self._pending.remember(request)
        allowed = None
        if request.group is not None:
            self._gangs.track(request.uid, request.group, request)
            rejected, allowed = self._gang_filter(request, node_names)
            if rejected is not None:
                if rejected.rejections[0].reason is Reason.GANG_QUORUM:
                    self._gangs.hold_back(request.group, request.uid, request.key)
                return rejected
        ids = self._inventory.ids(node_names)
        verdict, passed_ids = self._filter_ids(request, node_names, ids, allowed)
        self._last_passed = (verdict.passed, passed_ids, self._inventory.layout)
        return verdict

    def prioritize(self, pod: JSONObject, node_names: Sequence[str]) -> ScoreArray:
        """Scores aligned with ``node_names``."""
        try:
            request = self._request(pod)
        except PodRequestError:
            return np.zeros(len(node_names), dtype=np.int64)
        affinity = self._group_affinity(request) if request.group is not None else None
        return policy.score_nodes(
            self._inventory, request, self._ids(node_names), self.config, affinity
        )

    def preempt(
        self,
        pod: JSONObject,
        candidates: Mapping[str, Sequence[Victim]],
        *,
        now: float | None = None,
    ) -> dict[str, NodeVictims]:
        """Victims per candidate node worth preempting on (see :mod:`extender.preemption`).
        With ``now`` the answer is remembered for :meth:`awaited_victims`."""
        chosen = self._select_victims(pod, candidates)
        if now is not None:
            uid = fields.text(fields.obj(pod, "metadata"), "uid")
            if uid:
                self._evictions.record(uid, {n: v.uids for n, v in chosen.items()}, now)
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

    def _select_victims(
        self, pod: JSONObject, candidates: Mapping[str, Sequence[Victim]]
    ) -> dict[str, NodeVictims]:
        try:
            request = pod_request(pod, gpu_resource=self.config.gpu_resource)
        except PodRequestError:
            return {}
        group_can_fit = None
        if request.group is not None:
            spec = self._gangs.spec(request.group)
            if spec is None:
                return {}
            others = [r for r in self._needed(spec, include=request) if r.uid != request.uid]

            def group_can_fit(node: str, freed: int) -> bool:
                """The rest of the group still fits once this node frees ``freed`` GPUs and
                the preemptor takes its own."""
                node_id = int(self._inventory.ids([node])[0])
                delta = {node_id: freed - request.gpus}
                return self._fits_all(others, free_delta=delta)

        return select_victims(
            self._inventory,
            request,
            candidates,
            self.config,
            gang_victims=self._gang_victims,
            group_can_fit=group_can_fit,
        )

    def plan_bind(self, *, uid: str, namespace: str, name: str, node: str, now: float) -> BindPlan:
        """Re-check the pod against the current inventory, choose its GPUs and reserve them.
        The caller performs the bind, then calls :meth:`confirm_bind` or :meth:`abort_bind`."""
        self._inventory.expire(now)
        pod = f"{namespace}/{name}"
        held = self._inventory.holding(uid)
        if held is not None:
            state = "being bound" if held.kind is HoldingKind.RESERVED else "bound"
            raise BindRefusedError(f"pod {pod} is already {state} to node {held.node}")
        request = self._pending.get(uid)
        if request is None:
            raise BindRefusedError(
                f"pod {pod} (uid {uid}) is unknown to schedext: it never went through filter "
                "here, or was forgotten; kube-scheduler will retry it"
            )
        if (request.namespace, request.name) != (namespace, name):
            raise BindRefusedError(f"uid {uid} belongs to pod {request.key}, not {pod}")
        code = Reason(
            policy.node_reasons(self._inventory, request, self._inventory.ids([node]), self.config)[
                0
            ]
        )
        if code is not Reason.FITS:
            message = policy.reason_messages(request, self.config, self._inventory)[code]
            raise BindRefusedError(f"pod {pod} no longer fits node {node}: {message}")
        view = self._inventory.node(node)
        gpu_ids = policy.choose_gpus(view, request.gpus) if view is not None else None
        if gpu_ids is None:  # cannot happen after the check above, unless state is corrupt
            raise BindRefusedError(f"pod {pod}: no free GPUs left on node {node}")
        address = self._choose_address(request, node)
        holding = Holding(
            uid=uid,
            namespace=namespace,
            name=name,
            node=node,
            kind=HoldingKind.RESERVED,
            cpu_milli=request.cpu_milli,
            memory_bytes=request.memory_bytes,
            gpus=request.gpus,
            gpu_ids=gpu_ids,
            priority=request.priority,
            expires_at=now + self._reservation_ttl,
            group=request.group,
            ip=address[1] if address else None,
            ip_pool=address[0] if address else None,
        )
        try:
            self._inventory.reserve(holding)
        except InventoryConflictError as error:
            raise BindRefusedError(f"pod {pod}: {error}") from None
        if request.group is not None:
            self._admit_to_group(request, holding, now)
        annotations = {names.GPU_IDS: ",".join(map(str, gpu_ids))} if gpu_ids else {}
        if address is not None:
            annotations |= {names.IP: address[1], names.IP_POOL: address[0]}
        return BindPlan(
            uid=uid,
            namespace=namespace,
            name=name,
            node=node,
            gpu_ids=gpu_ids,
            annotations=annotations,
            group=request.group,
            ip=address[1] if address else None,
            ip_pool=address[0] if address else None,
            claim=self._claim_plan(request, address),
        )

    def confirm_bind(self, plan: BindPlan, *, awaiting_watch: bool = False) -> None:
        """The bind went through. With ``awaiting_watch`` (a live cluster) the reservation
        stays, without expiry, until the watch shows the pod bound or deleted; otherwise it
        becomes a bound holding at once (and a sticky claim is recorded here, as no claim
        watch will bring it)."""
        self._pending.forget(plan.uid)
        if plan.claim is not None and not awaiting_watch:
            self._inventory.addresses.upsert_claim(
                IPClaimSpec(
                    name=plan.claim.name,
                    pool=plan.claim.pool,
                    address=plan.claim.address,
                    owner=plan.claim.owner,
                    policy=plan.claim.policy,
                    holder_uid=plan.uid,
                )
            )
        held = self._inventory.holding(plan.uid)
        if held is None or held.kind is not HoldingKind.RESERVED or held.node != plan.node:
            return  # the watch got there first, or the pod is gone: nothing to confirm
        kind = HoldingKind.RESERVED if awaiting_watch else HoldingKind.BOUND
        self._inventory.upsert_holding(dataclasses.replace(held, kind=kind, expires_at=None))

    def abort_bind(self, plan: BindPlan) -> None:
        """The bind failed: give the reserved resources back."""
        held = self._inventory.holding(plan.uid)
        if held is not None and held.kind is HoldingKind.RESERVED:
            self._inventory.remove_holding(plan.uid)

    def expire(self, now: float) -> list[Holding]:
        """Drop stale reservations and end the waits of gangs past their timeout."""
        for group in self._gangs.overdue(now):
            self.time_out_group(group)
        return self._inventory.expire(now)

    def time_out_group(self, group: str) -> None:
        """End the group's wait at the bind barrier: its time is up. Every reservation of the
        group is released and its waiting binds fail (a TIMED_OUT event). The shell calls this
        when a waiting bind's own timer fires, even if ``now`` has not yet reached the
        deadline by the core's clock; nothing happens for a group that is not waiting."""
        if self._gangs.deadline(group) is None:
            return
        spec = self._gangs.spec(group)
        timeout = self._gangs.timeout_for(spec) if spec else 0
        minimum = spec.min_member if spec else "?"
        self._release_group(
            group,
            GangEventKind.TIMED_OUT,
            f"schedext: group {group} did not reach minMember {minimum} within {timeout:g}s",
        )

    # ---------------------------------------------------------------- explain

    def explain(self, namespace: str, name: str) -> Explanation | None:
        """Per node, whether the pod fits and why not; None for a pod schedext does not know."""
        key = f"{namespace}/{name}"
        held = next((h for h in self._inventory.holdings() if h.key == key), None)
        request = self._pending.find(namespace, name)
        if request is None and held is None:
            return None
        group = request.group if request else held.group if held else None
        status = self.group_status(group) if group else None
        if held is not None and request is None:
            state = "bound" if held.kind is HoldingKind.BOUND else "reserved"
            return Explanation(
                pod=key,
                uid=held.uid,
                state=state,
                node=held.node,
                request={"gpus": held.gpus, "gpuIds": list(held.gpu_ids or ()), "ip": held.ip},
                group=status,
                group_reason="",
                nodes=(),
            )
        assert request is not None
        names = sorted(self._inventory.node_names())
        gang, allowed = (
            self._gang_filter(request, names) if request.group is not None else (None, None)
        )
        verdict = gang or self._filter_ids(request, names, self._inventory.ids(names), allowed)[0]
        failed, unresolvable = verdict.failed, verdict.unresolvable
        nodes = tuple(
            NodeExplanation(
                node=node,
                fits=node not in failed,
                reason=failed.get(node, ""),
                resolvable=node in failed and node not in unresolvable,
            )
            for node in names
        )
        return Explanation(
            pod=key,
            uid=request.uid,
            state="reserved" if held is not None else "pending",
            node=held.node if held is not None else None,
            request=_describe(request),
            group=status,
            group_reason=verdict.rejections[0].message if gang is not None else "",
            nodes=nodes,
        )

    # -------------------------------------------------------------- addresses

    def _choose_address(self, request: PodRequest, node: str) -> tuple[str, str] | None:
        context = ip_context(self._inventory, request)
        if context is None:
            return None
        chosen = choose_address(self._inventory, context, node)
        if chosen is None:
            raise BindRefusedError(
                f"pod {request.key}: no free address in IP pool {context.pool_names()} "
                f"for node {node}"
            )
        pool, address = chosen
        return pool.name, str(ipaddress.ip_address(address))

    def _claim_plan(self, request: PodRequest, address: tuple[str, str] | None) -> ClaimPlan | None:
        ip = request.ip
        if ip is None or ip.identity is None or ip.policy is None or address is None:
            return None
        pool, text = address
        existing = self._inventory.addresses.claim_for(ip.identity)
        return ClaimPlan(
            name=existing.name if existing else claim_name(pool, text),
            pool=pool,
            address=text,
            owner=ip.identity,
            policy=existing.policy if existing else ip.policy,
            holder_uid=request.uid,
            exists=existing is not None,
        )

    def upsert_ip_pool(self, obj: JSONObject) -> None:
        spec = ip_pool_spec(obj)
        if spec is not None:
            self._inventory.addresses.upsert_pool(spec)

    def delete_ip_pool(self, obj: JSONObject) -> None:
        spec = ip_pool_spec(obj)
        if spec is not None:
            self._inventory.addresses.remove_pool(spec.name)

    def ip_pool_relist(self) -> SpecRelist[IPPoolSpec]:
        return SpecRelist(ip_pool_spec, self._inventory.addresses.replace_pools)

    def upsert_ip_claim(self, obj: JSONObject) -> None:
        spec = ip_claim_spec(obj)
        if spec is not None:
            self._inventory.addresses.upsert_claim(spec)

    def delete_ip_claim(self, obj: JSONObject) -> None:
        name = fields.text(fields.obj(obj, "metadata"), "name")
        self._inventory.addresses.remove_claim(name)

    def ip_claim_relist(self) -> SpecRelist[IPClaimSpec]:
        return SpecRelist(ip_claim_spec, self._inventory.addresses.replace_claims)

    def set_statefulset(self, key: str, replicas: int | None) -> None:
        """A StatefulSet's replica count ("namespace/name"); None when it is gone."""
        if replicas is None:
            self._statefulsets.pop(key, None)
        else:
            self._statefulsets[key] = replicas

    def replace_statefulsets(self, replicas: Mapping[str, int]) -> None:
        self._statefulsets = dict(replicas)

    def claims_to_release(self) -> list[IPClaimSpec]:
        """Sticky claims whose identity is gone for good: its StatefulSet was deleted or scaled
        below its ordinal, and no pod of that identity exists. never-release claims stay."""
        live = set(self._identities.values())
        released = []
        for claim in self._inventory.addresses.claims():
            if claim.policy is not ClaimPolicy.STICKY or claim.owner in live:
                continue
            parts = claim.owner.split("/")
            if len(parts) != 4 or parts[0] != "sts" or not parts[3].isdigit():
                continue
            replicas = self._statefulsets.get(f"{parts[1]}/{parts[2]}")
            if replicas is None or int(parts[3]) >= replicas:
                released.append(claim)
        return released

    # ------------------------------------------------------------------ gangs

    def waiting_groups(self) -> list[str]:
        return self._gangs.waiting_groups()

    def gang_deadline(self, group: str) -> float | None:
        """When the group's wait at the bind barrier ends; None when it is not waiting."""
        return self._gangs.deadline(group)

    def take_gang_events(self) -> list[GangEvent]:
        """Effects for the shell: wake (COMPLETE) or fail (RELEASED, TIMED_OUT) waiting binds,
        have kube-scheduler retry the members turned away for missing ones (QUORUM)."""
        return self._gangs.take_events()

    def group_status(self, group: str) -> GroupStatus | None:
        spec = self._gangs.spec(group)
        if spec is None:
            return None
        holdings = [self._inventory.holding(uid) for uid in self._gangs.members(group)]
        held = [h for h in holdings if h is not None]
        bound = [h for h in held if h.kind is HoldingKind.BOUND]
        running = sum(1 for h in bound if h.running)
        members = self._gangs.member_count(group)
        if running >= spec.min_member:
            phase = "Running"
        elif len(bound) >= spec.min_member:
            phase = "Scheduled"
        elif held:
            phase = "Scheduling"
        elif members >= spec.min_member:
            phase = "PreScheduling"
        else:
            phase = "Pending"
        return GroupStatus(phase, members, len(bound), running, len(held) - len(bound))

    def pod_groups(self) -> list[PodGroupSpec]:
        return self._gangs.specs()

    def upsert_pod_group(self, obj: JSONObject) -> None:
        spec = pod_group_spec(obj)
        if spec is not None:
            self._gangs.upsert_group(spec)

    def delete_pod_group(self, obj: JSONObject) -> None:
        spec = pod_group_spec(obj)
        if spec is not None:
            self._gangs.delete_group(spec.key)

    def pod_group_relist(self) -> SpecRelist[PodGroupSpec]:
        return SpecRelist(pod_group_spec, self._gangs.replace_groups)

    def _gang_filter(
        self, request: PodRequest, node_names: Sequence[str]
    ) -> tuple[FilterVerdict | None, BoolArray | None]:
        """A verdict that rejects a gang member on every node, or None and the node ids the
        member may take (None: any) so that the rest of its group still fits."""
        group = request.group
        assert group is not None
        spec = self._gangs.spec(group)
        if spec is None:
            message = f"schedext: pod group {group} not found"
            return policy.reject_all(node_names, message, Reason.GANG_NOT_FOUND), None
        missing = spec.min_member - self._gangs.member_count(group)
        if missing > 0:
            message = f"schedext: waiting for {missing} more members of group {group}"
            return policy.reject_all(node_names, message, Reason.GANG_QUORUM), None
        gaps = min_resources_gap(self._inventory, spec, self.config, self._holdings_of(group))
        if gaps:
            message = (
                f"schedext: not enough free resources for minResources of group {group}: "
                + "; ".join(gaps)
            )
            return policy.reject_all(node_names, message, Reason.GANG_CAPACITY), None
        needed = self._needed(spec, include=request)
        if not needed:
            return None, None
        allowed = None
        if needed[0].uid == request.uid:
            allowed = member_nodes(
                self._inventory, request, needed[1:], self.config, cache=self._fits
            )
        if not (allowed.any() if allowed is not None else self._fits_all(needed)):
            message = f"schedext: not enough free GPUs for all of group {group}"
            return policy.reject_all(node_names, message, Reason.GANG_CAPACITY), None
        return None, allowed

    def _filter_ids(
        self,
        request: PodRequest,
        node_names: Sequence[str],
        ids: IdArray,
        allowed: BoolArray | None,
    ) -> tuple[FilterVerdict, IdArray]:
        """policy.filter_ids, then, for a gang member, the nodes that would strand the rest of
        its group rejected too (evicting pods there may help)."""
        verdict, passed_ids = policy.filter_ids(
            self._inventory, request, node_names, ids, self.config
        )
        if allowed is None or not len(passed_ids):
            return verdict, passed_ids
        keep = allowed[passed_ids]
        if keep.all():
            return verdict, passed_ids
        flags = keep.tolist()
        stranded = Rejection(
            f"schedext: the rest of group {request.group} would not fit with this member here",
            resolvable=Reason.GANG_CAPACITY.resolvable,
            nodes=[n for n, k in zip(verdict.passed, flags, strict=True) if not k],
            reason=Reason.GANG_CAPACITY,
        )
        passed = [n for n, k in zip(verdict.passed, flags, strict=True) if k]
        return FilterVerdict(passed, (*verdict.rejections, stranded)), passed_ids[keep]

    def _admit_to_group(self, request: PodRequest, holding: Holding, now: float) -> None:
        """Join the barrier, or settle a competition between groups (see extender.gang)."""
        group = request.group
        assert group is not None
        spec = self._gangs.spec(group)
        if spec is None:
            self._inventory.remove_holding(holding.uid)
            raise BindRefusedError(f"pod {request.key}: pod group {group} not found")
        placed = self._placed(group)
        if placed >= spec.min_member or self._fits_all(self._needed(spec)):
            self._gangs.join(group, holding.uid, now=now, placed=placed)
            return
        blockers = [g for g in self._gangs.waiting_groups() if g != group]
        specs = [self._gangs.spec(b) for b in blockers]
        older_than_all = all(b is None or spec.age_key < b.age_key for b in specs)
        if blockers and older_than_all:
            freed = self._reserved_gpus(blockers)
            if self._fits_all(self._needed(spec), free_delta=freed):
                for blocker in blockers:
                    self._release_group(
                        blocker,
                        GangEventKind.RELEASED,
                        f"schedext: group {blocker} yielded to older group {group}",
                    )
                self._gangs.join(group, holding.uid, now=now, placed=placed)
                return
        self._inventory.remove_holding(holding.uid)
        reason = f"schedext: group {group} cannot complete now: too few free GPUs for its members"
        self._release_group(group, GangEventKind.RELEASED, reason)
        raise BindRefusedError(f"pod {request.key}: {reason}; its reservations were released")

    def _fits_all(
        self, requests: Iterable[PodRequest], free_delta: Mapping[int, int] | None = None
    ) -> bool:
        return fits_all(
            self._inventory, requests, self.config, free_delta=free_delta, cache=self._fits
        )

    def _release_group(self, group: str, kind: GangEventKind, reason: str) -> None:
        for uid in self._gangs.release(group, kind, reason):
            held = self._inventory.holding(uid)
            if held is not None and held.kind is HoldingKind.RESERVED:
                self._inventory.remove_holding(uid)

    def _holdings_of(self, group: str) -> list[Holding]:
        """What the group's members hold, bound or reserved."""
        held = (self._inventory.holding(uid) for uid in self._gangs.members(group))
        return [h for h in held if h is not None]

    def _placed(self, group: str) -> int:
        return sum(1 for uid in self._gangs.members(group) if self._inventory.holding(uid))

    def _needed(self, spec: PodGroupSpec, include: PodRequest | None = None) -> list[PodRequest]:
        """The unplaced members that must still find GPUs for the group to reach minMember:
        ``include`` (the pod being decided) and the smallest of the others."""
        members = self._gangs.members(spec.key)
        missing = spec.min_member - self._placed(spec.key)
        if missing <= 0:
            return []
        chosen: list[PodRequest] = []
        if include is not None and self._inventory.holding(include.uid) is None:
            chosen.append(include)
        others = [
            r
            for uid, r in members.items()
            if r is not None
            and self._inventory.holding(uid) is None
            and (include is None or uid != include.uid)
        ]
        others.sort(key=lambda r: r.gpus)
        return chosen + others[: max(0, missing - len(chosen))]

    def _reserved_gpus(self, groups: Iterable[str]) -> dict[int, int]:
        """GPUs per node id held by the waiting members of ``groups``."""
        freed: dict[int, int] = {}
        for group in groups:
            for uid in self._gangs.waiting_uids(group):
                held = self._inventory.holding(uid)
                if held is not None and held.kind is HoldingKind.RESERVED:
                    node_id = int(self._inventory.ids([held.node])[0])
                    freed[node_id] = freed.get(node_id, 0) + held.gpus
        return freed

    def _group_affinity(self, request: PodRequest) -> GroupAffinity:
        group = request.group
        assert group is not None
        placed = [
            held.node
            for uid in self._gangs.members(group)
            if uid != request.uid and (held := self._inventory.holding(uid)) is not None
        ]
        if placed:
            ids = self._inventory.ids(placed)
            a = self._inventory.arrays
            racks = [r for r, _ in Counter(a.rack[ids].tolist()).most_common()]
            zones = [z for z, _ in Counter(a.zone[ids].tolist()).most_common()]
            return GroupAffinity(racks=tuple(racks), zones=tuple(zones))
        spec = self._gangs.spec(group)
        needed = self._needed(spec, include=request) if spec is not None else [request]
        return GroupAffinity(gpus_needed=sum(r.gpus for r in needed))

    # ----------------------------------------------------------------- events

    def upsert_node(self, node: JSONObject) -> bool:
        spec = node_spec(node, gpu_resource=self.config.gpu_resource)
        return bool(spec.name) and self._inventory.upsert_node(spec)

    def delete_node(self, name: str) -> bool:
        return self._inventory.remove_node(name)

    def upsert_pod(self, pod: JSONObject) -> None:
        meta = fields.obj(pod, "metadata")
        uid = fields.text(meta, "uid")
        if not uid:
            return
        identity = statefulset_identity(meta)
        if identity is not None:
            self._identities[uid] = identity
        holding = holding_from_pod(pod, gpu_resource=self.config.gpu_resource)
        if holding is not None:
            self._inventory.upsert_holding(holding)
            self._pending.forget(uid)
            self._gangs.track(uid, holding.group, None)
            self._evictions.settle(uid)
            return
        held = self._inventory.holding(uid)
        if held is not None and held.kind is HoldingKind.BOUND:
            self._inventory.remove_holding(uid)  # the pod finished
        phase = fields.text(fields.obj(pod, "status"), "phase")
        if fields.text(fields.obj(pod, "spec"), "nodeName") or phase in ("Succeeded", "Failed"):
            self._pending.forget(uid)
            self._gangs.forget(uid)
            self._identities.pop(uid, None)
            return
        try:
            request = pod_request(pod, gpu_resource=self.config.gpu_resource)
        except PodRequestError:
            self._pending.forget(uid)  # filter will report why
            self._gangs.track(uid, group_key(fields.obj(pod, "metadata")), None)
            return
        self._pending.remember(request)
        self._gangs.track(uid, request.group, request)

    def forget_pending(self, uid: str) -> None:
        self._pending.forget(uid)

    def delete_pod(self, uid: str) -> None:
        self._inventory.remove_holding(uid)
        self._pending.forget(uid)
        self._evictions.settle(uid)
        self._gangs.forget(uid)
        self._identities.pop(uid, None)

    def replace_nodes(self, nodes: Iterable[JSONObject]) -> None:
        relist = self.node_relist()
        relist.add(nodes)
        relist.commit()

    def replace_pods(self, pods: Iterable[JSONObject]) -> None:
        relist = self.pod_relist()
        relist.add(pods)
        relist.commit()

    def node_relist(self) -> NodeRelist:
        """Replace all nodes with a full list that arrives page by page."""
        return NodeRelist(self)

    def pod_relist(self) -> PodRelist:
        """Replace all pod state with a full list that arrives page by page."""
        return PodRelist(self, self._gangs)

    def replace_identities(self, identities: Mapping[str, str]) -> None:
        self._identities = dict(identities)

    def pending_request(self, uid: str) -> PodRequest | None:
        return self._pending.get(uid)

    # -------------------------------------------------------------- internals

    def _request(self, pod: JSONObject) -> PodRequest:
        """Decode ``pod``, reusing the last decode of the same object version."""
        meta = fields.obj(pod, "metadata")
        uid, version = fields.text(meta, "uid"), fields.text(meta, "resourceVersion")
        last = self._last_request
        if last is not None and version and last[0] == uid and last[1] == version:
            return last[2]
        request = pod_request(pod, gpu_resource=self.config.gpu_resource)
        if version:
            self._last_request = (uid, version, request)
        return request

    def _ids(self, node_names: Sequence[str]) -> IdArray:
        last = self._last_passed
        if last is not None and last[2] == self._inventory.layout and last[0] == node_names:
            return last[1]
        return self._inventory.ids(node_names)


class NodeRelist:
    def __init__(self, scheduler: Scheduler) -> None:
        self._gpu_resource = scheduler.config.gpu_resource
        self._inventory = scheduler.inventory
        self._specs: list[NodeSpec] = []

    def add(self, nodes: Iterable[JSONObject]) -> None:
        for node in nodes:
            spec = node_spec(node, gpu_resource=self._gpu_resource)
            if spec.name:
                self._specs.append(spec)

    def commit(self) -> None:
        self._inventory.replace_nodes(self._specs)


class PodRelist:
    """Keeps only what each pod amounts to (a holding, or a pending request), never the pod
    objects, so that 100,000 pods can be relisted in bounded memory."""

    def __init__(self, scheduler: Scheduler, gangs: GangBook) -> None:
        self._scheduler = scheduler
        self._gangs = gangs
        self._bound: list[Holding] = []
        self._live: set[str] = set()
        self._members: list[tuple[str, str, PodRequest | None]] = []
        self._identities: dict[str, str] = {}

    def add(self, pods: Iterable[JSONObject]) -> None:
        gpu_resource = self._scheduler.config.gpu_resource
        for pod in pods:
            meta = fields.obj(pod, "metadata")
            uid = fields.text(meta, "uid")
            if not uid:
                continue
            self._live.add(uid)
            identity = statefulset_identity(meta)
            if identity is not None:
                self._identities[uid] = identity
            holding = holding_from_pod(pod, gpu_resource=gpu_resource)
            if holding is not None:
                self._bound.append(holding)
                if holding.group is not None:
                    self._members.append((uid, holding.group, None))
                continue
            self._scheduler.upsert_pod(pod)  # pending: remembered for bind
            group = group_key(meta)
            if group is not None:
                self._members.append((uid, group, self._scheduler.pending_request(uid)))

    def commit(self) -> None:
        self._scheduler.inventory.replace_bound(self._bound, live=self._live)
        self._gangs.replace_members(self._members)
        self._scheduler.replace_identities(self._identities)
        for holding in self._bound:
            self._scheduler.forget_pending(holding.uid)


class SpecRelist(Generic[Spec]):
    """A relist of objects the core keeps as specs (PodGroups, IPPools, IPClaims)."""

    def __init__(
        self,
        parse: Callable[[JSONObject], Spec | None],
        replace: Callable[[Iterable[Spec]], None],
    ) -> None:
        self._parse, self._replace = parse, replace
        self._specs: list[Spec] = []

    def add(self, objects: Iterable[JSONObject]) -> None:
        self._specs.extend(s for s in map(self._parse, objects) if s is not None)

    def commit(self) -> None:
        self._replace(self._specs)


def _describe(request: PodRequest) -> dict[str, object]:
    described: dict[str, object] = {
        "gpus": request.gpus,
        "cpuMilli": request.cpu_milli,
        "memoryBytes": request.memory_bytes,
        "priority": request.priority,
    }
    if request.workload.value:
        described["workload"] = request.workload.value
    if request.gpu_model:
        described["gpuModel"] = request.gpu_model
    if request.gpu_memory_mib:
        described["gpuMemoryMiB"] = request.gpu_memory_mib
    if request.group:
        described["group"] = request.group
    if request.ip is not None:
        described["ip"] = {
            "address": request.ip.address,
            "pools": list(request.ip.pools),
            "policy": request.ip.policy.value if request.ip.policy else None,
            "identity": request.ip.identity,
        }
    return described
