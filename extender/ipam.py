"""IP address management: pools, who holds which address, and durable sticky claims.

An ``IPPool`` (cluster-scoped) owns addresses, given as a CIDR and/or ranges, minus excluded
addresses and the gateway, and selects the nodes that may use them with a label selector
(typically a rack label). A pod holds an address while it is bound (the address is written
into its Binding annotations). An ``IPClaim`` is the durable record that keeps an address for
a workload identity (``sts/<namespace>/<statefulset>/<ordinal>``) across pod re-creations.

This module is pure: it keeps the book and answers questions about it.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace

from extender import fields
from extender.fields import JSONObject
from extender.model import ClaimPolicy

__all__ = [
    "AddressBook",
    "ClaimPolicy",
    "IPClaimSpec",
    "IPPoolSpec",
    "IPUse",
    "claim_name",
    "ip_claim_spec",
    "ip_pool_spec",
    "parse_address",
]

Address = int  # addresses are kept as integers (IPv4 and IPv6 never share a pool)

# Pools are bounded so that a typo (a /8) cannot make every allocation scan millions.
MAX_POOL_SIZE = 1 << 20


def parse_address(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """An IP address, or ValueError with a readable message."""
    try:
        return ipaddress.ip_address(text.strip())
    except ValueError:
        raise ValueError(f"not an IP address: {text!r}") from None


@dataclass(frozen=True, slots=True)
class IPPoolSpec:
    name: str
    version: int = 4
    # Inclusive integer ranges of usable addresses, sorted, excludes already removed.
    ranges: tuple[tuple[Address, Address], ...] = ()
    node_selector: Mapping[str, str] = field(default_factory=dict)
    gateway: str | None = None
    problem: str | None = None  # why the pool is unusable, when it is

    @property
    def size(self) -> int:
        return sum(end - start + 1 for start, end in self.ranges)

    def contains(self, address: Address) -> bool:
        return any(start <= address <= end for start, end in self.ranges)

    def addresses(self) -> Iterator[Address]:
        for start, end in self.ranges:
            yield from range(start, end + 1)

    def selects(self, labels: Mapping[str, str]) -> bool:
        return all(labels.get(key) == value for key, value in self.node_selector.items())


def ip_pool_spec(obj: JSONObject) -> IPPoolSpec | None:
    """An IPPool object reduced; an unusable one keeps its name and says why."""
    name = fields.text(fields.obj(obj, "metadata"), "name")
    if not name:
        return None
    spec = fields.obj(obj, "spec")
    selector = fields.string_map(spec, "nodeSelector")
    gateway = fields.text(spec, "gateway") or None
    try:
        version, ranges = _pool_ranges(spec, gateway)
    except ValueError as error:
        return IPPoolSpec(name=name, node_selector=selector, gateway=gateway, problem=str(error))
    return IPPoolSpec(
        name=name, version=version, ranges=ranges, node_selector=selector, gateway=gateway
    )


def _pool_ranges(spec: JSONObject, gateway: str | None) -> tuple[int, tuple[tuple[int, int], ...]]:
    spans: list[tuple[int, int]] = []
    versions: set[int] = set()
    cidr = fields.text(spec, "cidr")
    if cidr:
        try:
            network = ipaddress.ip_network(cidr, strict=False)
        except ValueError:
            raise ValueError(f"spec.cidr is not a CIDR: {cidr!r}") from None
        first, last = int(network.network_address), int(network.broadcast_address)
        if network.version == 4 and network.prefixlen < 31:
            first, last = first + 1, last - 1  # network and broadcast addresses are not usable
        spans.append((first, last))
        versions.add(network.version)
    for item in fields.objects(spec, "ranges"):
        start = parse_address(fields.text(item, "start"))
        end = parse_address(fields.text(item, "end"))
        if start.version != end.version or int(end) < int(start):
            raise ValueError(f"spec.ranges: {start}..{end} is not a range")
        spans.append((int(start), int(end)))
        versions.add(start.version)
    if not spans:
        raise ValueError("needs spec.cidr or spec.ranges")
    if len(versions) != 1:
        raise ValueError("mixes IPv4 and IPv6")
    excluded: list[tuple[int, int]] = []
    for text in [*(fields.get(spec, "exclude") or []), *([gateway] if gateway else [])]:
        if not isinstance(text, str):
            raise ValueError("spec.exclude must list addresses or CIDRs")
        try:
            network = ipaddress.ip_network(text.strip(), strict=False)
        except ValueError:
            raise ValueError(f"spec.exclude: not an address or CIDR: {text!r}") from None
        excluded.append((int(network.network_address), int(network.broadcast_address)))
    ranges = _subtract(_merge(spans), _merge(excluded))
    size = sum(end - start + 1 for start, end in ranges)
    if size > MAX_POOL_SIZE:
        raise ValueError(f"has {size} addresses; at most {MAX_POOL_SIZE} are supported")
    return versions.pop(), tuple(ranges)


def _merge(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    merged: list[tuple[int, int]] = []
    for start, end in sorted(spans):
        if merged and start <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def _subtract(spans: list[tuple[int, int]], holes: list[tuple[int, int]]) -> list[tuple[int, int]]:
    result: list[tuple[int, int]] = []
    for start, end in spans:
        cursor = start
        for hole_start, hole_end in holes:
            if hole_end < cursor or hole_start > end:
                continue
            if hole_start > cursor:
                result.append((cursor, hole_start - 1))
            cursor = max(cursor, hole_end + 1)
        if cursor <= end:
            result.append((cursor, end))
    return result


@dataclass(frozen=True, slots=True)
class IPClaimSpec:
    """The durable hold of an address for a workload identity."""

    name: str
    pool: str
    address: str
    owner: str  # "sts/<namespace>/<statefulset>/<ordinal>"
    policy: ClaimPolicy = ClaimPolicy.STICKY
    holder_uid: str = ""  # the pod currently using it, if any
    uid: str = ""  # the IPClaim object's own UID (a precondition when deleting it)

    @property
    def value(self) -> Address:
        return int(parse_address(self.address))


def claim_name(pool: str, address: str) -> str:
    """Claims are named after the address: the API server's name uniqueness then guarantees
    that no two claims ever hold one address, across schedext replicas and restarts."""
    return f"{pool}.{address.replace(':', '-').replace('.', '-')}"


def ip_claim_spec(obj: JSONObject) -> IPClaimSpec | None:
    meta = fields.obj(obj, "metadata")
    spec = fields.obj(obj, "spec")
    name = fields.text(meta, "name")
    address = fields.text(spec, "address")
    if not name or not address:
        return None
    try:
        parse_address(address)
        policy = ClaimPolicy(fields.text(spec, "releasePolicy") or ClaimPolicy.STICKY.value)
    except ValueError:
        return None
    return IPClaimSpec(
        name=name,
        pool=fields.text(spec, "pool"),
        address=address,
        owner=fields.text(spec, "owner"),
        policy=policy,
        holder_uid=fields.text(spec, "holderUID"),
        uid=fields.text(meta, "uid"),
    )


@dataclass(frozen=True, slots=True)
class IPUse:
    """Who holds an address: a pod (bound or reserved), or only a claim."""

    address: Address
    pool: str
    uid: str = ""  # the holding pod; empty when only a claim keeps the address
    pod: str = ""  # namespace/name of that pod
    node: str = ""
    priority: int = 0
    owner: str = ""  # the claim's identity, when a claim keeps it


class AddressBook:
    """Pools, and which addresses pods and claims hold. One writer: the inventory."""

    def __init__(self) -> None:
        self._pools: dict[str, IPPoolSpec] = {}
        self._pods: dict[Address, IPUse] = {}  # held by pods
        self._by_uid: dict[str, Address] = {}
        self._claims: dict[str, IPClaimSpec] = {}  # by claim name
        self._claims_by_owner: dict[str, IPClaimSpec] = {}
        self._claims_by_address: dict[Address, IPClaimSpec] = {}
        # Per pool name, every address taken by a pod or a claim, and how many of them the pool
        # contains: free counts without scans (filter asks for them on every call).
        self._taken: dict[str, set[Address]] = {}
        self._taken_counts: dict[str, int] = {}
        self.version = 0
        self.pools_version = 0  # bumped only when pools change (node masks depend on them)
        # Until the next take_freed: the addresses pods stopped holding (by pool), and the
        # pools created or changed (see extender.capacity_waits).
        self._vacated: dict[Address, str] = {}
        self._changed: set[str] = set()

    # ------------------------------------------------------------------ pools

    def pool(self, name: str) -> IPPoolSpec | None:
        return self._pools.get(name)

    def pools(self) -> list[IPPoolSpec]:
        return list(self._pools.values())

    def pools_selecting(self, labels: Mapping[str, str]) -> tuple[str, ...]:
        """The names of the pools whose node selector picks a node with ``labels``, sorted."""
        return tuple(sorted(name for name, p in self._pools.items() if p.selects(labels)))

    def replace_pools(self, pools: Iterable[IPPoolSpec]) -> None:
        self._pools = {p.name: p for p in pools}
        self._taken_counts = {name: self._count_taken(p) for name, p in self._pools.items()}
        self._changed.update(self._pools)
        self._pools_changed()

    def upsert_pool(self, pool: IPPoolSpec) -> None:
        if self._pools.get(pool.name) != pool:
            self._pools[pool.name] = pool
            self._taken_counts[pool.name] = self._count_taken(pool)
            self._changed.add(pool.name)
            self._pools_changed()

    def remove_pool(self, name: str) -> None:
        if self._pools.pop(name, None) is not None:
            self._taken_counts.pop(name, None)
            self._pools_changed()

    def _count_taken(self, pool: IPPoolSpec) -> int:
        return sum(1 for a in self._taken.get(pool.name, ()) if pool.contains(a))

    def _take(self, pool_name: str, address: Address) -> None:
        taken = self._taken.setdefault(pool_name, set())
        if address not in taken:
            taken.add(address)
            pool = self._pools.get(pool_name)
            if pool is not None and pool.contains(address):
                self._taken_counts[pool_name] = self._taken_counts.get(pool_name, 0) + 1

    def _untake(self, pool_name: str, address: Address) -> None:
        taken = self._taken.get(pool_name)
        if taken is not None and address in taken:
            taken.discard(address)
            pool = self._pools.get(pool_name)
            if pool is not None and pool.contains(address):
                self._taken_counts[pool_name] -= 1

    def _pools_changed(self) -> None:
        self.version += 1
        self.pools_version += 1

    def pool_of(self, address: Address) -> IPPoolSpec | None:
        return next((p for p in self._pools.values() if p.contains(address)), None)

    # ----------------------------------------------------------------- claims

    def claim_for(self, owner: str) -> IPClaimSpec | None:
        return self._claims_by_owner.get(owner)

    def kept_from(self, address: Address, identity: str | None) -> IPClaimSpec | None:
        """The claim keeping ``address`` from a pod of ``identity`` (None: a pod without
        one): any claim on it but that identity's own. Evicting the pod that uses such an
        address frees nothing: the claim outlives the pod, and the identity's next pod takes
        the address back."""
        claim = self._claims_by_address.get(address)
        return claim if claim is not None and claim.owner != identity else None

    def claims(self) -> list[IPClaimSpec]:
        return list(self._claims.values())

    def replace_claims(self, claims: Iterable[IPClaimSpec]) -> None:
        wanted = list(claims)
        kept = {claim.name for claim in wanted}
        for name in list(self._claims):
            if name in kept:
                self._drop_claim(name)
            else:
                self.remove_claim(name)  # gives back the addresses no pod holds
        for claim in wanted:
            self.upsert_claim(claim)

    def upsert_claim(self, claim: IPClaimSpec) -> None:
        self._drop_claim(claim.name)  # an update frees nothing
        self._claims[claim.name] = claim
        self._claims_by_owner[claim.owner] = claim
        self._claims_by_address[claim.value] = claim
        self._take(claim.pool, claim.value)
        self.version += 1

    def remove_claim(self, name: str) -> None:
        claim = self._drop_claim(name)
        if claim is not None:
            self._vacated[claim.value] = claim.pool

    def _drop_claim(self, name: str) -> IPClaimSpec | None:
        claim = self._claims.pop(name, None)
        if claim is not None:
            self._claims_by_owner.pop(claim.owner, None)
            self._claims_by_address.pop(claim.value, None)
            if claim.value not in self._pods:
                self._untake(claim.pool, claim.value)
            self.version += 1
        return claim

    # ------------------------------------------------------------------- uses

    def hold(self, use: IPUse) -> bool:
        """Record a pod's address; False (nothing recorded) when another pod holds it."""
        current = self._pods.get(use.address)
        if current is not None and current.uid != use.uid:
            return False
        if not use.pool and (pool := self.pool_of(use.address)) is not None:
            use = replace(use, pool=pool.name)  # a pod annotated with the address only
        self.release(use.uid)
        self._pods[use.address] = use
        self._by_uid[use.uid] = use.address
        self._take(use.pool, use.address)
        self.version += 1
        return True

    def release(self, uid: str) -> None:
        address = self._by_uid.pop(uid, None)
        if address is not None:
            use = self._pods.pop(address)
            if address not in self._claims_by_address:
                self._untake(use.pool, address)
            # Freed even when a claim keeps it: the claim's own identity may be waiting for it.
            self._vacated[address] = use.pool
            self.version += 1

    def take_freed(self) -> list[str]:
        """The pools that freed an address since the last call, once per address, and those
        created or changed (see :mod:`extender.capacity_waits`). An address vacated and held
        again by a pod since (its holding rewritten, or another pod taking it) frees nothing;
        one a claim keeps is freed for the claim's own identity."""
        freed = [pool for address, pool in self._vacated.items() if address not in self._pods]
        freed += sorted(self._changed)
        self._vacated.clear()
        self._changed.clear()
        return freed

    def address_of(self, uid: str) -> Address | None:
        return self._by_uid.get(uid)

    def user(self, address: Address) -> IPUse | None:
        """Who holds ``address``: the pod holding it, else the claim keeping it."""
        use = self._pods.get(address)
        if use is not None:
            return use
        claim = self._claims_by_address.get(address)
        if claim is not None:
            return IPUse(address=address, pool=claim.pool, uid="", owner=claim.owner)
        return None

    def is_free(self, address: Address) -> bool:
        return address not in self._pods and address not in self._claims_by_address

    def free_count(self, pool: IPPoolSpec) -> int:
        if self._pools.get(pool.name) is pool:
            return pool.size - self._taken_counts.get(pool.name, 0)
        return pool.size - self._count_taken(pool)  # a spec the book does not hold

    def lowest_free(self, pool: IPPoolSpec) -> Address | None:
        return next((a for a in pool.addresses() if self.is_free(a)), None)

    def uses_in(self, pool: IPPoolSpec) -> list[IPUse]:
        """The pods holding addresses of ``pool``."""
        taken = self._taken.get(pool.name, ())
        return [use for a in taken if (use := self._pods.get(a)) is not None]
