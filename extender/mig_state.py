"""MIG devices in the inventory: which pod holds which MIG device of a node
(:class:`MigState`, one per node, inside its ``NodeState``), the copy handed out
(:class:`MigView`), and the per-profile columns the filter and the scorer read
(:class:`MigColumns`).

A MIG device is held by the pod whose ``schedext.io/mig-uuids`` names it. A pod that takes
MIG devices without that record (bound by another scheduler, or its record names devices the
node no longer has) holds *anonymous* devices of its profiles: counted, never placed, so no
decision over-commits the node. As with whole GPUs, anonymous devices are assumed to sit on
the free devices bind would take last.

The columns are per profile, because pods ask by profile: per node slot, the healthy MIG
devices of the profile (what no eviction changes), the free ones, and the free ones on a GPU
that already has a MIG device in use (what packing prefers). A filter over 5,000 nodes reads
one column per profile the pod asks for, never a node's state.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from extender.columns import IntArray
from extender.devices.mig_slices import pick_slices
from extender.model import Holding, MigSlot, NodeSpec

__all__ = ["MigArrays", "MigColumns", "MigCount", "MigState", "MigView"]


class MigCount(NamedTuple):
    """One profile's MIG devices on one node."""

    healthy: int  # on GPUs the node agent has not marked unhealthy
    free: int  # healthy, held by no pod (named or anonymous)
    free_on_busy: int  # free, on a GPU where another MIG device is in use


@dataclass(frozen=True, slots=True)
class MigView:
    """A copy of one node's MIG devices and their holders (for bind, preemption, explain)."""

    slots: tuple[MigSlot, ...] = ()
    holders: tuple[str | None, ...] = ()  # per slot: the UID of the pod holding it
    anonymous: tuple[tuple[str, int], ...] = ()  # per profile: devices held unplaced
    unhealthy: frozenset[int] = frozenset()  # GPU indices
    # Slot positions the node agent reports in use by containers schedext did not place (the
    # kubelet's PodResources), held by no pod schedext knows: never free.
    outside: frozenset[int] = frozenset()

    def busy(self) -> dict[int, int]:
        """Per GPU index, its MIG devices held by a named pod."""
        counts: Counter[int] = Counter(
            slot.gpu for slot, holder in zip(self.slots, self.holders, strict=True) if holder
        )
        return dict(counts)

    def free(self, profile: str) -> list[int]:
        """The free MIG devices of ``profile`` (slot positions) in the order bind takes them
        (:func:`~extender.devices.mig_slices.pick_slices`), less those assumed held
        anonymously (the last ones)."""
        candidates = [
            (slot.gpu, position)
            for position, (slot, holder) in enumerate(zip(self.slots, self.holders, strict=True))
            if holder is None
            and slot.profile == profile
            and slot.gpu not in self.unhealthy
            and position not in self.outside
        ]
        ordered = pick_slices(candidates, self.busy(), len(candidates)) or ()
        taken = dict(self.anonymous).get(profile, 0)
        return list(ordered[: max(0, len(ordered) - taken)])

    def counts(self) -> dict[str, MigCount]:
        """Per profile the node has, its :class:`MigCount`."""
        busy = self.busy()
        counts: dict[str, MigCount] = {}
        for profile in dict.fromkeys(slot.profile for slot in self.slots):
            healthy = sum(
                1 for s in self.slots if s.profile == profile and s.gpu not in self.unhealthy
            )
            free = self.free(profile)
            on_busy = sum(1 for position in free if busy.get(self.slots[position].gpu, 0))
            counts[profile] = MigCount(healthy, len(free), on_busy)
        return counts


_NO_MIG = MigView()


