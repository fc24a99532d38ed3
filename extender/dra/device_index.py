"""The devices the GPU drivers advertise now, by reference and by node: :class:`DeviceIndex`.

A pool may span several ResourceSlices, and a driver that changes a pool bumps the generation
of every slice in it. "A consumer must only use ResourceSlices with the highest generation
number and ignore all others" (``resource/v1/types.go``): so a device is current when its
slice is at its pool's newest generation. A device name published twice in one pool at that
generation (which the driver must not do) is taken from the slice whose name sorts first.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Final

from extender.dra import api
from extender.dra.slices import DeviceRef, ResourceSlice, SliceDevice
from extender.dra.taint_rules import TaintRule

__all__ = ["DeviceIndex"]

_Pool = tuple[str, str]  # (driver, pool)
_NO_DEVICES: Final[frozenset[DeviceRef]] = frozenset()


class DeviceIndex:
    """The slices kept, and their current devices; every change says which devices and
    nodes it touched, so that the ledger rebuilds only those."""

    def __init__(self) -> None:
        self._slices: dict[str, ResourceSlice] = {}
        self._pools: dict[_Pool, set[str]] = {}  # slice names
        self._pool_refs: dict[_Pool, frozenset[DeviceRef]] = {}
        self._devices: dict[DeviceRef, SliceDevice] = {}
        self._by_node: dict[str, set[DeviceRef]] = {}
        self._node_slices: dict[str, set[str]] = {}  # by spec.nodeName

    def __len__(self) -> int:
        return len(self._slices)

    def __contains__(self, name: str) -> bool:
        return name in self._slices

    def put(self, piece: ResourceSlice) -> tuple[set[DeviceRef], set[str]]:
        """Keep ``piece`` (replacing the slice of that name): the devices whose current form
        may have changed, and the nodes touched."""
        refs, nodes = self.remove(piece.name)
        self._slices[piece.name] = piece
        self._pools.setdefault((piece.driver, piece.pool), set()).add(piece.name)
        self._node_slices.setdefault(piece.node, set()).add(piece.name)
        more, more_nodes = self._reindex((piece.driver, piece.pool))
        return refs | more, nodes | more_nodes | {piece.node}

    def remove(self, name: str) -> tuple[set[DeviceRef], set[str]]:
        piece = self._slices.pop(name, None)
        if piece is None:
            return set(), set()
        pool = (piece.driver, piece.pool)
        api.discard(self._pools, pool, name)
        api.discard(self._node_slices, piece.node, name)
        refs, nodes = self._reindex(pool)
        return refs, nodes | {piece.node}

    def get(self, ref: DeviceRef) -> SliceDevice | None:
        return self._devices.get(ref)

    def on(self, node: str) -> list[tuple[DeviceRef, SliceDevice]]:
        return [(ref, self._devices[ref]) for ref in self._by_node.get(node, ())]

    def drivers(self, node: str) -> set[str]:
        """The drivers with a current device on ``node``, or a slice naming it."""
        found = {ref.driver for ref in self._by_node.get(node, ())}
        found.update(self._slices[name].driver for name in self._node_slices.get(node, ()))
        found.discard("")
        return found

    def nodes(self) -> set[str]:
        return (set(self._by_node) | set(self._node_slices)) - {""}

    def matching(self, rule: TaintRule) -> set[str]:
        """The nodes with a current device ``rule`` selects."""
        return {device.node for ref, device in self._devices.items() if rule.matches(ref)}

    def slices(self) -> Iterator[ResourceSlice]:
        return iter(self._slices.values())

    def _reindex(self, pool: _Pool) -> tuple[set[DeviceRef], set[str]]:
        pieces = sorted((self._slices[name] for name in self._pools.get(pool, ())), key=_name)
        newest = max((piece.generation for piece in pieces), default=0)
        current: dict[DeviceRef, SliceDevice] = {}
        for piece in pieces:
            if piece.generation == newest:
                for device in piece.devices:
                    if device.name:
                        current.setdefault(piece.ref(device), device)
        nodes = set()
        old = self._pool_refs.pop(pool, _NO_DEVICES)
        for ref in old:
            node = self._devices.pop(ref).node
            api.discard(self._by_node, node, ref)
            nodes.add(node)
        for ref, device in current.items():
            self._devices[ref] = device
            self._by_node.setdefault(device.node, set()).add(ref)
            nodes.add(device.node)
        if current:
            self._pool_refs[pool] = frozenset(current)
        return set(old) | set(current), nodes


def _name(piece: ResourceSlice) -> str:
    return piece.name
