"""The inventory's nodes by slot: the slot each node has, the state behind it
(:class:`~extender.node_state.NodeState`), the numpy columns written from that state, and the
reads of both that every verb makes.

Why a module of its own: :class:`~extender.inventory.Inventory` is two things, and this is the
one that holds numbers. Its other half, the one writer path (nodes added, changed or removed,
holdings recorded, reserved, expired), stays in :mod:`extender.inventory` and writes through
here (``_state``, ``_sync``, ``_changed``). The seam is what is stored against what changes it,
never a kind of resource: a new column or kind touches :mod:`extender.columns` and ``_sync``,
a new way to hold something touches the inventory. ``Inventory`` inherits every method here,
so callers see one class.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from itertools import repeat
from types import MappingProxyType
from typing import TypeVar

import numpy as np

from extender import names
from extender.columns import NO_TOPOLOGY, BoolArray, Columns, DeviceArrays, IdArray, NodeArrays
from extender.derived import Derived
from extender.gpu_models import GpuModels
from extender.mig_state import MigArrays, MigColumns
from extender.model import NodeSpec
from extender.node_rows import write_devices, write_dra, write_use
from extender.node_state import NodeState
from extender.packed import NameTable, PackedNames

__all__ = ["NodeSlots"]

_T = TypeVar("_T")


class NodeSlots:
    """Nodes by slot and their columns; :class:`~extender.inventory.Inventory` adds the
    holdings and every change."""

    def __init__(
        self,
        *,
        capacity: int = 64,
        rack_label: str = names.RACK_LABEL,
        zone_label: str = names.ZONE_LABEL,
        use_stale_s: float = 300.0,
    ) -> None:
        self._rack_label, self._zone_label, self._use_stale_s = rack_label, zone_label, use_stale_s
        self._now = 0.0  # the latest wall-clock time age_use() was given
        self._topology_ids: dict[str, int] = {"": 0}
        self._slots: dict[str, int] = {}
        self._states: list[NodeState | None] = [None]
        self._free_slots: list[int] = []
        self._models = GpuModels()
        self._cols = Columns(max(capacity, 2))
        self._view: NodeArrays | None = None
        self._device_view: DeviceArrays | None = None
        self._mig = MigColumns()  # per MIG profile: healthy, free MIG devices per slot
        self.nodes_version = 0  # bumped when a node is added, removed or its spec changes
        self.version = 0  # bumped on every change; lets callers cache derived answers
        self.layout = 0  # bumped when the name -> id mapping changes (nodes added or removed)
        self._names: tuple[int, NameTable] | None = None  # (layout, table) for packed names
        self._spec_derived, self._held_derived = Derived(), Derived()
        # Nodes whose agent documents were not read, and why (Node events and a metric).
        self._problems: dict[str, tuple[str, ...]] = {}

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

    def names_of(self, ids: Sequence[int]) -> list[str]:
        """Node names for slot ids (of nodes the inventory holds)."""
        return [self._state(int(slot)).spec.name for slot in ids]

    def _name_table(self) -> NameTable:
        """Names by slot, for :class:`PackedNames`; rebuilt when the layout changed."""
        if self._names is None or self._names[0] != self.layout:
            by_slot: list[str | None] = [None] * len(self._states)
            for name, slot in self._slots.items():
                by_slot[slot] = name
            self._names = (self.layout, NameTable(by_slot))
        return self._names[1]

    def spec_derived(self, key: Hashable, compute: Callable[[], _T]) -> _T:
        """``compute()``, kept under ``key`` until a node is added, removed or changes its spec:
        for values that depend on the nodes' specs alone, never on what pods hold. ``key`` must
        name everything ``compute`` reads besides the specs."""
        return self._spec_derived.get(self.nodes_version, key, compute)

    def held_derived(self, key: Hashable, compute: Callable[[], _T]) -> _T:
        """``compute()``, kept under ``key`` until anything changes (:attr:`version`): for
        values that depend on what pods hold (prioritize reads what filter derived for the
        same pod). ``key`` must name everything ``compute`` reads besides the inventory."""
        return self._held_derived.get(self.version, key, compute)

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

    def mig_arrays(self, profile: str) -> MigArrays:
        """Per slot, the MIG devices of ``profile``: healthy, free, free on a busy GPU
        (read-only; zeros for a profile no node has)."""
        return self._mig.arrays(profile, self._cols.size)

    @property
    def problems(self) -> Mapping[str, tuple[str, ...]]:
        """Per node, why its topology, live-use or drift annotation was ignored (read-only)."""
        return MappingProxyType(self._problems)

    @property
    def gpus_in_use(self) -> bool:
        """Whether some node has GPUs in use outside schedext's placements (its agent's
        drift): only then does the filter look for them (one pass over a column)."""
        return bool(self.arrays.gpu_in_use.any())

    def node_names(self) -> list[str]:
        return list(self._slots)

    def spec(self, name: str) -> NodeSpec | None:
        """The node's spec alone (cheaper than :meth:`node` when only that is needed)."""
        slot = self._slots.get(name)
        return None if slot is None else self._state(slot).spec

    def model_name(self, model_id: int) -> str:
        return self._models.name(model_id)

    def model_mask(self, pattern: str | None) -> BoolArray:
        """Which model ids satisfy a pod's GPU model hint (:meth:`GpuModels.mask`)."""
        return self._models.mask(pattern)

    # -------------------------------------------------------------- internals

    def _state(self, slot: int) -> NodeState:
        state = self._states[slot]
        assert state is not None, "slot map and node states disagree"
        return state

    def _sync(self, state: NodeState) -> None:
        """Write the node's row: every column of :class:`NodeArrays`, derived from its state."""
        spec, slot, cols = state.spec, state.slot, self._cols.arrays
        free = state.free_ids()
        cols.alive[slot] = True
        cols.gpu_total[slot] = spec.gpu_count
        cols.gpu_healthy[slot] = spec.gpu_healthy
        cols.gpu_mig[slot] = len(spec.gpu_mig)
        self._mig.write(slot, state.mig.view(spec).counts(), len(cols.alive))
        cols.gpu_free[slot] = len(free)
        cols.gpu_in_use[slot] = len(state.outside_ids())
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
        cols.model[slot] = self._models.id(spec.gpu_model)
        cols.gpu_memory_mib[slot] = spec.gpu_memory_mib or 0
        write_devices(self._cols, state, free)
        write_dra(cols, slot, spec.dra)
        cols.rack[slot] = self._topology_id(spec.labels.get(self._rack_label, ""))
        cols.zone[slot] = self._topology_id(spec.labels.get(self._zone_label, ""))
        self._write_use(state, free)
        self._changed()

    def _write_use(self, state: NodeState, free: list[int]) -> None:
        write_use(self._cols.arrays, state, free, fresh_after=self._now - self._use_stale_s)

    def age_use(self, now: float) -> None:
        """Stop trusting the live-use samples that grew stale by ``now`` (wall-clock Unix
        seconds, as the agent stamps them; vectorised, called about once a second)."""
        self._now = now
        cols = self._cols.arrays
        stale = (cols.use_fresh == 1) & (cols.use_at < now - self._use_stale_s)
        if stale.any():
            cols.use_fresh[stale] = 0
            self._changed()

    def _topology_id(self, value: str) -> int:
        topology_id = self._topology_ids.get(value)
        if topology_id is None:
            topology_id = self._topology_ids[value] = len(self._topology_ids)
        return topology_id

    def _changed(self) -> None:
        self.version += 1
        self._view = None
        self._device_view = None
