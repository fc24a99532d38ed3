"""Whole GPUs (``nvidia.com/gpu``): a pod takes some GPUs of a node entirely.

The node has too few at all (``GPU_TOTAL``) or too few healthy ones (``GPU_UNHEALTHY``), or
too few free now (``GPU_FREE``), or too few free only because containers schedext did not
place hold some (``GPU_IN_USE``: the node agent's drift). Bind takes them inside the smallest
NVLink/NUMA group that holds them all (:func:`extender.devices.placement.pick_gpus`, the rule
the node agent shares).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping, Sequence

import numpy as np

from extender.columns import DRA_OWNED
from extender.config import SharePlacement
from extender.devices.placement import pick_gpus
from extender.inventory import IdArray, Inventory
from extender.kinds.kind import (
    BoolArray,
    Column,
    Conditions,
    GpuModelWaits,
    Placed,
    VictimsCheck,
    frozen,
)
from extender.model import Demand, Holding, PodRequest, Reason
from extender.node_state import NodeView

__all__ = ["WHOLE_GPU", "WholeGpu", "free_after", "outside_freed"]


class WholeGpu(GpuModelWaits):
    name = "gpu"
    via_dra = True

    def asks(self, demand: Demand) -> bool:
        return demand.gpus > 0

    def spec_key(self, request: PodRequest) -> int:
        return request.gpus

    def spec_conditions(self, inventory: Inventory, key: int) -> Conditions:
        a = inventory.arrays
        return [(a.gpu_total < key, Reason.GPU_TOTAL), (a.gpu_healthy < key, Reason.GPU_UNHEALTHY)]

    def held_conditions(self, inventory: Inventory, request: PodRequest, col: Column) -> Conditions:
        a = inventory.arrays
        short = col(a.gpu_free) < request.gpus
        conditions = [(short, Reason.GPU_FREE)]
        if inventory.gpus_in_use:
            # Short only by the GPUs the kubelet says containers schedext did not place hold:
            # say so, rather than "fewer free" (Reason.GPU_IN_USE ranks first).
            outside = col(a.gpu_free) + col(a.gpu_in_use) >= request.gpus
            conditions.append((short & outside, Reason.GPU_IN_USE))
        return conditions

    def messages(self, request: PodRequest) -> Mapping[Reason, str]:
        return _messages(request.gpus)

    def score_gate(self, inventory: Inventory, request: PodRequest, ids: IdArray) -> BoolArray:
        a = inventory.arrays
        fits: BoolArray = a.gpu_free.take(ids) >= request.gpus
        if request.gpus_via_dra:  # where DRA owns the node, DRA's free GPUs
            on_dra = a.dra_owner.take(ids) == DRA_OWNED
            fits = np.where(on_dra, a.dra_free.take(ids) >= request.dra_asks, fits)
        return fits

    def choose(
        self, view: NodeView, request: PodRequest, placement: SharePlacement
    ) -> Placed | None:
        chosen = pick_gpus(view.free_gpu_ids, view.spec.gpu_groups, request.gpus)
        return None if chosen is None else Placed(gpu_ids=chosen)

    def annotations(self, holding: Holding) -> dict[str, str]:
        return {}  # the GPU indices and UUIDs bind writes for every kind that takes GPUs

    def victims_check(self, view: NodeView, request: PodRequest) -> VictimsCheck:
        groups = view.spec.gpu_groups
        group_of = {i: g for g, members in enumerate(groups) for i in members}
        # Require one NVLink/NUMA group only where it is reachable by evicting pods at all.
        one_group = any(len(members) >= request.gpus for members in groups)

        def check(victims: Sequence[Holding]) -> bool:
            free = free_after(view, victims)
            if len(free) < request.gpus:
                return False
            if not one_group:
                return True
            per_group: dict[int, int] = {}
            for index in free:
                group = group_of.get(index, -1 - index)
                per_group[group] = per_group.get(group, 0) + 1
            return max(per_group.values()) >= request.gpus

        return check

    def freed(self, view: NodeView, victim: Holding) -> int:
        return victim.gpus

    freed_by_departure = frozenset({Reason.GPU_FREE})
    # GPU_IN_USE: the GPUs are held by what schedext did not place (the agent's drift, DRA's
    # claims); both reach the node's spec, so a change of the node may lift it.
    freed_by_node = frozenset({Reason.GPU_TOTAL, Reason.GPU_UNHEALTHY, Reason.GPU_IN_USE})

    def size(self, demand: Demand) -> int:
        return demand.gpus

    def pack_shape(self, request: PodRequest) -> tuple[object, ...]:
        return ()  # a node with enough free GPUs has enough GPUs

    def unit(self, request: PodRequest) -> PodRequest:
        return dataclasses.replace(request, gpus=1)

    def describe(self, demand: Demand) -> dict[str, object]:
        return {"gpus": demand.gpus}  # for every pod: 0 says it takes none

    def detail(self, view: NodeView, request: PodRequest, reason: Reason) -> str | None:
        return None


def free_after(view: NodeView, victims: Sequence[Holding]) -> list[int]:
    """The GPU indices free for a whole-GPU pod once ``victims`` are gone: no pod left holds
    them whole or a share of them, and they are healthy; GPUs held anonymously are assumed on
    the highest of those (as :meth:`NodeState.free_ids` assumes)."""
    gone = {h.uid for h in victims}
    shared = list(view.share_memory) or [0] * len(view.holders)  # MiB of shares per device
    for victim in victims:
        if victim.share.devices:
            for index in victim.gpu_ids or ():
                if 0 <= index < len(shared):
                    shared[index] -= victim.share.memory_mib
    # Unhealthy GPUs, GPUs in MIG mode and GPUs in use by containers schedext did not place
    # are never free whole, but for those only victims use (a DRA claim of a victim's, a
    # container of a victim's the kubelet reports): evicting them frees those.
    closed = {index for index, _ in view.spec.gpu_unhealthy} | set(view.spec.gpu_mig)
    closed.update(set(view.outside()) - set(outside_freed(view, victims)))
    free = [
        i
        for i, holder in enumerate(view.holders)
        if (holder is None or holder in gone) and shared[i] <= 0 and i not in closed
    ]
    # A victim without readable indices was counted as that many anonymous GPUs (unless the
    # kubelet's report placed it: it then holds its indices).
    anonymous = view.anonymous_gpus - sum(
        h.devices for h in victims if h.gpu_ids is None and h.uid not in view.holders
    )
    return free[: max(0, len(free) - max(0, anonymous))]


def outside_freed(view: NodeView, victims: Sequence[Holding]) -> dict[int, str]:
    """The GPUs in use outside schedext's placements (``gpu_in_use``: DRA's claims, the
    kubelet's report) that only ``victims`` use, each with why it was held: evicting them
    frees these too. A GPU a claim holds for no pod schedext knows, or also for a pod that
    stays, is not freed."""
    gone = {h.key for h in victims}
    users: dict[int, set[str]] = {}
    why: dict[int, str] = {}
    for use in view.spec.gpu_in_use:
        users.setdefault(use.gpu, set()).add(use.pod)
        why.setdefault(use.gpu, use.why)
    return {gpu: why[gpu] for gpu, pods in sorted(users.items()) if pods <= gone}


@functools.lru_cache(maxsize=64)
def _messages(gpus: int) -> Mapping[Reason, str]:
    # Short: kube-scheduler decodes every rejected node's message (thousands per call).
    return frozen(
        {
            Reason.GPU_TOTAL: f"schedext: node has fewer than {gpus} GPUs",
            # Replaced per node by the filter, which names the GPUs and why.
            Reason.GPU_UNHEALTHY: f"schedext: fewer than {gpus} healthy GPUs",
            Reason.GPU_FREE: f"schedext: fewer than {gpus} free GPUs",
            # Replaced per node by the filter, which names the GPUs and who holds them.
            Reason.GPU_IN_USE: (
                f"schedext: fewer than {gpus} free GPUs, some in use outside schedext"
            ),
        }
    )


WHOLE_GPU = WholeGpu()
