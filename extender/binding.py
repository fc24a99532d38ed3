"""Bind planning: the checks a bind must pass against the inventory as it is now, the
reservation it makes (GPU indices and address), the plan the shell performs, and what a
completed bind leaves behind.

kube-scheduler calls bind with a pod's name, namespace, UID and node only, some time after
filter judged the pod: the inventory may have changed since, so the pod is judged again here
before anything is reserved.
"""

from __future__ import annotations

import dataclasses
import ipaddress

from extender import names, policy
from extender.addressing import choose_address, ip_context
from extender.config import PolicyConfig, SharePlacement
from extender.dra import ClaimsLedger, Ownership
from extender.dra_asks import with_dra
from extender.errors import BindRefusedError
from extender.inventory import Inventory
from extender.ipam import IPClaimSpec, claim_name
from extender.kinds import Placed, asked
from extender.model import BindPlan, ClaimPlan, Holding, HoldingKind, PodRequest
from extender.node_state import NodeView
from extender.pending import PendingPods

__all__ = ["abort", "bindable", "confirm", "plan", "reservation"]


def bindable(
    inventory: Inventory,
    pending: PendingPods,
    config: PolicyConfig,
    *,
    uid: str,
    namespace: str,
    name: str,
    node: str,
    dra: ClaimsLedger,
    offered: bool | None = None,
) -> PodRequest:
    """The request of the pod to bind, with what it asks of DRA as ``dra`` says now, when it
    may be bound to ``node`` now; else raises :class:`BindRefusedError` saying why (the
    message kube-scheduler shows). ``offered``: whether schedext's last answer for the pod
    offered ``node`` (None: unknown), for the words of a refusal: a node it was offered "no
    longer fits" it, one it never was "does not fit" it."""
    pod = f"{namespace}/{name}"
    held = inventory.holding(uid)
    if held is not None:
        state = "being bound" if held.kind is HoldingKind.RESERVED else "bound"
        raise BindRefusedError(f"pod {pod} is already {state} to node {held.node}")
    request = pending.get(uid)
    refusal = pending.refusal(uid) if request is None else None
    if refusal is not None:
        raise BindRefusedError(f"pod {pod}: {refusal}")  # what filter said of it
    if request is None:
        raise BindRefusedError(
            f"pod {pod} (uid {uid}) is unknown to schedext: it never went through filter "
            "here, or was forgotten; kube-scheduler will retry it"
        )
    if (request.namespace, request.name) != (namespace, name):
        raise BindRefusedError(f"uid {uid} belongs to pod {request.key}, not {pod}")
    # The pending request is the watch's decode when the pod changed since filter (as it does
    # between filter and bind: kube-scheduler writes its claim statuses in PreBind), which
    # knows nothing of DRA: its DRA fields are filled here, as each verb fills them.
    request = with_dra(request, dra, config.gpu_resource)
    rank = int(policy.node_reasons(inventory, request, inventory.ids([node]), config)[0])
    if rank:  # any rank but FITS's
        message = policy.reason_messages(request, config, inventory)[rank]
        if offered is False:
            raise BindRefusedError(
                f"pod {pod} does not fit node {node} (filter did not offer it): {message}"
            )
        raise BindRefusedError(f"pod {pod} no longer fits node {node}: {message}")
    return request


def reservation(
    inventory: Inventory,
    request: PodRequest,
    node: str,
    *,
    expires_at: float,
    placement: SharePlacement = SharePlacement.PACK,
) -> Holding:
    """What the pod will hold on ``node`` (the GPU indices and the address chosen for it),
    as a reservation to make; raises :class:`BindRefusedError` when none is left."""
    view = inventory.node(node)
    if view is not None and _dra_serves(view, request):
        # DRA's allocator gives the pod its GPUs on this node (KEP-5004): bind chooses none
        # and writes no gpu-ids; the pod's GPUs are counted once its claim is allocated.
        request = dataclasses.replace(request, gpus=0)
    placed = _placed(view, request, placement) if view is not None else None
    if view is None or placed is None:  # cannot happen after bindable(), unless corrupt
        raise BindRefusedError(f"pod {request.key}: no free GPUs left on node {node}")
    gpu_ids, mig_uuids = placed
    pool, address = _address(inventory, request, node) or (None, None)
    uuids = view.spec.gpu_uuids
    return Holding.placing(
        request,
        node=node,
        kind=HoldingKind.RESERVED,
        gpu_ids=gpu_ids,
        gpu_uuids=tuple(uuids[i] for i in gpu_ids) if uuids and gpu_ids else None,
        mig_uuids=mig_uuids,
        expires_at=expires_at,
        ip=address,
        ip_pool=pool,
    )


def _dra_serves(view: NodeView, request: PodRequest) -> bool:
    """Whether DRA, not schedext, gives the pod its whole GPUs on the node of ``view``."""
    dra = view.spec.dra
    return request.gpus_via_dra and dra is not None and dra.owner is Ownership.DRA


