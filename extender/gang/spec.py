"""PodGroups (scheduling.x-k8s.io/v1alpha1, scheduler-plugins' coscheduling API) reduced to
what gangs use, and the ``minResources`` check against the cluster's free resources."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from extender import fields, names
from extender.config import PolicyConfig
from extender.fields import JSONObject
from extender.inventory import Inventory
from extender.model import Holding
from extender.quantity import QuantityError, to_milli, to_units

__all__ = ["PodGroupSpec", "min_resources_gap", "pod_group_spec"]


@dataclass(frozen=True, slots=True)
class PodGroupSpec:
    namespace: str
    name: str
    min_member: int
    timeout_s: float | None = None
    created: str = ""  # RFC 3339 creationTimestamp: the age that decides competitions
    uid: str = ""
    # spec.minResources: (resource name, amount) with CPU in milli-units, the rest in units.
    min_resources: tuple[tuple[str, int], ...] = ()
    # Its topology annotations (schedext's and their aliases, extender.gang.topology), as
    # written: read against the configured levels by the coordinator.
    topology: tuple[tuple[str, str], ...] = ()
    # The hold schedext recorded on it (names.GANG_HOLD, extender.gang.holds), as written.
    hold: str = ""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def age_key(self) -> tuple[str, str]:
        """Sorts older groups first; equal timestamps fall back to the name."""
        return (self.created or "9999", self.key)


def pod_group_spec(obj: JSONObject) -> PodGroupSpec | None:
    """A PodGroup (scheduling.x-k8s.io/v1alpha1) reduced to what gangs use."""
    meta = fields.obj(obj, "metadata")
    spec = fields.obj(obj, "spec")
    name = fields.text(meta, "name")
    if not name:
        return None
    min_member = fields.get(spec, "minMember")
    timeout = fields.get(spec, "scheduleTimeoutSeconds")
    return PodGroupSpec(
        namespace=fields.text(meta, "namespace") or "default",
        name=name,
        min_member=min_member if isinstance(min_member, int) and min_member > 0 else 1,
        timeout_s=float(timeout) if isinstance(timeout, int) and timeout > 0 else None,
        created=fields.text(meta, "creationTimestamp"),
        uid=fields.text(meta, "uid"),
        min_resources=_min_resources(fields.obj(spec, "minResources")),
        topology=tuple(
            (key, value)
            for key, value in sorted(fields.string_map(meta, "annotations").items())
            if key in names.TOPOLOGY_KEYS
        ),
        hold=fields.string_map(meta, "annotations").get(names.GANG_HOLD, ""),
    )


def _min_resources(resources: JSONObject) -> tuple[tuple[str, int], ...]:
    """spec.minResources, parsed; entries that are not positive quantities are ignored."""
    parsed = []
    for name, value in sorted(resources.items()):
        if not isinstance(value, str | int | float):
            continue
        try:
            amount = to_milli(value) if name == "cpu" else to_units(value)
        except QuantityError:
            continue
        if amount > 0:
            parsed.append((name, amount))
    return tuple(parsed)


def min_resources_gap(
    inventory: Inventory,
    spec: PodGroupSpec,
    config: PolicyConfig,
    own: Iterable[Holding] = (),
) -> list[str]:
    """What the cluster lacks to cover the group's minResources, as scheduler-plugins'
    coscheduling checks it: the free GPUs (of the configured resource), CPU and memory summed
    over all nodes, counting what the group's own members hold (``own``) as free. The share
    resources' memory and cores are the room for shares summed over every device that takes
    them (free whole, or shared), in the resources' units. Other resources are not tracked
    here and not checked. Empty when nothing is short."""
    if not spec.min_resources:
        return []
    a, grid = inventory.arrays, inventory.devices
    alive = a.alive
    shares = config.shares
    free = {
        config.gpu_resource: int(np.maximum(a.gpu_free[alive], 0).sum()),
        "cpu": int(np.maximum(a.cpu_free[alive], 0).sum()),
        "memory": int(np.maximum(a.memory_free[alive], 0).sum()),
    }
    share_mib = int(np.maximum(grid.memory_free[alive], 0).sum())
    share_cores = int(np.maximum(grid.cores_free[alive], 0).sum())
    for holding in own:
        if holding.node in inventory:
            free[config.gpu_resource] += holding.gpus
            free["cpu"] += holding.cpu_milli
            free["memory"] += holding.memory_bytes
            # A whole GPU it holds would be room for shares too, all of its memory.
            device_mib = int(a.gpu_memory_mib[inventory.ids([holding.node])[0]])
            share_mib += (
                holding.share.devices * holding.share.memory_mib + holding.gpus * device_mib
            )
            share_cores += holding.share.devices * holding.share.cores + holding.gpus * 100
    free[shares.memory] = share_mib // shares.memory_unit_mib
    if shares.cores is not None:
        free[shares.cores] = share_cores
    gaps = []
    for name, wanted in spec.min_resources:
        have = free.get(name)
        if have is not None and wanted > have:
            gaps.append(f"{name} {_amount(name, wanted)} wanted, {_amount(name, have)} free")
    return gaps


def _amount(name: str, value: int) -> str:
    if name == "cpu":
        return f"{round(value / 1000, 3):g}"
    if name == "memory":
        return f"{round(value / 2**30, 1):g}Gi"
    return str(value)
