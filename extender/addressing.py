"""Address policy: which nodes can give a pod the address it asks for, and which address.

A pod asks for a specific address (``schedext.io/ip``), any address of some pools
(``schedext.io/ip-pool``), and may ask its StatefulSet identity to keep its address
(``schedext.io/ip-policy``). A node can serve the pod when a pool that can give that address
selects the node.

Only the pools that select a node count on that node: with several pools, a pool with free
addresses elsewhere does not make a node whose own pools are exhausted fit.

When preemption can help. kube-scheduler evicts victims only on the candidate node, and
evicting a pod frees its address only when no ``IPClaim`` keeps it: a claim (sticky or
never-release) outlives its pod, and the identity's next pod takes the address back. So:

* an address held by another pod is resolvable only on the node where that pod runs, only if
  it has lower priority than the pod being placed, and only if no claim keeps it (the claim
  of the pod's own identity aside). Everywhere else it is unresolvable;
* an exhausted pool is resolvable on the nodes it selects where lower-priority pods hold
  addresses of it that no claim keeps;
* a claim whose pod is gone, a missing pool, an address in no pool, and a node no pool selects
  are all unresolvable.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Collection
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from extender.inventory import IdArray, Inventory
from extender.ipam import Address, IPPoolSpec, IPUse
from extender.model import PodRequest, Reason

__all__ = [
    "IPContext",
    "choose_address",
    "ip_conditions",
    "ip_context",
    "ip_headroom",
    "waits_for_address",
]

BoolArray = npt.NDArray[np.bool_]
FloatArray = npt.NDArray[np.float64]

# The reasons that an address freed in the pod's pool, or a change of the pool, may resolve.
_FREED_RESOLVES = frozenset(
    {
        Reason.IP_UNKNOWN_POOL,  # the pool may be created
        Reason.IP_STICKY_BUSY,
        Reason.IP_TAKEN,
        Reason.IP_TAKEN_HERE,
        Reason.IP_EXHAUSTED,
        Reason.IP_EXHAUSTED_EVICTABLE,
    }
)


@dataclass(frozen=True, slots=True)
class IPContext:
    """What a pod's address request amounts to against the current address book."""

    pools: tuple[IPPoolSpec, ...]  # the pools that could serve it
    target: Address | None = None  # a specific address: asked for, or kept by a claim
    holder: IPUse | None = None  # someone else holding the target
    sticky_busy: IPUse | None = None  # the identity's previous pod still holds the address
    missing_pools: tuple[str, ...] = ()
    unpooled: bool = False  # the asked-for address is in no pool
    identity: str | None = None  # the pod's StatefulSet identity, when it asks to keep one
    # The identity whose claim keeps the target: evicting its holder would not free it.
    kept_by: str = ""
    exhausted: tuple[str, ...] = ()  # pools without a free address (pool requests)

    def target_text(self) -> str:
        return str(ipaddress.ip_address(self.target)) if self.target is not None else ""

    def pool_names(self) -> str:
        return ",".join(p.name for p in self.pools) or ",".join(self.missing_pools)


def ip_context(inventory: Inventory, request: PodRequest) -> IPContext | None:
    ip = request.ip
    if ip is None:
        return None
    book = inventory.addresses
    claim = book.claim_for(ip.identity) if ip.identity else None
    if claim is not None or ip.address is not None:
        target = claim.value if claim is not None else int(ipaddress.ip_address(ip.address or ""))
        pool = book.pool(claim.pool) if claim is not None else book.pool_of(target)
        if pool is None:
            return IPContext(pools=(), target=target, unpooled=True)
        user = book.user(target)
        holder = sticky_busy = None
        if user is not None and user.uid != request.uid:
            if user.uid and user.pod == request.key:
                sticky_busy = user  # a same-name pod with another UID: the old one, not gone yet
            elif user.uid or user.owner != ip.identity:
                holder = user  # another pod, or another identity's claim
        kept = book.kept_from(target, ip.identity) if holder is not None else None
        return IPContext(
            pools=(pool,),
            target=target,
            holder=holder,
            sticky_busy=sticky_busy,
            identity=ip.identity,
            kept_by=kept.owner if kept is not None else "",
        )
    pools = tuple(p for name in ip.pools if (p := book.pool(name)) is not None and not p.problem)
    missing = tuple(name for name in ip.pools if book.pool(name) is None)
    exhausted = tuple(p.name for p in pools if book.free_count(p) == 0)
    return IPContext(pools=pools, missing_pools=missing, identity=ip.identity, exhausted=exhausted)


