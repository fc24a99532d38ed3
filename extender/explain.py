"""Why a pod fits, or does not fit, each node: what ``schedext explain`` shows. Read-only: the
pod is judged as filter would judge it over every node, without being recorded anywhere, and
each node it fits is scored as prioritize scores it (the absolute 0-10, not lowered by the
lowest score as prioritize's compact answer is).

Filter answers with one message per reason, naming the pod's need only, so that
kube-scheduler can aggregate thousands of rejected nodes; explain is asked about one pod, so a
node rejected for a reason of the kind the pod asks for gets that kind's own detail where it
has one (:meth:`extender.kinds.Kind.detail`; a share's room: the largest free memory and on
which GPU). Each node also says where its kubelet disagrees
with schedext's placements (its agent's drift), whether or not the pod fits, and what DRA says
of it (:func:`dra_lines`): who hands out its GPUs when the device plugin does not alone, and
which claims hold which of its devices.

A gang member's explanation also says whether its group has a hold (GPUs kept for it while
it waits, extender.gang.holds) and where, or why it has none; a pod that a hold keeps off a
node gets filter's reason for it there, as any other."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Final, Protocol

from extender.devices.drift import describe
from extender.dra import HeldDevice, NodeDra, Ownership, held_gpus
from extender.gang import OPEN, GangCoordinator, GangGate
from extender.gang.holds import Hold, hold_text
from extender.inventory import Inventory
from extender.kinds import KINDS, asked
from extender.model import (
    Demand,
    Explanation,
    FilterVerdict,
    Holding,
    HoldingKind,
    NodeExplanation,
    PodRequest,
    QuotaHold,
)
from extender.pending import PendingPods
from extender.scoring import ScoreArray

__all__ = ["DRA_LINES", "DraReads", "dra_lines", "explain_pod"]

# Filter's judgement of a request over named nodes, once its group let it through.
Judge = Callable[[PodRequest, Sequence[str], GangGate], FilterVerdict]
# Which team quota holds a pending pod back, if one does.
QuotaCheck = Callable[[PodRequest], QuotaHold | None]
# Prioritize's scores of a request over named nodes, aligned with them.
Score = Callable[[PodRequest, Sequence[str]], ScoreArray]
# A group's hold, or why it has none ("" when that is not known).
HoldOf = Callable[[str], tuple[Hold | None, str]]

# Per node, the held DRA devices explain lists; the rest are counted.
DRA_LINES: Final = 16
_OWNERS: Final = {
    Ownership.DRA: "DRA hands out its GPUs (ResourceSlices), not the device plugin",
    Ownership.MIXED: "both the device plugin and DRA advertise its GPUs",
}


class DraReads(Protocol):
    """What explain reads of DRA per node (the scheduler's shell reads)."""

    def gpu_owner(self, node: str) -> Ownership: ...

    def dra_node(self, name: str) -> NodeDra: ...

    def dra_pod_key(self, uid: str) -> str: ...


def explain_pod(
    namespace: str,
    name: str,
    *,
    inventory: Inventory,
    pending: PendingPods,
    gangs: GangCoordinator,
    judge: Judge,
    quota: QuotaCheck | None = None,
    score: Score | None = None,
    dra: DraReads | None = None,
    hold: HoldOf | None = None,
) -> Explanation | None:
    """Per node, whether the pod fits and why not, and the team quota that holds it back;
    None for a pod schedext does not know. The nodes are judged even when a quota holds the
    pod back: they say where it would go once the quota lets it."""
    key = f"{namespace}/{name}"
    held = next((h for h in inventory.holdings() if h.key == key), None)
    request = pending.find(namespace, name)
    if request is None and held is None:
        return None
    group = request.group if request else held.group if held else None
    status = gangs.status(group) if group else None
    group_hold = _hold(hold, group) if hold is not None and group else ""
    # The state is the holding's kind, as /inventory counts it ("reserved": a reservation,
    # one of its ``reservations``). A bound pod filtered again (by hand: kube-scheduler never
    # does) is still bound, not reserved.
    if held is not None and (request is None or held.kind is HoldingKind.BOUND):
        state = "bound" if held.kind is HoldingKind.BOUND else "reserved"
        return Explanation(
            pod=key,
            uid=held.uid,
            state=state,
            node=held.node,
            request={
                **_kinds(held),
                "gpuIds": list(held.gpu_ids or ()),
                "ip": held.ip,
            },
            group=status,
            group_reason="",
            nodes=(),
            group_hold=group_hold,
        )
    assert request is not None
    names = sorted(inventory.node_names())
    gate = gangs.gate(request, names) if request.group is not None else OPEN
    verdict = gate.verdict or judge(request, names, gate)
    failed, unresolvable = verdict.failed, verdict.unresolvable
    failed.update(_details(inventory, request, verdict))
    fitting = [node for node in names if node not in failed]
    scores = dict(zip(fitting, score(request, fitting).tolist(), strict=True)) if score else {}
    nodes = tuple(
        NodeExplanation(
            node=node,
            fits=node not in failed,
            reason=failed.get(node, ""),
            resolvable=node in failed and node not in unresolvable,
            score=scores.get(node),
            drift=_drift(inventory, node),
            dra=_dra(dra, inventory, node) if dra is not None else (),
        )
        for node in names
    )
    return Explanation(
        pod=key,
        uid=request.uid,
        state="reserved" if held is not None else "pending",
        node=held.node if held is not None else None,
        request=_describe(request, held),
        group=status,
        group_reason=verdict.rejections[0].message if gate.verdict is not None else "",
        nodes=nodes,
        quota=quota(request) if quota is not None and held is None else None,
        group_hold=group_hold,
    )


def _hold(hold: HoldOf, group: str) -> str:
    """The group's hold in words, or why it has none."""
    standing, why_not = hold(group)
    return hold_text(standing) if standing is not None else why_not


def _drift(inventory: Inventory, node: str) -> tuple[str, ...]:
    """Where the node's kubelet and schedext disagree (its agent's drift), GPUs by index."""
    spec = inventory.spec(node)
    if spec is None or not spec.drift:
        return ()
    return describe(spec.drift, {uuid: i for i, uuid in enumerate(spec.gpu_uuids)})


def _dra(dra: DraReads, inventory: Inventory, node: str) -> tuple[str, ...]:
    spec = inventory.spec(node)
    uuids = spec.gpu_uuids if spec is not None else ()
    return dra_lines(dra.gpu_owner(node), dra.dra_node(node), uuids, dra.dra_pod_key)


def dra_lines(
    owner: Ownership, node: NodeDra, gpu_uuids: Sequence[str], pod_key: Callable[[str], str]
) -> tuple[str, ...]:
    """What DRA says of a node, one sentence each: who owns its GPUs, when the device plugin
    does not alone; then each device a claim holds (the first :data:`DRA_LINES`), the GPU it
    is by the agent's UUIDs, the claims that hold it and their pods (``pod_key``: a UID's
    "namespace/name", "" when unknown)."""
    lines = [f"owner {owner.value}: {_OWNERS[owner]}"] if owner in _OWNERS else []
    mapping = held_gpus(node, gpu_uuids)
    gpus = {h.held.ref: (h.gpu, h.via_parent) for h in mapping.mapped}
    unmapped = {u.held.ref: u.why for u in mapping.unmapped}
    for held in node.held[:DRA_LINES]:
        if held.ref in gpus:
            index, via_parent = gpus[held.ref]
            where = f"on GPU {index}" if via_parent else f"GPU {index}"
        else:
            where = f"not counted: {unmapped.get(held.ref, 'not mapped to a GPU')}"
        lines.append(f"{held.ref} ({where}) held by {_holders(held, pod_key)}")
    if len(node.held) > DRA_LINES:
        lines.append(f"and {len(node.held) - DRA_LINES} more devices held by claims")
    return tuple(lines)


def _holders(held: HeldDevice, pod_key: Callable[[str], str]) -> str:
    """``claim ml/a for pod ml/p``; and the shares' memory, where claims hold shares of it:
    ``claims ml/a, ml/b (shares of 30720 MiB)``."""
    noun = "claims" if len(held.claims) > 1 else "claim"
    text = f"{noun} {', '.join(held.claims)}"
    if not held.whole and held.memory_mib:
        text += f" (shares of {held.memory_mib} MiB)"
    pods = sorted({key for uid in held.pods if (key := pod_key(uid))})
    if pods:
        text += f" for pod{'s' if len(pods) > 1 else ''} {', '.join(pods)}"
    return text


def _details(inventory: Inventory, request: PodRequest, verdict: FilterVerdict) -> dict[str, str]:
    """Per node rejected for a reason of a kind the pod asks for, that kind's own detail of
    it, where it has one (a share's room: device by device)."""
    details: dict[str, str] = {}
    kinds = asked(request)
    for rejection in verdict.rejections:
        for node in rejection.nodes:
            view = inventory.node(node)
            found = (k.detail(view, request, rejection.reason) for k in kinds) if view else ()
            detail = next((d for d in found if d is not None), None)
            if detail is not None:
                details[node] = detail
    return details


def _kinds(demand: Demand) -> dict[str, object]:
    """What the demand asks of each kind (every pod says how many whole GPUs: maybe 0)."""
    described: dict[str, object] = {}
    for kind in KINDS:
        described |= kind.describe(demand)
    return described


def _describe(request: PodRequest, held: Holding | None) -> dict[str, object]:
    described: dict[str, object] = {
        **_kinds(request),
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
    if held is not None:
        described["gpuIds"] = list(held.gpu_ids or ())  # what its reservation holds
    if request.ip is not None:
        described["ip"] = {
            "address": request.ip.address,
            "pools": list(request.ip.pools),
            "policy": request.ip.policy.value if request.ip.policy else None,
            "identity": request.ip.identity,
        }
    return described
