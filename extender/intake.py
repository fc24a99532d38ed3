"""The intake of cluster events: the one path by which what the informers see (nodes, pods,
PodGroups, IP pools and claims, StatefulSets, ElasticQuotas, and DRA's ResourceSlices,
ResourceClaims, DeviceClasses and DeviceTaintRules) changes the core's books.

Per kind: an upsert and a delete for watch events, and a relist that takes a full list page by
page and replaces that kind's state when committed. :class:`Intake` is given the books it
updates (:class:`Books`) and nothing else, and it decides nothing. The core's facade,
:class:`~extender.scheduler.Scheduler`, inherits these methods: they are its doors for cluster
events.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from extender import fields
from extender.claimed import claimed_in_use, claimed_shares
from extender.config import ShareResources
from extender.dra import (
    Claim,
    ClaimsLedger,
    DeviceClass,
    ResourceSlice,
    TaintRule,
    decode_claim,
    decode_device_class,
    decode_pod_claims,
    decode_slice,
    decode_taint_rule,
    dra_gpus,
    uuid_groups,
)
from extender.evictions import EvictionBook
from extender.fields import JSONObject
from extender.gang import GangBook, PodGroupSpec, pod_group_spec
from extender.inventory import Inventory
from extender.ipam import IPClaimSpec, IPPoolSpec, ip_claim_spec, ip_pool_spec
from extender.model import Holding, HoldingKind, NodeSpec, PodRequest
from extender.nodes import node_spec
from extender.pending import PendingPods
from extender.pod_marks import PodMarks, bound, fingerprint
from extender.quotas import Departures, QuotaBook, QuotaError, QuotaSpec, quota_spec
from extender.requests import (
    PodRequestError,
    group_key,
    holding_from_pod,
    pod_request,
    statefulset_identity,
)
from extender.statefulsets import StatefulSetBook
from extender.wakeups import WakeUps

__all__ = ["Books", "Intake", "NodeRelist", "PodRelist", "QuotaRelist", "SpecRelist"]

Spec = TypeVar("Spec")


@dataclass(frozen=True, slots=True)
class Books:
    """What cluster events change: the inventory (nodes, holdings, addresses), the pending
    pods, the gangs' members and groups, preempt's approvals, StatefulSet identities, the
    team quotas, the pods waiting for something to be freed, DRA's claims ledger; and what
    the intake last applied of each bound pod (:mod:`extender.pod_marks`)."""

    inventory: Inventory
    pending: PendingPods
    gangs: GangBook
    evictions: EvictionBook
    departures: Departures
    statefulsets: StatefulSetBook
    gpu_resource: str
    shares: ShareResources
    quotas: QuotaBook
    wakeups: WakeUps
    dra: ClaimsLedger
    marks: PodMarks = field(default_factory=PodMarks)


class Intake:
    def __init__(self, books: Books) -> None:
        self._books = books

    # ----------------------------------------------------------------- nodes

    def upsert_node(self, node: JSONObject) -> bool:
        """False when the event changed nothing schedext keeps (a heartbeat, most often)."""
        spec = node_spec(node, gpu_resource=self._books.gpu_resource)
        if not spec.name:
            return False
        changed = self._books.inventory.upsert_node(spec)
        known = self._books.dra.node(spec.name)
        if known.held or known.drivers:  # its GPU UUIDs, groups or plugin GPUs may have changed
            _charge(self._books, (spec.name,))
            return True  # what DRA's claims hold there was charged again: count it a change
        return changed

    def delete_node(self, name: str) -> bool:
        return self._books.inventory.remove_node(name)

    def node_relist(self) -> NodeRelist:
        """Replace all nodes with a full list that arrives page by page."""
        return NodeRelist(self._books)

    def replace_nodes(self, nodes: Iterable[JSONObject]) -> None:
        _replace(self.node_relist(), nodes)

    # ------------------------------------------------------------------ pods

    def upsert_pod(self, pod: JSONObject) -> bool:
        """False when the event changed nothing schedext keeps (then it freed nothing)."""
        return _upsert_pod(self._books, pod)

    def delete_pod(self, uid: str) -> None:
        b = self._books
        b.marks.forget(uid)
        _charge(b, b.dra.delete_pod(uid))
        b.inventory.remove_holding(uid)
        b.wakeups.pod_gone(uid, b.pending.get(uid))
        b.pending.forget(uid)
        b.evictions.placed(uid)
        b.departures.placed(uid)
        b.gangs.forget(uid)
        b.statefulsets.forget_pod(uid)

    def pod_relist(self) -> PodRelist:
        """Replace all pod state with a full list that arrives page by page."""
        return PodRelist(self._books)

    def replace_pods(self, pods: Iterable[JSONObject]) -> None:
        _replace(self.pod_relist(), pods)

    # ------------------------------------------------------------- PodGroups

    def upsert_pod_group(self, obj: JSONObject) -> None:
        spec = pod_group_spec(obj)
        if spec is not None:
            self._books.gangs.upsert_group(spec)

    def delete_pod_group(self, obj: JSONObject) -> None:
        spec = pod_group_spec(obj)
        if spec is not None:
            self._books.gangs.delete_group(spec.key)

    def pod_group_relist(self) -> SpecRelist[PodGroupSpec]:
        return SpecRelist(pod_group_spec, self._books.gangs.replace_groups)

    # ------------------------------------------------------ IP pools, claims

    def upsert_ip_pool(self, obj: JSONObject) -> None:
        spec = ip_pool_spec(obj)
        if spec is not None:
            self._books.inventory.addresses.upsert_pool(spec)

    def delete_ip_pool(self, obj: JSONObject) -> None:
        spec = ip_pool_spec(obj)
        if spec is not None:
            self._books.inventory.addresses.remove_pool(spec.name)

    def ip_pool_relist(self) -> SpecRelist[IPPoolSpec]:
        return SpecRelist(ip_pool_spec, self._books.inventory.addresses.replace_pools)

    def upsert_ip_claim(self, obj: JSONObject) -> None:
        spec = ip_claim_spec(obj)
        if spec is not None:
            self._books.inventory.addresses.upsert_claim(spec)

    def delete_ip_claim(self, obj: JSONObject) -> None:
        self._books.inventory.addresses.remove_claim(_name(obj))

    def ip_claim_relist(self) -> SpecRelist[IPClaimSpec]:
        return SpecRelist(ip_claim_spec, self._books.inventory.addresses.replace_claims)

    # --------------------------------------------------------- ElasticQuotas

    def upsert_quota(self, obj: JSONObject) -> None:
        """Raises :class:`~extender.quotas.QuotaError` for a quota that cannot apply as
        written: the shell warns and goes on. An earlier version of the same object stops
        applying too (as after a restart, where it was never read)."""
        try:
            spec = quota_spec(obj, gpu_resource=self._books.gpu_resource, shares=self._books.shares)
        except QuotaError:
            self.delete_quota(obj)
            raise
        if spec is not None:
            self._books.quotas.upsert(spec)
            self._books.wakeups.quotas_changed()

    def delete_quota(self, obj: JSONObject) -> None:
        meta = fields.obj(obj, "metadata")
        namespace = fields.text(meta, "namespace") or "default"
        self._books.quotas.delete(namespace, fields.text(meta, "name"))
        self._books.wakeups.quotas_changed()

    def quota_relist(self) -> QuotaRelist:
        return QuotaRelist(self._books)

    def replace_quotas(self, objs: Iterable[JSONObject]) -> list[QuotaError]:
        """Make the quotas exactly ``objs``; the ones refused, for the shell to warn about."""
        relist = self.quota_relist()
        refused = relist.add(objs)
        relist.commit()
        return refused

    # ------------------------------------------ DRA: slices, claims, classes, taint rules

    def upsert_resource_slice(self, obj: JSONObject) -> None:
        piece = decode_slice(obj)
        if piece is not None:
            _charge(self._books, self._books.dra.upsert_slice(piece))

    def delete_resource_slice(self, obj: JSONObject) -> None:
        _charge(self._books, self._books.dra.delete_slice(_name(obj)))

    def upsert_resource_claim(self, obj: JSONObject) -> None:
        claim = decode_claim(obj)
        if claim is not None:
            _charge(self._books, self._books.dra.upsert_claim(claim))

    def delete_resource_claim(self, obj: JSONObject) -> None:
        meta = fields.obj(obj, "metadata")
        key = f"{fields.text(meta, 'namespace') or 'default'}/{fields.text(meta, 'name')}"
        _charge(self._books, self._books.dra.delete_claim(key))

    def upsert_device_taint_rule(self, obj: JSONObject) -> None:
        rule = decode_taint_rule(obj)
        if rule is not None:
            _charge(self._books, self._books.dra.upsert_taint_rule(rule))

    def delete_device_taint_rule(self, obj: JSONObject) -> None:
        _charge(self._books, self._books.dra.delete_taint_rule(_name(obj)))

    def upsert_device_class(self, obj: JSONObject) -> None:
        device_class = decode_device_class(obj)
        if device_class is not None:
            self._books.dra.upsert_device_class(device_class)

    def delete_device_class(self, obj: JSONObject) -> None:
        self._books.dra.delete_device_class(_name(obj))

    def resource_slice_relist(self) -> SpecRelist[ResourceSlice]:
        dra = self._books.dra
        return SpecRelist(decode_slice, lambda s: _charge(self._books, dra.replace_slices(s)))

    def resource_claim_relist(self) -> SpecRelist[Claim]:
        dra = self._books.dra
        return SpecRelist(decode_claim, lambda c: _charge(self._books, dra.replace_claims(c)))

    def device_taint_rule_relist(self) -> SpecRelist[TaintRule]:
        dra = self._books.dra
        return SpecRelist(
            decode_taint_rule, lambda r: _charge(self._books, dra.replace_taint_rules(r))
        )

    def device_class_relist(self) -> SpecRelist[DeviceClass]:
        return SpecRelist(decode_device_class, self._books.dra.replace_device_classes)

    # ---------------------------------------------------------- StatefulSets

    def set_statefulset(self, key: str, replicas: int | None) -> None:
        """A StatefulSet's replica count ("namespace/name"); None when it is gone."""
        self._books.statefulsets.set_replicas(key, replicas)

    def replace_statefulsets(self, replicas: Mapping[str, int]) -> None:
        self._books.statefulsets.replace_replicas(replicas)


