"""ResourceClaims: which devices a claim was given, and for whom, decoded into :class:`Claim`.

What is read (``resource/v1/types.go``, ``ResourceClaimStatus``): ``status.allocation``, set
once the claim is allocated and cleared when it is deallocated; its ``devices.results[]``,
one entry per device given, {request, driver, pool, device, adminAccess, shareID,
consumedCapacity}; its ``nodeSelector``, which for node-local devices kube-scheduler writes
as one term matching ``metadata.name`` (the node, when no slice names the device); and
``status.reservedFor[]``, the consumers {apiGroup, resource, name, uid} allowed to use it,
of which the pods (resource "pods", the core group) are read. Of ``spec.devices.requests[]``,
what each asks before it is allocated (:class:`Asked`): ``exactly`` {deviceClassName,
allocationMode, count}, or the first of ``firstAvailable`` (the alternative the allocator
tries first), so that schedext can score nodes for a claim pod's device count. A claim
KEP-5004's scheduler wrote for a pod's extended resource carries the annotation
``resource.kubernetes.io/extended-resource-claim: "true"``.

A result with ``adminAccess: true`` is kept (as ``admin``) but occupies nothing: admin access
ignores every other claim to the device. With consumable capacity (the device's
``allowMultipleAllocations``), ``consumedCapacity`` says what one share took; its ``memory``
(bare or in the driver's domain) is read, rounded up to whole MiB.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from math import ceil
from typing import Final

from extender import fields
from extender.dra import api
from extender.dra.slices import MIB, DeviceRef
from extender.fields import JSONObject
from extender.quantity import QuantityError, parse_quantity

__all__ = ["EXTENDED_CLAIM", "Allocated", "Asked", "Claim", "decode_claim"]

EXTENDED_CLAIM: Final = "resource.kubernetes.io/extended-resource-claim"
_NODE_FIELD: Final = "metadata.name"


@dataclass(frozen=True, slots=True)
class Allocated:
    """One allocation result: a device given to one of the claim's requests."""

    request: str
    ref: DeviceRef
    admin: bool = False
    share_id: str = ""
    # consumedCapacity's memory in MiB (rounded up); None when the result carries none.
    memory_mib: int | None = None


@dataclass(frozen=True, slots=True)
class Asked:
    """One request of the claim's spec: ``count`` devices of ``device_class`` (``every``:
    allocationMode All, every matching device of the node; ``count`` is then 1)."""

    request: str
    device_class: str
    count: int = 1
    every: bool = False


@dataclass(frozen=True, slots=True)
class Claim:
    namespace: str
    name: str
    uid: str = ""
    allocated: bool = False
    results: tuple[Allocated, ...] = ()
    node: str = ""  # the one node allocation.nodeSelector names; "" otherwise
    pods: tuple[str, ...] = ()  # reservedFor's pod UIDs, sorted
    extended: bool = False  # written by kube-scheduler for a pod's extended resource
    asked: tuple[Asked, ...] = ()  # spec.devices.requests, as the allocator reads them
    problem: str = ""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    def occupying(self, drivers: frozenset[str]) -> tuple[Allocated, ...]:
        """The results that occupy a device of ``drivers`` (an ``adminAccess`` one does not)."""
        return tuple(r for r in self.results if not r.admin and r.ref.driver in drivers)


