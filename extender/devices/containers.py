"""How the kubelet hands a pod's devices to its containers, and so which of the pod's devices
the next container's ``Allocate`` is for.

``Allocate`` carries device IDs only: no pod, no container. The kubelet's device manager
(``pkg/kubelet/cm/devicemanager``, v1.36) admits one pod at a time and, per resource, calls
``Allocate`` once per container that asks for it, init containers first, each list in spec
order. For each container it takes:

- first the pod's *reusable* devices, those of the regular init containers admitted before it
  (they have exited by the time the next container runs), and names them again;
- then fresh devices no container holds, steered by ``GetPreferredAllocation``.

A regular init container's devices join the reusable pool; a sidecar's (an init container with
``restartPolicy: Always``) and an app container's leave it, because they hold them for the
pod's life. So a pod never holds more than its effective request (what kube-scheduler sums,
:mod:`extender.resource_totals`), and that is what schedext chose devices for.

The agent keeps the same book per pod: each container's grant is recorded by container name
(:func:`format_grants`), and the next container's devices are the pool's first, then devices
schedext chose for the pod that no container of it has been given (:func:`next_container`).
A record written before records named containers (a plain "uuid,uuid" list) still counts: its
devices cover the containers in order.
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass

from extender import fields
from extender.fields import JSONObject
from extender.quantity import NANO, QuantityError, to_nano

__all__ = [
    "MAX_GRANTS",
    "ContainerAsk",
    "ContainerGrant",
    "NextContainer",
    "PodContainer",
    "Role",
    "asks_for",
    "format_grants",
    "granted_devices",
    "next_container",
    "of_devices",
    "parse_grants",
    "pod_containers",
    "reusable",
]

MAX_GRANTS = 256  # containers in a record; a pod has far fewer, a longer record is not ours
_MAX_RECORD = 64 * 1024  # characters of a record read at all
_GRANT_SEPARATOR = ";"
_NAME_SEPARATOR = ":"


class Role(enum.Enum):
    """What the kubelet does with a container's devices once it is admitted."""

    INIT = "init"  # exits before the next container starts: its devices are reusable
    SIDECAR = "sidecar"  # a restartable init container: holds its devices for the pod's life
    APP = "app"  # holds its devices for the pod's life


@dataclass(frozen=True, slots=True)
class PodContainer:
    """One container of a pod, in the kubelet's order, with the extended resources it asks
    for: (resource, whole units) pairs, units > 0 only."""

    name: str
    role: Role
    requests: tuple[tuple[str, int], ...] = ()

    def count(self, resource: str) -> int:
        return dict(self.requests).get(resource, 0)


@dataclass(frozen=True, slots=True)
class ContainerAsk:
    """A container that asks for ``count`` devices of one resource."""

    name: str
    role: Role
    count: int


@dataclass(frozen=True, slots=True)
class ContainerGrant:
    """The devices (GPU or MIG UUIDs) one container was given; ``container`` is "" for a
    record written before records named containers."""

    container: str
    uuids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class NextContainer:
    """What the pod's next ``Allocate`` of a resource is: which container, the devices it
    reuses from the pool (the pod's already), and how many it takes fresh."""

    ask: ContainerAsk
    reused: tuple[str, ...]
    fresh: int


def pod_containers(spec: JSONObject) -> tuple[PodContainer, ...]:
    """The pod's containers in the order the kubelet admits them, with their extended
    resources (names with a "/": devices are always extended resources). A device is asked for
    in ``limits`` (``requests``, if given, must equal it); an amount that is not a whole
    number is rounded up, as kube-scheduler counts it."""
    out = []
    for key, default_role in (("initContainers", Role.INIT), ("containers", Role.APP)):
        for container in fields.objects(spec, key):
            role = default_role
            if role is Role.INIT and fields.text(container, "restartPolicy") == "Always":
                role = Role.SIDECAR
            resources = fields.obj(container, "resources")
            asked = {**fields.obj(resources, "requests"), **fields.obj(resources, "limits")}
            requests = tuple(
                (name, units)
                for name, raw in asked.items()
                if "/" in name and (units := _units(raw)) > 0
            )
            out.append(PodContainer(fields.text(container, "name"), role, requests))
    return tuple(out)


