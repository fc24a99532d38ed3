"""The kubelet's device-plugin API (v1beta1) for every resource the agent serves: one servicer
over an :class:`Allocator`, as NVIDIA's device plugin has one over its resource manager.

The servicer owns what every resource does alike: the options, ListAndWatch on every change
of the GPUs, ``GetPreferredAllocation``, and ``Allocate`` serialized by one lock per agent,
waiting for the pod watch (:func:`until_seen`) and recording each container's grant on its pod
before it answers, so that two never race for a device and nothing is handed out that a
restarted agent could hand out again. An :class:`Allocator` says what differs: its resource,
the devices it lists, and the core's decisions and answer for them
(:mod:`app.agent.gpu_allocator`, :mod:`app.agent.share_allocator`,
:mod:`app.agent.mig_allocator`). A new device kind is one allocator.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Generic, Protocol, TypeVar

import grpc

from app.agent.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc
from app.agent.ports import Devices, PodLedger
from extender.devices.allocation import AllocationError, NodePod, NoPodWaitingError
from extender.names import GPU_ALLOCATED

__all__ = [
    "CONTROL_DEVICES",
    "DEFAULT_ANSWERS",
    "HEALTHY",
    "UNHEALTHY",
    "Allocator",
    "Answers",
    "DevicePluginServicer",
    "Granted",
    "listed_device",
    "until_seen",
]

log = logging.getLogger("schedext.agent.plugin")

T = TypeVar("T")
_Context = grpc.aio.ServicerContext[object, object]

# The kubelet's own spelling (deviceplugin/v1beta1/constants.go).
HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"
# Every CUDA process opens these beside its GPUs' /dev/nvidiaN.
CONTROL_DEVICES = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools")


class Granted(Protocol):
    """One container's grant: the pod it is recorded on (None: no pod the watch has shown,
    so it cannot be recorded), its devices and the container's name."""

    @property
    def pod(self) -> NodePod | None: ...

    @property
    def uuids(self) -> tuple[str, ...]: ...

    @property
    def container(self) -> str: ...


G = TypeVar("G", bound=Granted)


class Allocator(Protocol[G]):
    """What one resource's plugin answers; the decisions are the core's. ``devices``: the
    GPUs, whose changes ListAndWatch follows. ``G``: what its grant is (the answer takes it
    back)."""

    resource: str
    devices: Devices

    def listed(self) -> list[api_pb2.Device]:
        """ListAndWatch's list, from the GPUs as they are now."""
        ...

    def preferred(
        self,
        pods: Sequence[NodePod],
        *,
        available: Sequence[str],
        must_include: Sequence[str],
        size: int,
    ) -> tuple[str, ...]:
        """GetPreferredAllocation for one container."""
        ...

    def grant(self, pods: Sequence[NodePod], requested: Sequence[str]) -> G:
        """One container's ``Allocate``: raises :class:`AllocationError` to refuse, and
        :class:`NoPodWaitingError` while no pod seen waits for the request."""
        ...

    def answer(self, granted: G) -> api_pb2.ContainerAllocateResponse:
        """What the container gets: environment, device nodes, mounts."""
        ...


@dataclass(frozen=True, slots=True)
class Answers:
    """How an answer names what a container gets: ``env_names`` carry the granted UUIDs (the
    NVIDIA container runtime reads ``NVIDIA_VISIBLE_DEVICES``), device nodes under
    ``dev_root`` (the host's /dev), with the control nodes every CUDA process opens."""

    env_names: tuple[str, ...] = ("NVIDIA_VISIBLE_DEVICES",)
    dev_root: str = "/dev"
    control_devices: tuple[str, ...] = CONTROL_DEVICES

    def answer(
        self, uuids: Sequence[str], nodes: Sequence[str]
    ) -> api_pb2.ContainerAllocateResponse:
        visible = ",".join(uuids)
        root = self.dev_root.rstrip("/")
        return api_pb2.ContainerAllocateResponse(
            envs=dict.fromkeys(self.env_names, visible),
            devices=[
                api_pb2.DeviceSpec(
                    container_path=f"/dev/{name}", host_path=f"{root}/{name}", permissions="rw"
                )
                for name in (*dict.fromkeys(nodes), *self.control_devices)
            ],
            # Shown by the runtime (crictl inspect): which devices this container was given.
            annotations={GPU_ALLOCATED: visible},
        )


DEFAULT_ANSWERS = Answers()


def listed_device(device_id: str, healthy: bool, numa_node: int | None) -> api_pb2.Device:
    """One device as ListAndWatch sends it, with its NUMA node where known (the kubelet's
    topology manager aligns on it)."""
    topology = (
        api_pb2.TopologyInfo(nodes=[api_pb2.NUMANode(ID=numa_node)])
        if numa_node is not None
        else None
    )
    return api_pb2.Device(ID=device_id, health=HEALTHY if healthy else UNHEALTHY, topology=topology)


