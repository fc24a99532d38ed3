"""The agent's side of GPU shares, as the runner wires it: the share handle's device plugin on
its own socket, share memory and cores on the Node's status, and, with ``mps`` on, a CUDA MPS
daemon per GPU. docs/gpu-sharing.md, "GPU shares on the node", is the user's view; the
decisions are in :mod:`extender.devices.share_handle` and
:mod:`extender.devices.share_allocation`."""

from __future__ import annotations

import logging
from collections.abc import Coroutine, Sequence
from typing import Any

from app.agent.mps import CONTAINER_SHM, MpsDaemons, MpsLayout, SubprocessMps
from app.agent.node_capacity import NodeCapacity
from app.agent.ports import Devices
from app.agent.registration import Endpoint
from app.agent.settings import AgentSettings
from app.agent.share_allocator import ShareAllocator
from app.kube.api import KubeApi
from extender.devices.gpus import Gpu
from extender.devices.share_handle import node_capacity

__all__ = ["Shares"]

log = logging.getLogger("schedext.agent")


class Shares:
    def __init__(self, settings: AgentSettings, api: KubeApi) -> None:
        self.resources = settings.share_resources()
        self.handle = settings.share_handle()
        self.capacity = NodeCapacity(api, settings.node_name)
        self.endpoint = Endpoint(
            directory=settings.device_plugin_dir,
            socket_name=settings.share_socket_name,
            resource_name=self.handle.resource,
        )
        self.mps = MpsLayout(settings.mps_dir) if settings.mps else None

    @classmethod
    def from_settings(cls, settings: AgentSettings, api: KubeApi) -> Shares | None:
        return cls(settings, api) if settings.shares else None

    def allocator(self, devices: Devices) -> ShareAllocator:
        return ShareAllocator(devices, self.handle, mps=self.mps)

    def ready(self) -> bool:
        return self.endpoint.socket.exists()

    async def publish(self, gpus: Sequence[Gpu]) -> None:
        """Share memory and cores of the sharable GPUs on the Node (written on change)."""
        await self.capacity.write(node_capacity(gpus, self.resources, self.handle))

    async def prepare(self, devices: Devices) -> list[Coroutine[Any, Any, None]]:
        """Before the plugin registers: the MPS daemons started (with ``mps`` on). Returns
        what must run beside the agent's other tasks (their supervision)."""
        if self.mps is None:
            return []
        shm = self.mps.shm
        try:
            shared = shm.samefile(CONTAINER_SHM)  # the agent's own, which its daemons use
        except OSError:
            shared = False
        if not shared:
            log.warning(
                "the MPS daemons' /dev/shm is not the directory shares get: MPS clients in "
                "containers will not reach their server (mount it at /dev/shm)",
                extra={"shm": str(shm)},
            )
        daemons = MpsDaemons(SubprocessMps(self.mps), devices.current)
        await daemons.check()
        return [daemons.run()]
