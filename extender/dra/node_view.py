"""What DRA says of one node, as one value: :class:`NodeDra`, built by :func:`summarize`.

The claims ledger builds a node's summary whenever something it is made of changes (a
slice, a claim, a pod naming a claim, a taint rule) and hands the same value to every read
until then: the filter asks per call, the writes are rare. Everything in it is sorted
(devices and holdings by driver, pool, device; charges by claim, request, share), so two
ledgers fed the same objects in any order give equal summaries.

A device is *held* while an allocated claim's result names it, from allocation until
deallocation clears ``status.allocation`` (not only while a pod runs: an allocated claim
keeps its devices). Each result is a :class:`Charge`: the whole device, or on a device with
``allowMultipleAllocations`` and a result that says what it consumed, that much memory for
one share. Results with ``adminAccess`` occupy nothing and are left out before this.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple

from extender.dra.claims import Allocated
from extender.dra.slices import DeviceRef, SliceDevice
from extender.dra.taint_rules import TaintRule

__all__ = ["Charge", "DeviceState", "HeldDevice", "NodeDra", "Result", "summarize"]


class Charge(NamedTuple):
    """What one allocation result takes of a device, and for whom."""

    claim: str  # "namespace/name"
    request: str
    share_id: str  # "" for a whole device
    memory_mib: int | None  # a share's memory; None: the whole device
    pods: tuple[str, ...]  # the pod UIDs it is charged to, sorted (may be none yet)


@dataclass(frozen=True, slots=True)
class DeviceState:
    """A device DRA advertises on the node, with what makes it unfit for new pods."""

    ref: DeviceRef
    device: SliceDevice
    unhealthy: str = ""  # the NoSchedule/NoExecute taints on it and where from; "" if none

    @property
    def uuid(self) -> str:
        return self.device.uuid

    @property
    def unknown(self) -> str:
        """Why schedext cannot read the device; "" when it can."""
        return self.device.problem


@dataclass(frozen=True, slots=True)
class HeldDevice:
    """A device claims hold on the node: known (in a slice), or unknown, with why. What the
    verbs ask of it (``whole``, ``memory_mib``, ``pods``) is computed once, when built."""

    ref: DeviceRef
    charges: tuple[Charge, ...]
    uuid: str = ""
    parent_uuid: str = ""  # a MIG device's GPU
    unknown: str = ""  # why the device is unknown; "" when a slice advertises it readably
    whole: bool = False  # some claim holds the whole device: nothing is left for a share
    memory_mib: int = 0  # what its shares consumed (0 when held whole)
    pods: tuple[str, ...] = ()  # every pod charged, sorted
    claims: tuple[str, ...] = ()  # every claim charged, sorted

    @classmethod
    def of(
        cls,
        ref: DeviceRef,
        charges: tuple[Charge, ...],
        *,
        uuid: str = "",
        parent_uuid: str = "",
        unknown: str = "",
    ) -> HeldDevice:
        whole = any(charge.memory_mib is None for charge in charges)
        return cls(
            ref,
            charges,
            uuid,
            parent_uuid,
            unknown,
            whole=whole,
            memory_mib=0 if whole else sum(charge.memory_mib or 0 for charge in charges),
            pods=tuple(sorted({pod for charge in charges for pod in charge.pods})),
            claims=tuple(sorted({charge.claim for charge in charges})),
        )


@dataclass(frozen=True, slots=True)
class NodeDra:
    name: str
    drivers: tuple[str, ...] = ()  # the GPU drivers with slices for this node, sorted
    devices: tuple[DeviceState, ...] = ()
    held: tuple[HeldDevice, ...] = ()  # known and unknown alike
    # The held devices schedext cannot place on a GPU (in no slice, or unreadable), and the
    # devices with a NoSchedule or NoExecute taint: ``held`` and ``devices`` filtered once.
    unknown: tuple[HeldDevice, ...] = ()
    unhealthy: tuple[DeviceState, ...] = ()


class Result(NamedTuple):
    """One allocation result placed on the node, as the ledger hands it over."""

    claim: str
    pods: tuple[str, ...]
    allocated: Allocated
    device: SliceDevice | None  # None: no slice advertises it


def summarize(
    name: str,
    *,
    drivers: Iterable[str],
    devices: Iterable[tuple[DeviceRef, SliceDevice]],
    rules: Iterable[TaintRule],
    results: Iterable[Result],
) -> NodeDra:
    """The node's summary from its current devices, the taint rules, and the allocation
    results placed on it."""
    rules = tuple(rules)
    states = tuple(
        DeviceState(ref, device, _unhealthy(ref, device, rules))
        for ref, device in sorted(devices, key=lambda pair: pair[0])
    )
    grouped: dict[DeviceRef, list[Result]] = {}
    for result in results:
        grouped.setdefault(result.allocated.ref, []).append(result)
    held = tuple(_held(ref, grouped[ref]) for ref in sorted(grouped))
    return NodeDra(
        name,
        tuple(sorted(set(drivers))),
        states,
        held,
        unknown=tuple(device for device in held if device.unknown),
        unhealthy=tuple(state for state in states if state.unhealthy),
    )


def _held(ref: DeviceRef, results: list[Result]) -> HeldDevice:
    device = results[0].device
    charges = [
        Charge(
            claim=result.claim,
            request=result.allocated.request,
            share_id=result.allocated.share_id,
            memory_mib=_share(result),
            pods=result.pods,
        )
        for result in results
    ]
    charges.sort(key=lambda c: (c.claim, c.request, c.share_id, c.memory_mib or 0, c.pods))
    if device is None:
        return HeldDevice.of(ref, tuple(charges), unknown=f"{ref} is in no ResourceSlice")
    return HeldDevice.of(
        ref,
        tuple(charges),
        uuid=device.uuid,
        parent_uuid=device.parent_uuid,
        unknown=device.problem,
    )


def _share(result: Result) -> int | None:
    """A share's memory where the device is shared and the result says what it consumed;
    None (the whole device) otherwise. Of a device no slice has, a result that consumed
    capacity is a share: only a device that allows several allocations gets one."""
    device, memory = result.device, result.allocated.memory_mib
    if device is not None and not device.shared:
        return None
    return memory


def _unhealthy(ref: DeviceRef, device: SliceDevice, rules: tuple[TaintRule, ...]) -> str:
    taints = [f"{taint} (in its ResourceSlice)" for taint in device.taints if taint.blocks]
    taints += [
        f"{rule.taint} (DeviceTaintRule {rule.name})"
        for rule in rules
        if rule.taint.blocks and rule.matches(ref)
    ]
    return "; ".join(taints)