def _units(raw: object) -> int:
    if not isinstance(raw, str | int | float) or isinstance(raw, bool):
        return 0
    try:
        return max(0, -(-to_nano(raw) // NANO))
    except QuantityError:
        return 0


def asks_for(
    containers: Sequence[PodContainer], resource: str, *, per_device: int = 1
) -> tuple[ContainerAsk, ...]:
    """The containers that ask for ``resource``, as device counts: ``per_device`` units of the
    resource make one device (a share handle served per GiB names each GPU many times)."""
    return tuple(
        ContainerAsk(c.name, c.role, -(-c.count(resource) // per_device))
        for c in containers
        if c.count(resource) > 0
    )


def of_devices(
    grants: Iterable[ContainerGrant], devices: Collection[str]
) -> tuple[ContainerGrant, ...]:
    """The grants as far as they are of ``devices`` (one resource's: one MIG profile's), so
    that a container given devices of two resources counts for each apart."""
    kept = (ContainerGrant(g.container, tuple(u for u in g.uuids if u in devices)) for g in grants)
    return tuple(g for g in kept if g.uuids)


def granted_devices(grants: Iterable[ContainerGrant]) -> tuple[str, ...]:
    """Every device the pod's containers were given, each once, in the order given."""
    return tuple(dict.fromkeys(uuid for grant in grants for uuid in grant.uuids))


def _granted_asks(
    asks: Sequence[ContainerAsk], grants: Sequence[ContainerGrant]
) -> list[tuple[ContainerAsk, tuple[str, ...]]]:
    """The asks already given devices, in order, with what each got. A named grant is its
    container's; an unnamed (older) record's devices cover the asks in order."""
    by_name: dict[str, tuple[str, ...]] = {}
    for grant in grants:
        if grant.container:
            by_name[grant.container] = by_name.get(grant.container, ()) + grant.uuids
    unnamed = [u for g in grants if not g.container for u in g.uuids]
    done = []
    for ask in asks:
        if ask.name in by_name:
            done.append((ask, by_name[ask.name]))
        elif unnamed and len(unnamed) >= ask.count:
            done.append((ask, tuple(unnamed[: ask.count])))
            unnamed = unnamed[ask.count :]
    return done


def reusable(asks: Sequence[ContainerAsk], grants: Sequence[ContainerGrant]) -> tuple[str, ...]:
    """The pod's devices a later container takes first: those of its regular init containers,
    less those a sidecar or an app container has taken since."""
    pool: dict[str, None] = {}
    for ask, uuids in _granted_asks(asks, grants):
        if ask.role is Role.INIT:
            pool.update(dict.fromkeys(uuids))
        else:
            for uuid in uuids:
                pool.pop(uuid, None)
    return tuple(pool)


def next_container(
    asks: Sequence[ContainerAsk],
    grants: Sequence[ContainerGrant],
    *,
    named: Sequence[str] = (),
) -> NextContainer | None:
    """The first container not given its devices yet, and how it gets them: as many as it
    needs from the pool (the ones the kubelet ``named`` first, then in pool order), the rest
    fresh. None when every container has its devices."""
    granted = {ask.name for ask, _ in _granted_asks(asks, grants)}
    ask = next((a for a in asks if a.name not in granted), None)
    if ask is None:
        return None
    pool = reusable(asks, grants)
    ordered = [u for u in named if u in pool] + [u for u in pool if u not in named]
    reused = tuple(dict.fromkeys(ordered))[: ask.count]
    return NextContainer(ask, reused, ask.count - len(reused))


def parse_grants(text: str | None) -> tuple[ContainerGrant, ...]:
    """Read a pod's allocation record: "main:GPU-a,GPU-b;init:GPU-c", or an older plain
    "GPU-a,GPU-b". Anything unreadable reads as no record of that container (the agent then
    refuses rather than guesses, see the callers); the whole record when it is too long."""
    if not text or len(text) > _MAX_RECORD:
        return ()
    grants: list[ContainerGrant] = []
    for part in text.split(_GRANT_SEPARATOR)[:MAX_GRANTS]:
        name, sep, devices = part.partition(_NAME_SEPARATOR)
        if not sep:
            name, devices = "", part
        uuids = tuple(dict.fromkeys(u.strip() for u in devices.split(",") if u.strip()))
        if uuids:
            grants.append(ContainerGrant(name.strip(), uuids))
    return tuple(grants)


def format_grants(grants: Iterable[ContainerGrant]) -> str:
    """The record :func:`parse_grants` reads. A container given devices of two resources
    (two MIG profiles) appears twice."""
    return _GRANT_SEPARATOR.join(
        f"{g.container}{_NAME_SEPARATOR}{','.join(g.uuids)}" if g.container else ",".join(g.uuids)
        for g in grants
    )
