"""Gangs: all-or-nothing placement of a PodGroup, built from filter and bind.

kube-scheduler's extender protocol has no Permit phase, so schedext makes bind the barrier:

* **Filter** rejects a member (every node, unresolvable) while fewer than ``minMember`` pods
  of its group exist, and rejects it (preemption may help) when the members not yet placed
  cannot all find free GPUs in the cluster, a whole-group check over the inventory.
* **Bind** reserves the member's node and GPUs (every later filter sees them) and makes the
  member wait until reserved + bound members reach ``minMember``; then all waiting members
  are bound. A group that does not complete within its timeout releases every reservation it
  holds, and its waiting binds fail, so kube-scheduler retries them.

**Competing groups.** Two groups that each need most of the cluster could each reserve part of
it and wait for each other. The rule: *the older group wins* (PodGroup creationTimestamp, then
namespace/name). When a member cannot complete its group because of GPUs reserved by waiting
members of other groups, then either its group is older than all of them, and their
reservations are released (they retry later), or it is not, and it releases its own group's
reservations and its bind fails. Exactly one group keeps its reservations, so no two groups
wait on each other. The rule is the same after a restart, since the age is read from the API.

Everything here is pure: the caller passes ``now`` and performs the effects, which are
returned as :class:`GangEvent` values (wake or fail the waiting binds).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum

import numpy as np
import numpy.typing as npt

from extender import fields, policy
from extender.fields import JSONObject
from extender.inventory import Inventory
from extender.model import PodRequest, Reason
from extender.policy import PolicyConfig

__all__ = [
    "GangBook",
    "GangEvent",
    "GangEventKind",
    "PodGroupSpec",
    "fits_all",
    "pod_group_spec",
]


@dataclass(frozen=True, slots=True)
class PodGroupSpec:
    namespace: str
    name: str
    min_member: int
    timeout_s: float | None = None
    created: str = ""  # RFC 3339 creationTimestamp: the age that decides competitions
    uid: str = ""

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
    )


class GangEventKind(Enum):
    COMPLETE = "complete"  # quorum reached: the waiting members may bind
    RELEASED = "released"  # the group gave its reservations back (lost a competition, or
    # cannot complete); its waiting binds fail
    TIMED_OUT = "timed_out"  # the group did not reach quorum in time; same effect


@dataclass(frozen=True, slots=True)
class GangEvent:
    kind: GangEventKind
    group: str
    reason: str = ""
    uids: tuple[str, ...] = ()  # the members whose reservations were released
    pods: tuple[tuple[str, str], ...] = ()  # (namespace/name, uid) of those members, if known


@dataclass(slots=True)
class _Waiting:
    started: float
    deadline: float
    uids: set[str] = field(default_factory=set)


class GangBook:
    """PodGroups, their member pods, and the groups whose members wait at the bind barrier."""

    def __init__(self, *, default_timeout_s: float = 20.0, max_wait_s: float = 20.0) -> None:
        if default_timeout_s <= 0 or max_wait_s <= 0:
            raise ValueError("gang timeouts must be > 0")
        self._default_timeout_s = default_timeout_s
        self._max_wait_s = max_wait_s
        self._specs: dict[str, PodGroupSpec] = {}
        # group -> member uid -> the member's request (None once known only as bound)
        self._members: dict[str, dict[str, PodRequest | None]] = {}
        self._member_of: dict[str, str] = {}
        self._waiting: dict[str, _Waiting] = {}
        self._events: list[GangEvent] = []

    # ------------------------------------------------------------------ reads

    def spec(self, group: str) -> PodGroupSpec | None:
        return self._specs.get(group)

    def specs(self) -> list[PodGroupSpec]:
        return list(self._specs.values())

    def member_count(self, group: str) -> int:
        return len(self._members.get(group, {}))

    def members(self, group: str) -> dict[str, PodRequest | None]:
        return dict(self._members.get(group, {}))

    def waiting_groups(self) -> list[str]:
        return list(self._waiting)

    def waiting_uids(self, group: str) -> set[str]:
        waiting = self._waiting.get(group)
        return set(waiting.uids) if waiting else set()

    def deadline(self, group: str) -> float | None:
        waiting = self._waiting.get(group)
        return waiting.deadline if waiting else None

    def take_events(self) -> list[GangEvent]:
        """The effects recorded since the last call (the shell performs them)."""
        events, self._events = self._events, []
        return events

    def timeout_for(self, spec: PodGroupSpec) -> float:
        """The group's wait, capped so that a waiting bind answers kube-scheduler before its
        extender httpTimeout."""
        return min(spec.timeout_s or self._default_timeout_s, self._max_wait_s)

    # ----------------------------------------------------------------- groups

    def upsert_group(self, spec: PodGroupSpec) -> None:
        self._specs[spec.key] = spec

    def delete_group(self, key: str) -> None:
        self._specs.pop(key, None)

    def replace_groups(self, specs: Iterable[PodGroupSpec]) -> None:
        self._specs = {spec.key: spec for spec in specs}

    # ---------------------------------------------------------------- members

    def track(self, uid: str, group: str | None, request: PodRequest | None) -> None:
        """Record that pod ``uid`` exists in ``group`` (None: in no group)."""
        old = self._member_of.get(uid)
        if old is not None and old != group:
            self.forget(uid)
        if group is None:
            return
        members = self._members.setdefault(group, {})
        if request is not None or uid not in members:
            members[uid] = request
        self._member_of[uid] = group

    def forget(self, uid: str) -> None:
        group = self._member_of.pop(uid, None)
        if group is None:
            return
        members = self._members.get(group)
        if members is not None:
            members.pop(uid, None)
            if not members:
                del self._members[group]
        waiting = self._waiting.get(group)
        if waiting is not None:
            waiting.uids.discard(uid)

    def replace_members(self, members: Iterable[tuple[str, str, PodRequest | None]]) -> None:
        """A pod relist: exactly these (uid, group, request) members exist."""
        self._members.clear()
        self._member_of.clear()
        for uid, group, request in members:
            self.track(uid, group, request)
        for waiting in self._waiting.values():
            waiting.uids.intersection_update(self._member_of)

    # ---------------------------------------------------------------- barrier

    def join(self, group: str, uid: str, *, now: float, placed: int) -> bool:
        """A member reserved its place; True when that completes the group (quorum)."""
        spec = self._specs[group]
        if placed >= spec.min_member:
            waiting = self._waiting.pop(group, None)
            self._events.append(
                GangEvent(
                    GangEventKind.COMPLETE, group, uids=tuple(waiting.uids) if waiting else ()
                )
            )
            return True
        waiting = self._waiting.get(group)
        if waiting is None:
            waiting = self._waiting[group] = _Waiting(now, now + self.timeout_for(spec))
        waiting.uids.add(uid)
        return False

    def release(self, group: str, kind: GangEventKind, reason: str) -> tuple[str, ...]:
        """End the group's wait; returns the members whose reservations must go."""
        waiting = self._waiting.pop(group, None)
        uids = tuple(sorted(waiting.uids)) if waiting else ()
        members = self._members.get(group, {})
        pods = tuple((r.key, uid) for uid in uids if (r := members.get(uid)) is not None)
        self._events.append(GangEvent(kind, group, reason=reason, uids=uids, pods=pods))
        return uids

    def overdue(self, now: float) -> list[str]:
        return [group for group, waiting in self._waiting.items() if waiting.deadline <= now]