def _charge(b: Books, nodes: Iterable[str]) -> None:
    """DRA's claims changed on ``nodes``: the GPUs they hold there are in use."""
    for name in nodes:
        spec = b.inventory.spec(name) or NodeSpec(name)
        node = b.dra.node(name)
        groups = spec.gpu_links or uuid_groups(spec.gpu_uuids, spec.gpu_groups)
        offered = dra_gpus(node, device_plugin_gpus=spec.gpu_indices, groups=groups)
        uses = claimed_in_use(node, spec.gpu_uuids, b.dra.pod_key)
        b.inventory.set_claimed(name, uses, offered, claimed_shares(node, spec.gpu_uuids))


def _names_claims(pod: JSONObject) -> bool:
    """Whether ``pod`` names a DRA claim, or one serves its extended resource."""
    spec, status = pod.get("spec"), pod.get("status")
    return bool(
        (isinstance(spec, dict) and spec.get("resourceClaims"))
        or (isinstance(status, dict) and status.get("extendedResourceClaimStatus"))
    )


def _name(obj: JSONObject) -> str:
    return fields.text(fields.obj(obj, "metadata"), "name")


def _upsert_pod(b: Books, pod: JSONObject) -> bool:
    """A bound pod becomes a holding; a pending one is remembered for bind (and counted in its
    gang); a finished one gives back what it held."""
    meta = fields.obj(pod, "metadata")
    uid = fields.text(meta, "uid")
    if not uid:
        return False
    mark = fingerprint(pod) if bound(pod) else None
    if mark is not None and b.marks.applied(b, uid, mark):
        return False  # nothing it reads changed since it was applied (a status update, often)
    identity = statefulset_identity(meta)
    if identity is not None:
        b.statefulsets.set_identity(uid, identity)
    if _names_claims(pod) or b.dra.knows_pod(uid):  # most pods: neither, and no decoding
        claims = decode_pod_claims(pod)
        if claims is not None:
            _charge(b, b.dra.upsert_pod(claims))  # before its holding: where its claims are
    holding = holding_from_pod(pod, gpu_resource=b.gpu_resource, shares=b.shares)
    if holding is not None:
        b.inventory.upsert_holding(holding)
        b.pending.forget(uid)
        b.wakeups.forget(uid)
        b.gangs.track(uid, holding.group, None)
        b.evictions.placed(uid)
        b.departures.placed(uid)
        b.marks.record(b, holding, mark)
        return True
    b.marks.forget(uid)
    held = b.inventory.holding(uid)
    if held is not None and held.kind is HoldingKind.BOUND:
        b.inventory.remove_holding(uid)  # the pod finished
    phase = fields.text(fields.obj(pod, "status"), "phase")
    if fields.text(fields.obj(pod, "spec"), "nodeName") or phase in ("Succeeded", "Failed"):
        b.pending.forget(uid)
        b.wakeups.forget(uid)
        b.gangs.forget(uid)
        b.statefulsets.forget_pod(uid)
        return True
    try:
        request = pod_request(pod, gpu_resource=b.gpu_resource, shares=b.shares)
    except PodRequestError:
        b.pending.forget(uid)  # filter will report why
        b.gangs.track(uid, group_key(meta), None)
        return True
    b.pending.remember(request, fields.text(meta, "resourceVersion"))
    b.gangs.track(uid, request.group, request)
    return True


