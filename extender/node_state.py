"""One node's state as the inventory keeps it (which pod holds which GPU, what is used), and
the copy of it that the inventory hands out (:class:`NodeView`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from extender.columns import NO_ROOM
from extender.mig_state import MigState, MigView
from extender.model import Holding, NodeSpec

__all__ = ["Applied", "NodeState", "NodeView"]


@dataclass(frozen=True, slots=True)
class NodeView:
    """A copy of one node's state, for bind planning and explanations."""

    spec: NodeSpec
    # Per GPU index: the UID of the pod holding it, or None.
    holders: tuple[str | None, ...]
    # GPUs held by pods bound without schedext's annotation: counted, index unknown.
    anonymous_gpus: int
    # Free indices usable now. When anonymous GPUs exist we assume, deterministically, that
    # they sit on the highest free indices, and plan around the lower ones.
    free_gpu_ids: tuple[int, ...]
    cpu_free: int
    memory_free: int
    holdings: tuple[Holding, ...]
    # GPU shares, per GPU index: the memory (MiB) and cores (percent) they hold, and the room
    # a new share has there ((NO_ROOM, NO_ROOM): the device takes no share now).
    share_memory: tuple[int, ...] = ()
    share_cores: tuple[int, ...] = ()
    share_room: tuple[tuple[int, int], ...] = ()
    # Per GPU index: the UIDs of the pods holding a share of it (what /inventory lists).
    share_holders: tuple[tuple[str, ...], ...] = ()
    # MIG devices and who holds them (empty on a node without MIG).
    mig: MigView = dataclasses.field(default_factory=MigView)

    def shared(self, index: int) -> bool:
        """Whether some pod holds a share of GPU ``index``."""
        return index < len(self.share_memory) and self.share_memory[index] > 0

    def outside(self) -> set[int]:
        """The GPUs in use by containers schedext did not place (the node agent's drift) that
        no pod schedext knows holds: no eviction frees them."""
        return {
            use.gpu
            for use in self.spec.gpu_in_use
            if use.gpu < len(self.holders) and self.holders[use.gpu] is None
        }


@dataclass(slots=True)
class Applied:
    """What one holding added to its node, to take away exactly that again."""

    gpu_ids: tuple[int, ...]
    anonymous: int
    cpu_milli: int
    memory_bytes: int
    # A share: the devices it is on, and what it holds on each.
    share_ids: tuple[int, ...] = ()
    share_memory: int = 0
    share_cores: int = 0


