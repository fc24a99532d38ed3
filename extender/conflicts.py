"""Why a reservation cannot be held now: bind planned on a view that changed before it
reserved (:func:`reservation_conflict`). The inventory refuses such a reservation instead of
double-allocating a GPU, a share's room, a MIG device or an address."""

from __future__ import annotations

import ipaddress

from extender.columns import NO_ROOM
from extender.ipam import AddressBook
from extender.model import Holding
from extender.node_state import NodeState

__all__ = ["reservation_conflict"]


def reservation_conflict(
    state: NodeState, holding: Holding, own: Holding | None, addresses: AddressBook
) -> str | None:
    """What of ``holding`` is taken on its node now, or None. ``own``: the pod's present
    holding on the same node, whose GPUs it may keep."""
    node = holding.node
    ids = holding.gpu_ids or ()
    if len(set(ids)) != len(ids) or (holding.gpu_ids is not None and len(ids) != holding.devices):
        # A plan naming a device twice would hold it twice (two shares' worth of memory on
        # one device, or two whole GPUs counted as one): refuse it rather than apply it.
        return f"GPU {list(ids)} on {node}: not {holding.devices} distinct devices"
    if holding.share.devices:
        no_room = share_conflict(state, holding, own)
        if no_room:
            return no_room
    else:
        free = set(state.free_ids())
        if own is not None and own.gpu_ids:
            free.update(own.gpu_ids)
        taken = [i for i in ids if i not in free]
        if taken:
            return f"GPU {taken} on {node} already held"
    mig_taken = state.mig.taken(state.spec, holding.mig_uuids or (), holding.uid)
    if mig_taken:
        return f"MIG {mig_taken} on {node} already held"
    if holding.ip is not None:
        user = addresses.user(int(ipaddress.ip_address(holding.ip)))
        if user is not None and user.uid and user.uid != holding.uid:
            return f"address {holding.ip} already held by {user.pod}"
    return None


def share_conflict(state: NodeState, holding: Holding, own: Holding | None) -> str | None:
    """Why a share reserved on a stale view cannot be held now (a device lacks the room), or
    None. ``own``: the pod's present holding on the same node, whose room it may reuse."""
    room = state.share_room()
    for index in holding.gpu_ids or ():
        memory, cores = room[index] if 0 <= index < len(room) else (NO_ROOM, NO_ROOM)
        if own is not None and index in (own.gpu_ids or ()):
            memory += own.share.memory_mib
            cores += own.share.cores
        if memory < holding.share.memory_mib or cores < holding.share.cores:
            return (
                f"GPU {index} on {holding.node} has no room for a "
                f"{holding.share.memory_mib} MiB share now"
            )
    return None
