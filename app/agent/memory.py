"""In-memory :class:`~app.agent.ports.Devices` and :class:`~app.agent.ports.PodLedger`: for
tests, and for running the device plugin without NVML or an API server (a fixed GPU list, a
ledger that forgets on restart)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from dataclasses import replace

from app.agent.ports import GpuGroups
from extender.devices.allocation import NodePod
from extender.devices.containers import ContainerGrant, granted_devices
from extender.devices.gpus import Gpu, GpuHealth

__all__ = ["LedgerError", "MemoryLedger", "StaticDevices"]


class StaticDevices:
    """A GPU list changed only by its owner (:meth:`set_health`, :meth:`set_gpus`), from the
    event loop's thread."""

    def __init__(self, gpus: Iterable[Gpu], groups: GpuGroups = ()) -> None:
        self._gpus = tuple(gpus)
        self._groups = groups
        self._version = 1
        self._bumped = asyncio.Event()

    def current(self) -> tuple[Gpu, ...]:
        return self._gpus

    def groups(self) -> GpuGroups:
        return self._groups

    async def changed(self, version: int) -> int:
        while self._version == version:
            # The event is swapped on every change, so a waiter never sees a stale set().
            await self._bumped.wait()
        return self._version

    def set_health(self, index: int, health: GpuHealth) -> None:
        self.set_gpus(replace(g, health=health) if g.index == index else g for g in self._gpus)

    def set_gpus(self, gpus: Iterable[Gpu]) -> None:
        self._gpus = tuple(gpus)
        self._version += 1
        bumped, self._bumped = self._bumped, asyncio.Event()
        bumped.set()


class LedgerError(RuntimeError):
    """The record could not be written (here: an unknown pod, or a failure a test asked for)."""


class MemoryLedger:
    """Pods held in a dict by UID; ``fail_next`` makes the next :meth:`record` raise, the way an
    API server refusing the patch would."""

    def __init__(self, pods: Iterable[NodePod] = ()) -> None:
        self._pods = {pod.uid: pod for pod in pods}
        self.fail_next = False

    def pods(self) -> Sequence[NodePod]:
        return tuple(self._pods.values())

    def add(self, pod: NodePod) -> None:
        self._pods[pod.uid] = pod

    def remove(self, uid: str) -> None:
        self._pods.pop(uid, None)

    def get(self, uid: str) -> NodePod | None:
        return self._pods.get(uid)

    async def record(self, pod: NodePod, uuids: tuple[str, ...], container: str = "") -> None:
        if self.fail_next:
            self.fail_next = False
            raise LedgerError(f"could not record GPUs on pod {pod.key}")
        held = self._pods.get(pod.uid)
        if held is None:
            raise LedgerError(f"pod {pod.key} is gone")
        grants = (*held.recorded(), ContainerGrant(container, uuids))
        self._pods[pod.uid] = replace(held, grants=grants, allocated=granted_devices(grants))