class NodeRelist:
    def __init__(self, books: Books) -> None:
        self._books = books
        self._specs: list[NodeSpec] = []

    def add(self, nodes: Iterable[JSONObject]) -> None:
        for node in nodes:
            spec = node_spec(node, gpu_resource=self._books.gpu_resource)
            if spec.name:
                self._specs.append(spec)

    def commit(self) -> None:
        self._books.inventory.replace_nodes(self._specs)
        _charge(self._books, self._books.dra.node_names())  # what DRA offers may have moved


class PodRelist:
    """Keeps only what each pod amounts to (a holding, or a pending request), never the pod
    objects, so that 100,000 pods can be relisted in bounded memory."""

    def __init__(self, books: Books) -> None:
        self._books = books
        self._bound: list[Holding] = []
        self._live: set[str] = set()
        self._members: list[tuple[str, str, PodRequest | None]] = []
        self._identities: dict[str, str] = {}

    def add(self, pods: Iterable[JSONObject]) -> None:
        b = self._books
        for pod in pods:
            meta = fields.obj(pod, "metadata")
            uid = fields.text(meta, "uid")
            if not uid:
                continue
            self._live.add(uid)
            identity = statefulset_identity(meta)
            if identity is not None:
                self._identities[uid] = identity
            holding = holding_from_pod(pod, gpu_resource=b.gpu_resource, shares=b.shares)
            if holding is not None:
                self._bound.append(holding)
                if holding.group is not None:
                    self._members.append((uid, holding.group, None))
                if _names_claims(pod) and (claims := decode_pod_claims(pod)) is not None:
                    _charge(b, b.dra.upsert_pod(claims))  # who its claims are charged to
                continue
            _upsert_pod(b, pod)  # pending: remembered for bind
            group = group_key(meta)
            if group is not None:
                self._members.append((uid, group, b.pending.get(uid)))

    def commit(self) -> None:
        b = self._books
        b.marks.clear()  # what was applied before the list says nothing of what it holds
        _charge(b, b.dra.keep_pods(self._live))
        b.inventory.replace_bound(self._bound, live=self._live)
        b.gangs.replace_members(self._members)
        b.statefulsets.replace_identities(self._identities)
        for holding in self._bound:
            b.pending.forget(holding.uid)


class QuotaRelist:
    """A relist of ElasticQuotas: the ones that cannot apply are left out, and each
    :meth:`add` returns them, for the shell to warn about."""

    def __init__(self, books: Books) -> None:
        self._books = books
        self._specs: list[QuotaSpec] = []

    def add(self, objs: Iterable[JSONObject]) -> list[QuotaError]:
        b, refused = self._books, []
        for obj in objs:
            try:
                spec = quota_spec(obj, gpu_resource=b.gpu_resource, shares=b.shares)
            except QuotaError as error:
                refused.append(error)
                continue
            if spec is not None:
                self._specs.append(spec)
        return refused

    def commit(self) -> None:
        self._books.quotas.replace(self._specs)
        self._books.wakeups.quotas_changed()


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


def _replace(relist: NodeRelist | PodRelist, objects: Iterable[JSONObject]) -> None:
    """A relist of one page: every object of the kind, at once."""
    relist.add(objects)
    relist.commit()
