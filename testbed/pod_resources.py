"""The kubelet's PodResources socket, for tests: a real ``PodResourcesLister`` gRPC server
(asyncio) on a unix socket, answering ``List`` and ``GetAllocatableResources`` from what the
test sets, optionally slower than a reader's deadline; served from a thread of its own
(:class:`PodResourcesThread`), so that the reader under test may use any event loop. The drift
benchmark (``loadtests.agent_drift``) reads the same socket."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Sequence
from pathlib import Path
from typing import Any

import grpc

from app.agent.podresources.v1 import api_pb2, api_pb2_grpc
from extender.devices.drift import KubeletDevices

WAIT_S = 5.0


class FakePodResources(api_pb2_grpc.PodResourcesListerServicer):
    """Answers with :attr:`listed` (the kubelet's devices per container) and
    :attr:`allocatable`; each answer waits :attr:`delay_s` first."""

    def __init__(self, socket: Path) -> None:
        self.socket = socket
        self.listed: list[KubeletDevices] = []
        self.allocatable: dict[str, list[str]] = {}
        self.delay_s = 0.0
        self.calls = 0
        self._server: grpc.aio.Server | None = None

    async def List(  # noqa: N802 - the gRPC method's name
        self, _request: api_pb2.ListPodResourcesRequest, _context: object
    ) -> api_pb2.ListPodResourcesResponse:
        self.calls += 1
        await asyncio.sleep(self.delay_s)
        pods: dict[tuple[str, str], api_pb2.PodResources] = {}
        for entry in self.listed:
            pod = pods.setdefault(
                (entry.namespace, entry.pod),
                api_pb2.PodResources(name=entry.pod, namespace=entry.namespace),
            )
            container = next((c for c in pod.containers if c.name == entry.container), None)
            if container is None:
                container = pod.containers.add(name=entry.container)
            if entry.device_ids:
                container.devices.add(
                    resource_name=entry.resource, device_ids=list(entry.device_ids)
                )
        return api_pb2.ListPodResourcesResponse(pod_resources=list(pods.values()))

    async def GetAllocatableResources(  # noqa: N802 - the gRPC method's name
        self, _request: api_pb2.AllocatableResourcesRequest, _context: object
    ) -> api_pb2.AllocatableResourcesResponse:
        await asyncio.sleep(self.delay_s)
        return api_pb2.AllocatableResourcesResponse(
            devices=[
                api_pb2.ContainerDevices(resource_name=name, device_ids=ids)
                for name, ids in self.allocatable.items()
            ]
        )

    async def start(self) -> None:
        self._server = grpc.aio.server()
        api_pb2_grpc.add_PodResourcesListerServicer_to_server(self, self._server)
        self._server.add_insecure_port(f"unix://{self.socket}")
        await self._server.start()

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(0)


class PodResourcesThread:
    """A :class:`FakePodResources` served from its own event loop and thread."""

    def __init__(self, socket: Path) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self.kubelet = FakePodResources(socket)
        self._call(self.kubelet.start())

    def _call(self, coroutine: Coroutine[Any, Any, object]) -> object:
        future = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        return future.result(WAIT_S + 1)

    def set(self, listed: Sequence[KubeletDevices]) -> None:
        """What the next ``List`` answers (one attribute swap: safe across threads)."""
        self.kubelet.listed = list(listed)

    def stop(self) -> None:
        self._call(self.kubelet.stop())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(WAIT_S)
        self._loop.close()
