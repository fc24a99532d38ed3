"""What the device plugin needs from the rest of the agent, as two small interfaces: the GPUs
(from the NVML reader) and the pods on this node (from the pod watch). The plugin depends on
nothing else, so tests drive it with the in-memory versions (``app.agent.memory``) and the
agent wires in the real ones."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from extender.devices.allocation import NodePod
from extender.devices.gpus import Gpu

__all__ = ["Devices", "GpuGroups", "PodLedger"]

GpuGroups = tuple[tuple[int, ...], ...]


class Devices(Protocol):
    """This node's GPUs as last read. Called on the event loop's thread only."""

    def current(self) -> tuple[Gpu, ...]:
        """Every GPU the kubelet should know of (index, UUID, health, NUMA node)."""
        ...

    def groups(self) -> GpuGroups:
        """NVLink groups by GPU index (empty when unknown), for the agent's own picks."""
        ...

    async def changed(self, version: int) -> int:
        """Wait until the GPUs' version differs from ``version`` and return the new one.
        Versions start at 1, so ``changed(0)`` returns at once: ListAndWatch sends the list
        first, then again after every change (a coalesced burst sends the latest only)."""
        ...


class PodLedger(Protocol):
    """The live pods on this node that ask for the GPU resource, and the durable record of
    the devices each of its containers was given (``schedext.io/gpu-allocated``)."""

    def pods(self) -> Sequence[NodePod]:
        """As last seen (by the pod watch; a pod the watch has not seen yet is missing)."""
        ...

    async def record(self, pod: NodePod, uuids: tuple[str, ...], container: str = "") -> None:
        """Add ``uuids`` to the pod's allocated GPUs, as given to ``container``, durably.
        Before returning, :meth:`pods` already shows them (a second Allocate must never reuse
        them, even if the watch has not echoed the write yet). Raises when the record could
        not be written: the plugin then fails the Allocate, so that nothing is handed out that
        a restart could hand out again."""
        ...
