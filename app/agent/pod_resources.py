"""The kubelet's record of which container holds which device: its PodResources API
(``v1.PodResourcesLister`` on ``/var/lib/kubelet/pod-resources/kubelet.sock``), read as values.

One small interface (:class:`PodResources`) with the real client over the unix socket
(:class:`KubeletPodResources`); tests pass a stand-in. Every read has a deadline and fails
with :class:`PodResourcesError` (no socket, no answer in time, the kubelet refusing): the
caller then goes on without reconciliation, as before it existed."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

import grpc

from app.agent.podresources.v1 import api_pb2, api_pb2_grpc
from extender.devices.drift import KubeletDevices

__all__ = ["POD_RESOURCES_SOCKET", "KubeletPodResources", "PodResources", "PodResourcesError"]

POD_RESOURCES_SOCKET = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
# The kubelet's own PodResources clients read up to 16 MiB (a node full of pods with CPU and
# memory assignments); gRPC's default, 4 MiB, could refuse a large node's answer.
_MAX_MESSAGE = 16 * 1024 * 1024


class PodResourcesError(Exception):
    """Why the kubelet's PodResources could not be read (one sentence, no stack)."""


class PodResources(Protocol):
    async def list(self) -> tuple[KubeletDevices, ...]:
        """Every device the kubelet assigned, per container of each active pod and resource;
        :class:`PodResourcesError` when it cannot be read."""
        ...

    async def allocatable(self) -> Mapping[str, int]:
        """How many devices of each resource the kubelet may allocate on this node."""
        ...

    async def close(self) -> None: ...


class KubeletPodResources:
    """The kubelet's socket, read with a deadline per call. The channel is opened on first
    use (on the caller's event loop) and again after the socket went away: a restarted
    kubelet makes a new socket."""

    def __init__(self, socket: Path = POD_RESOURCES_SOCKET, *, deadline_s: float = 2.0) -> None:
        self.socket = socket
        self._deadline_s = deadline_s
        self._channel: grpc.aio.Channel | None = None
        self._stub: api_pb2_grpc.PodResourcesListerStub | None = None

    def _lister(self) -> api_pb2_grpc.PodResourcesListerStub:
        if not self.socket.exists():
            raise PodResourcesError(f"no PodResources socket at {self.socket}")
        if self._stub is None:
            self._channel = grpc.aio.insecure_channel(
                f"unix://{self.socket}",
                options=[("grpc.max_receive_message_length", _MAX_MESSAGE)],
            )
            self._stub = api_pb2_grpc.PodResourcesListerStub(self._channel)
        return self._stub

    async def list(self) -> tuple[KubeletDevices, ...]:
        try:
            answer = await self._lister().List(
                api_pb2.ListPodResourcesRequest(), timeout=self._deadline_s
            )
        except grpc.aio.AioRpcError as error:
            await self._failed()
            raise PodResourcesError(_sentence("List", error)) from None
        return tuple(
            KubeletDevices(
                namespace=pod.namespace,
                pod=pod.name,
                container=container.name,
                resource=devices.resource_name,
                device_ids=tuple(devices.device_ids),
            )
            for pod in answer.pod_resources
            for container in pod.containers
            for devices in container.devices
        )

    async def allocatable(self) -> Mapping[str, int]:
        try:
            answer = await self._lister().GetAllocatableResources(
                api_pb2.AllocatableResourcesRequest(), timeout=self._deadline_s
            )
        except grpc.aio.AioRpcError as error:
            await self._failed()
            raise PodResourcesError(_sentence("GetAllocatableResources", error)) from None
        counts: dict[str, int] = {}
        for devices in answer.devices:
            counts[devices.resource_name] = counts.get(devices.resource_name, 0) + len(
                devices.device_ids
            )
        return counts

    async def _failed(self) -> None:
        """Drop the channel after a failure: the next call dials the socket afresh."""
        if self._channel is not None:
            await self._channel.close()
        self._channel, self._stub = None, None

    async def close(self) -> None:
        await self._failed()


def _sentence(call: str, error: grpc.aio.AioRpcError) -> str:
    code = error.code()
    if code is grpc.StatusCode.DEADLINE_EXCEEDED:
        return f"the kubelet did not answer {call} in time"
    return f"the kubelet refused {call}: {code.name}: {error.details() or ''}".rstrip(": ")
