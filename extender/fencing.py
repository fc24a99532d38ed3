"""Which devices the fence covers (``dra.fence``): every GPU that schedext's binds hold, bound
or reserved, which a GPU driver's ResourceSlices advertise too, matched by UUID.

On a mixed node NVIDIA's device plugin and its DRA driver offer the same GPUs. schedext never
hands out a GPU a claim holds (:mod:`extender.claimed`); the fence is the other direction: a
``NoSchedule`` DeviceTaintRule on each device whose GPU a pod of schedext's holds, so that
kube-scheduler's DRA allocator never picks it (:mod:`extender.dra.fence` names and diffs the
rules). A GPU index maps to its UUID by the holding's own (``schedext.io/gpu-uuids``) or the
node agent's topology document; the DRA devices to fence are the one with that UUID and any
partition of it (a MIG device whose ``parentUUID`` it is). A MIG device schedext handed out is
fenced by its UUID, with the whole GPU it is on.

A GPU with no UUID, or whose UUID no DRA device has while some of the node's devices have no
UUID (or cannot be read), cannot be fenced: it is reported (:class:`Unfenced`), never guessed
at. A GPU whose UUID no device has while all of them have one is not DRA's: nothing to fence.

The taint's value is the UID of the pod that holds the GPU, or ``held`` when several do
(shares). A fenced device is unfit for DRA (:mod:`extender.dra.node_view` counts it unhealthy)
and changes nothing for schedext, which counts only the devices claims hold.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import NamedTuple

from extender.dra import (
    HELD,
    DeviceRef,
    FenceDiff,
    FenceRule,
    NodeDra,
    TaintRule,
    fence_diff,
    fence_name,
)
from extender.model import Holding, NodeSpec

__all__ = ["FencePlan", "Unfenced", "fence_plan", "pod_fence"]

_LABEL_VALUE = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")
SpecOf = Callable[[str], NodeSpec | None]
DraOf = Callable[[str], NodeDra]


class Unfenced(NamedTuple):
    """A GPU a pod of schedext's holds that the fence cannot cover, and why."""

    node: str
    pod: str  # "namespace/name"
    gpu: str  # "GPU 2 (GPU-...)" or "MIG device MIG-..."
    why: str


class FencePlan(NamedTuple):
    rules: tuple[FenceRule, ...]  # every rule wanted now, by name
    unfenced: tuple[Unfenced, ...]  # sorted
    diff: FenceDiff  # what makes the published rules ``rules``


def fence_plan(
    holdings: Iterable[Holding], spec_of: SpecOf, dra_of: DraOf, seen: Iterable[TaintRule]
) -> FencePlan:
    """The rules ``holdings`` want, and the writes that make ``seen`` (the ledger's
    DeviceTaintRules) match them. ``spec_of``/``dra_of``: a node's spec and what DRA says of
    it (only nodes with DRA devices are looked at)."""
    fenced = _Fenced(spec_of, dra_of)
    for holding in holdings:
        fenced.add(holding)
    rules = fenced.rules()
    return FencePlan(rules, tuple(sorted(fenced.unfenced)), fence_diff(rules, seen))


def pod_fence(
    uid: str, holdings: Iterable[Holding], spec: NodeSpec, node: NodeDra
) -> tuple[tuple[FenceRule, ...], tuple[Unfenced, ...]]:
    """The rules for the GPUs pod ``uid`` holds, as the pass over ``holdings`` (all of the
    node's, the pod's included) would publish them, and its GPUs that cannot be fenced: what
    a bind publishes before its Binding."""
    fenced = _Fenced(lambda _: spec, lambda _: node)
    for holding in holdings:
        fenced.add(holding)
    rules = tuple(rule for rule in fenced.rules() if uid in fenced.holders[rule.ref])
    mine = {h.key for h in holdings if h.uid == uid}
    return rules, tuple(sorted(u for u in fenced.unfenced if u.pod in mine))


