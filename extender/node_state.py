"""One node's state as the inventory keeps it (which pod holds which GPU, what is used), and
the copy of it that the inventory hands out (:class:`NodeView`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

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


@dataclass(slots=True)
class Applied:
    """What one holding added to its node, to take away exactly that again."""

    gpu_ids: tuple[int, ...]
    anonymous: int
    cpu_milli: int
    memory_bytes: int


@dataclass(slots=True)
class NodeState:
    spec: NodeSpec
    slot: int
    holders: list[str | None]
    anonymous: int = 0
    cpu_used: int = 0
    memory_used: int = 0
    applied: dict[str, Applied] = dataclasses.field(default_factory=dict)

    def free_ids(self) -> list[int]:
        """Indices no pod holds and the node agent has not marked unhealthy: an unhealthy GPU
        is never handed out, and still counts as held by a pod that has it."""
        unhealthy = {index for index, _ in self.spec.gpu_unhealthy}
        free = [i for i, h in enumerate(self.holders) if h is None and i not in unhealthy]
        return free[: max(0, len(free) - self.anonymous)]

    def apply(self, holding: Holding) -> None:
        """Count ``holding`` on this node: its annotated GPU indices where they are free, else
        as many anonymous GPUs, and its CPU and memory."""
        ids: tuple[int, ...] = ()
        anonymous = holding.gpus
        wanted = self._by_uuid(holding) or holding.gpu_ids
        if (
            wanted is not None
            and len(wanted) == holding.gpus
            and all(0 <= i < len(self.holders) and self.holders[i] is None for i in wanted)
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
        applied = self.applied.pop(uid, None)
        if applied is None:
            return
        for index in applied.gpu_ids:
            self.holders[index] = None
        self.anonymous -= applied.anonymous
        self.cpu_used -= applied.cpu_milli
        self.memory_used -= applied.memory_bytes

    def reset(self) -> None:
        """Forget every holding (the node's GPU shape changed: they are applied anew)."""
        self.holders = [None] * self.spec.gpu_count
        self.anonymous = self.cpu_used = self.memory_used = 0
        self.applied.clear()
