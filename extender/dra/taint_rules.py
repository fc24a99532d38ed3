"""DeviceTaintRules: one taint put on every device a selector matches, from outside the driver.

A DeviceTaintRule (``resource.k8s.io/v1beta2``, ``resource/v1beta2/types.go``; the same shape
in the newest ``v1``) is cluster-scoped: ``spec.deviceSelector`` {driver, pool, device}, each
optional, all set ones to match, and ``spec.taint`` {key, value, effect}. "The empty selector
matches all devices. Without a selector, no devices are matched." The selector's
``deviceClassName`` and CEL ``selectors`` were dropped in 1.35; ``v1alpha3``'s rules, which may
carry them, are not read (an unknown version), so no rule is read as broader than it is.
The taint has the same effect as one the driver put in the slice.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from extender import fields
from extender.dra import api
from extender.dra.slices import DeviceRef, DeviceTaint
from extender.fields import JSONObject

__all__ = ["MANAGED_BY", "TaintRule", "decode_taint_rule"]

_SELECTOR: Final = ("driver", "pool", "device")
_NO_TAINT: Final = DeviceTaint("", "", "")
MANAGED_BY: Final = "app.kubernetes.io/managed-by"  # "schedext" on the fence's rules


@dataclass(frozen=True, slots=True)
class TaintRule:
    name: str
    taint: DeviceTaint = _NO_TAINT
    selects: bool = False  # a deviceSelector is present (an empty one matches every device)
    driver: str = ""  # "" matches any
    pool: str = ""
    device: str = ""
    problem: str = ""
    managed: bool = False  # labelled app.kubernetes.io/managed-by: schedext (its fence)

    def matches(self, ref: DeviceRef) -> bool:
        return (
            self.selects
            and bool(self.taint.key)
            and self.driver in ("", ref.driver)
            and self.pool in ("", ref.pool)
            and self.device in ("", ref.device)
        )


def decode_taint_rule(obj: JSONObject) -> TaintRule | None:
    """The rule ``obj`` states; None for an object with no name. Never raises."""
    meta = fields.obj(obj, "metadata")
    name = fields.text(meta, "name")
    if not name:
        return None
    managed = fields.text(fields.obj(meta, "labels"), MANAGED_BY) == "schedext"
    version = api.version_problem(obj, api.TAINT_RULES_READ)
    if version:
        return TaintRule(name, problem=version, managed=managed)
    spec = fields.obj(obj, "spec")
    raw = fields.obj(spec, "taint")
    taint = DeviceTaint(
        fields.text(raw, "key"), fields.text(raw, "value"), fields.text(raw, "effect")
    )
    selector = fields.get(spec, "deviceSelector")
    driver, pool, device = (fields.text(selector, key) for key in _SELECTOR)
    return TaintRule(
        name,
        taint=taint,
        selects=isinstance(selector, Mapping),
        driver=driver,
        pool=pool,
        device=device,
        problem="" if taint.key else "no spec.taint.key",
        managed=managed,
    )