def decode_claim(obj: JSONObject) -> Claim | None:
    """The claim ``obj`` states; None for an object with no name. Never raises."""
    meta = fields.obj(obj, "metadata")
    name = fields.text(meta, "name")
    if not name:
        return None
    namespace = fields.text(meta, "namespace") or "default"
    uid = fields.text(meta, "uid")
    version = api.version_problem(obj)
    if version:
        return Claim(namespace, name, uid, problem=version)
    status = fields.obj(obj, "status")
    reserved = fields.objects(status, "reservedFor")
    pods = sorted(
        {
            uid
            for consumer in reserved[: api.MAX_RESERVED_FOR]
            if fields.text(consumer, "resource") == "pods"
            and not fields.text(consumer, "apiGroup")
            and (uid := fields.text(consumer, "uid"))
        }
    )
    problems = []
    if len(reserved) > api.MAX_RESERVED_FOR:
        problems.append(
            f"only the first {api.MAX_RESERVED_FOR} of {len(reserved)} reservedFor read"
        )
    allocation = fields.get(status, "allocation")
    results: list[Allocated] = []
    if isinstance(allocation, Mapping):
        raw = fields.objects(fields.obj(allocation, "devices"), "results")
        if len(raw) > api.MAX_RESULTS:
            problems.append(f"only the first {api.MAX_RESULTS} of {len(raw)} results read")
        for index, item in enumerate(raw[: api.MAX_RESULTS]):
            result, problem = _result(item)
            if result is not None:
                results.append(result)
            if problem:
                problems.append(f"result {index}: {problem}")
    extended = fields.string_map(meta, "annotations").get(EXTENDED_CLAIM) == "true"
    requests = fields.objects(fields.obj(fields.obj(obj, "spec"), "devices"), "requests")
    if len(requests) > api.MAX_RESULTS:
        problems.append(f"only the first {api.MAX_RESULTS} of {len(requests)} requests read")
    asked = tuple(filter(None, (_asked(item) for item in requests[: api.MAX_RESULTS])))
    return Claim(
        namespace,
        name,
        uid,
        allocated=isinstance(allocation, Mapping),
        results=tuple(results),
        node=_node(fields.obj(allocation, "nodeSelector")),
        pods=tuple(pods),
        extended=extended,
        asked=asked,
        problem="; ".join(problems),
    )


def _asked(obj: JSONObject) -> Asked | None:
    """What one spec request asks: its ``exactly``, or its first ``firstAvailable``."""
    exact = fields.obj(obj, "exactly")
    if not exact:
        alternatives = fields.objects(obj, "firstAvailable")
        exact = alternatives[0] if alternatives else exact
    device_class = fields.text(exact, "deviceClassName")
    if not device_class:
        return None
    every = fields.text(exact, "allocationMode") == "All"
    count = fields.get(exact, "count")
    sure = isinstance(count, int) and not isinstance(count, bool) and 0 < count <= api.MAX_RESULTS
    return Asked(fields.text(obj, "name"), device_class, count if sure else 1, every)


def _result(obj: JSONObject) -> tuple[Allocated | None, str]:
    ref = DeviceRef(
        fields.text(obj, "driver"), fields.text(obj, "pool"), fields.text(obj, "device")
    )
    if not all(ref):
        return None, f"names no device (driver, pool and device): {fields.quoted(dict(obj))}"
    memory, problem = None, ""
    consumed = api.qualified(fields.obj(obj, "consumedCapacity"), ref.driver)
    for key, value in consumed:
        if key != f"{ref.driver}/memory":
            continue
        try:
            amount = parse_quantity(value)
        except QuantityError:
            problem = f"consumed memory is no quantity: {fields.quoted(value)} (the whole device)"
            break
        if amount < 0:
            problem = f"consumed memory is negative: {fields.quoted(value)} (the whole device)"
            break
        memory = ceil(amount / MIB)
    share = fields.get(obj, "shareID")
    result = Allocated(
        request=fields.text(obj, "request"),
        ref=ref,
        admin=api.flag(obj, "adminAccess"),
        share_id=share if isinstance(share, str) else "",
        memory_mib=None if problem else memory,
    )
    return result, problem


def _node(selector: JSONObject) -> str:
    """The node a node-local allocation is on: one term, matching ``metadata.name`` In one
    value (how kube-scheduler's DRA plugin writes it); "" for any other selector."""
    terms = fields.objects(selector, "nodeSelectorTerms")
    if len(terms) != 1:
        return ""
    matches = fields.objects(terms[0], "matchFields")
    for match in matches:
        values = fields.get(match, "values")
        if (
            fields.text(match, "key") == _NODE_FIELD
            and fields.text(match, "operator") == "In"
            and isinstance(values, list)
            and len(values) == 1
            and isinstance(values[0], str)
        ):
            return values[0]
    return ""
