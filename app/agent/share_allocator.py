"""The GPU share *handle* (``schedext.io/gpu-shares`` by default;
:mod:`extender.devices.share_handle` says why a handle and not memory): ``slots`` IDs listed
per non-MIG GPU, with its health, and each share pod's container given the GPU schedext chose,
with the share's limits. A share has no fallback: a share pod the watch has not shown yet is
waited for (the servicer's ``until_seen``), and then refused, for nobody chose its GPU. The
decisions are the core's (:mod:`extender.devices.share_allocation`)."""

from __future__ import annotations

from collections.abc import Sequence

from app.agent.deviceplugin.v1beta1 import api_pb2
from app.agent.mps import CONTAINER_PIPE_DIRECTORY, CONTAINER_SHM, MpsLayout
from app.agent.ports import Devices
from app.agent.servicer import DEFAULT_ANSWERS, Answers, listed_device
from extender.devices.allocation import NodePod
from extender.devices.share_allocation import (
    ShareGrant,
    grant_share,
    preferred_share,
    share_envs,
)
from extender.devices.share_handle import ShareHandle

__all__ = ["ShareAllocator"]


class ShareAllocator:
    """``mps``: where the agent's MPS daemons keep their pipes (None: MPS is off; the limits
    are then set but nothing enforces them)."""

    def __init__(
        self,
        devices: Devices,
        handle: ShareHandle,
        *,
        mps: MpsLayout | None = None,
        answers: Answers = DEFAULT_ANSWERS,
    ) -> None:
        self.devices, self.resource = devices, handle.resource
        self._handle, self._mps, self._answers = handle, mps, answers

    def listed(self) -> list[api_pb2.Device]:
        """Every slot of every non-MIG GPU, with its GPU's health and NUMA node."""
        return [
            listed_device(device, gpu.health.healthy, gpu.numa_node)
            for gpu in self.devices.current()
            if not gpu.mig_enabled
            for device in self._handle.device_ids(gpu)
        ]

    def preferred(
        self,
        pods: Sequence[NodePod],
        *,
        available: Sequence[str],
        must_include: Sequence[str],
        size: int,
    ) -> tuple[str, ...]:
        gpus = self.devices.current()
        return preferred_share(
            pods, gpus, self._handle, available=available, must_include=must_include, size=size
        )

    def grant(self, pods: Sequence[NodePod], requested: Sequence[str]) -> ShareGrant:
        gpus, one_gpu = self.devices.current(), self._mps is not None
        return grant_share(pods, gpus, self._handle, requested, one_gpu=one_gpu)

    def answer(self, granted: ShareGrant) -> api_pb2.ContainerAllocateResponse:
        by_uuid = {gpu.uuid: gpu for gpu in self.devices.current()}
        nodes = [by_uuid[u].device_node for u in granted.uuids if u in by_uuid]
        answer = self._answers.answer(granted.uuids, nodes)
        pipe = CONTAINER_PIPE_DIRECTORY if self._mps is not None else None
        answer.envs.update(share_envs(granted, pipe_directory=pipe))
        if self._mps is not None:
            (uuid,) = granted.uuids  # one GPU per container under MPS (grant_share's rule)
            answer.mounts.extend(
                [
                    api_pb2.Mount(
                        container_path=CONTAINER_PIPE_DIRECTORY,
                        host_path=str(self._mps.pipe(uuid)),
                        read_only=False,
                    ),
                    api_pb2.Mount(
                        container_path=CONTAINER_SHM, host_path=str(self._mps.shm), read_only=False
                    ),
                ]
            )
        return answer