class _Devices:
    """A node's DRA devices by UUID, by the UUID of the GPU they partition, and how many have
    no UUID schedext can read."""

    def __init__(self, node: NodeDra) -> None:
        self.by_uuid: dict[str, list[DeviceRef]] = {}
        self.by_parent: dict[str, list[DeviceRef]] = {}
        self.parent_of: dict[str, str] = {}
        self.nameless = 0
        for state in node.devices:
            device = state.device
            if state.unknown or not device.uuid:
                self.nameless += 1
                continue
            self.by_uuid.setdefault(device.uuid, []).append(state.ref)
            if device.parent_uuid:
                self.by_parent.setdefault(device.parent_uuid, []).append(state.ref)
                self.parent_of[device.uuid] = device.parent_uuid

    def unmatched(self, uuid: str) -> str:
        """Why the GPU of ``uuid``, which no device has, cannot be fenced ("" if it need not)."""
        if not self.nameless:
            return ""  # every device has a UUID, none this one: DRA does not offer it
        return (
            f"no DRA device has UUID {uuid}, and {self.nameless} of the node's DRA devices "
            "have no UUID schedext can read"
        )


class _Fenced:
    def __init__(self, spec_of: SpecOf, dra_of: DraOf) -> None:
        self._spec_of = spec_of
        self._dra_of = dra_of
        self._nodes: dict[str, _Devices | None] = {}
        self.holders: dict[DeviceRef, set[str]] = {}
        self._node_of: dict[DeviceRef, str] = {}
        self.unfenced: list[Unfenced] = []

    def add(self, holding: Holding) -> None:
        if not holding.gpu_ids and not holding.mig_uuids:
            return
        devices = self._devices(holding.node)
        if devices is None:
            return
        spec = self._spec_of(holding.node)
        for gpu, uuid in _gpu_uuids(holding, spec):
            name = f"GPU {gpu} ({uuid})" if uuid else f"GPU {gpu}"
            if not uuid:
                self._unfenced(holding, name, "the node agent publishes no UUID for it")
                continue
            refs = devices.by_uuid.get(uuid, []) + devices.by_parent.get(uuid, [])
            self._fence(holding, refs, name, devices.unmatched(uuid))
        mig_parents = {slot.uuid: slot.gpu for slot in spec.mig_slices} if spec else {}
        for uuid in holding.mig_uuids or ():
            refs = list(devices.by_uuid.get(uuid, []))
            parent = devices.parent_of.get(uuid) or _uuid_at(spec, mig_parents.get(uuid))
            refs += [ref for ref in devices.by_uuid.get(parent, []) if ref not in refs]
            self._fence(holding, refs, f"MIG device {uuid}", devices.unmatched(uuid))

    def rules(self) -> tuple[FenceRule, ...]:
        made = (
            FenceRule(fence_name(node, ref), node, ref, _value(self.holders[ref]))
            for ref, node in self._node_of.items()
        )
        return tuple(sorted(made))

    def _fence(self, holding: Holding, refs: list[DeviceRef], name: str, why: str) -> None:
        if not refs:
            if why:
                self._unfenced(holding, name, why)
            return
        for ref in refs:
            self.holders.setdefault(ref, set()).add(holding.uid)
            self._node_of[ref] = holding.node

    def _unfenced(self, holding: Holding, gpu: str, why: str) -> None:
        self.unfenced.append(Unfenced(holding.node, holding.key, gpu, why))

    def _devices(self, node: str) -> _Devices | None:
        """The node's DRA devices; None where no GPU driver advertises any."""
        if node not in self._nodes:
            dra = self._dra_of(node)
            self._nodes[node] = _Devices(dra) if dra.devices else None
        return self._nodes[node]


def _gpu_uuids(holding: Holding, spec: NodeSpec | None) -> list[tuple[int, str]]:
    """Each GPU index the holding has, with its UUID ("" when unknown): the holding's own
    where bind wrote them, else the node agent's."""
    ids = holding.gpu_ids or ()
    own = holding.gpu_uuids
    if own is not None and len(own) == len(ids):
        return list(zip(ids, own, strict=True))
    return [(gpu, _uuid_at(spec, gpu)) for gpu in ids]


def _uuid_at(spec: NodeSpec | None, gpu: int | None) -> str:
    if spec is None or gpu is None or not 0 <= gpu < len(spec.gpu_uuids):
        return ""
    return spec.gpu_uuids[gpu]


def _value(uids: set[str]) -> str:
    """The taint's value: the one holder's UID, where it is a valid label value (a UID is)."""
    if len(uids) == 1:
        (uid,) = uids
        if _LABEL_VALUE.fullmatch(uid):
            return uid
    return HELD