@dataclass(slots=True)
class NodeState:
    spec: NodeSpec
    slot: int
    holders: list[str | None]
    anonymous: int = 0
    cpu_used: int = 0
    memory_used: int = 0
    applied: dict[str, Applied] = dataclasses.field(default_factory=dict)
    # Per GPU index: the memory (MiB) and cores (percent) shares hold, and how many shares.
    share_memory: list[int] = dataclasses.field(default_factory=list)
    share_cores: list[int] = dataclasses.field(default_factory=list)
    sharers: list[int] = dataclasses.field(default_factory=list)
    mig: MigState = dataclasses.field(default_factory=MigState)

    def __post_init__(self) -> None:
        gpus = len(self.holders)
        self.share_memory, self.share_cores, self.sharers = [0] * gpus, [0] * gpus, [0] * gpus
        self.mig = MigState.of(self.spec)

    def free_ids(self) -> list[int]:
        """Indices free for a whole-GPU pod: no pod holds them or a share of them, and the node
        agent has not marked them unhealthy (an unhealthy GPU is never handed out, and still
        counts as held by a pod that has it) nor reported them in use by a container
        schedext did not place. A GPU in MIG mode is never free whole."""
        closed = {index for index, _ in self.spec.gpu_unhealthy}
        closed.update(self.spec.gpu_mig)
        closed.update(use.gpu for use in self.spec.gpu_in_use)
        free = [
            i
            for i, h in enumerate(self.holders)
            if h is None and not self.sharers[i] and i not in closed
        ]
        return free[: max(0, len(free) - self.anonymous)]

    def outside_ids(self) -> list[int]:
        """The GPUs the node agent reports in use (the kubelet's PodResources) that no holding
        of schedext's accounts for: healthy, whole, held by no pod schedext knows. What the
        drift alone takes from the node's free GPUs."""
        closed = {index for index, _ in self.spec.gpu_unhealthy}
        closed.update(self.spec.gpu_mig)
        return sorted(
            {
                use.gpu
                for use in self.spec.gpu_in_use
                if use.gpu < len(self.holders)
                and self.holders[use.gpu] is None
                and not self.sharers[use.gpu]
                and use.gpu not in closed
            }
        )

    def share_room(self, free: list[int] | None = None) -> list[tuple[int, int]]:
        """Per GPU index, the (memory MiB, cores percent) a new share has there; NO_ROOM for
        a device that takes none: held whole (or assumed held by an anonymous pod) or
        unhealthy. A device's memory is the node's GPU memory (the agent's NVML total, or
        the ``nvidia.com/gpu.memory`` label); unknown memory gives no room."""
        whole_free = set(self.free_ids() if free is None else free)
        unhealthy = {index for index, _ in self.spec.gpu_unhealthy}
        capacity = self.spec.gpu_memory_mib or 0
        # DRA's shares (consumable capacity) take their memory of a GPU no one holds whole.
        dra_shares = self._dra_shares(unhealthy)
        room: list[tuple[int, int]] = []
        for i in range(len(self.holders)):
            if i in whole_free or (self.sharers[i] and i not in unhealthy) or i in dra_shares:
                memory = capacity - self.share_memory[i] - dra_shares.get(i, 0)
                room.append((memory, 100 - self.share_cores[i]))
            else:
                room.append((NO_ROOM, NO_ROOM))
        return room

    def _dra_shares(self, unhealthy: set[int]) -> dict[int, int]:
        """The GPUs only DRA's shares hold (no pod of schedext's whole, no other use
        outside schedext), with the memory they took."""
        if not self.spec.gpu_shared_outside:
            return {}
        shared = dict(self.spec.gpu_shared_outside)
        other = {use.gpu for use in self.spec.gpu_in_use if use.gpu not in shared}
        other |= unhealthy | set(self.spec.gpu_mig)
        return {
            gpu: mib
            for gpu, mib in shared.items()
            if 0 <= gpu < len(self.holders) and self.holders[gpu] is None and gpu not in other
        }

    def share_holders(self) -> list[tuple[str, ...]]:
        """Per GPU index, the UIDs of the pods holding a share of it (where it was counted:
        by UUID or by index, as :meth:`apply` placed it)."""
        by_index: list[list[str]] = [[] for _ in self.holders]
        for uid, applied in self.applied.items():
            for index in applied.share_ids:
                by_index[index].append(uid)
        return [tuple(uids) for uids in by_index]

    def keeps(self, holding: Holding) -> bool:
        """Whether taking away what pod ``holding.uid`` added and applying ``holding`` would
        leave this state as it is, but for order: a holding of whole GPUs (no share, no MIG
        device) that would be counted exactly as its pod is now (the same GPUs, or the same
        anonymous count, CPU and memory)."""
        applied = self.applied.get(holding.uid)
        if applied is None or applied.share_ids or holding.share.devices:
            return False
        if holding.mig or holding.mig_uuids or holding.uid in self.mig.applied:
            return False
        dra_only = not self.holders and self.spec.dra is not None
        wanted = self._by_uuid(holding) or holding.gpu_ids or self._reported(holding)
        ids: tuple[int, ...] = ()
        if (
            wanted is not None
            and len(wanted) == holding.gpus
            and all(self._whole_free(i, but=holding.uid) for i in wanted)
        ):
            ids = wanted
        anonymous = 0 if dra_only or ids else holding.gpus
        return applied == Applied(ids, anonymous, holding.cpu_milli, holding.memory_bytes)

    def move_last(self, uid: str) -> None:
        """Count ``uid``'s holding last, as applying it again would."""
        applied = self.applied.pop(uid, None)
        if applied is not None:
            self.applied[uid] = applied

    def apply(self, holding: Holding) -> None:
        """Count ``holding`` on this node: its annotated GPU indices where they are free (for a
        share: not held whole), else as many anonymous GPUs, and its CPU and memory."""
        self.mig.apply(holding)  # its MIG devices, if any (never beside GPUs for a new pod)
        if holding.share.devices:
            self._apply_share(holding)
            return
        ids: tuple[int, ...] = ()
        # On a node whose GPUs DRA alone hands out, a pod's nvidia.com/gpu is DRA's (KEP-5004):
        # its claim holds them, and none of the node's own (it has none) is taken.
        dra_only = not self.holders and self.spec.dra is not None
        anonymous = 0 if dra_only else holding.gpus
        wanted = self._by_uuid(holding) or holding.gpu_ids or self._reported(holding)
        if (
            wanted is not None
            and len(wanted) == holding.gpus
            and all(self._whole_free(i) for i in wanted)
        ):
            ids, anonymous = wanted, 0
            for index in ids:
                self.holders[index] = holding.uid
        # Otherwise (no annotation, or indices out of range or already held) the pod still
        # consumes that many GPUs: count them so that no decision overcommits the node.
        self.anonymous += anonymous
        self.cpu_used += holding.cpu_milli
        self.memory_used += holding.memory_bytes
        self.applied[holding.uid] = Applied(ids, anonymous, holding.cpu_milli, holding.memory_bytes)

    def _whole_free(self, index: int, *, but: str | None = None) -> bool:
        """Whether GPU ``index`` is free to take whole (``but``: held by that pod counts as
        free)."""
        return (
            0 <= index < len(self.holders)
            and self.holders[index] in (None, but)
            and not (self.sharers[index])
            and index not in self.spec.gpu_mig
        )

    def _apply_share(self, holding: Holding) -> None:
        """A share sits on the devices bind wrote, where no pod holds them whole. It is
        counted even past a device's memory (it is a fact: the pod runs there), which only
        leaves that device no room. A share without readable indices counts as that many
        anonymous whole GPUs: which device it uses is unknown, and no device may be
        over-committed for it."""
        wanted = self._by_uuid(holding) or holding.gpu_ids
        ids: tuple[int, ...] = ()
        anonymous = holding.share.devices
        if (
            wanted is not None
            and len(wanted) == holding.share.devices
            and all(
                0 <= i < len(self.holders)
                and self.holders[i] is None
                and i not in self.spec.gpu_mig
                for i in wanted
            )
        ):
            ids, anonymous = wanted, 0
            for index in ids:
                self.share_memory[index] += holding.share.memory_mib
                self.share_cores[index] += holding.share.cores
                self.sharers[index] += 1
        self.anonymous += anonymous
        self.cpu_used += holding.cpu_milli
        self.memory_used += holding.memory_bytes
        self.applied[holding.uid] = Applied(
            (),
            anonymous,
            holding.cpu_milli,
            holding.memory_bytes,
            share_ids=ids,
            share_memory=holding.share.memory_mib,
            share_cores=holding.share.cores,
        )

    def _reported(self, holding: Holding) -> tuple[int, ...] | None:
        """Where the kubelet says a pod without schedext's annotation holds its GPUs (the node
        agent's drift): such a pod is then counted there, not on assumed indices."""
        reported = sorted({use.gpu for use in self.spec.gpu_in_use if use.pod == holding.key})
        return tuple(reported) or None

    def _by_uuid(self, holding: Holding) -> tuple[int, ...] | None:
        """The holding's GPUs by the UUIDs bind wrote, where the node published UUIDs: indices
        may change order across a reboot or a GPU swap, UUIDs do not."""
        if not holding.gpu_uuids or not self.spec.gpu_uuids:
            return None
        index = {uuid: i for i, uuid in enumerate(self.spec.gpu_uuids)}
        found = [index.get(uuid) for uuid in holding.gpu_uuids]
        if any(i is None for i in found):
            return None
        return tuple(sorted(i for i in found if i is not None))

    def unapply(self, uid: str) -> None:
        """Take away what the holding of ``uid`` added, if anything."""
        self.mig.unapply(uid)
        applied = self.applied.pop(uid, None)
        if applied is None:
            return
        for index in applied.gpu_ids:
            self.holders[index] = None
        for index in applied.share_ids:
            self.share_memory[index] -= applied.share_memory
            self.share_cores[index] -= applied.share_cores
            self.sharers[index] -= 1
        self.anonymous -= applied.anonymous
        self.cpu_used -= applied.cpu_milli
        self.memory_used -= applied.memory_bytes

    def reset(self) -> None:
        """Forget every holding (the node's GPU shape changed: they are applied anew)."""
        self.holders = [None] * self.spec.gpu_indices
        self.__post_init__()
        self.anonymous = self.cpu_used = self.memory_used = 0
        self.applied.clear()
