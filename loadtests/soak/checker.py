"""The invariants the soak holds schedext to, judged from the API server's own state.

Everything here is a pure function of values read from the API server (:class:`Snapshot`)
and, for one check, of schedext's ``/inventory``: no I/O and no clock (``now`` is passed
in), so that each rule has a table of unit tests and a planted fault can be shown to trip it.

Instant invariants hold at every moment, whatever the faults:

* ``gpu-twice``: no GPU index of a node is held whole by two live pods, or whole by one and
  in shares by others;
* ``share-over``: the shares on one device never add up to more than its memory, or to more
  than 100 percent of its cores;
* ``gpu-unrecorded``: a bound pod that asks for GPUs carries the indices bind gave it, each
  one that its node has;
* ``address-twice``: no address is held by two live pods;
* ``sticky-moved``: a pod of a sticky identity holds the address its claim keeps.

Lingering invariants allow the cluster a bounded time to converge (``Limits``); a state that
lasts longer is a violation:

* ``gang-partial``: a gang with some but fewer than ``minMember`` members bound, for longer
  than its timeout (plus ``Limits.gang_grace_s``);
* ``claim-left``: an IPClaim whose identity is gone (its StatefulSet deleted, or scaled below
  the ordinal), for longer than ``Limits.claim_grace_s``;
* ``no-reason``: a pod pending for longer than ``Limits.reason_grace_s`` with no
  FailedScheduling event (judged only where events were read);
* ``inventory``: schedext's ``/inventory`` differs from what the bound pods' annotations say
  (a GPU, a share or an address held by another pod, by none, or a reservation whose pod is
  gone), for longer than ``Limits.inventory_grace_s`` (judged only while the leader is
  stable).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

__all__ = [
    "Checker",
    "Claim",
    "Group",
    "Limits",
    "Node",
    "Pod",
    "Snapshot",
    "Violation",
    "inventory_holders",
]

K = TypeVar("K", bound=Hashable)
REASON_RECHECK_S = 10.0


@dataclass(frozen=True, slots=True)
class Pod:
    """A live pod (no deletionTimestamp) as the checks see it."""

    key: str  # namespace/name
    uid: str
    node: str | None = None  # spec.nodeName: bound when set
    gpus: tuple[int, ...] | None = None  # schedext.io/gpu-ids (None: absent or unreadable)
    asked_gpus: int = 0  # whole GPUs asked (nvidia.com/gpu)
    share_mib: int = 0  # a share's memory per device (schedext.io/gpu-memory asked)
    share_cores: int = 0
    ip: str | None = None  # schedext.io/ip, as bind wrote it
    asks_address: bool = False
    group: str | None = None  # namespace/podgroup
    identity: str | None = None  # sts/<namespace>/<statefulset>/<ordinal>
    created: float = 0.0  # creationTimestamp, seconds since the epoch


@dataclass(frozen=True, slots=True)
class Node:
    name: str
    gpus: int
    device_mib: int


@dataclass(frozen=True, slots=True)
class Group:
    key: str  # namespace/name
    min_member: int
    timeout_s: float


@dataclass(frozen=True, slots=True)
class Claim:
    name: str
    address: str
    owner: str  # sts/<namespace>/<statefulset>/<ordinal>
    holder_uid: str | None


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What the API server holds at one moment (``at``: seconds since the epoch)."""

    at: float
    pods: tuple[Pod, ...] = ()
    nodes: Mapping[str, Node] = field(default_factory=dict)
    groups: Mapping[str, Group] = field(default_factory=dict)
    claims: tuple[Claim, ...] = ()
    statefulsets: Mapping[str, int] = field(default_factory=dict)  # namespace/name: replicas
    # Keys of pods with a FailedScheduling event; None when events were not read this time.
    reasons: frozenset[str] | None = None


@dataclass(frozen=True, slots=True)
class Violation:
    check: str
    subject: str  # the pod(s), or the object, it is about
    resource: str  # the GPU, device, address, gang or claim
    detail: str

    def __str__(self) -> str:
        return f"{self.check}: {self.subject} on {self.resource}: {self.detail}"


@dataclass(frozen=True, slots=True)
class Limits:
    """How long a lingering state may last before it is a violation."""

    gang_grace_s: float = 30.0
    claim_grace_s: float = 30.0
    reason_grace_s: float = 30.0
    inventory_grace_s: float = 20.0


