"""The soak's stream of work: seeded, random units of pods, and when each one goes.

A **unit** is what a user creates and deletes together: one pod asking for whole GPUs, one
GPU share, one pod asking for an address of a pool, a StatefulSet whose pods keep sticky
addresses, or a gang (a PodGroup and its members). Each has a lifetime once placed, and a
patience while it waits. A StatefulSet's pods are also deleted and made again while it lives,
as a rollout does, so that sticky addresses are kept across re-creation.

Everything here is decided by one seeded ``random.Random`` in order, so a seed gives the same
units, the same shapes and the same lifetimes (the order in which the cluster then answers
still varies: the seed replays the work and the faults, not the machine's timing). Building
the objects is pure; the runner (``loadtests.soak.run``) creates and deletes them.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from extender import names
from testbed.manifests import pod_manifest, statefulset_manifest

__all__ = [
    "HIGH",
    "LOW",
    "NAMESPACES",
    "SOAK_LABEL",
    "Unit",
    "UnitKind",
    "Workload",
    "parse_mix",
]

JSON = dict[str, Any]

SOAK_LABEL = "schedext.io/soak"  # on every object the stream makes, so it lists only its own
UNIT_LABEL = "schedext.io/soak-unit"
NAMESPACES = ("soak-a", "soak-b")
LOW, HIGH = "soak-low", "soak-high"  # PriorityClasses: high preempts low
SHARE_MIB = (10_240, 20_480, 40_960)
WHOLE_GPUS = (1, 1, 1, 2, 2, 4, 8)


class UnitKind(StrEnum):
    WHOLE = "whole"
    SHARE = "share"
    POOL = "pool"
    STICKY = "sticky"
    GANG = "gang"


DEFAULT_MIX = {
    UnitKind.WHOLE: 5,
    UnitKind.SHARE: 2,
    UnitKind.POOL: 1,
    UnitKind.STICKY: 1,
    UnitKind.GANG: 1,
}


def parse_mix(text: str) -> dict[UnitKind, int]:
    """``whole=5,share=2,...``: weights of the unit kinds (absent kinds: 0)."""
    mix: dict[UnitKind, int] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        kind, _, weight = part.partition("=")
        try:
            mix[UnitKind(kind.strip())] = int(weight)
        except ValueError:
            kinds = ", ".join(k.value for k in UnitKind)
            message = f"bad mix entry {part!r}: want KIND=WEIGHT, KIND one of {kinds}"
            raise ValueError(message) from None
    if not any(weight > 0 for weight in mix.values()):
        raise ValueError("the mix gives every kind a weight of 0")
    return mix


@dataclass
class Unit:
    """One unit of work, its objects, and what the runner has seen of it."""

    name: str
    kind: UnitKind
    namespace: str
    pods: list[JSON]  # manifests; sticky pods get their owner's UID when it exists
    lifetime_s: float
    group: JSON | None = None  # a gang's PodGroup
    statefulset: JSON | None = None  # a sticky unit's StatefulSet
    restarts: int = 0  # sticky pods deleted and made again while the unit lives
    created_at: float = 0.0
    bound_at: float | None = None
    restarted: int = 0
    uids: dict[str, str] = field(default_factory=dict)  # pod name -> UID of its current pod

    @property
    def pod_names(self) -> list[str]:
        return [pod["metadata"]["name"] for pod in self.pods]

    def restart_due(self, now: float) -> bool:
        """Whether the next re-creation of a sticky pod is due: spread over the lifetime."""
        if self.bound_at is None or self.restarted >= self.restarts:
            return False
        step = self.lifetime_s / (self.restarts + 1)
        return now >= self.bound_at + step * (self.restarted + 1)


@dataclass
class Workload:
    """The seeded generator of units."""

    seed: int
    mix: dict[UnitKind, int] = field(default_factory=lambda: dict(DEFAULT_MIX))
    lifetime_s: float = 20.0  # mean, once placed (exponential, within [2, 5x mean])
    high_share: float = 0.25  # the part of units at the high priority
    gang_timeout_s: tuple[int, int] = (8, 20)
    pools: tuple[str, ...] = ("pool-a", "pool-b")
    _rng: random.Random = field(init=False, repr=False)
    _count: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)
        self._kinds = [kind for kind, weight in self.mix.items() if weight > 0]
        self._weights = [self.mix[kind] for kind in self._kinds]

    def next_unit(self) -> Unit:
        rng = self._rng
        self._count += 1
        kind = rng.choices(self._kinds, self._weights)[0]
        namespace = rng.choice(NAMESPACES)
        priority = HIGH if rng.random() < self.high_share else LOW
        lifetime = min(max(2.0, rng.expovariate(1 / self.lifetime_s)), 5 * self.lifetime_s)
        name = f"{kind.value[0]}{self._count:06d}"
        unit = Unit(name, kind, namespace, [], lifetime)
        labels = {SOAK_LABEL: "1", UNIT_LABEL: name}
        if kind is UnitKind.WHOLE:
            gpus = rng.choice(WHOLE_GPUS)
            unit.pods = [_pod(name, labels, priority, {names.GPU_RESOURCE: str(gpus)})]
        elif kind is UnitKind.SHARE:
            asked = {
                names.SHARE_MEMORY_RESOURCE: str(rng.choice(SHARE_MIB)),
                names.SHARE_COUNT_RESOURCE: "1",
            }
            unit.pods = [_pod(name, labels, priority, asked)]
        elif kind is UnitKind.POOL:
            asked = {names.IP_RESOURCE: "1"}
            if rng.random() < 0.5:
                asked[names.GPU_RESOURCE] = "1"
            annotations = {names.IP_POOL: rng.choice(self.pools)}
            unit.pods = [_pod(name, labels, priority, asked, annotations)]
        elif kind is UnitKind.STICKY:
            replicas = rng.randint(1, 3)
            pool = rng.choice(self.pools)
            unit.statefulset = statefulset_manifest(
                name, replicas=replicas, namespace=namespace, labels=labels
            )
            annotations = {names.IP_POOL: pool, names.IP_POLICY: "sticky"}
            unit.pods = [
                _pod(
                    f"{name}-{ordinal}",
                    {**labels, "app": name},
                    priority,
                    {names.IP_RESOURCE: "1"},
                    annotations,
                )
                for ordinal in range(replicas)
            ]
            unit.restarts = rng.randint(1, 2)
        else:
            members = rng.randint(2, 8)
            timeout = rng.randint(*self.gang_timeout_s)
            unit.group = _pod_group(name, namespace, members, timeout, labels)
            member_labels = {**labels, names.POD_GROUP_LABEL: name}
            unit.pods = [
                _pod(
                    f"{name}-{i}",
                    member_labels,
                    priority,
                    {names.GPU_RESOURCE: str(rng.choice((1, 1, 2)))},
                )
                for i in range(members)
            ]
        return unit


def _pod(
    name: str,
    labels: dict[str, str],
    priority: str,
    asked: dict[str, str],
    annotations: dict[str, str] | None = None,
) -> JSON:
    return pod_manifest(
        name,
        requests={"cpu": "100m", "memory": "64Mi", **asked},
        limits=asked,
        labels=labels,
        annotations=annotations,
        priority_class=priority,
    )


def _pod_group(
    name: str, namespace: str, members: int, timeout_s: int, labels: dict[str, str]
) -> JSON:
    return {
        "apiVersion": "scheduling.x-k8s.io/v1alpha1",
        "kind": "PodGroup",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {"minMember": members, "scheduleTimeoutSeconds": timeout_s},
    }
