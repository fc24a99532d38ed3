"""DeviceClasses: which extended resource a class serves, and which drivers it selects.

A DeviceClass (``resource/v1/types.go``, ``DeviceClassSpec``) is cluster-scoped:
``spec.selectors[]`` (each ``{cel: {expression}}``), ``spec.config[]`` and
``spec.extendedResourceName`` (KEP-5004: a pod asking for that extended resource, say
``nvidia.com/gpu``, is given devices of this class through a claim kube-scheduler writes).
A class with no ``extendedResourceName`` still serves the implicit
``deviceclass.resource.kubernetes.io/<class name>``. When two classes name one resource, the
one created later serves it; created together, the name sorted first.

The drivers a class selects are read from its CEL selectors where they say so plainly
(``device.driver == "gpu.nvidia.com"``, either side, either quote); schedext evaluates no CEL.
A class whose selectors name no driver has ``drivers == ()``: any driver.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

from extender import fields
from extender.dra import api
from extender.fields import JSONObject

__all__ = ["IMPLICIT_PREFIX", "DeviceClass", "decode_device_class"]

IMPLICIT_PREFIX: Final = "deviceclass.resource.kubernetes.io/"
_MAX_EXPRESSION: Final = 10 * 1024  # CELSelectorExpressionMaxLength
_LITERAL: Final = r"""(?:"([^"\\]{1,63})"|'([^'\\]{1,63})')"""
_DRIVER: Final = re.compile(
    rf"device\.driver\s*==\s*{_LITERAL}|{_LITERAL}\s*==\s*device\.driver", re.ASCII
)


@dataclass(frozen=True, slots=True)
class DeviceClass:
    name: str
    extended_resource: str = ""  # spec.extendedResourceName; "" when unset
    drivers: tuple[str, ...] = ()  # the drivers its selectors name, sorted; (): any
    created: str = ""  # creationTimestamp (RFC 3339)
    problem: str = ""

    @property
    def serves(self) -> tuple[str, ...]:
        """The extended resources a pod may ask this class's devices by."""
        implicit = IMPLICIT_PREFIX + self.name
        explicit = self.extended_resource
        return (explicit, implicit) if explicit and explicit != implicit else (implicit,)


def decode_device_class(obj: JSONObject) -> DeviceClass | None:
    """The class ``obj`` states; None for an object with no name. Never raises."""
    meta = fields.obj(obj, "metadata")
    name = fields.text(meta, "name")
    if not name:
        return None
    created = fields.text(meta, "creationTimestamp")
    version = api.version_problem(obj)
    if version:
        return DeviceClass(name, created=created, problem=version)
    spec = fields.obj(obj, "spec")
    selectors = fields.objects(spec, "selectors")
    drivers: set[str] = set()
    for selector in selectors[: api.MAX_SELECTORS]:
        expression = fields.text(fields.obj(selector, "cel"), "expression")[:_MAX_EXPRESSION]
        for match in _DRIVER.finditer(expression):
            drivers.update(group for group in match.groups() if group)
    problem = ""
    if len(selectors) > api.MAX_SELECTORS:
        problem = f"only the first {api.MAX_SELECTORS} of {len(selectors)} selectors read"
    return DeviceClass(
        name,
        extended_resource=fields.text(spec, "extendedResourceName"),
        drivers=tuple(sorted(drivers)),
        created=created,
        problem=problem,
    )
