"""The in-memory inventory: nodes, their GPUs, and what bound pods and reservations hold.

Per-node numbers live in numpy columns indexed by a slot id (:mod:`extender.columns`); the
state behind them, per node, in :class:`~extender.node_state.NodeState`. Both are kept, and
read, by :class:`~extender.node_slots.NodeSlots`, which :class:`Inventory` extends with what
pods hold and with every change.

Concurrency: every change goes through the methods below (the one writer path); callers in
the service run them on one event-loop thread, so a request computed without awaiting in
between reads one consistent state. Nothing here hands out its internal maps or writable
arrays.
"""

from __future__ import annotations

import dataclasses
import ipaddress
from collections.abc import Collection, Iterable

import numpy as np

from extender import names
from extender.capacity_waits import Vacancies
from extender.columns import BoolArray, DeviceArrays, IdArray, IntArray, NodeArrays
from extender.conflicts import reservation_conflict
from extender.dra import DraGpus
from extender.ipam import AddressBook, IPPoolSpec, IPUse
from extender.model import GpuInUse, Holding, HoldingKind, NodeSpec
from extender.node_slots import NodeSlots
from extender.node_state import NodeState, NodeView
from extender.tally import Amounts, NamespaceTally

__all__ = [
    "BoolArray",
    "DeviceArrays",
    "IdArray",
    "IntArray",
    "Inventory",
    "InventoryConflictError",
    "NodeArrays",
    "NodeView",
]


def _gpu_shape(spec: NodeSpec) -> tuple[object, ...]:
    """What of a node's spec decides where its holdings sit: a change re-applies them (the
    drift too: a pod placed without schedext is counted where the kubelet says)."""
    shape = (spec.gpu_count, spec.gpu_groups, spec.gpu_uuids, spec.gpu_mig, spec.mig_slices)
    return (*shape, spec.gpu_in_use)


# What DRA's claims hold on a node: GPUs in use, what DRA offers, GPUs held only in shares.
_Claimed = tuple[tuple[GpuInUse, ...], DraGpus | None, tuple[tuple[int, int], ...]]
_UNCLAIMED: _Claimed = ((), None, ())


class InventoryConflictError(Exception):
    """A reservation asked for what another pod holds now (see extender.conflicts)."""


