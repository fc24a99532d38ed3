"""The kubelet's side of the device-plugin API, for tests: a real ``Registration`` gRPC server
on ``kubelet.sock`` (:class:`FakeKubelet`, asyncio), the same run on a thread of its own for
synchronous tests (:class:`KubeletThread`), and the calls the kubelet's device manager makes
(:class:`KubeletClient`, which :class:`tests.device_manager.DeviceManager` drives as the
kubelet does), and plugins served on a thread for such tests (:class:`ServedPlugins`). The
drift benchmark (``loadtests.agent_drift``) runs the node agent against the same kubelet."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import grpc

from app.agent.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc
from app.agent.registration import Endpoint, serve

T = TypeVar("T")

WAIT_S = 5.0  # every wait in these tests is bounded by this
# An Allocate's deadline: the agent waits up to 5 s for its pod watch before it refuses a
# request no pod it has seen waits for (the kubelet itself sets no deadline on Allocate).
ALLOCATE_S = 15.0


class FakeKubelet(api_pb2_grpc.RegistrationServicer):
    """The kubelet's registration service, recording every Register call."""

    def __init__(self, directory: Path) -> None:
        self.socket = directory / "kubelet.sock"
        self.requests: list[api_pb2.RegisterRequest] = []
        self._registered = asyncio.Condition()
        self._server: grpc.aio.Server | None = None

    async def Register(  # noqa: N802 - the gRPC method's name
        self, request: api_pb2.RegisterRequest, _context: object
    ) -> api_pb2.Empty:
        async with self._registered:
            self.requests.append(request)
            self._registered.notify_all()
        return api_pb2.Empty()

    async def start(self) -> None:
        self._server = grpc.aio.server()
        api_pb2_grpc.add_RegistrationServicer_to_server(self, self._server)
        self._server.add_insecure_port(f"unix://{self.socket}")
        await self._server.start()

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(0)

    async def registered(self, count: int = 1) -> api_pb2.RegisterRequest:
        async with self._registered:
            await asyncio.wait_for(
                self._registered.wait_for(lambda: len(self.requests) >= count), WAIT_S
            )
        return self.requests[count - 1]


class KubeletThread:
    """A :class:`FakeKubelet` served from its own event loop and thread."""

    def __init__(self, directory: Path) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self.kubelet = FakeKubelet(directory)
        self._call(self.kubelet.start())

    def _call(self, coroutine: Coroutine[Any, Any, object], timeout: float = WAIT_S) -> object:
        future = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        return future.result(timeout + 1)

    def registered(self, count: int = 1) -> api_pb2.RegisterRequest:
        request = self._call(self.kubelet.registered(count))
        assert isinstance(request, api_pb2.RegisterRequest)
        return request

    def stop(self) -> None:
        self._call(self.kubelet.stop())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(WAIT_S)
        self._loop.close()  # its self-pipe sockets, or the garbage collector warns of them


def quick_endpoint(directory: Path) -> Endpoint:
    """A plugin's endpoint in ``directory`` that retries, polls and stops in milliseconds, as
    a test wants (the defaults are the kubelet's pace)."""
    return Endpoint(
        directory=directory,
        retry_first_s=0.02,
        retry_max_s=0.1,
        poll_s=0.02,
        stop_grace_s=0.1,
        register_timeout_s=1.0,
    )


class ServedPlugins:
    """Device plugins served, and registered with a :class:`FakeKubelet`, from an event loop
    of their own, so that a synchronous test plays the kubelet against them; :meth:`stop`
    stops them as an agent's exit would."""

    def __init__(
        self, directory: Path, plugins: Sequence[tuple[api_pb2_grpc.DevicePluginServicer, Endpoint]]
    ) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self.kubelet = FakeKubelet(directory)
        self._call(self.kubelet.start())
        self._tasks = [self._call(self._start(plugin, endpoint)) for plugin, endpoint in plugins]
        self._call(self.kubelet.registered(len(plugins)))

    async def _start(
        self, plugin: api_pb2_grpc.DevicePluginServicer, endpoint: Endpoint
    ) -> asyncio.Task[None]:
        return asyncio.create_task(serve(plugin, endpoint))

    def _call(self, coroutine: Coroutine[object, object, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(WAIT_S + 1)

    def stop(self) -> None:
        async def cancel() -> None:
            for task in self._tasks:
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            await self.kubelet.stop()

        self._call(cancel())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(WAIT_S)
        self._loop.close()


class KubeletClient:
    """The device manager's calls to a plugin's socket."""

    def __init__(self, socket: Path) -> None:
        self._channel = grpc.insecure_channel(f"unix://{socket}")
        self._stub = api_pb2_grpc.DevicePluginStub(self._channel)
        self.answers: list[api_pb2.ContainerAllocateResponse] = []  # every Allocate's

    def close(self) -> None:
        self._channel.close()

    def allocate(self, device_ids: Sequence[str]) -> tuple[str, ...]:
        """NVIDIA_VISIBLE_DEVICES of one container's allocation."""
        return tuple(self.allocate_envs(device_ids)["NVIDIA_VISIBLE_DEVICES"].split(","))

    def allocate_envs(self, device_ids: Sequence[str]) -> dict[str, str]:
        """The environment of one container's allocation."""
        return dict(self.allocate_answer(device_ids).envs)

    def allocate_answer(self, device_ids: Sequence[str]) -> api_pb2.ContainerAllocateResponse:
        """One container's whole answer (environment, device nodes, mounts)."""
        request = api_pb2.AllocateRequest(
            container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=device_ids)]
        )
        answer: api_pb2.AllocateResponse = self._stub.Allocate(request, timeout=ALLOCATE_S)
        (container,) = answer.container_responses
        self.answers.append(container)
        return container

    def preferred(self, available: Sequence[str], must: Sequence[str], size: int) -> list[str]:
        """GetPreferredAllocation of one container (tests.device_manager.Plugin)."""
        ask = api_pb2.ContainerPreferredAllocationRequest(
            available_deviceIDs=available, must_include_deviceIDs=must, allocation_size=size
        )
        request = api_pb2.PreferredAllocationRequest(container_requests=[ask])
        answer = self._stub.GetPreferredAllocation(request, timeout=WAIT_S)
        return list(answer.container_responses[0].deviceIDs)

    def devices(self) -> Iterator[dict[str, str]]:
        """ListAndWatch: each list the plugin sends, as {device id: health}."""
        for answer in self._stub.ListAndWatch(api_pb2.Empty(), timeout=60):
            yield {device.ID: device.health for device in answer.devices}