class DevicePluginServicer(api_pb2_grpc.DevicePluginServicer, Generic[G]):
    """One resource's plugin; :func:`app.agent.registration.serve` puts it on a socket.
    ``lock``: one per agent, shared by its servicers, so that the containers of one pod are
    recorded one after the other whatever resource they ask for. ``wait_s``: how long an
    ``Allocate`` for no pod seen waits for the pod watch, looking every ``poll_s``."""

    def __init__(
        self,
        allocator: Allocator[G],
        ledger: PodLedger,
        *,
        lock: asyncio.Lock | None = None,
        wait_s: float = 5.0,
        poll_s: float = 0.05,
    ) -> None:
        self.allocator = allocator
        self._ledger = ledger
        self._lock = lock or asyncio.Lock()
        self._wait_s, self._poll_s = wait_s, poll_s

    async def GetDevicePluginOptions(
        self, request: api_pb2.Empty, context: _Context
    ) -> api_pb2.DevicePluginOptions:
        return api_pb2.DevicePluginOptions(
            pre_start_required=False, get_preferred_allocation_available=True
        )

    async def ListAndWatch(
        self, request: api_pb2.Empty, context: _Context
    ) -> AsyncIterator[api_pb2.ListAndWatchResponse]:
        # Ends only when the kubelet hangs up or the server stops (both cancel this).
        version = 0
        while True:
            version = await self.allocator.devices.changed(version)
            yield api_pb2.ListAndWatchResponse(devices=self.allocator.listed())

    async def GetPreferredAllocation(
        self, request: api_pb2.PreferredAllocationRequest, context: _Context
    ) -> api_pb2.PreferredAllocationResponse:
        pods = self._ledger.pods()
        answers = [
            api_pb2.ContainerPreferredAllocationResponse(
                deviceIDs=self.allocator.preferred(
                    pods,
                    available=list(ask.available_deviceIDs),
                    must_include=list(ask.must_include_deviceIDs),
                    size=ask.allocation_size,
                )
            )
            for ask in request.container_requests
        ]
        return api_pb2.PreferredAllocationResponse(container_responses=answers)

    async def Allocate(
        self, request: api_pb2.AllocateRequest, context: _Context
    ) -> api_pb2.AllocateResponse:
        resource = self.allocator.resource
        answers = []
        async with self._lock:
            for ask in request.container_requests:
                try:
                    granted = await until_seen(
                        partial(self._grant, list(ask.devices_ids)),
                        seen=lambda g: g.pod is not None,
                        wait_s=self._wait_s,
                        poll_s=self._poll_s,
                    )
                except AllocationError as error:
                    log.warning(
                        "allocation refused", extra={"resource": resource, "reason": str(error)}
                    )
                    await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(error))
                await self._record(granted, context)
                answers.append(self.allocator.answer(granted))
        return api_pb2.AllocateResponse(container_responses=answers)

    async def PreStartContainer(
        self, request: api_pb2.PreStartContainerRequest, context: _Context
    ) -> api_pb2.PreStartContainerResponse:
        return api_pb2.PreStartContainerResponse()

    def _grant(self, requested: Sequence[str]) -> G:
        return self.allocator.grant(self._ledger.pods(), requested)

    async def _record(self, granted: Granted, context: _Context) -> None:
        resource, uuids = self.allocator.resource, ",".join(granted.uuids)
        if granted.pod is None:
            # The pod watch has still not shown the pod: the kubelet's own choice, which is
            # healthy and unclaimed, but cannot be recorded on a pod.
            log.warning("allocated to an unseen pod", extra={"resource": resource, "uuids": uuids})
            return
        try:
            await self._ledger.record(granted.pod, granted.uuids, granted.container)
        except Exception as error:  # noqa: BLE001 - any failure refuses the RPC
            message = f"could not record devices on pod {granted.pod.key}: {error}"
            log.warning("allocation not recorded", extra={"reason": message})
            await context.abort(grpc.StatusCode.UNAVAILABLE, message)
        log.info(
            "allocated",
            extra={
                "resource": resource,
                "pod": granted.pod.key,
                "container": granted.container,
                "uuids": uuids,
            },
        )


async def until_seen(
    decide: Callable[[], T], *, seen: Callable[[T], bool], wait_s: float, poll_s: float
) -> T:
    """``decide()``, asked again every ``poll_s`` while no pod it has seen waits for the
    request (its answer is not ``seen``, or it raises :class:`NoPodWaitingError`), until
    ``wait_s`` has passed: the kubelet may call ``Allocate`` for a pod a moment before this
    node's pod watch shows it bound. The last answer (or error) is the one returned."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            answer = decide()
        except NoPodWaitingError:
            if time.monotonic() >= deadline:
                raise
        else:
            if seen(answer) or time.monotonic() >= deadline:
                return answer
        await asyncio.sleep(poll_s)