class Inventory(NodeSlots):
    """The nodes (by slot and column, from :class:`~extender.node_slots.NodeSlots`), what their
    pods hold, and every change to either."""

    def __init__(
        self,
        *,
        capacity: int = 64,
        rack_label: str = names.RACK_LABEL,
        zone_label: str = names.ZONE_LABEL,
        use_stale_s: float = 300.0,
        vacancies: Vacancies | None = None,
    ) -> None:
        super().__init__(
            capacity=capacity, rack_label=rack_label, zone_label=zone_label, use_stale_s=use_stale_s
        )
        self._vacancies = vacancies  # told what may have made room
        self._holdings: dict[str, Holding] = {}
        self._reserved: set[str] = set()  # uids of RESERVED holdings, so expiry is cheap
        self._holdings_by_node: dict[str, dict[str, None]] = {}  # insertion-ordered sets
        self._use = NamespaceTally()  # what holdings take per namespace (team quotas)
        self.addresses = AddressBook()  # IP pools and who holds which address
        self._pool_masks: dict[str, tuple[tuple[int, int], BoolArray]] = {}
        self.removals = 0  # bumped when a pod stops holding anything: something was freed
        # Each node's spec as the node watch gave it, and the GPUs DRA's claims hold there
        # (extender.claimed): the spec the books use is the one with both in gpu_in_use.
        self._received: dict[str, NodeSpec] = {}
        self._claimed: dict[str, _Claimed] = {}

    # ----------------------------------------------------------------- reads

    def node(self, name: str) -> NodeView | None:
        slot = self._slots.get(name)
        if slot is None:
            return None
        state = self._state(slot)
        free = state.free_ids()
        return NodeView(
            spec=state.spec,
            holders=tuple(state.holders),
            anonymous_gpus=state.anonymous,
            free_gpu_ids=tuple(free),
            cpu_free=state.spec.cpu_milli - state.cpu_used,
            memory_free=state.spec.memory_bytes - state.memory_used,
            holdings=tuple(self._holdings[uid] for uid in self._holdings_by_node.get(name, {})),
            share_memory=tuple(state.share_memory),
            share_cores=tuple(state.share_cores),
            share_room=tuple(state.share_room(free)),
            share_holders=tuple(state.share_holders()),
            mig=state.mig.view(state.spec),
        )

    @property
    def reservation_count(self) -> int:
        return len(self._reserved)

    def holding(self, uid: str) -> Holding | None:
        return self._holdings.get(uid)

    def holdings(self) -> list[Holding]:
        return list(self._holdings.values())

    def namespace_use(self, namespace: str) -> Amounts:
        """What the namespace's pods hold, bound or reserved, on any node (kept as holdings
        change: a lookup, not a pass over the holdings)."""
        return self._use.of(namespace)

    def pool_mask(self, pool: IPPoolSpec) -> BoolArray:
        """Which node slots ``pool``'s node selector selects (cached until nodes change)."""
        cached = self._pool_masks.get(pool.name)
        stamp = (self.nodes_version, self.addresses.pools_version)
        if cached is not None and cached[0] == stamp:
            return cached[1]
        mask = np.zeros(len(self._states), dtype=np.bool_)
        for slot, state in enumerate(self._states):
            if state is not None and not pool.problem and pool.selects(state.spec.labels):
                mask[slot] = True
        mask.flags.writeable = False
        self._pool_masks[pool.name] = (stamp, mask)
        return mask

    # ----------------------------------------------------------------- nodes

    def upsert_node(self, spec: NodeSpec) -> bool:
        """Add or update a node; False when nothing that matters changed."""
        self._received[spec.name] = spec
        spec = _with_claimed(spec, self._claimed.get(spec.name, _UNCLAIMED))
        problems = tuple(
            p for p in (spec.topology_problem, spec.use_problem, spec.drift_problem) if p
        )
        if problems:
            self._problems[spec.name] = problems
        else:
            self._problems.pop(spec.name, None)
        slot = self._slots.get(spec.name)
        if slot is not None:
            state = self._state(slot)
            if state.spec == spec:
                return False
            if (
                dataclasses.replace(state.spec, gpu_use=spec.gpu_use, use_problem=spec.use_problem)
                == spec
            ):
                # Only the live-use sample changed (every few seconds per node): no spec
                # derived answer depends on it, so the caches of filter stay.
                state.spec = spec
                self._write_use(state, state.free_ids())
                self._changed()
                return True
            old = state.spec
            gpu_shape_same = _gpu_shape(state.spec) == _gpu_shape(spec)
            if state.spec.gpu_model != spec.gpu_model:
                self._models.count(state.spec.gpu_model, -1)
                self._models.count(spec.gpu_model, +1)
            state.spec = spec
            self.nodes_version += 1
            if not gpu_shape_same:
                self._rebuild(state)
            self._sync(state)
            if self._vacancies is not None:
                self._vacancies.node_changed(old, spec)
            return True
        slot = self._free_slots.pop() if self._free_slots else self._cols.append()
        state = NodeState(spec=spec, slot=slot, holders=[None] * spec.gpu_indices)
        if slot == len(self._states):
            self._states.append(state)
        else:
            self._states[slot] = state
        self._slots[spec.name] = slot
        self._models.count(spec.gpu_model, +1)
        self.layout += 1
        self.nodes_version += 1
        for uid in self._holdings_by_node.get(spec.name, {}):
            state.apply(self._holdings[uid])
        self._sync(state)
        if self._vacancies is not None:
            self._vacancies.node_changed(None, spec)
        return True

    def set_claimed(
        self,
        name: str,
        uses: tuple[GpuInUse, ...],
        dra: DraGpus | None = None,
        shares: tuple[tuple[int, int], ...] = (),
    ) -> bool:
        """The GPUs DRA's claims hold on node ``name`` now (:func:`extender.claimed.
        claimed_in_use`; ``shares``: those held only in shares, :func:`~extender.claimed.
        claimed_shares`), and what DRA offers there; kept for a node not seen yet. False when
        nothing changed."""
        claimed = (uses, dra, shares)
        if self._claimed.get(name, _UNCLAIMED) == claimed:
            return False
        if claimed != _UNCLAIMED:
            self._claimed[name] = claimed
        else:
            self._claimed.pop(name, None)
        received = self._received.get(name)
        return received is not None and self.upsert_node(received)

    def remove_node(self, name: str) -> bool:
        """Forget a node. Holdings on it stay: its pods are still there until deleted."""
        self._received.pop(name, None)
        slot = self._slots.pop(name, None)
        self._problems.pop(name, None)
        if slot is None:
            return False
        self._models.count(self._state(slot).spec.gpu_model, -1)
        self.layout += 1
        self.nodes_version += 1
        self._states[slot] = None
        self._cols.clear(slot)
        self._mig.write(slot, {}, 0)
        self._free_slots.append(slot)
        self._changed()
        return True

    def replace_nodes(self, specs: Iterable[NodeSpec]) -> None:
        """Make the node set exactly ``specs`` (a relist)."""
        wanted = {spec.name: spec for spec in specs}
        for name in [n for n in self._slots if n not in wanted]:
            self.remove_node(name)
        for spec in wanted.values():
            self.upsert_node(spec)

    # -------------------------------------------------------------- holdings

    def upsert_holding(self, holding: Holding) -> bool:
        """Record what a pod holds (bound pod or reservation); False when unchanged."""
        return self._upsert_holding(holding, None)

    def _upsert_holding(self, holding: Holding, rows: dict[int, NodeState] | None) -> bool:
        """``rows``: where to leave the node's state whose row is to be written, for a caller
        that records many holdings and writes each node's row once (:meth:`replace_bound`)."""
        old = self._holdings.get(holding.uid)
        if old == holding:
            return False
        if old is not None and _retag(self, old, holding):
            return True
        if old is not None:
            self._unrecord(old)
        self._holdings[holding.uid] = holding
        self._use.add(holding)
        if holding.kind is HoldingKind.RESERVED:
            self._reserved.add(holding.uid)
        if holding.ip is not None:
            # A second pod claiming a held address (broken outside schedext) is not recorded:
            # the first holder keeps it, and schedext never hands it out again.
            self.addresses.hold(_address(holding))
        self._holdings_by_node.setdefault(holding.node, {})[holding.uid] = None
        slot = self._slots.get(holding.node)
        if slot is None:
            self._changed()
        elif rows is not None:
            state = rows[slot] = self._state(slot)
            state.apply(holding)
        else:
            state = self._state(slot)
            state.apply(holding)
            self._sync(state)
        return True

    def reserve(self, holding: Holding) -> None:
        """Hold exactly ``holding.gpu_ids`` for a pod; raise :class:`InventoryConflictError` if any
        is taken (bind planned on a stale view) instead of double-allocating."""
        slot = self._slots.get(holding.node)
        if slot is None:
            raise InventoryConflictError(f"node {holding.node} is not in the inventory")
        own = self._holdings.get(holding.uid)
        if own is not None and own.node != holding.node:
            own = None
        conflict = reservation_conflict(self._state(slot), holding, own, self.addresses)
        if conflict is not None:
            raise InventoryConflictError(conflict)
        self.upsert_holding(holding)

    def remove_holding(self, uid: str) -> Holding | None:
        holding = self._holdings.pop(uid, None)
        if holding is not None:
            self._unrecord(holding)
            self.removals += 1
            slot = self._slots.get(holding.node)
            if self._vacancies is not None:
                self._vacancies.vacated(holding, None if slot is None else self._state(slot).spec)
        return holding

    def replace_bound(
        self, holdings: Iterable[Holding], *, live: Collection[str] | None = None
    ) -> None:
        """Make the bound holdings exactly ``holdings`` (a pod relist). Reservations are binds
        in flight that the list may not show bound yet: they stay, unless ``live`` (the UIDs of
        every listed pod) shows their pod is gone."""
        wanted = {h.uid: h for h in holdings}
        stale = [
            uid
            for uid, h in self._holdings.items()
            if uid not in wanted
            and (h.kind is HoldingKind.BOUND or (live is not None and uid not in live))
        ]
        for uid in stale:
            self.remove_holding(uid)
        # Each node's row written once, not once per pod: a cold sync of 300,000 pods on
        # 15,000 nodes wrote every row 20 times.
        rows: dict[int, NodeState] = {}
        for holding in wanted.values():
            self._upsert_holding(holding, rows)
        for state in rows.values():
            self._sync(state)

    def expire(self, now: float) -> list[Holding]:
        """Drop reservations whose time is up (a bind that never completed)."""
        reserved = (self._holdings[uid] for uid in self._reserved)
        expired = [h for h in reserved if h.expires_at is not None and h.expires_at <= now]
        for holding in expired:
            self.remove_holding(holding.uid)
        return expired

    # -------------------------------------------------------------- internals

    def _unrecord(self, holding: Holding) -> None:
        self._use.remove(holding)
        self._reserved.discard(holding.uid)
        self.addresses.release(holding.uid)
        on_node = self._holdings_by_node.get(holding.node)
        if on_node is not None:
            on_node.pop(holding.uid, None)
            if not on_node:
                del self._holdings_by_node[holding.node]
        slot = self._slots.get(holding.node)
        if slot is None:
            self._changed()
            return
        state = self._state(slot)
        state.unapply(holding.uid)
        self._sync(state)

    def _rebuild(self, state: NodeState) -> None:
        state.reset()
        for uid in self._holdings_by_node.get(state.spec.name, {}):
            state.apply(self._holdings[uid])


