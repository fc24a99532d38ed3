"""ResourceSlices: the devices a DRA driver advertises, decoded into :class:`ResourceSlice`.

A slice (``resource.k8s.io/v1``, ``resource/v1/types.go``) is one page of a driver's pool:
``spec.driver``, ``spec.pool`` {name, generation, resourceSliceCount}, ``spec.nodeName`` (or,
with ``perDeviceNodeSelection``, each device's ``nodeName``) and ``spec.devices[]``. A device
is {name, attributes, capacity, allowMultipleAllocations, taints}; ``attributes`` maps a
qualified name to exactly one of ``{"string"|"int"|"bool"|"version": value}``, ``capacity`` a
qualified name to ``{"value": quantity}``. A name without a domain ("uuid") is in the driver's
own ("gpu.nvidia.com/uuid"); both spellings are read. A device is known everywhere by
(driver, pool, device name): :class:`DeviceRef`.

What NVIDIA's driver (``gpu.nvidia.com``, NVIDIA/k8s-dra-driver-gpu,
``cmd/gpu-kubelet-plugin/deviceinfo.go`` and ``mig.go``) publishes, and what is read of it: a
whole GPU ("gpu-0") with ``type`` "gpu", ``uuid`` ("GPU-..."), ``productName``, the standard
``resource.kubernetes.io/pcieRoot`` (k8s.io/dynamic-resource-allocation/deviceattribute), and
capacity ``memory`` in bytes; a MIG device with ``type`` "mig", its own ``uuid`` ("MIG-...")
and ``parentUUID``. Its health monitor taints a device ``gpu.nvidia.com/xid`` or
``gpu.nvidia.com/gpu-lost`` (``NoSchedule``), or ``gpu.nvidia.com/unmonitored`` (``None``).

A device schedext cannot read is kept with a ``problem`` (an *unknown device*): an attribute
whose value is none of the four kinds (a newer API's, or garbage), no ``uuid``, a memory
capacity that is no quantity. The shell logs the reason; the filter will treat the device as
not to be handed out.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from math import floor
from typing import Final, NamedTuple

from extender import fields
from extender.dra import api
from extender.fields import JSONObject
from extender.quantity import QuantityError, parse_quantity

__all__ = [
    "PCIE_ROOT",
    "DeviceRef",
    "DeviceTaint",
    "ResourceSlice",
    "SliceDevice",
    "decode_slice",
]

PCIE_ROOT: Final = "resource.kubernetes.io/pcieRoot"
MIB: Final = 1 << 20
_KINDS: Final = (("string", str), ("version", str), ("int", int), ("bool", bool))
_BLOCKING: Final = frozenset({"NoSchedule", "NoExecute"})


class DeviceRef(NamedTuple):
    """A device, as a claim's allocation result names it."""

    driver: str
    pool: str
    device: str

    def __str__(self) -> str:
        return f"{self.driver}/{self.pool}/{self.device}"


class DeviceTaint(NamedTuple):
    """A taint on a device (in its slice, or from a DeviceTaintRule). Only ``NoSchedule`` and
    ``NoExecute`` keep a device from new pods; ``None`` and effects unknown to this version
    are informational, as the API asks consumers to treat them."""

    key: str
    value: str
    effect: str

    @property
    def blocks(self) -> bool:
        return self.effect in _BLOCKING

    def __str__(self) -> str:
        return (
            f"{self.key}={self.value}:{self.effect}" if self.value else f"{self.key}:{self.effect}"
        )


@dataclass(frozen=True, slots=True)
class SliceDevice:
    name: str
    node: str = ""  # the node it is on; "" for a device no single node has
    uuid: str = ""
    parent_uuid: str = ""  # a MIG device's GPU
    kind: str = ""  # the driver's "type" attribute: "gpu", "mig", ...
    product: str = ""
    pcie_root: str = ""
    memory_mib: int | None = None  # capacity "memory", rounded down to whole MiB
    shared: bool = False  # allowMultipleAllocations: claims consume its capacity in shares
    taints: tuple[DeviceTaint, ...] = ()
    problem: str = ""  # why it is an unknown device; "" when read


@dataclass(frozen=True, slots=True)
class ResourceSlice:
    name: str
    driver: str = ""
    pool: str = ""
    generation: int = 0
    node: str = ""  # spec.nodeName
    devices: tuple[SliceDevice, ...] = ()
    problem: str = ""  # why the slice (or part of it) could not be read

    def ref(self, device: SliceDevice) -> DeviceRef:
        return DeviceRef(self.driver, self.pool, device.name)


