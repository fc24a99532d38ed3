"""The core's front door: one method per extender verb, and the intake of cluster events.

:class:`Scheduler` owns the inventory and the pending-pod memory. Verb methods take decoded
values and return values; event methods are the one path by which the inventory changes.
Time is passed in (``now``), never read.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from extender import fields, names, policy
from extender.errors import BindRefusedError
from extender.fields import JSONObject
from extender.inventory import IdArray, Inventory, InventoryConflictError
from extender.model import (
    BindPlan,
    FilterVerdict,
    Holding,
    HoldingKind,
    NodeSpec,
    PodRequest,
    Reason,
    Victim,
)
from extender.nodes import node_spec
from extender.pending import PendingPods
from extender.policy import PolicyConfig, ScoreArray
from extender.requests import PodRequestError, holding_from_pod, pod_request

__all__ = ["Scheduler"]


class Scheduler:
    def __init__(
        self,
        config: PolicyConfig | None = None,
        *,
        pending_capacity: int = 10_000,
        reservation_ttl: float = 60.0,
    ) -> None:
        if reservation_ttl <= 0:
            raise ValueError("reservation_ttl must be > 0")
        self.config = config or PolicyConfig()
        self._inventory = Inventory()
        self._pending = PendingPods(pending_capacity)
        self._reservation_ttl = reservation_ttl
        # kube-scheduler sends prioritize exactly the list filter returned; remembering the
        # last one saves the name lookups (filter's own input order varies call to call).
        self._last_passed: tuple[list[str], IdArray, int] | None = None
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
            return policy.reject_all(node_names, f"schedext: invalid pod: {error}")
        self._pending.remember(request)
        ids = self._inventory.ids(node_names)
        verdict, passed_ids = policy.filter_ids(
            self._inventory, request, node_names, ids, self.config
        )
        self._last_passed = (verdict.passed, passed_ids, self._inventory.layout)
        return verdict

    def prioritize(self, pod: JSONObject, node_names: Sequence[str]) -> ScoreArray:
        """Scores aligned with ``node_names``."""
        try:
            request = self._request(pod)
        except PodRequestError:
            return np.zeros(len(node_names), dtype=np.int64)
        return policy.score_nodes(self._inventory, request, self._ids(node_names), self.config)

    def preempt(self, pod: JSONObject, candidates: Mapping[str, Sequence[Victim]]) -> list[str]:
        """The candidate nodes worth preempting on (see :func:`policy.preemption_nodes`)."""
        try:
            request = pod_request(pod, gpu_resource=self.config.gpu_resource)
        except PodRequestError:
            return []
        return policy.preemption_nodes(self._inventory, request, candidates, self.config)

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
            message = policy.reason_messages(request, self.config)[code]
            raise BindRefusedError(f"pod {pod} no longer fits node {node}: {message}")
        view = self._inventory.node(node)
        gpu_ids = policy.choose_gpus(view, request.gpus) if view is not None else None
        if gpu_ids is None:  # cannot happen after the check above, unless state is corrupt
            raise BindRefusedError(f"pod {pod}: no free GPUs left on node {node}")
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
        )
        try:
            self._inventory.reserve(holding)
        except InventoryConflictError as error:
            raise BindRefusedError(f"pod {pod}: {error}") from None
        annotations = {names.GPU_IDS: ",".join(map(str, gpu_ids))} if gpu_ids else {}
        return BindPlan(
            uid=uid,
            namespace=namespace,
            name=name,
            node=node,
            gpu_ids=gpu_ids,
            annotations=annotations,
        )

    def confirm_bind(self, plan: BindPlan, *, awaiting_watch: bool = False) -> None:
        """The bind went through. With ``awaiting_watch`` (a live cluster) the reservation
        stays, without expiry, until the watch shows the pod bound or deleted; otherwise it
        becomes a bound holding at once."""
        self._pending.forget(plan.uid)
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
        return self._inventory.expire(now)

    # ----------------------------------------------------------------- events

    def upsert_node(self, node: JSONObject) -> bool:
        spec = node_spec(node, gpu_resource=self.config.gpu_resource)
        return bool(spec.name) and self._inventory.upsert_node(spec)

    def delete_node(self, name: str) -> bool:
        return self._inventory.remove_node(name)

    def upsert_pod(self, pod: JSONObject) -> None:
        uid = fields.text(fields.obj(pod, "metadata"), "uid")
        if not uid:
            return
        holding = holding_from_pod(pod, gpu_resource=self.config.gpu_resource)
        if holding is not None:
            self._inventory.upsert_holding(holding)
            self._pending.forget(uid)
            return
        held = self._inventory.holding(uid)
        if held is not None and held.kind is HoldingKind.BOUND:
            self._inventory.remove_holding(uid)  # the pod finished
        if fields.text(fields.obj(pod, "spec"), "nodeName"):
            self._pending.forget(uid)
            return
        phase = fields.text(fields.obj(pod, "status"), "phase")
        if phase in ("Succeeded", "Failed"):
            self._pending.forget(uid)
            return
        try:
            self._pending.remember(pod_request(pod, gpu_resource=self.config.gpu_resource))
        except PodRequestError:
            self._pending.forget(uid)  # filter will report why

    def forget_pending(self, uid: str) -> None:
        self._pending.forget(uid)

    def delete_pod(self, uid: str) -> None:
        self._inventory.remove_holding(uid)
        self._pending.forget(uid)

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
        return PodRelist(self)

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

    def __init__(self, scheduler: Scheduler) -> None:
        self._scheduler = scheduler
        self._bound: list[Holding] = []
        self._live: set[str] = set()

    def add(self, pods: Iterable[JSONObject]) -> None:
        gpu_resource = self._scheduler.config.gpu_resource
        for pod in pods:
            uid = fields.text(fields.obj(pod, "metadata"), "uid")
            if not uid:
                continue
            self._live.add(uid)
            holding = holding_from_pod(pod, gpu_resource=gpu_resource)
            if holding is not None:
                self._bound.append(holding)
            else:
                self._scheduler.upsert_pod(pod)  # pending: remembered for bind

    def commit(self) -> None:
        self._scheduler.inventory.replace_bound(self._bound, live=self._live)
        for holding in self._bound:
            self._scheduler.forget_pending(holding.uid)