def ip_conditions(
    inventory: Inventory, request: PodRequest, ids: IdArray, context: IPContext
) -> list[tuple[BoolArray, Reason]]:
    """(nodes failing, reason) pairs for the pod's address request."""
    everywhere = np.ones(len(ids), dtype=np.bool_)
    if context.unpooled:
        return [(everywhere, Reason.IP_NO_POOL)]
    if not context.pools:
        return [(everywhere, Reason.IP_UNKNOWN_POOL)]
    in_pool = np.zeros(len(ids), dtype=np.bool_)
    for pool in context.pools:
        in_pool |= inventory.pool_mask(pool)[ids]
    conditions = [(~in_pool, Reason.IP_NOT_IN_POOL)]
    if context.sticky_busy is not None:
        conditions.append((everywhere, Reason.IP_STICKY_BUSY))
    elif context.holder is not None:
        here = _on_node(inventory, ids, context.holder, request)
        if context.kept_by:
            here = np.zeros(len(ids), dtype=np.bool_)  # evicting the holder frees nothing
        conditions += [(~here, Reason.IP_TAKEN), (here, Reason.IP_TAKEN_HERE)]
    elif context.target is None:
        book = inventory.addresses
        served = np.zeros(len(ids), dtype=np.bool_)
        evictable = np.zeros(len(ids), dtype=np.bool_)
        for pool in context.pools:
            mask = inventory.pool_mask(pool)[ids]
            if pool.name not in context.exhausted:
                served |= mask
                continue
            for use in book.uses_in(pool):
                if book.kept_from(use.address, context.identity) is None:
                    evictable |= mask & _on_node(inventory, ids, use, request)
        exhausted = in_pool & ~served
        conditions += [
            (exhausted & ~evictable, Reason.IP_EXHAUSTED),
            (exhausted & evictable, Reason.IP_EXHAUSTED_EVICTABLE),
        ]
    return conditions


def _on_node(inventory: Inventory, ids: IdArray, use: IPUse, request: PodRequest) -> BoolArray:
    """The holder's node, when evicting the holder is allowed (lower priority)."""
    if not use.uid or not use.node or use.priority >= request.priority:
        return np.zeros(len(ids), dtype=np.bool_)
    node_id = int(inventory.ids([use.node])[0])
    on_node: BoolArray = ids == node_id
    return on_node if node_id != 0 else np.zeros(len(ids), dtype=np.bool_)


def waits_for_address(reasons: Collection[Reason]) -> bool:
    """Whether a pod turned away on every node for ``reasons`` waits for an address of its
    pools, or for a change of them (see extender.address_waits): some node lacks the address,
    or its pools select none of the nodes (a node selector may change). When the nodes its
    pools select lack something else (GPUs), it waits for that, not for an address."""
    if not _FREED_RESOLVES.isdisjoint(reasons):
        return True
    return bool(reasons) and all(reason is Reason.IP_NOT_IN_POOL for reason in reasons)


def ip_messages(context: IPContext) -> dict[Reason, str]:
    holder = context.holder
    held_by = (holder.pod or f"the claim of {holder.owner}") if holder else ""
    if holder is not None and holder.pod and context.kept_by:
        held_by += f", kept by the claim of {context.kept_by}: preemption cannot free it"
    busy = context.sticky_busy.pod if context.sticky_busy else ""
    address, pools = context.target_text(), context.pool_names()
    exhausted = ",".join(context.exhausted) or pools
    return {
        Reason.IP_UNKNOWN_POOL: f"schedext: IP pool {pools} not found",
        Reason.IP_NO_POOL: f"schedext: address {address} is in no IP pool",
        Reason.IP_NOT_IN_POOL: f"schedext: node not in IP pool {pools}",
        Reason.IP_STICKY_BUSY: f"schedext: address {address} still held by previous pod {busy}",
        Reason.IP_TAKEN: f"schedext: address {address} of pool {pools} held by {held_by}",
        Reason.IP_TAKEN_HERE: f"schedext: address {address} of pool {pools} held by {held_by}",
        # Only pools without a free address: a node rejected as exhausted has no other.
        Reason.IP_EXHAUSTED: f"schedext: IP pool {exhausted} exhausted",
        Reason.IP_EXHAUSTED_EVICTABLE: f"schedext: IP pool {exhausted} exhausted",
    }


def choose_address(
    inventory: Inventory, context: IPContext, node: str
) -> tuple[IPPoolSpec, Address] | None:
    """The address to bind with: the target, or the lowest free address of the pool with the
    most free addresses among those that select ``node``."""
    node_id = int(inventory.ids([node])[0])
    book = inventory.addresses
    if context.target is not None:
        pool = context.pools[0] if context.pools else None
        return (pool, context.target) if pool is not None else None
    selecting = [p for p in context.pools if inventory.pool_mask(p)[node_id]]
    pools = sorted(selecting, key=lambda p: -book.free_count(p))
    for pool in pools:
        address = book.lowest_free(pool)
        if address is not None:
            return pool, address
    return None


def ip_headroom(inventory: Inventory, ids: IdArray, context: IPContext) -> FloatArray:
    """Per node, the free share of the best pool that selects it (0..1): prefer racks whose
    pool has more free addresses."""
    book = inventory.addresses
    headroom = np.zeros(len(ids))
    for pool in context.pools:
        share = book.free_count(pool) / pool.size if pool.size else 0.0
        headroom = np.maximum(headroom, np.where(inventory.pool_mask(pool)[ids], share, 0.0))
    return headroom