# ---------------------------------------------------------------------------------------------
# Instant invariants
# ---------------------------------------------------------------------------------------------


def _bound(snapshot: Snapshot) -> list[Pod]:
    return [pod for pod in snapshot.pods if pod.node]


def gpus_held_twice(snapshot: Snapshot) -> list[Violation]:
    whole: dict[tuple[str, int], list[str]] = defaultdict(list)
    shared: dict[tuple[str, int], list[str]] = defaultdict(list)
    for pod in _bound(snapshot):
        for index in pod.gpus or ():
            assert pod.node is not None
            (shared if pod.share_mib else whole)[(pod.node, index)].append(pod.key)
    found = []
    for (node, index), holders in sorted(whole.items()):
        sharers = shared.get((node, index), [])
        if len(holders) > 1 or sharers:
            detail = f"held whole by {', '.join(holders)}"
            if sharers:
                detail += f" and in shares by {', '.join(sharers)}"
            found.append(
                Violation("gpu-twice", ", ".join(holders + sharers), f"{node}/gpu{index}", detail)
            )
    return found


def shares_over(snapshot: Snapshot) -> list[Violation]:
    memory: dict[tuple[str, int], int] = defaultdict(int)
    cores: dict[tuple[str, int], int] = defaultdict(int)
    sharers: dict[tuple[str, int], list[str]] = defaultdict(list)
    for pod in _bound(snapshot):
        if not pod.share_mib:
            continue
        for index in pod.gpus or ():
            assert pod.node is not None
            memory[(pod.node, index)] += pod.share_mib
            cores[(pod.node, index)] += pod.share_cores
            sharers[(pod.node, index)].append(pod.key)
    found = []
    for device, mib in sorted(memory.items()):
        node = snapshot.nodes.get(device[0])
        if node is None:
            continue  # its node is gone: nothing to hold against
        over = []
        if mib > node.device_mib:
            over.append(f"{mib} MiB of {node.device_mib}")
        if cores[device] > 100:
            over.append(f"{cores[device]} percent of the cores")
        if over:
            found.append(
                Violation(
                    "share-over",
                    ", ".join(sharers[device]),
                    f"{device[0]}/gpu{device[1]}",
                    " and ".join(over),
                )
            )
    return found


def gpus_unrecorded(snapshot: Snapshot) -> list[Violation]:
    found = []
    for pod in _bound(snapshot):
        if not (pod.asked_gpus or pod.share_mib):
            continue
        node = snapshot.nodes.get(pod.node or "")
        if pod.gpus is None:
            found.append(
                Violation(
                    "gpu-unrecorded", pod.key, pod.node or "", "bound without schedext.io/gpu-ids"
                )
            )
        elif node is not None and any(index >= node.gpus for index in pod.gpus):
            found.append(
                Violation(
                    "gpu-unrecorded",
                    pod.key,
                    pod.node or "",
                    f"GPU indices {pod.gpus} on a node of {node.gpus}",
                )
            )
        elif pod.asked_gpus and not pod.share_mib and len(pod.gpus) != pod.asked_gpus:
            found.append(
                Violation(
                    "gpu-unrecorded",
                    pod.key,
                    pod.node or "",
                    f"{len(pod.gpus)} GPU indices for {pod.asked_gpus} asked",
                )
            )
    return found


def addresses_held_twice(snapshot: Snapshot) -> list[Violation]:
    holders: dict[str, list[str]] = defaultdict(list)
    for pod in _bound(snapshot):
        if pod.ip:
            holders[pod.ip].append(pod.key)
    return [
        Violation("address-twice", ", ".join(keys), address, f"held by {len(keys)} live pods")
        for address, keys in sorted(holders.items())
        if len(keys) > 1
    ]


def sticky_moved(snapshot: Snapshot) -> list[Violation]:
    claims = {claim.owner: claim for claim in snapshot.claims}
    found = []
    for pod in _bound(snapshot):
        claim = claims.get(pod.identity or "")
        if claim is None or not pod.ip or claim.holder_uid not in (None, "", pod.uid):
            continue
        if claim.address != pod.ip:
            found.append(
                Violation(
                    "sticky-moved",
                    pod.key,
                    pod.ip,
                    f"its identity {pod.identity} keeps {claim.address}",
                )
            )
    return found


