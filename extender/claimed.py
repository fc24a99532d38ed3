"""The GPUs that DRA's claims hold on a node, as the inventory counts them: in use, never free.

kube-scheduler's DynamicResources plugin hands GPUs to ResourceClaims without schedext. The
claims ledger (:mod:`extender.dra`) knows which devices they hold; this turns a node's held
devices into :class:`~extender.model.GpuInUse` entries by the node agent's UUIDs, beside the
drift's (:mod:`extender.devices.drift`): a GPU a claim holds is never given to a pod of
schedext's, and filter's ``GPU_IN_USE`` message names the claim. An entry names the pod the
claim is charged to, where the ledger knows its name, so that a pod whose ``nvidia.com/gpu``
a claim serves (KEP-5004) is counted on the claimed GPUs once, not on others besides
(:meth:`~extender.node_state.NodeState.apply` places a pod without schedext's annotation where
such an entry names it).

Held devices that cannot be mapped to an index (no agent UUIDs, a device no slice has) are
left to the ledger's own report; a MIG device marks its GPU, which is in MIG mode and never
whole-free anyway. A device that claims hold only shares of (consumable capacity: each result
says the memory it consumed) is in use for a whole-GPU pod too, but not for a share of
schedext's: :func:`claimed_shares` says how much memory DRA's shares take of it, and the
rest is room for schedext's (:meth:`~extender.node_state.NodeState.share_room`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from extender.dra import NodeDra, held_gpus
from extender.model import GpuInUse

__all__ = ["claimed_in_use", "claimed_shares"]


def claimed_in_use(
    node: NodeDra, gpu_uuids: Sequence[str], pod_key: Callable[[str], str]
) -> tuple[GpuInUse, ...]:
    """One entry per GPU index and pod charged (``pod_key``: a pod UID's "namespace/name",
    "" when unknown), sorted."""
    uses: set[GpuInUse] = set()
    for held in held_gpus(node, gpu_uuids).mapped:
        claims = ", ".join(held.held.claims)
        keys = sorted({key for uid in held.held.pods if (key := pod_key(uid))})
        why = f"GPU {held.gpu} allocated by DRA to claim {claims}"
        if keys:
            why += f" (pod {', '.join(keys)})"
        for key in keys or [""]:
            uses.add(GpuInUse(held.gpu, key, why))
    return tuple(sorted(uses))


def claimed_shares(node: NodeDra, gpu_uuids: Sequence[str]) -> tuple[tuple[int, int], ...]:
    """The GPUs (by index) that DRA's claims hold only shares of, each with the memory (MiB)
    those shares consumed, by index. A GPU one claim holds whole, or through a partition, is
    not among them: it takes no share."""
    shared: dict[int, int] = {}
    whole: set[int] = set()
    for held in held_gpus(node, gpu_uuids).mapped:
        if held.held.whole or held.via_parent or not held.held.memory_mib:
            whole.add(held.gpu)
        else:
            shared[held.gpu] = shared.get(held.gpu, 0) + held.held.memory_mib
    return tuple(sorted((gpu, mib) for gpu, mib in shared.items() if gpu not in whole))
