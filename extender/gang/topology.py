"""A gang's topology: the level all its members must share one domain of (*required*), and
the one they should (*preferred*), read from its PodGroup; and each node's domain at a level.

Levels are node label keys, listed narrowest first in settings (``policy.topology_levels``:
an NVLink clique, a rack, a spine block, a zone by default), because the keys that label
writers use (GPU feature discovery, NVIDIA's topograph, a cloud's) differ between clusters
and versions. A node without a level's label is a domain of its own at that level: a gang
that must share a rack never lands across unlabelled nodes.

What users already write is read too: Kueue's TAS annotations
(``kueue.x-k8s.io/podset-required-topology``, ``podset-preferred-topology``) and KAI's
(``kai.scheduler/topology-required-placement``, ``topology-preferred-placement``), each a label
key like schedext's own: on the PodGroup, or where it names none, on its members (the
coordinator gathers them, :meth:`~extender.gang.GangCoordinator.topology`). Two annotations
that disagree, or a level that is not configured, are a *problem*: the gang runs without
that requirement (never refused for a typo), and the shell warns.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NamedTuple

import numpy as np

from extender import names
from extender.inventory import IntArray, Inventory
from extender.model import PodRequest

__all__ = ["ALIASES", "Domains", "Topology", "domains", "group_topology", "read_topology"]

# Per meaning, the annotations read, schedext's own first.
ALIASES: Mapping[str, tuple[str, ...]] = {
    "required": names.TOPOLOGY_REQUIRED_KEYS,
    "preferred": names.TOPOLOGY_PREFERRED_KEYS,
}


class Topology(NamedTuple):
    """A gang's levels ("" for none) and why any annotation was not followed ("" if all
    were)."""

    required: str = ""
    preferred: str = ""
    problem: str = ""


def read_topology(annotations: Mapping[str, str], levels: Sequence[str]) -> Topology:
    """The gang's topology from its PodGroup's ``annotations``, against the configured
    ``levels``. A level not configured, or annotations that disagree, drop that rule."""
    chosen: dict[str, str] = {}
    problems: list[str] = []
    for meaning, keys in ALIASES.items():
        found = {key: value.strip() for key in keys if (value := annotations.get(key, "").strip())}
        values = set(found.values())
        if len(values) > 1:
            said = ", ".join(f"{key}={value}" for key, value in found.items())
            problems.append(f"{meaning} topology ignored: the annotations disagree ({said})")
        elif values:
            (level,) = values
            if level in levels:
                chosen[meaning] = level
            else:
                key = next(iter(found))
                problems.append(
                    f"{meaning} topology ignored: {key}={level} is not a configured level "
                    f"(policy.topology_levels: {', '.join(levels) or 'none'})"
                )
    required, preferred = chosen.get("required", ""), chosen.get("preferred", "")
    if required and preferred and levels.index(preferred) > levels.index(required):
        problems.append(
            f"preferred topology {preferred} ignored: it is wider than the required {required}"
        )
        preferred = ""
    return Topology(required, preferred, "; ".join(problems))


def group_topology(
    annotations: Sequence[tuple[str, str]], members: Sequence[PodRequest], levels: Sequence[str]
) -> Topology:
    """A gang's levels, read against the configured ``levels``: from its PodGroup's topology
    ``annotations``, or where those name none, from its ``members``' (Kueue writes its
    podset's annotations on the pods). Members that disagree are a problem: none then."""
    if not annotations:
        said = {pair for request in members for pair in request.topology}
        if len({key for key, _ in said}) < len(said):
            listed = ", ".join(f"{key}={value}" for key, value in sorted(said))
            return Topology(problem=f"topology ignored: the members disagree ({listed})")
        annotations = tuple(said)
    return read_topology(dict(annotations), levels)


class Domains(NamedTuple):
    """A level's domains: per node slot, its domain's id (0 for slots that hold no node), and
    per id, what to call it (the label's value, or the node alone without one)."""

    ids: IntArray
    names: tuple[str, ...]


def domains(inventory: Inventory, level: str) -> Domains:
    """The domains at ``level``: nodes with the same label value share one; each node
    without the label is one of its own. Kept until a node changes."""
    return inventory.spec_derived(("topology-domains", level), lambda: _domains(inventory, level))


def _domains(inventory: Inventory, level: str) -> Domains:
    ids = np.zeros(len(inventory.arrays.alive), dtype=np.int64)
    node_names = inventory.node_names()
    slots = inventory.ids(node_names)
    by_value: dict[str, int] = {}
    called = [""]
    for name, slot in zip(node_names, slots.tolist(), strict=True):
        spec = inventory.spec(name)
        value = spec.labels.get(level, "") if spec is not None else ""
        if value and value in by_value:
            ids[slot] = by_value[value]
            continue
        ids[slot] = len(called)
        if value:
            by_value[value] = len(called)
        called.append(value or f"node {name} (no {level} label)")
    ids.flags.writeable = False
    return Domains(ids, tuple(called))