INSTANT = (gpus_held_twice, shares_over, gpus_unrecorded, addresses_held_twice, sticky_moved)


# ---------------------------------------------------------------------------------------------
# Lingering invariants
# ---------------------------------------------------------------------------------------------


class Lingering(Generic[K]):
    """Since when each state has been seen without a break: a state missing from one round
    is forgotten, and starts again from that round if it comes back."""

    def __init__(self) -> None:
        self._since: dict[K, float] = {}

    def ages(self, now: float, present: Iterable[K]) -> dict[K, float]:
        current = set(present)
        self._since = {key: self._since.get(key, now) for key in current}
        return {key: now - since for key, since in self._since.items()}


def _partial_gangs(snapshot: Snapshot) -> dict[str, tuple[int, Group]]:
    bound: dict[str, int] = defaultdict(int)
    for pod in _bound(snapshot):
        if pod.group:
            bound[pod.group] += 1
    return {
        key: (count, group)
        for key, count in bound.items()
        if (group := snapshot.groups.get(key)) is not None and 0 < count < group.min_member
    }


def _identity_gone(owner: str, statefulsets: Mapping[str, int]) -> bool:
    parts = owner.split("/")
    if len(parts) != 4 or not parts[3].isdigit():
        return True  # not an identity the soak made: nothing keeps it
    replicas = statefulsets.get(f"{parts[1]}/{parts[2]}")
    return replicas is None or int(parts[3]) >= replicas


Holders = dict[tuple[str, str], frozenset[str]]  # (node, "gpu3" | "share3" | address): pods


def api_holders(snapshot: Snapshot) -> Holders:
    """What the bound pods' annotations say is held: whole GPUs, shares per device, and
    addresses (node "" for an address)."""
    held: dict[tuple[str, str], set[str]] = defaultdict(set)
    for pod in _bound(snapshot):
        assert pod.node is not None
        for index in pod.gpus or ():
            held[(pod.node, f"{'share' if pod.share_mib else 'gpu'}{index}")].add(pod.key)
        if pod.ip:
            held[("", pod.ip)].add(pod.key)
    return {resource: frozenset(keys) for resource, keys in held.items()}


def inventory_holders(inventory: Mapping[str, Any]) -> Holders:
    """The same from schedext's ``/inventory``, reservations included (a bind under way)."""
    held: dict[tuple[str, str], set[str]] = defaultdict(set)
    for node in inventory.get("nodes", ()):
        for gpu in node.get("gpus", ()):
            if gpu.get("holder"):
                held[(node["name"], f"gpu{gpu['index']}")].add(gpu["holder"])
            for sharer in (gpu.get("share") or {}).get("pods", ()):
                held[(node["name"], f"share{gpu['index']}")].add(sharer["pod"])
    for pool in inventory.get("pools", ()):
        for holder in pool.get("holders", ()):
            held[("", holder["address"])].add(holder["pod"])
    return {resource: frozenset(keys) for resource, keys in held.items()}


def inventory_differences(
    snapshot: Snapshot, inventory: Mapping[str, Any]
) -> tuple[dict[tuple[str, str], tuple[frozenset[str], frozenset[str]]], set[tuple[str, str]]]:
    """Where schedext's inventory and the API server disagree, with what each says; and,
    apart, where the inventory holds more only for pods that exist and are not bound yet
    (reservations: a bind under way, or a gang member at the barrier)."""
    ours, theirs = inventory_holders(inventory), api_holders(snapshot)
    waiting = {pod.key for pod in snapshot.pods if not pod.node}
    differ: dict[tuple[str, str], tuple[frozenset[str], frozenset[str]]] = {}
    reserved: set[tuple[str, str]] = set()
    for resource in ours.keys() | theirs.keys():
        held, bound = ours.get(resource, frozenset()), theirs.get(resource, frozenset())
        if held == bound:
            continue
        if bound <= held and held - bound <= waiting:
            reserved.add(resource)
        else:
            differ[resource] = (held, bound)
    return differ, reserved


def _where(resource: tuple[str, str]) -> str:
    node, what = resource
    return f"{node}/{what}" if node else what


