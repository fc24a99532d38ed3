"""ElasticQuotas (scheduling.x-k8s.io/v1alpha1, scheduler-plugins' capacity scheduling API)
decoded into :class:`QuotaSpec`, or refused with a :class:`QuotaError` that says why.

A quota counts a resource only when it names it, in ``spec.min`` or ``spec.max``: the GPU
resource (whole GPUs), the share resources' memory and cores (``PolicyConfig.shares``), ``cpu``
and ``memory``. An absent max is no ceiling; an absent min is 0, and a resource named in max
alone is a plain ceiling: it guarantees nothing and borrows nothing, so the borrowing rules
(which a min, even 0, opts into) leave it alone. MIG devices and every other resource are not
counted, and a quota that names one is refused rather than half applied.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import IntEnum
from fractions import Fraction
from typing import NamedTuple

from extender import fields, names
from extender.config import ShareResources
from extender.fields import JSONObject
from extender.quantity import QuantityError, QuantityRangeError, parse_quantity
from extender.tally import Amounts

__all__ = [
    "Kind",
    "Limit",
    "QuotaError",
    "QuotaSpec",
    "quota_spec",
    "show_amount",
    "used_quantities",
]


class Kind(IntEnum):
    """What a quota can count; the number is the index in :class:`~extender.tally.Amounts`."""

    GPUS = 0  # whole GPUs
    SHARE_MEMORY = 1  # MiB (the share memory resource's unit times its count)
    SHARE_CORES = 2  # percent of a device's SMs
    CPU = 3  # milli-CPU
    MEMORY = 4  # bytes


class Limit(NamedTuple):
    """One resource a quota names, in its kind's unit."""

    kind: Kind
    resource: str  # as the quota names it ("nvidia.com/gpu")
    min: int
    max: int | None  # None: no ceiling
    # Whether the quota states a min for it: only then does the namespace take part in
    # borrowing (guarantees lent, borrowing bounded by the sum of mins, reclaim).
    guarantees: bool = True


@dataclass(frozen=True, slots=True)
class QuotaSpec:
    namespace: str
    name: str
    limits: tuple[Limit, ...]  # sorted by kind, each kind at most once
    uid: str = ""
    created: str = ""  # RFC 3339 creationTimestamp: the oldest quota of a namespace applies
    # schedext.io/borrow-weight; None: each resource's min is its weight.
    borrow_weight: int | None = None
    share_unit_mib: int = 1  # MiB per unit of the share memory resource (for messages)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def age_key(self) -> tuple[str, str]:
        """Sorts older quotas first; equal (or missing) timestamps fall back to the name."""
        return (self.created or "9999", self.name)

    def limit(self, kind: Kind) -> Limit | None:
        return next((limit for limit in self.limits if limit.kind is kind), None)

    @property
    def guarantees(self) -> tuple[Limit, ...]:
        """The limits with a min: what the namespace takes part in borrowing with."""
        return tuple(limit for limit in self.limits if limit.guarantees)

    def weight(self, limit: Limit) -> int:
        """The weight the namespace borrows ``limit``'s kind by."""
        return limit.min if self.borrow_weight is None else self.borrow_weight


class QuotaError(ValueError):
    """An ElasticQuota that cannot apply: the message names the object and why (the shell
    logs it, emits a Warning event on the object, and goes on without it)."""


def quota_spec(obj: JSONObject, *, gpu_resource: str, shares: ShareResources) -> QuotaSpec | None:
    """The quota ``obj`` states; None for an object with no name. Raises
    :class:`QuotaError` for a quota that cannot apply as written."""
    meta = fields.obj(obj, "metadata")
    name = fields.text(meta, "name")
    if not name:
        return None
    namespace = fields.text(meta, "namespace") or "default"
    key = f"{namespace}/{name}"
    spec = fields.obj(obj, "spec")
    kinds = _kinds(gpu_resource, shares)
    unit = shares.memory_unit_mib
    lower = _resources(key, spec, "min", kinds, unit)
    upper = _resources(key, spec, "max", kinds, unit)
    limits = []
    for kind in sorted(set(lower) | set(upper)):
        resource = kinds[kind]
        low, high = lower.get(kind, 0), upper.get(kind)
        if high is not None and low > high:
            raise QuotaError(
                f"ElasticQuota {key}: min {show_amount(kind, low, unit)} is over max "
                f"{show_amount(kind, high, unit)} for {resource}"
            )
        limits.append(Limit(kind, resource, low, high, guarantees=kind in lower))
    return QuotaSpec(
        namespace=namespace,
        name=name,
        limits=tuple(limits),
        uid=fields.text(meta, "uid"),
        created=fields.text(meta, "creationTimestamp"),
        borrow_weight=_weight(key, fields.string_map(meta, "annotations")),
        share_unit_mib=unit,
    )


