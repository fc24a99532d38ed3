"""The in-memory inventory: nodes, their GPUs, and what bound pods and reservations hold.

Per-node numbers live in numpy columns indexed by a slot id (:mod:`extender.columns`); the
state behind them, per node, in :class:`~extender.node_state.NodeState`.

Concurrency: every change goes through the methods below (the one writer path); callers in
the service run them on one event-loop thread, so a request computed without awaiting in
between reads one consistent state. Nothing here hands out its internal maps or writable
arrays.
"""

from __future__ import annotations

import dataclasses
import ipaddress
from collections.abc import Callable, Collection, Hashable, Iterable, Mapping, Sequence
from itertools import repeat
from types import MappingProxyType
from typing import TypeVar

import numpy as np

from extender import names
from extender.columns import (
    NO_TOPOLOGY,
    BoolArray,
    Columns,
    DeviceArrays,
    IdArray,
    IntArray,
    NodeArrays,
)
from extender.ipam import AddressBook, IPPoolSpec, IPUse
from extender.model import Holding, HoldingKind, NodeSpec
from extender.node_state import NodeState, NodeView
from extender.packed import NameTable, PackedNames

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

_SPEC_DERIVED_MAX = 64  # bounds the cache below: pod shapes are few, but pods are not trusted
_MODEL_MASKS_MAX = 256  # the same for GPU model hints, which pods write
_T = TypeVar("_T")


class InventoryConflictError(Exception):
    """A reservation asked for GPU indices that another pod already holds."""