def plan(inventory: Inventory, request: PodRequest, holding: Holding) -> BindPlan:
    """The effects for the shell: the Binding's annotations, and the sticky claim to write."""
    annotations = {names.GPU_IDS: ",".join(map(str, holding.gpu_ids))} if holding.gpu_ids else {}
    if holding.gpu_ids and holding.gpu_uuids:
        # The node agent gives the container exactly these (indices can be renumbered).
        annotations[names.GPU_UUIDS] = ",".join(holding.gpu_uuids)
    for kind in asked(holding):
        annotations |= kind.annotations(holding)
    if holding.ip is not None and holding.ip_pool is not None:
        annotations |= {names.IP: holding.ip, names.IP_POOL: holding.ip_pool}
    return BindPlan(
        uid=holding.uid,
        namespace=holding.namespace,
        name=holding.name,
        node=holding.node,
        gpu_ids=holding.gpu_ids or (),
        annotations=annotations,
        group=request.group,
        ip=holding.ip,
        ip_pool=holding.ip_pool,
        claim=_claim_plan(inventory, request, holding),
    )


def confirm(inventory: Inventory, plan: BindPlan, *, awaiting_watch: bool) -> None:
    """The bind went through. With ``awaiting_watch`` (a live cluster) the reservation stays,
    without expiry, until the watch shows the pod bound or deleted; otherwise it becomes a
    bound holding at once (and a sticky claim is recorded here, as no claim watch will bring
    it)."""
    if plan.claim is not None and not awaiting_watch:
        inventory.addresses.upsert_claim(
            IPClaimSpec(
                name=plan.claim.name,
                pool=plan.claim.pool,
                address=plan.claim.address,
                owner=plan.claim.owner,
                policy=plan.claim.policy,
                holder_uid=plan.uid,
            )
        )
    held = inventory.holding(plan.uid)
    if held is None or held.kind is not HoldingKind.RESERVED or held.node != plan.node:
        return  # the watch got there first, or the pod is gone: nothing to confirm
    kind = HoldingKind.RESERVED if awaiting_watch else HoldingKind.BOUND
    inventory.upsert_holding(dataclasses.replace(held, kind=kind, expires_at=None))


def abort(inventory: Inventory, plan: BindPlan) -> None:
    """The bind failed: give back what it reserved (nothing, if the watch saw it bound)."""
    held = inventory.holding(plan.uid)
    if held is not None and held.kind is HoldingKind.RESERVED:
        inventory.remove_holding(plan.uid)


def doubt(inventory: Inventory, plan: BindPlan, *, expires_at: float) -> None:
    """The bind's outcome is unknown (a Binding went out and its answer was lost): what it
    reserved stays reserved until the watch shows the pod bound (the reservation becomes its
    holding) or gone, or until ``expires_at``. Never given back at once: the pod may be bound
    as planned, and the next pod would get the same GPUs and address."""
    held = inventory.holding(plan.uid)
    if held is not None and held.kind is HoldingKind.RESERVED and held.node == plan.node:
        inventory.upsert_holding(dataclasses.replace(held, expires_at=expires_at))


def _placed(view: NodeView, request: PodRequest, placement: SharePlacement) -> Placed | None:
    """The devices each kind the pod asks for chose on the node (none for a pod that asks no
    kind); None when one of them has none left."""
    placed = Placed()
    for kind in asked(request):
        chosen = kind.choose(view, request, placement)
        if chosen is None:
            return None
        mig = (*(placed.mig_uuids or ()), *(chosen.mig_uuids or ())) or None
        placed = Placed(gpu_ids=placed.gpu_ids + chosen.gpu_ids, mig_uuids=mig)
    return placed


def _address(inventory: Inventory, request: PodRequest, node: str) -> tuple[str, str] | None:
    """(pool, address) to bind with, for a pod that asks for one."""
    context = ip_context(inventory, request)
    if context is None:
        return None
    chosen = choose_address(inventory, context, node)
    if chosen is None:
        raise BindRefusedError(
            f"pod {request.key}: no free address in IP pool {context.pool_names()} for node {node}"
        )
    pool, address = chosen
    return pool.name, str(ipaddress.ip_address(address))


def _claim_plan(inventory: Inventory, request: PodRequest, holding: Holding) -> ClaimPlan | None:
    ip = request.ip
    if ip is None or ip.identity is None or ip.policy is None:
        return None
    if holding.ip is None or holding.ip_pool is None:
        return None
    existing = inventory.addresses.claim_for(ip.identity)
    return ClaimPlan(
        name=existing.name if existing else claim_name(holding.ip_pool, holding.ip),
        pool=holding.ip_pool,
        address=holding.ip,
        owner=ip.identity,
        policy=existing.policy if existing else ip.policy,
        holder_uid=request.uid,
        exists=existing is not None,
    )