def _kinds(gpu_resource: str, shares: ShareResources) -> dict[Kind, str]:
    """The resource name each kind is counted under in this cluster."""
    kinds = {
        Kind.GPUS: gpu_resource,
        Kind.SHARE_MEMORY: shares.memory,
        Kind.CPU: "cpu",
        Kind.MEMORY: "memory",
    }
    if shares.cores is not None:
        kinds[Kind.SHARE_CORES] = shares.cores
    return kinds


def _resources(
    key: str, spec: JSONObject, field: str, kinds: dict[Kind, str], share_unit_mib: int
) -> dict[Kind, int]:
    raw = fields.get(spec, field)
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise QuotaError(f"ElasticQuota {key}: spec.{field} is not a resource list")
    by_name = {resource: kind for kind, resource in kinds.items()}
    parsed: dict[Kind, int] = {}
    for resource, value in sorted(raw.items()):
        kind = by_name.get(resource)
        if kind is None:
            counted = ", ".join(kinds[k] for k in sorted(kinds))
            raise QuotaError(
                f"ElasticQuota {key}: spec.{field} names {resource}, which schedext does not "
                f"count (it counts {counted})"
            )
        try:
            if not isinstance(value, str | int | float):
                raise QuantityError(f"not a quantity: {value!r}")
            exact = parse_quantity(value)
        except QuantityError as error:
            problem = (
                "is out of range (over 2^63-1)"
                if isinstance(error, QuantityRangeError)
                else "is not a quantity"
            )
            raise QuotaError(
                f"ElasticQuota {key}: spec.{field}.{resource} {problem}: {fields.quoted(value)}"
            ) from None
        if exact < 0:
            raise QuotaError(f"ElasticQuota {key}: spec.{field}.{resource} is negative: {value}")
        parsed[kind] = _units(kind, exact, share_unit_mib)
    return parsed


def _units(kind: Kind, exact: Fraction, share_unit_mib: int) -> int:
    """A quantity in ``kind``'s unit, rounded up as Kubernetes rounds ``Value()``."""
    if kind is Kind.CPU:
        exact *= 1000
    elif kind is Kind.SHARE_MEMORY:
        exact *= share_unit_mib
    return -(-exact.numerator // exact.denominator)


def _weight(key: str, annotations: Mapping[str, str]) -> int | None:
    raw = annotations.get(names.BORROW_WEIGHT)
    if raw is None:
        return None
    weight = fields.whole_number(raw.strip())
    if weight is None:
        raise QuotaError(
            f"ElasticQuota {key}: annotation {names.BORROW_WEIGHT} must be a whole number >= 0, "
            f"not {fields.quoted(raw)}"
        )
    return weight


def show_amount(kind: Kind, value: int, share_unit_mib: int = 1) -> str:
    """``value`` (in ``kind``'s unit) as the resource writes it: "8", "2.5" CPUs, "64Gi"."""
    if kind is Kind.CPU:
        return f"{value // 1000}" if value % 1000 == 0 else f"{value}m"
    if kind is Kind.MEMORY:
        for suffix, size in (("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10)):
            if value and value % size == 0:
                return f"{value // size}{suffix}"
        return str(value)
    if kind is Kind.SHARE_MEMORY and share_unit_mib > 1:
        return f"{round(value / share_unit_mib, 3):g}"
    return str(value)


def used_quantities(spec: QuotaSpec, used: Amounts) -> dict[str, str]:
    """What the namespace uses of each resource its quota names, as Kubernetes quantities
    (``status.used``)."""
    return {
        limit.resource: show_amount(limit.kind, used[limit.kind], spec.share_unit_mib)
        for limit in spec.limits
    }
