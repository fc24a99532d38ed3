"""A gang that requires one domain of a topology level: the whole-group fit search, run per
domain (:func:`required_fit`).

The search is :mod:`~extender.gang.packing`'s, with every member's nodes cut to one domain
(:class:`~extender.gang.capacity.Within`). A group none of whose members is placed may go to
any domain that can hold it all at once; once one is placed (reserved at bind, or bound), the
rest follow it into its domain. A domain must also give each member that asks for an address
one, from the pools that select its nodes (:func:`addresses_short`): a rack whose pool is short
does not hold the gang. Domains whose free GPUs together fall short are not searched at all (a
bincount); of the others at most :data:`MAX_DOMAINS` are, the tightest first, and the search
stops at :data:`MAX_FITTING` domains that hold the group, so that a filter over thousands of
racks stays bounded and the group goes where it fits best.
"""

from __future__ import annotations

import ipaddress
from collections import Counter
from collections.abc import Sequence
from typing import Final, NamedTuple

import numpy as np
import numpy.typing as npt

from extender.config import PolicyConfig
from extender.gang.capacity import Within, free_gpus
from extender.gang.packing import FitCache, fits_all, member_nodes
from extender.gang.topology import domains
from extender.inventory import Inventory
from extender.model import PodRequest

__all__ = ["MAX_DOMAINS", "MAX_FITTING", "DomainFit", "addresses_short", "required_fit"]

MAX_DOMAINS: Final = 64
# The member is offered the nodes of at most this many domains that hold its group, the
# tightest first (best fit: the roomiest domains stay whole for bigger groups); two leave
# kube-scheduler a choice when its own plugins refuse one (each costs a search: at 1,000
# nodes, a member's filter takes 1.6x a gang's without topology, loadtests.gangbench).
MAX_FITTING: Final = 2

BoolArray = npt.NDArray[np.bool_]


class DomainFit(NamedTuple):
    """The nodes the member may take (None: judge the group as a whole, it fits), or why no
    domain can hold the group ("" when one can)."""

    allowed: BoolArray | None
    refusal: str = ""


def required_fit(
    inventory: Inventory,
    config: PolicyConfig,
    *,
    group: str,
    level: str,
    request: PodRequest,
    needed: Sequence[PodRequest],
    placed: Sequence[str],
    cache: FitCache | None = None,
) -> DomainFit:
    """Where the member ``request`` may go so that its group's unplaced members (``needed``,
    the member first when it is one of them) all fit inside one domain of ``level``, with its
    placed members (on the nodes ``placed``)."""
    zones = domains(inventory, level)
    free = free_gpus(inventory, None, dra=any(r.gpus_via_dra for r in needed))
    alive = inventory.arrays.alive
    room = np.bincount(zones.ids[alive], weights=free[alive], minlength=len(zones.names))
    want = sum(r.gpus for r in needed)
    if placed:
        slots = inventory.ids(placed)
        (home, _), *_ = Counter(zones.ids[slots].tolist()).most_common(1)
        candidates = [int(home)]
    else:
        enough = np.flatnonzero(room >= want)
        enough = enough[enough > 0]
        candidates = sorted(enough.tolist(), key=lambda d: (room[d], d))[:MAX_DOMAINS]
    first = bool(needed) and needed[0].uid == request.uid
    allowed = np.zeros(len(alive), dtype=np.bool_)
    short_of_addresses = ""
    found = 0
    for domain in candidates:
        within = Within(zones.ids == domain, (level, domain))
        lacking = addresses_short(inventory, needed, within.nodes)
        if lacking:
            short_of_addresses = short_of_addresses or f"{zones.names[domain]}: {lacking}"
            continue
        nodes = (
            member_nodes(inventory, request, needed[1:], config, cache=cache, within=within)
            if first
            else None
        )
        if nodes is None:
            fits = fits_all(inventory, needed, config, cache=cache, within=within)
            nodes = within.nodes if fits else None
        if nodes is not None:
            allowed |= nodes
            found += 1
            if found == MAX_FITTING:  # enough choice for kube-scheduler, the tightest ones
                break
    if allowed.any():
        return DomainFit(allowed)
    if short_of_addresses:
        return DomainFit(
            None,
            f"schedext: no {level} can hold all of group {group}: the members' addresses do "
            f"not fit in any that has the GPUs ({short_of_addresses})",
        )
    if placed:
        best, where = candidates[0], f"the group's {level}"
    else:
        best, where = (int(np.argmax(room[1:])) + 1 if len(room) > 1 else 0), "the best"
    name, has = zones.names[best], int(room[best])
    short = (
        f"has {has} free GPUs of the {want} its unplaced members need"
        if has < want
        else f"has {has} free GPUs, but not on nodes that can take its members"
    )
    return DomainFit(
        None, f"schedext: no {level} can hold all of group {group}: {where}, {name}, {short}"
    )


def addresses_short(inventory: Inventory, needed: Sequence[PodRequest], nodes: BoolArray) -> str:
    """Why the pools that select ``nodes`` cannot give each member of ``needed`` that asks
    for an address one ("" when they can): the members asking any of a set of pools, against
    the free addresses of those of the set that select a node here. A member that asks for one
    address needs its pool to select a node here (whether that address is free is each node's
    own filter reason)."""
    book = inventory.addresses
    wants: Counter[tuple[str, ...]] = Counter()
    for request in needed:
        ip = request.ip
        if ip is None:
            continue
        pools = ip.pools
        if ip.address is not None:
            pool = book.pool_of(int(ipaddress.ip_address(ip.address)))
            pools = (pool.name,) if pool is not None else ()
        usable = tuple(sorted(name for name in pools if _selects_here(inventory, name, nodes)))
        if not usable:
            return f"no pool of {', '.join(pools) or 'its address'} selects a node there"
        wants[usable] += 1
    for usable, members in sorted(wants.items()):
        # Members that share pools draw on them together (a pool counted once per set).
        free = sum(book.free_count(p) for name in usable if (p := book.pool(name)) is not None)
        if free < members:
            return f"pool {', '.join(usable)} has {free} free addresses for {members} members"
    return ""


def _selects_here(inventory: Inventory, name: str, nodes: BoolArray) -> bool:
    pool = inventory.addresses.pool(name)
    return pool is not None and bool((inventory.pool_mask(pool) & nodes).any())
