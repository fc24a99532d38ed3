"""The kubelet device plugins for MIG devices: one per MIG profile on this node, serving
``nvidia.com/mig-<profile>`` (NVIDIA's "mixed" strategy names), each on its own socket; and
the whole-GPU resource's view of the GPUs, which leaves the GPUs in MIG mode out.

Each plugin lists its profile's MIG devices by UUID, healthy when their GPU is, and gives a
container exactly its part of the MIG devices schedext chose for its pod
(``schedext.io/mig-uuids``; init and sidecar containers as ``extender.devices.containers``
says): ``NVIDIA_VISIBLE_DEVICES`` names them, and the answer carries their GPU's node
(``/dev/nvidia<minor>``) and their capability nodes (``/dev/nvidia-caps/nvidia-cap<N>``, from
the driver's ``mig-minors``: ``extender.devices.device_nodes``) where those are known. Every
decision is the core's (:mod:`extender.devices.mig_allocation`). The profiles are read at start:
a GPU's MIG layout is changed by an administrator (``nvidia-smi mig``, NVIDIA's MIG manager)
with its pods drained, and the agent restarted; schedext never changes it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import AsyncIterator, Mapping, Sequence
from functools import partial
from pathlib import Path

import grpc

from app.agent.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc
from app.agent.plugin import CONTROL_DEVICES, HEALTHY, UNHEALTHY, until_seen
from app.agent.ports import Devices, GpuGroups, PodLedger
from app.agent.registration import Endpoint
from extender.devices.allocation import AllocationError, Grant
from extender.devices.device_nodes import mig_capability_nodes, parse_mig_minors
from extender.devices.gpus import Gpu
from extender.devices.mig_allocation import MigDevice, grant_mig, mig_devices, preferred_mig
from extender.devices.mig_slices import resource_name
from extender.names import GPU_ALLOCATED

__all__ = ["MigPlugin", "WholeGpus", "mig_endpoint", "mig_plugins", "read_mig_minors"]

log = logging.getLogger("schedext.agent.mig")

_Context = grpc.aio.ServicerContext[object, object]


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


class MigPlugin(api_pb2_grpc.DevicePluginServicer):
    """The device plugin of one MIG profile. ``lock``: shared by the plugins of one agent,
    so that two profiles' ``Allocate`` for one pod record its devices one after the other."""

    def __init__(
        self,
        profile: str,
        devices: Devices,
        ledger: PodLedger,
        *,
        lock: asyncio.Lock | None = None,
        caps: Mapping[str, int] | None = None,
        env_names: Sequence[str] = ("NVIDIA_VISIBLE_DEVICES",),
        dev_root: str = "/dev",
        control_devices: Sequence[str] = CONTROL_DEVICES,
        wait_s: float = 5.0,
        poll_s: float = 0.05,
    ) -> None:
        self.profile = profile
        self._devices = devices
        self._ledger = ledger
        self._lock = lock or asyncio.Lock()
        self._env_names = tuple(env_names)
        self._dev_root = dev_root.rstrip("/")
        self._control_devices = tuple(control_devices)
        self._caps = dict(caps or {})
        self._wait_s, self._poll_s = wait_s, poll_s

    def listed(self) -> tuple[MigDevice, ...]:
        """This profile's MIG devices, as ListAndWatch sends them."""
        return tuple(d for d in mig_devices(self._devices.current()) if d.profile == self.profile)

    async def GetDevicePluginOptions(
        self, request: api_pb2.Empty, context: _Context
    ) -> api_pb2.DevicePluginOptions:
        return api_pb2.DevicePluginOptions(
            pre_start_required=False, get_preferred_allocation_available=True
        )

    async def ListAndWatch(
        self, request: api_pb2.Empty, context: _Context
    ) -> AsyncIterator[api_pb2.ListAndWatchResponse]:
        version = 0
        while True:
            version = await self._devices.changed(version)
            yield api_pb2.ListAndWatchResponse(devices=[_device(d) for d in self.listed()])

    async def GetPreferredAllocation(
        self, request: api_pb2.PreferredAllocationRequest, context: _Context
    ) -> api_pb2.PreferredAllocationResponse:
        pods, gpus = self._ledger.pods(), self._devices.current()
        answers = [
            api_pb2.ContainerPreferredAllocationResponse(
                deviceIDs=preferred_mig(
                    pods,
                    gpus,
                    self.profile,
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
                    granted = await until_seen(
                        partial(self._grant, list(ask.devices_ids)),
                        seen=lambda g: g.pod is not None,
                        wait_s=self._wait_s,
                        poll_s=self._poll_s,
                    )
                except AllocationError as error:
                    log.warning("MIG allocation refused", extra={"reason": str(error)})
                    await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(error))
                if granted.pod is None:
                    log.warning(
                        "MIG devices allocated to an unseen pod",
                        extra={"uuids": ",".join(granted.uuids)},
                    )
                else:
                    try:
                        await self._ledger.record(granted.pod, granted.uuids, granted.container)
                    except Exception as error:  # noqa: BLE001 - any failure refuses the RPC
                        message = f"could not record MIG devices on pod {granted.pod.key}: {error}"
                        log.warning("MIG allocation not recorded", extra={"reason": message})
                        await context.abort(grpc.StatusCode.UNAVAILABLE, message)
                    log.info(
                        "MIG devices allocated",
                        extra={
                            "pod": granted.pod.key,
                            "container": granted.container,
                            "uuids": ",".join(granted.uuids),
                        },
                    )
                answers.append(self._answer(self._devices.current(), granted.uuids))
        return api_pb2.AllocateResponse(container_responses=answers)

    def _grant(self, requested: Sequence[str]) -> Grant:
        return grant_mig(self._ledger.pods(), self._devices.current(), self.profile, requested)

    async def PreStartContainer(
        self, request: api_pb2.PreStartContainerRequest, context: _Context
    ) -> api_pb2.PreStartContainerResponse:
        return api_pb2.PreStartContainerResponse()

    def _answer(
        self, gpus: Sequence[Gpu], uuids: tuple[str, ...]
    ) -> api_pb2.ContainerAllocateResponse:
        found = {mig.uuid: (gpu, mig) for gpu in gpus for mig in gpu.migs}
        visible = ",".join(uuids)
        # The parent GPUs' nodes, the devices' capability nodes where known (else the NVIDIA
        # container runtime adds them from NVIDIA_VISIBLE_DEVICES), and the control nodes.
        parents = dict.fromkeys(found[u][0].device_node for u in uuids if u in found)
        caps = dict.fromkeys(
            node
            for u in uuids
            if u in found
            for node in mig_capability_nodes(*found[u], self._caps)
        )
        return api_pb2.ContainerAllocateResponse(
            envs=dict.fromkeys(self._env_names, visible),
            devices=[
                api_pb2.DeviceSpec(
                    container_path=f"/dev/{name}",
                    host_path=f"{self._dev_root}/{name}",
                    permissions="rw",
                )
                for name in (*parents, *caps, *self._control_devices)
            ],
            annotations={GPU_ALLOCATED: visible},
        )


def _device(device: MigDevice) -> api_pb2.Device:
    topology = (
        api_pb2.TopologyInfo(nodes=[api_pb2.NUMANode(ID=device.numa_node)])
        if device.numa_node is not None
        else None
    )
    return api_pb2.Device(
        ID=device.uuid, health=HEALTHY if device.healthy else UNHEALTHY, topology=topology
    )


def mig_endpoint(whole: Endpoint, profile: str) -> Endpoint:
    """Where the plugin of ``profile`` listens: beside the whole-GPU plugin's socket."""
    return dataclasses.replace(
        whole, socket_name=f"schedext-mig-{profile}.sock", resource_name=resource_name(profile)
    )


def mig_plugins(
    devices: Devices,
    ledger: PodLedger,
    whole: Endpoint,
    *,
    caps: Mapping[str, int] | None = None,
    wait_s: float = 5.0,
) -> list[tuple[MigPlugin, Endpoint]]:
    """A plugin and its endpoint per MIG profile this node's GPUs have now; ``caps``: the
    driver's capability minors (:func:`read_mig_minors`); ``wait_s`` as :class:`MigPlugin`."""
    profiles = sorted({d.profile for d in mig_devices(devices.current())})
    lock = asyncio.Lock()
    return [
        (
            MigPlugin(profile, devices, ledger, lock=lock, caps=caps, wait_s=wait_s),
            mig_endpoint(whole, profile),
        )
        for profile in profiles
    ]


def read_mig_minors(path: Path) -> dict[str, int]:
    """The driver's MIG capability minors (``/proc/driver/nvidia-caps/mig-minors``); empty,
    with one log line, where it cannot be read (no MIG support in this driver, or not
    mounted): the container runtime then adds the capability nodes itself."""
    try:
        return parse_mig_minors(path.read_text(errors="replace"))
    except OSError as error:
        log.info(
            "MIG capability minors not read; the container runtime adds those nodes",
            extra={"path": str(path), "reason": error.strerror or type(error).__name__},
        )
        return {}