@dataclass(slots=True)
class MigState:
    """One node's MIG devices (``slots``, the node spec's) and who holds them. Built anew
    whenever the node's MIG layout changes (the inventory then applies its holdings again)."""

    slots: tuple[MigSlot, ...] = ()
    holders: list[str | None] = field(default_factory=list)
    anonymous: Counter[str] = field(default_factory=Counter)
    # Per holding UID: the slots it holds by name, and per profile the devices it holds
    # anonymously; what unapply takes away again.
    applied: dict[str, tuple[tuple[int, ...], tuple[tuple[str, int], ...]]] = field(
        default_factory=dict
    )

    @classmethod
    def of(cls, spec: NodeSpec) -> MigState:
        return cls(slots=spec.mig_slices, holders=[None] * len(spec.mig_slices))

    def apply(self, holding: Holding) -> None:
        """Count ``holding``'s MIG devices: those its record names, where the node has them
        and no one else holds them (all or none), and per profile what it asks beyond those
        as anonymous devices."""
        if not (holding.mig or holding.mig_uuids):
            return
        position = {slot.uuid: i for i, slot in enumerate(self.slots)}
        wanted = [position.get(uuid, -1) for uuid in holding.mig_uuids or ()]
        held: tuple[int, ...] = ()
        if (
            wanted
            and len(set(wanted)) == len(wanted)
            and all(i >= 0 and self.holders[i] is None for i in wanted)
        ):
            held = tuple(wanted)
            for i in held:
                self.holders[i] = holding.uid
        named = Counter(self.slots[i].profile for i in held)
        anonymous = tuple((p, n - named[p]) for p, n in holding.mig if n > named[p])
        self.anonymous.update(dict(anonymous))
        self.applied[holding.uid] = (held, anonymous)

    def unapply(self, uid: str) -> None:
        applied = self.applied.pop(uid, None)
        if applied is None:
            return
        held, anonymous = applied
        for i in held:
            self.holders[i] = None
        self.anonymous.subtract(dict(anonymous))
        self.anonymous = +self.anonymous  # drop the profiles back at 0

    def view(self, spec: NodeSpec) -> MigView:
        if not self.slots:
            return _NO_MIG
        mig = set(spec.gpu_mig)
        return MigView(
            slots=self.slots,
            holders=tuple(self.holders),
            anonymous=tuple(sorted(self.anonymous.items())),
            unhealthy=frozenset(i for i, _ in spec.gpu_unhealthy if i in mig),
            outside=frozenset(
                i
                for i, slot in enumerate(self.slots)
                if slot.uuid in spec.mig_in_use and self.holders[i] is None
            ),
        )

    def taken(self, spec: NodeSpec, uuids: tuple[str, ...], uid: str) -> list[str]:
        """Of ``uuids`` (a reservation for pod ``uid``), those it cannot have now: not on the
        node, unhealthy, held by another pod, or assumed held anonymously."""
        view = self.view(spec)
        position = {slot.uuid: i for i, slot in enumerate(self.slots)}
        free: set[int] = set()
        for profile in {slot.profile for slot in self.slots}:
            free.update(view.free(profile))
        return [
            uuid
            for uuid in uuids
            if (i := position.get(uuid)) is None
            or (i not in free and self.holders[i] != uid)
            or self.slots[i].gpu in view.unhealthy
        ]


class MigArrays(NamedTuple):
    """One profile's per-slot columns (read-only; index with ids from ``Inventory.ids``)."""

    healthy: IntArray
    free: IntArray
    free_on_busy: IntArray


class MigColumns:
    """Per profile, the :class:`MigArrays` of every slot, grown with the inventory's slots.
    A profile no node has reads as zeros."""

    def __init__(self) -> None:
        self._columns: dict[str, IntArray] = {}  # profile -> (3, capacity): MigCount rows
        self._rows: dict[int, tuple[str, ...]] = {}  # slot -> the profiles written there

    def write(self, slot: int, counts: dict[str, MigCount], capacity: int) -> None:
        """Slot ``slot``'s counts (every profile it does not name reads 0 there)."""
        for profile in self._rows.pop(slot, ()):
            self._columns[profile][:, slot] = 0
        if not counts:
            return
        for profile, count in counts.items():
            column = self._columns.get(profile)
            if column is None or column.shape[1] < capacity:
                wider = np.zeros((3, capacity), dtype=np.int64)
                if column is not None:
                    wider[:, : column.shape[1]] = column
                column = self._columns[profile] = wider
            column[:, slot] = count
        self._rows[slot] = tuple(counts)

    def arrays(self, profile: str, size: int) -> MigArrays:
        """``profile``'s columns for slots 0..size-1."""
        column = self._columns.get(profile)
        if column is None:
            view = np.zeros((3, size), dtype=np.int64)
        else:
            view = column[:, :size]
            if view.shape[1] < size:  # slots appended since its last write hold none
                view = np.concatenate([view, np.zeros((3, size - view.shape[1]), np.int64)], 1)
        view = view.view()
        view.flags.writeable = False
        return MigArrays(view[0], view[1], view[2])
