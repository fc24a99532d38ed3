"""The whole-GPU resource (``nvidia.com/gpu``): every GPU not in MIG mode, listed by UUID with
its health, and each container given its part of the GPUs schedext chose for its pod, with
their device nodes (``/dev/nvidia<minor>``, NVML's minor number, not the index). The decisions
are the core's (:mod:`extender.devices.allocation`); :class:`GpuAllocator` is what the
servicer (:mod:`app.agent.servicer`) asks."""

from __future__ import annotations

from collections.abc import Sequence

from app.agent.deviceplugin.v1beta1 import api_pb2
from app.agent.ports import Devices, GpuGroups
from app.agent.servicer import DEFAULT_ANSWERS, Answers, listed_device
from extender.devices.allocation import Grant, NodePod, grant, preferred
from extender.devices.gpus import Gpu
from extender.names import GPU_RESOURCE

__all__ = ["GpuAllocator", "WholeGpus"]


class WholeGpus:
    """The GPUs the whole-GPU resource serves: every GPU but those in MIG mode (a GPU in MIG
    mode runs only its MIG devices' work)."""

    def __init__(self, devices: Devices) -> None:
        self._devices = devices

    def current(self) -> tuple[Gpu, ...]:
        return tuple(gpu for gpu in self._devices.current() if not gpu.mig_enabled)

    def groups(self) -> GpuGroups:
        whole = {gpu.index for gpu in self.current()}
        kept = (tuple(i for i in group if i in whole) for group in self._devices.groups())
        return tuple(group for group in kept if group)

    async def changed(self, version: int) -> int:
        return await self._devices.changed(version)


class GpuAllocator:
    """``devices``: the GPUs it serves (:class:`WholeGpus` of the node's, on a node with MIG);
    ``resource``: the resource registered for them."""

    def __init__(
        self, devices: Devices, *, resource: str = GPU_RESOURCE, answers: Answers = DEFAULT_ANSWERS
    ) -> None:
        self.devices, self.resource, self._answers = devices, resource, answers

    def listed(self) -> list[api_pb2.Device]:
        return [
            listed_device(gpu.uuid, gpu.health.healthy, gpu.numa_node)
            for gpu in self.devices.current()
        ]

    def preferred(
        self,
        pods: Sequence[NodePod],
        *,
        available: Sequence[str],
        must_include: Sequence[str],
        size: int,
    ) -> tuple[str, ...]:
        return preferred(
            pods,
            self.devices.current(),
            self.devices.groups(),
            available=available,
            must_include=must_include,
            size=size,
            resource=self.resource,
        )

    def grant(self, pods: Sequence[NodePod], requested: Sequence[str]) -> Grant:
        gpus, groups = self.devices.current(), self.devices.groups()
        return grant(pods, gpus, groups, requested, resource=self.resource)

    def answer(self, granted: Grant) -> api_pb2.ContainerAllocateResponse:
        by_uuid = {gpu.uuid: gpu for gpu in self.devices.current()}
        nodes = [by_uuid[u].device_node for u in granted.uuids if u in by_uuid]
        return self._answers.answer(granted.uuids, nodes)