def fits_all(
    inventory: Inventory,
    requests: Iterable[PodRequest],
    config: PolicyConfig,
    *,
    free_delta: Mapping[int, int] | None = None,
) -> bool:
    """Whether every request can get its GPUs at the same time, somewhere in the cluster.

    Largest request first, each onto the node with the fewest free GPUs that still holds it
    (best fit), honouring each request's model, memory and CPU-class constraints.
    ``free_delta`` adds GPUs per node id (what releasing other reservations would free).
    """
    free = inventory.arrays.gpu_free.copy()
    for node_id, delta in (free_delta or {}).items():
        free[node_id] += delta
    all_ids = np.arange(len(free), dtype=np.int32)
    static_ok: dict[tuple[object, ...], npt.NDArray[np.bool_]] = {}
    for request in sorted(requests, key=lambda r: -r.gpus):
        if request.gpus == 0:
            continue
        shape = (request.gpus, request.gpu_model, request.gpu_memory_mib, request.workload)
        if shape not in static_ok:
            codes = policy.node_reasons(inventory, request, all_ids, config)
            # Everything but "not free right now": free GPUs are simulated here instead.
            static_ok[shape] = np.isin(codes, _DYNAMIC)
        eligible = np.flatnonzero(static_ok[shape] & (free >= request.gpus))
        if len(eligible) == 0:
            return False
        best = eligible[np.argmin(free[eligible])]
        free[best] -= request.gpus
    return True


_DYNAMIC = np.array([Reason.FITS, Reason.GPU_FREE, Reason.CPU_FREE], dtype=np.int8)
