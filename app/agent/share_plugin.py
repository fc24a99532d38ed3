"""The kubelet device plugin for the GPU share *handle* (``schedext.io/gpu-shares`` by default;
:mod:`extender.devices.share_handle` says why a handle and not memory): it lists ``slots`` IDs
per healthy, non-MIG GPU, and gives each share pod's container the GPU schedext chose, with
the share's limits.

It is the whole-GPU plugin's sibling (same options, device nodes and allocation record, on a
socket of its own, registered for its own resource); what differs is the listing and the
decision, which is the core's (:mod:`extender.devices.share_allocation`). A share pod the pod
watch has not shown yet is waited for, up to ``wait_s``: unlike a whole GPU, a share has no
fallback, and refusing would fail the pod's admission for good.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Sequence
from functools import partial

import grpc

from app.agent.deviceplugin.v1beta1 import api_pb2
from app.agent.mps import CONTAINER_PIPE_DIRECTORY, CONTAINER_SHM, MpsLayout
from app.agent.plugin import CONTROL_DEVICES, HEALTHY, UNHEALTHY, DevicePlugin, until_seen
from app.agent.ports import Devices, PodLedger
from extender.devices.allocation import AllocationError
from extender.devices.gpus import Gpu
from extender.devices.share_allocation import (
    ShareGrant,
    grant_share,
    preferred_share,
    share_envs,
)
from extender.devices.share_handle import ShareHandle

__all__ = ["SharePlugin"]

log = logging.getLogger("schedext.agent.plugin")

_Context = grpc.aio.ServicerContext[object, object]


class SharePlugin(DevicePlugin):
    """``mps``: where the agent's MPS daemons keep their pipes (None: MPS is off; the limits
    are then set but nothing enforces them). ``wait_s``: how long an ``Allocate`` waits for
    the pod watch to show its pod. The other keywords as :class:`DevicePlugin`."""

    def __init__(
        self,
        devices: Devices,
        ledger: PodLedger,
        handle: ShareHandle,
        *,
        mps: MpsLayout | None = None,
        wait_s: float = 5.0,
        poll_s: float = 0.05,
        env_names: Sequence[str] = ("NVIDIA_VISIBLE_DEVICES",),
        dev_root: str = "/dev",
        control_devices: Sequence[str] = CONTROL_DEVICES,
    ) -> None:
        super().__init__(
            devices,
            ledger,
            resource=handle.resource,
            env_names=env_names,
            dev_root=dev_root,
            control_devices=control_devices,
            wait_s=wait_s,
            poll_s=poll_s,
        )
        self._handle, self._mps = handle, mps

    async def ListAndWatch(
        self, request: api_pb2.Empty, context: _Context
    ) -> AsyncIterator[api_pb2.ListAndWatchResponse]:
        version = 0
        while True:
            version = await self._devices.changed(version)
            yield api_pb2.ListAndWatchResponse(devices=self._listed(self._devices.current()))

    def _listed(self, gpus: Sequence[Gpu]) -> list[api_pb2.Device]:
        """Every slot of every non-MIG GPU, with its GPU's health and NUMA node."""
        listed = []
        for gpu in gpus:
            if gpu.mig_enabled:
                continue
            health = HEALTHY if gpu.health.healthy else UNHEALTHY
            topology = (
                api_pb2.TopologyInfo(nodes=[api_pb2.NUMANode(ID=gpu.numa_node)])
                if gpu.numa_node is not None
                else None
            )
            listed += [
                api_pb2.Device(ID=device, health=health, topology=topology)
                for device in self._handle.device_ids(gpu)
            ]
        return listed

    async def GetPreferredAllocation(
        self, request: api_pb2.PreferredAllocationRequest, context: _Context
    ) -> api_pb2.PreferredAllocationResponse:
        pods, gpus = self._ledger.pods(), self._devices.current()
        answers = [
            api_pb2.ContainerPreferredAllocationResponse(
                deviceIDs=preferred_share(
                    pods,
                    gpus,
                    self._handle,
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
        answers = []
        async with self._lock:
            for ask in request.container_requests:
                try:
                    # A share has no fallback: while no share pod waits, the watch gets until
                    # wait_s to show it, and then the request is refused.
                    granted = await until_seen(
                        partial(self._grant_share, list(ask.devices_ids)),
                        seen=lambda _: True,
                        wait_s=self._wait_s,
                        poll_s=self._poll_s,
                    )
                except AllocationError as error:
                    log.warning("share allocation refused", extra={"reason": str(error)})
                    await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(error))
                try:
                    await self._ledger.record(granted.pod, granted.uuids, granted.container)
                except Exception as error:  # noqa: BLE001 - any failure refuses the RPC
                    message = f"could not record GPUs on pod {granted.pod.key}: {error}"
                    log.warning("allocation not recorded", extra={"reason": message})
                    await context.abort(grpc.StatusCode.UNAVAILABLE, message)
                log.info(
                    "share allocated",
                    extra={
                        "pod": granted.pod.key,
                        "container": granted.container,
                        "uuids": ",".join(granted.uuids),
                        "memory_mib": granted.memory_mib,
                        "cores": granted.cores,
                    },
                )
                answers.append(self._share_answer(granted))
        return api_pb2.AllocateResponse(container_responses=answers)

    def _grant_share(self, requested: Sequence[str]) -> ShareGrant:
        return grant_share(
            self._ledger.pods(),
            self._devices.current(),
            self._handle,
            requested,
            one_gpu=self._mps is not None,
        )

    def _share_answer(self, granted: ShareGrant) -> api_pb2.ContainerAllocateResponse:
        answer = self._answer(self._devices.current(), granted.uuids)
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
                        container_path=CONTAINER_SHM,
                        host_path=str(self._mps.shm),
                        read_only=False,
                    ),
                ]
            )
        return answer