class Inventory:
    def __init__(
        self,
        *,
        capacity: int = 64,
        rack_label: str = names.RACK_LABEL,
        zone_label: str = names.ZONE_LABEL,
        use_stale_s: float = 300.0,
    ) -> None:
        self._rack_label, self._zone_label = rack_label, zone_label
        self._use_stale_s = use_stale_s
        self._now = 0.0  # the latest wall-clock time age_use() was given
        self._topology_ids: dict[str, int] = {"": 0}
        self._slots: dict[str, int] = {}
        self._states: list[NodeState | None] = [None]
        self._free_slots: list[int] = []
        self._holdings: dict[str, Holding] = {}
        self._reserved: set[str] = set()  # uids of RESERVED holdings, so expiry is cheap
        self._holdings_by_node: dict[str, dict[str, None]] = {}  # insertion-ordered sets
        self._model_ids: dict[str, int] = {"": 0}
        self._model_names: list[str] = [""]
        # Model ids are never reused (the column keeps them), but whether a hint names a
        # product exactly depends on the nodes there now: count the nodes per model id.
        self._model_nodes: list[int] = [0]
        self._models_present = 0  # bumped when a model gains its first or loses its last node
        self._model_masks: dict[str | None, tuple[int, BoolArray]] = {}
        self._cols = Columns(max(capacity, 2))
        self._view: NodeArrays | None = None
        self._device_view: DeviceArrays | None = None
        self.addresses = AddressBook()  # IP pools and who holds which address
        self._pool_masks: dict[str, tuple[tuple[int, int], BoolArray]] = {}
        self.nodes_version = 0  # bumped when a node is added, removed or its spec changes
        self.version = 0  # bumped on every change; lets callers cache derived answers
        self.layout = 0  # bumped when the name -> id mapping changes (nodes added or removed)
        self._names: tuple[int, NameTable] | None = None  # (layout, table) for packed names
        self._spec_derived: dict[Hashable, object] = {}
        # Nodes whose agent documents were not read, and why (reported by the shell as Node
        # events and a metric); a few entries at most, kept as changes come.
        self._problems: dict[str, tuple[str, ...]] = {}
        self._spec_derived_version = 0
        self._held_derived: dict[Hashable, object] = {}
        self._held_derived_version = 0

    # ----------------------------------------------------------------- reads

    def __len__(self) -> int:
        return len(self._slots)

    def __contains__(self, name: object) -> bool:
        return name in self._slots

    def ids(self, names: Sequence[str]) -> IdArray:
        """Slot ids for node names, 0 (never alive) for names the inventory does not know."""
        if isinstance(names, PackedNames):
            return names.slots(self._name_table())
        return np.fromiter(map(self._slots.get, names, repeat(0)), dtype=np.int32, count=len(names))

    def _name_table(self) -> NameTable:
        """Names by slot, for :class:`PackedNames`; rebuilt when the layout changed."""
        if self._names is None or self._names[0] != self.layout:
            by_slot: list[str | None] = [None] * len(self._states)
            for name, slot in self._slots.items():
                by_slot[slot] = name
            self._names = (self.layout, NameTable(by_slot))
        return self._names[1]

    def spec_derived(self, key: Hashable, compute: Callable[[], _T]) -> _T:
        """``compute()``, kept under ``key`` until a node is added, removed or changes its spec.

        For values that depend on the nodes' specs alone, never on what pods hold: filter
        judges the same few pod shapes against the same nodes again and again. ``key`` must
        name everything ``compute`` reads besides the specs."""
        if self._spec_derived_version != self.nodes_version:
            self._spec_derived.clear()
            self._spec_derived_version = self.nodes_version
        if key in self._spec_derived:
            return self._spec_derived[key]  # type: ignore[return-value]  # stored by compute
        if len(self._spec_derived) >= _SPEC_DERIVED_MAX:
            self._spec_derived.clear()
        value = self._spec_derived[key] = compute()
        return value

    def held_derived(self, key: Hashable, compute: Callable[[], _T]) -> _T:
        """``compute()``, kept under ``key`` until anything changes (:attr:`version`).

        For values that depend on what pods hold: prioritize reads what filter derived for
        the same pod, and pods of one shape come one after another between two changes.
        ``key`` must name everything ``compute`` reads besides the inventory."""
        if self._held_derived_version != self.version:
            self._held_derived.clear()
            self._held_derived_version = self.version
        if key in self._held_derived:
            return self._held_derived[key]  # type: ignore[return-value]  # stored by compute
        if len(self._held_derived) >= _SPEC_DERIVED_MAX:
            self._held_derived.clear()
        value = self._held_derived[key] = compute()
        return value

    @property
    def arrays(self) -> NodeArrays:
        if self._view is None:
            self._view = self._cols.read_only()
        return self._view

    @property
    def devices(self) -> DeviceArrays:
        """Per slot and GPU index, the room a share has (read-only; see DeviceArrays)."""
        if self._device_view is None:
            self._device_view = self._cols.read_only_devices()
        return self._device_view

    @property
    def problems(self) -> Mapping[str, tuple[str, ...]]:
        """Per node, why its topology or live-use annotation was ignored (read-only)."""
        return MappingProxyType(self._problems)

    def node_names(self) -> list[str]:
        return list(self._slots)

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
        )

    @property
    def reservation_count(self) -> int:
        return len(self._reserved)

    def holding(self, uid: str) -> Holding | None:
        return self._holdings.get(uid)

    def holdings(self) -> list[Holding]:
        return list(self._holdings.values())

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

    def model_name(self, model_id: int) -> str:
        return self._model_names[model_id]

    def model_mask(self, pattern: str | None) -> BoolArray:
        """Which model ids satisfy a pod's GPU model hint: the exact product name when a node
        in the inventory now has it, otherwise every model containing the hint, ignoring case
        ("h100")."""
        stamp = self._models_present
        cached = self._model_masks.get(pattern)
        if cached is not None and cached[0] == stamp and len(cached[1]) == len(self._model_names):
            return cached[1]
        mask = np.zeros(len(self._model_names), dtype=np.bool_)
        exact = self._model_ids.get(pattern) if pattern is not None else None
        if pattern is None:
            mask[:] = True
        elif exact is not None and self._model_nodes[exact] > 0:
            mask[exact] = True
        else:
            folded = pattern.casefold()
            for model_id, name in enumerate(self._model_names):
                mask[model_id] = bool(name) and folded in name.casefold()
        mask.flags.writeable = False
        if len(self._model_masks) >= _MODEL_MASKS_MAX:
            self._model_masks.clear()
        self._model_masks[pattern] = (stamp, mask)
        return mask

    # ----------------------------------------------------------------- nodes

    def upsert_node(self, spec: NodeSpec) -> bool:
        """Add or update a node; False when nothing that matters changed."""
        problems = tuple(p for p in (spec.topology_problem, spec.use_problem) if p)
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
                self._sync_use(state)
                self._changed()
                return True
            gpu_shape_same = (
                state.spec.gpu_count,
                state.spec.gpu_groups,
                state.spec.gpu_uuids,
            ) == (
                spec.gpu_count,
                spec.gpu_groups,
                spec.gpu_uuids,
            )
            if state.spec.gpu_model != spec.gpu_model:
                self._count_model(state.spec.gpu_model, -1)
                self._count_model(spec.gpu_model, +1)
            state.spec = spec
            self.nodes_version += 1
            if not gpu_shape_same:
                self._rebuild(state)
            self._sync(state)
            return True
        slot = self._free_slots.pop() if self._free_slots else self._cols.append()
        state = NodeState(spec=spec, slot=slot, holders=[None] * spec.gpu_count)
        if slot == len(self._states):
            self._states.append(state)
        else:
            self._states[slot] = state
        self._slots[spec.name] = slot
        self._count_model(spec.gpu_model, +1)
        self.layout += 1
        self.nodes_version += 1
        for uid in self._holdings_by_node.get(spec.name, {}):
            state.apply(self._holdings[uid])
        self._sync(state)
        return True

    def remove_node(self, name: str) -> bool:
        """Forget a node. Holdings on it stay: its pods are still there until deleted."""
        slot = self._slots.pop(name, None)
        self._problems.pop(name, None)
        if slot is None:
            return False
        self._count_model(self._state(slot).spec.gpu_model, -1)
        self.layout += 1
        self.nodes_version += 1
        self._states[slot] = None
        self._cols.clear(slot)
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
        old = self._holdings.get(holding.uid)
        if old == holding:
            return False
        if old is not None:
            self._unrecord(old)
        self._holdings[holding.uid] = holding
        if holding.kind is HoldingKind.RESERVED:
            self._reserved.add(holding.uid)
        if holding.ip is not None:
            # A second pod claiming a held address (broken outside schedext) is not recorded:
            # the first holder keeps it, and schedext never hands it out again.
            self.addresses.hold(
                IPUse(
                    address=int(ipaddress.ip_address(holding.ip)),
                    pool=holding.ip_pool or "",
                    uid=holding.uid,
                    pod=holding.key,
                    node=holding.node,
                    priority=holding.priority,
                )
            )
        self._holdings_by_node.setdefault(holding.node, {})[holding.uid] = None
        slot = self._slots.get(holding.node)
        if slot is not None:
            state = self._state(slot)
            state.apply(holding)
            self._sync(state)
        else:
            self._changed()
        return True

    def reserve(self, holding: Holding) -> None:
        """Hold exactly ``holding.gpu_ids`` for a pod; raise :class:`InventoryConflictError` if any
        is taken (bind planned on a stale view) instead of double-allocating."""
        slot = self._slots.get(holding.node)
        if slot is None:
            raise InventoryConflictError(f"node {holding.node} is not in the inventory")
        state = self._state(slot)
        if holding.shares:
            self._check_share_room(state, holding)
        free = set(state.free_ids())
        own = self._holdings.get(holding.uid)
        if own is not None and own.node == holding.node and own.gpu_ids:
            free.update(own.gpu_ids)
        taken = [i for i in holding.gpu_ids or () if i not in free and not holding.shares]
        if taken:
            raise InventoryConflictError(f"GPU {taken} on {holding.node} already held")
        if holding.ip is not None:
            address = int(ipaddress.ip_address(holding.ip))
            user = self.addresses.user(address)
            if user is not None and user.uid and user.uid != holding.uid:
                raise InventoryConflictError(f"address {holding.ip} already held by {user.pod}")
        self.upsert_holding(holding)

    def _check_share_room(self, state: NodeState, holding: Holding) -> None:
        """A share reserved on a stale view: refuse it where the device lacks the room now."""
        room = state.share_room()
        own = self._holdings.get(holding.uid)
        for index in holding.gpu_ids or ():
            memory, cores = room[index] if 0 <= index < len(room) else (-1, -1)
            if own is not None and own.node == holding.node and index in (own.gpu_ids or ()):
                memory += own.share_memory_mib
                cores += own.share_cores
            if memory < holding.share_memory_mib or cores < holding.share_cores:
                raise InventoryConflictError(
                    f"GPU {index} on {holding.node} has no room for a {holding.share_memory_mib}"
                    " MiB share now"
                )

    def remove_holding(self, uid: str) -> Holding | None:
        holding = self._holdings.pop(uid, None)
        if holding is not None:
            self._unrecord(holding)
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
        for holding in wanted.values():
            self.upsert_holding(holding)

    def expire(self, now: float) -> list[Holding]:
        """Drop reservations whose time is up (a bind that never completed)."""
        reserved = (self._holdings[uid] for uid in self._reserved)
        expired = [h for h in reserved if h.expires_at is not None and h.expires_at <= now]
        for holding in expired:
            self.remove_holding(holding.uid)
        return expired

    # -------------------------------------------------------------- internals

    def _state(self, slot: int) -> NodeState:
        state = self._states[slot]
        assert state is not None, "slot map and node states disagree"
        return state

    def _unrecord(self, holding: Holding) -> None:
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

    def _sync(self, state: NodeState) -> None:
        """Write the node's row: every column of :class:`NodeArrays`, derived from its state."""
        spec, slot, cols = state.spec, state.slot, self._cols.arrays
        free = state.free_ids()
        cols.alive[slot] = True
        cols.gpu_total[slot] = spec.gpu_count
        cols.gpu_healthy[slot] = spec.gpu_healthy
        cols.gpu_free[slot] = len(free)
        if spec.gpu_groups:
            free_set = set(free)
            cols.max_group_free[slot] = max(
                sum(1 for i in group if i in free_set) for group in spec.gpu_groups
            )
        else:
            cols.max_group_free[slot] = NO_TOPOLOGY
        cols.cpu_alloc[slot] = spec.cpu_milli
        cols.cpu_free[slot] = spec.cpu_milli - state.cpu_used
        cols.memory_alloc[slot] = spec.memory_bytes
        cols.memory_free[slot] = spec.memory_bytes - state.memory_used
        cols.model[slot] = self._model_id(spec.gpu_model)
        cols.gpu_memory_mib[slot] = spec.gpu_memory_mib or 0
        self._sync_devices(state, free)
        cols.rack[slot] = self._topology_id(spec.labels.get(self._rack_label, ""))
        cols.zone[slot] = self._topology_id(spec.labels.get(self._zone_label, ""))
        self._sync_use(state, free)
        self._changed()

    def _sync_devices(self, state: NodeState, free: list[int]) -> None:
        """The node's row of the device grid, and its share totals."""
        slot, cols = state.slot, self._cols.arrays
        self._cols.fit_width(len(state.holders))
        grid = self._cols.devices
        grid.memory_free[slot] = grid.cores_free[slot] = -1
        grid.sharers[slot] = 0
        for index, (memory, cores) in enumerate(state.share_room(free)):
            grid.memory_free[slot, index] = memory
            grid.cores_free[slot, index] = cores
            grid.sharers[slot, index] = state.sharers[index]
        cols.share_devices[slot] = sum(1 for n in state.sharers if n)
        cols.share_memory_held[slot] = sum(state.share_memory)

    def _sync_use(self, state: NodeState, free: list[int] | None = None) -> None:
        """The live-use columns: the means over the GPUs a pod would get (the free ones) of
        the agent's last sample, when there is one."""
        spec, slot, cols = state.spec, state.slot, self._cols.arrays
        sample = spec.gpu_use
        by_index = {u.index: u for u in sample.gpus} if sample is not None else {}
        rows = [by_index[i] for i in (state.free_ids() if free is None else free) if i in by_index]
        if sample is None or not rows:
            cols.use_util[slot] = cols.use_memory[slot] = cols.use_at[slot] = 0
            cols.use_fresh[slot] = 0
            return
        memory = spec.gpu_memory_mib or 0
        cols.use_util[slot] = round(sum(u.utilisation for u in rows) / len(rows))
        cols.use_memory[slot] = (
            min(100, round(100 * sum(u.memory_used_mib for u in rows) / (memory * len(rows))))
            if memory
            else 0
        )
        cols.use_at[slot] = int(sample.at)
        cols.use_fresh[slot] = int(sample.at >= self._now - self._use_stale_s)

    def age_use(self, now: float) -> None:
        """Stop trusting the live-use samples that grew stale by ``now`` (wall-clock Unix
        seconds, as the agent stamps them; vectorised, called about once a second)."""
        self._now = now
        cols = self._cols.arrays
        stale = (cols.use_fresh == 1) & (cols.use_at < now - self._use_stale_s)
        if stale.any():
            cols.use_fresh[stale] = 0
            self._changed()

    def _model_id(self, model: str | None) -> int:
        if not model:
            return 0
        model_id = self._model_ids.get(model)
        if model_id is None:
            model_id = self._model_ids[model] = len(self._model_names)
            self._model_names.append(model)
            self._model_nodes.append(0)
        return model_id

    def _count_model(self, model: str | None, delta: int) -> None:
        model_id = self._model_id(model)
        before = self._model_nodes[model_id]
        self._model_nodes[model_id] = before + delta
        if model_id and (before == 0) != (before + delta == 0):
            self._models_present += 1

    def _topology_id(self, value: str) -> int:
        topology_id = self._topology_ids.get(value)
        if topology_id is None:
            topology_id = self._topology_ids[value] = len(self._topology_ids)
        return topology_id

    def _changed(self) -> None:
        self.version += 1
        self._view = None
        self._device_view = None
