"""The kubelet device plugin (API v1beta1) for the GPU resource: it lists this node's GPUs by
UUID with their health, and gives each container exactly its share of the GPUs schedext chose
for its pod (init and sidecar containers included: ``extender.devices.containers``), with
each GPU's own device node (``/dev/nvidia<minor>``, NVML's minor number, not its index).

Every decision is the core's (``extender.devices.allocation``); this module turns gRPC calls
into those decisions and their answers into gRPC. Allocations are serialized by one lock and
recorded on the pod, by container, before they are answered: two never race for a GPU, and
nothing is handed out that a restarted agent could hand out again. A request no pod the watch
has shown waits for it, up to ``wait_s``: the kubelet may admit a pod a moment before the
agent's watch shows it bound.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from functools import partial
from typing import TypeVar

import grpc

from app.agent.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc
from app.agent.ports import Devices, PodLedger
from extender.devices.allocation import (
    AllocationError,
    Grant,
    NoPodWaitingError,
    grant,
    preferred,
)
from extender.devices.gpus import Gpu
from extender.names import GPU_ALLOCATED, GPU_RESOURCE

__all__ = ["CONTROL_DEVICES", "HEALTHY", "UNHEALTHY", "DevicePlugin", "until_seen"]

T = TypeVar("T")

log = logging.getLogger("schedext.agent.plugin")

# The kubelet's own spelling (deviceplugin/v1beta1/constants.go).
HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"
# Every CUDA process opens these beside its GPUs' /dev/nvidiaN.
CONTROL_DEVICES = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools")

_Context = grpc.aio.ServicerContext[object, object]


class DevicePlugin(api_pb2_grpc.DevicePluginServicer):
    """One instance per agent; :func:`app.agent.registration.serve` puts it on a socket.

    ``resource``: the resource it serves (the pods' containers ask for it). ``env_names``: the
    variables that carry the granted UUIDs (the NVIDIA container runtime reads
    ``NVIDIA_VISIBLE_DEVICES``). ``dev_root``: the host's /dev. ``wait_s``: how long an
    ``Allocate`` for no pod seen waits for the pod watch, looking every ``poll_s``.
    """

    def __init__(
        self,
        devices: Devices,
        ledger: PodLedger,
        *,
        resource: str = GPU_RESOURCE,
        env_names: Sequence[str] = ("NVIDIA_VISIBLE_DEVICES",),
        dev_root: str = "/dev",
        control_devices: Sequence[str] = CONTROL_DEVICES,
        wait_s: float = 5.0,
        poll_s: float = 0.05,
    ) -> None:
        self._devices = devices
        self._ledger = ledger
        self._resource = resource
        self._env_names = tuple(env_names)
        self._dev_root = dev_root.rstrip("/")
        self._control_devices = tuple(control_devices)
        self._wait_s, self._poll_s = wait_s, poll_s
        self._lock = asyncio.Lock()

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
            version = await self._devices.changed(version)
            yield api_pb2.ListAndWatchResponse(
                devices=[_device(gpu) for gpu in self._devices.current()]
            )

    async def GetPreferredAllocation(
        self, request: api_pb2.PreferredAllocationRequest, context: _Context
    ) -> api_pb2.PreferredAllocationResponse:
        pods = self._ledger.pods()
        gpus = self._devices.current()
        groups = self._devices.groups()
        answers = [
            api_pb2.ContainerPreferredAllocationResponse(
                deviceIDs=preferred(
                    pods,
                    gpus,
                    groups,
                    available=list(ask.available_deviceIDs),
                    must_include=list(ask.must_include_deviceIDs),
                    size=ask.allocation_size,
                    resource=self._resource,
                )
            )
            for ask in request.container_requests
        ]
        return api_pb2.PreferredAllocationResponse(container_responses=answers)

    async def Allocate(
        self, request: api_pb2.AllocateRequest, context: _Context
    ) -> api_pb2.AllocateResponse:
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
                    log.warning("allocation refused", extra={"reason": str(error)})
                    await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(error))
                await self._record(granted, context)
                answers.append(self._answer(self._devices.current(), granted.uuids))
        return api_pb2.AllocateResponse(container_responses=answers)

    def _grant(self, requested: Sequence[str]) -> Grant:
        return grant(
            self._ledger.pods(),
            self._devices.current(),
            self._devices.groups(),
            requested,
            resource=self._resource,
        )

    async def _record(self, granted: Grant, context: _Context) -> None:
        if granted.pod is None:
            # The pod watch has still not shown the pod: the kubelet's own choice, which is
            # healthy and unclaimed, but cannot be recorded on a pod.
            log.warning("allocated to an unseen pod", extra={"uuids": ",".join(granted.uuids)})
            return
        try:
            await self._ledger.record(granted.pod, granted.uuids, granted.container)
        except Exception as error:  # noqa: BLE001 - any failure refuses the RPC
            message = f"could not record GPUs on pod {granted.pod.key}: {error}"
            log.warning("allocation not recorded", extra={"reason": message})
            await context.abort(grpc.StatusCode.UNAVAILABLE, message)
        log.info(
            "allocated",
            extra={
                "pod": granted.pod.key,
                "container": granted.container,
                "uuids": ",".join(granted.uuids),
            },
        )

    async def PreStartContainer(
        self, request: api_pb2.PreStartContainerRequest, context: _Context
    ) -> api_pb2.PreStartContainerResponse:
        return api_pb2.PreStartContainerResponse()

    def _answer(
        self, gpus: Sequence[Gpu], uuids: tuple[str, ...]
    ) -> api_pb2.ContainerAllocateResponse:
        by_uuid = {gpu.uuid: gpu for gpu in gpus}
        visible = ",".join(uuids)
        nodes = [by_uuid[u].device_node for u in uuids]
        return api_pb2.ContainerAllocateResponse(
            envs=dict.fromkeys(self._env_names, visible),
            devices=[
                api_pb2.DeviceSpec(
                    container_path=f"/dev/{name}",
                    host_path=f"{self._dev_root}/{name}",
                    permissions="rw",
                )
                for name in (*nodes, *self._control_devices)
            ],
            # Shown by the runtime (crictl inspect): which GPUs this container was given.
            annotations={GPU_ALLOCATED: visible},
        )


def _device(gpu: Gpu) -> api_pb2.Device:
    topology = (
        api_pb2.TopologyInfo(nodes=[api_pb2.NUMANode(ID=gpu.numa_node)])
        if gpu.numa_node is not None
        else None
    )
    return api_pb2.Device(
        ID=gpu.uuid, health=HEALTHY if gpu.health.healthy else UNHEALTHY, topology=topology
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
