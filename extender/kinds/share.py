"""A share of GPUs: this much memory (and compute) on each of some distinct devices.

The node has too few GPUs at all, too few healthy ones, or GPUs too small for the share
(``GPU_SHARE_SIZE``, also when their memory is unpublished); or too few devices with room for
the memory now (``GPU_SHARE_MEMORY``), or for memory and cores (``GPU_SHARE_CORES``). What has
room, and where bind puts a share, is :mod:`extender.shares`.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping, Sequence

from extender import names
from extender.config import SharePlacement
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
from extender.shares import (
    choose_share_gpus,
    pick_share_gpus,
    room_after,
    room_counts,
    share_detail,
)

__all__ = ["SHARE", "Share"]


class Share(GpuModelWaits):
    name = "share"
    via_dra = False

    def asks(self, demand: Demand) -> bool:
        return demand.share.devices > 0

    def spec_key(self, request: PodRequest) -> tuple[int, int]:
        return request.share.devices, request.share.memory_mib

    def spec_conditions(self, inventory: Inventory, key: tuple[int, int]) -> Conditions:
        a, (shares, memory_mib) = inventory.arrays, key
        return [
            (a.gpu_total < shares, Reason.GPU_TOTAL),
            (a.gpu_healthy < shares, Reason.GPU_UNHEALTHY),
            # Unknown device memory (0) holds no share: nothing says how much it has.
            (a.gpu_memory_mib < memory_mib, Reason.GPU_SHARE_SIZE),
        ]

    def held_conditions(self, inventory: Inventory, request: PodRequest, col: Column) -> Conditions:
        room = room_counts(inventory, request)  # for the whole cluster, kept for prioritize
        conditions = [(col(room.memory) < request.share.devices, Reason.GPU_SHARE_MEMORY)]
        if request.share.cores:
            conditions.append((col(room.both) < request.share.devices, Reason.GPU_SHARE_CORES))
        return conditions

    def messages(self, request: PodRequest) -> Mapping[Reason, str]:
        return _messages(request.share.devices, request.share.memory_mib, request.share.cores)

    def score_gate(self, inventory: Inventory, request: PodRequest, ids: IdArray) -> BoolArray:
        return room_counts(inventory, request).both.take(ids) >= request.share.devices

    def choose(
        self, view: NodeView, request: PodRequest, placement: SharePlacement
    ) -> Placed | None:
        chosen = choose_share_gpus(view, request, placement)
        return None if chosen is None else Placed(gpu_ids=chosen)

    def annotations(self, holding: Holding) -> dict[str, str]:
        if not holding.gpu_ids:
            return {}
        # The share on each of its GPUs: the agent's limits, and the record a restart reads.
        written = {names.GPU_SHARE_MEMORY: str(holding.share.memory_mib)}
        if holding.share.cores:
            written[names.GPU_SHARE_CORES] = str(holding.share.cores)
        return written

    def victims_check(self, view: NodeView, request: PodRequest) -> VictimsCheck:
        capacity, groups = view.spec.gpu_memory_mib or 0, view.spec.gpu_groups

        def check(victims: Sequence[Holding]) -> bool:
            # Distinct devices with room for the share once the victims go, by bind's rule.
            room = room_after(view, victims)
            return pick_share_gpus(room, capacity, groups, request, _ANY_PLACEMENT) is not None

        return check

    def freed(self, view: NodeView, victim: Holding) -> int:
        """MiB of GPU memory: the victim's share on each of its devices, or the whole memory
        of the GPUs it holds whole (a share evicts small shares before large ones)."""
        if victim.share.devices:
            return victim.share.memory_mib * victim.share.devices
        return victim.gpus * (view.spec.gpu_memory_mib or 0)

    freed_by_departure = frozenset({Reason.GPU_SHARE_MEMORY, Reason.GPU_SHARE_CORES})
    freed_by_node = frozenset({Reason.GPU_TOTAL, Reason.GPU_UNHEALTHY, Reason.GPU_SHARE_SIZE})

    def size(self, demand: Demand) -> tuple[int, int, int]:
        return demand.share.devices, demand.share.memory_mib, demand.share.cores

    def pack_shape(self, request: PodRequest) -> tuple[object, ...]:
        return ("share", request.share.memory_mib)  # which devices are large enough

    def unit(self, request: PodRequest) -> PodRequest:
        return dataclasses.replace(request, share=dataclasses.replace(request.share, devices=1))

    def describe(self, demand: Demand) -> dict[str, object]:
        if not demand.share.devices:
            return {}
        return {
            "shares": demand.share.devices,
            "shareMemoryMiB": demand.share.memory_mib,
            "shareCores": demand.share.cores,
        }

    def detail(self, view: NodeView, request: PodRequest, reason: Reason) -> str | None:
        # The filter names the need only (kube-scheduler aggregates it); explain is asked
        # about one pod: the largest free memory, and on which GPU.
        if reason not in _ROOM:
            return None
        return f"schedext: {share_detail(view, request)}"


_ROOM = frozenset({Reason.GPU_SHARE_MEMORY, Reason.GPU_SHARE_CORES})


# Whether a share fits does not depend on where it would go: any placement answers it.
_ANY_PLACEMENT = SharePlacement.PACK


@functools.lru_cache(maxsize=64)
def _messages(shares: int, memory_mib: int, cores: int) -> Mapping[Reason, str]:
    # The GPUs a share needs, named by its need ("no GPU" / "fewer than 2 GPUs").
    few = f"fewer than {shares} GPUs" if shares > 1 else "no GPU"
    return frozen(
        {
            Reason.GPU_TOTAL: f"schedext: node has fewer than {shares} GPUs",
            # Replaced per node by the filter, which names the GPUs and why.
            Reason.GPU_UNHEALTHY: f"schedext: fewer than {shares} healthy GPUs",
            Reason.GPU_SHARE_SIZE: (
                f"schedext: a {memory_mib} MiB GPU share is larger than the node's GPUs "
                "(or their memory is not published)"
            ),
            Reason.GPU_SHARE_MEMORY: f"schedext: {few} with {memory_mib} MiB free",
            Reason.GPU_SHARE_CORES: (
                f"schedext: {few} with {memory_mib} MiB and {cores}% cores free"
            ),
        }
    )


SHARE = Share()