class Checker:
    """The invariants over a stream of snapshots: :meth:`check` answers the violations found
    in one (instant ones at once, lingering ones once they last too long); each violation is
    reported once, at its first reading, however long it lasts."""

    def __init__(self, limits: Limits | None = None, *, reservation_grace_s: float = 60.0) -> None:
        self.limits = limits or Limits()
        self.reservation_grace_s = reservation_grace_s
        self._gangs: Lingering[str] = Lingering()
        self._claims: Lingering[str] = Lingering()
        self._reasons: Lingering[str] = Lingering()
        self._differ: Lingering[tuple[tuple[str, str], frozenset[str], frozenset[str]]] = (
            Lingering()
        )
        self._reserved: Lingering[tuple[str, str]] = Lingering()
        self._reported: set[tuple[str, Hashable]] = set()

    def check(
        self,
        snapshot: Snapshot,
        inventory: Mapping[str, Any] | None = None,
        *,
        strict: bool = False,
    ) -> list[Violation]:
        """``inventory``: the stable leader's ``/inventory``, read after ``snapshot`` (None:
        not judged this time, and the inventory's lingering states start again). ``strict``:
        the last judgement, once the run has settled: a difference with the inventory, or a
        pod pending without a reason, counts at once."""
        now = snapshot.at
        # An instant violation is reported once, however many readings still show it.
        found = [
            violation
            for check in INSTANT
            for violation in check(snapshot)
            if self._first(violation.check, (violation.subject, violation.resource))
        ]
        limits = self.limits
        partial = _partial_gangs(snapshot)
        for key, age in self._gangs.ages(now, partial).items():
            count, group = partial[key]
            if age > group.timeout_s + limits.gang_grace_s and self._first("gang", key):
                found.append(
                    Violation(
                        "gang-partial",
                        key,
                        key,
                        f"{count} of minMember {group.min_member} bound for {age:.0f} s",
                    )
                )
        orphans = {
            claim.name: claim
            for claim in snapshot.claims
            if _identity_gone(claim.owner, snapshot.statefulsets)
        }
        for name, age in self._claims.ages(now, orphans).items():
            if age > limits.claim_grace_s and self._first("claim", name):
                found.append(
                    Violation(
                        "claim-left",
                        orphans[name].owner,
                        name,
                        f"kept {age:.0f} s after its identity went",
                    )
                )
        if snapshot.reasons is not None:
            # Silent in two readings of the events at least REASON_RECHECK_S apart, so that
            # a pod kube-scheduler has not reached yet at the first one is not judged.
            created = {pod.key: pod.created for pod in snapshot.pods if not pod.node}
            silent = {
                key
                for key, at in created.items()
                if key not in snapshot.reasons
                and now - at > (REASON_RECHECK_S if strict else limits.reason_grace_s)
            }
            for key, age in self._reasons.ages(now, silent).items():
                if (strict or age >= REASON_RECHECK_S) and self._first("reason", key):
                    pending = now - created[key]
                    detail = f"pending {pending:.0f} s without a FailedScheduling event"
                    found.append(Violation("no-reason", key, "-", detail))
        found += self._inventory(snapshot, inventory, strict=strict)
        return found

    def _inventory(
        self, snapshot: Snapshot, inventory: Mapping[str, Any] | None, *, strict: bool
    ) -> list[Violation]:
        if inventory is None:
            self._differ.ages(snapshot.at, ())
            self._reserved.ages(snapshot.at, ())
            return []
        differ, reserved = inventory_differences(snapshot, inventory)
        found = []
        states = [(resource, held, bound) for resource, (held, bound) in differ.items()]
        for (resource, held, bound), age in self._differ.ages(snapshot.at, states).items():
            late = strict or age > self.limits.inventory_grace_s
            if late and self._first("inventory", resource):
                detail = (
                    f"schedext holds it for {', '.join(sorted(held)) or 'nobody'}, the bound "
                    f"pods' annotations say {', '.join(sorted(bound)) or 'nobody'}, "
                    f"for {age:.0f} s"
                )
                pods = ", ".join(sorted(held | bound))
                found.append(Violation("inventory", pods, _where(resource), detail))
        for resource, age in self._reserved.ages(snapshot.at, reserved).items():
            if age > self.reservation_grace_s and self._first("reservation", resource):
                found.append(
                    Violation(
                        "inventory",
                        "-",
                        _where(resource),
                        f"reserved for {age:.0f} s for a pod never bound",
                    )
                )
        return found

    def _first(self, check: str, key: Hashable) -> bool:
        if (check, key) in self._reported:
            return False
        self._reported.add((check, key))
        return True