# What a holding is but where it sits: its kind, expiry and phase. A bind's reservation
# confirmed, then seen bound by the watch, changes only these.
_TAGS = frozenset({"kind", "expires_at", "running"})
_PLACE = tuple(f.name for f in dataclasses.fields(Holding) if f.name not in _TAGS)


def _retag(inventory: Inventory, old: Holding, new: Holding) -> bool:
    """Record ``new`` in place of ``old`` when it differs only in its tags and its node would
    count it exactly as it counts ``old``: then its node's row is left as it is (the full
    path takes it away and applies it again, writing the row twice, for the same row). The
    rest is done as the full path does it, orders included. False, having done nothing,
    otherwise."""
    if old.node != new.node or any(getattr(old, f) != getattr(new, f) for f in _PLACE):
        return False
    slot = inventory._slots.get(new.node)
    state = None if slot is None else inventory._state(slot)
    if state is not None and not state.keeps(new):
        return False
    uid = new.uid
    inventory._use.remove(old)
    inventory._use.add(new)
    inventory._reserved.discard(uid)
    if new.kind is HoldingKind.RESERVED:
        inventory._reserved.add(uid)
    inventory.addresses.release(uid)
    if new.ip is not None:
        inventory.addresses.hold(_address(new))
    inventory._holdings[uid] = new
    on_node = inventory._holdings_by_node[new.node]
    del on_node[uid]
    on_node[uid] = None
    if state is not None:
        state.move_last(uid)
    inventory._changed()
    return True


def _address(holding: Holding) -> IPUse:
    assert holding.ip is not None
    return IPUse(
        address=int(ipaddress.ip_address(holding.ip)),
        pool=holding.ip_pool or "",
        uid=holding.uid,
        pod=holding.key,
        node=holding.node,
        priority=holding.priority,
    )


def _with_claimed(spec: NodeSpec, claimed: _Claimed) -> NodeSpec:
    """``spec`` with the GPUs DRA's claims hold beside the drift's in ``gpu_in_use``, what DRA
    offers there, and the GPUs held only in DRA's shares (but those the kubelet says are used
    too)."""
    uses, dra, shares = claimed
    if not uses and dra is None:
        return spec
    in_use = tuple(sorted(set(spec.gpu_in_use) | set(uses)))
    drift = {use.gpu for use in spec.gpu_in_use}
    shares = tuple((gpu, mib) for gpu, mib in shares if gpu not in drift)
    return dataclasses.replace(spec, gpu_in_use=in_use, dra=dra, gpu_shared_outside=shares)