def decode_slice(obj: JSONObject) -> ResourceSlice | None:
    """The slice ``obj`` states; None for an object with no name. Never raises."""
    name = fields.text(fields.obj(obj, "metadata"), "name")
    if not name:
        return None
    version = api.version_problem(obj)
    if version:
        return ResourceSlice(name, problem=version)
    spec = fields.obj(obj, "spec")
    driver = fields.text(spec, "driver")
    pool = fields.obj(spec, "pool")
    node = fields.text(spec, "nodeName")
    per_device = api.flag(spec, "perDeviceNodeSelection")
    raw = fields.objects(spec, "devices")
    devices = tuple(
        _device(item, driver, fields.text(item, "nodeName") if per_device else node)
        for item in raw[: api.MAX_DEVICES]
    )
    problems = []
    if not driver:
        problems.append("no spec.driver")
    if len(raw) > api.MAX_DEVICES:
        problems.append(f"only the first {api.MAX_DEVICES} of {len(raw)} devices read")
    return ResourceSlice(
        name,
        driver=driver,
        pool=fields.text(pool, "name"),
        generation=api.integer(pool, "generation") or 0,
        node=node,
        devices=devices,
        problem="; ".join(problems),
    )


def _device(obj: JSONObject, driver: str, node: str) -> SliceDevice:
    name = fields.text(obj, "name")
    attributes, problems = _attributes(fields.obj(obj, "attributes"), driver)
    memory, memory_problem = _memory(fields.obj(obj, "capacity"), driver)
    uuid = attributes.get(f"{driver}/uuid")
    if not isinstance(uuid, str) or not uuid:
        problems.append("no uuid attribute (a string)")
    if memory_problem:
        problems.append(memory_problem)
    taints = tuple(_taint(item) for item in fields.objects(obj, "taints")[: api.MAX_TAINTS])
    if not name:
        problems.insert(0, "a device with no name")

    def text(*keys: str) -> str:
        found = next((attributes[key] for key in keys if key in attributes), "")
        return found if isinstance(found, str) else ""

    return SliceDevice(
        name=name,
        node=node,
        uuid=text(f"{driver}/uuid"),
        parent_uuid=text(f"{driver}/parentUUID"),
        kind=text(f"{driver}/type"),
        product=text(f"{driver}/productName"),
        pcie_root=text(PCIE_ROOT, f"{driver}/pcieRoot"),
        memory_mib=memory,
        shared=api.flag(obj, "allowMultipleAllocations"),
        taints=tuple(t for t in taints if t.key),
        problem="; ".join(problems),
    )


def _attributes(raw: JSONObject, driver: str) -> tuple[dict[str, object], list[str]]:
    """Each attribute's one value by qualified name, and what could not be read."""
    values: dict[str, object] = {}
    problems: list[str] = []
    items = api.qualified(raw, driver)
    if len(items) > api.MAX_ATTRIBUTES:
        problems.append(f"only the first {api.MAX_ATTRIBUTES} of {len(items)} attributes read")
    for name, value in items[: api.MAX_ATTRIBUTES]:
        read = _value(value)
        if read is None:
            bare = name.removeprefix(f"{driver}/")
            problems.append(
                f"attribute {bare!r} has no value schedext reads: {fields.quoted(value)}"
            )
        else:
            values[name] = read
    return values, problems


def _value(value: object) -> object:
    """An attribute's one value; None unless exactly one of the four kinds is set, and set to
    a value of its type (JSON ``true`` is no ``int``)."""
    if not isinstance(value, Mapping) or len(value) != 1:
        return None
    for kind, cast in _KINDS:
        field = fields.get(value, kind)
        if field is not None:
            right = isinstance(field, cast) and (cast is bool or not isinstance(field, bool))
            return field if right else None
    return None


def _memory(capacity: JSONObject, driver: str) -> tuple[int | None, str]:
    memory = f"{driver}/memory"
    raw = next((value for name, value in api.qualified(capacity, driver) if name == memory), None)
    if raw is None:
        return None, ""
    value = fields.get(raw, "value")
    try:
        amount = parse_quantity(value)
    except QuantityError:
        return None, f"capacity memory is no quantity: {fields.quoted(value)}"
    if amount < 0:
        return None, f"capacity memory is negative: {fields.quoted(value)}"
    return floor(amount / MIB), ""


def _taint(obj: JSONObject) -> DeviceTaint:
    return DeviceTaint(
        fields.text(obj, "key"), fields.text(obj, "value"), fields.text(obj, "effect")
    )
