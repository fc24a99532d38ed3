"""MIG devices: one resource per MIG profile on this node, ``nvidia.com/mig-<profile>``
(NVIDIA's "mixed" strategy names), each served by its own servicer on its own socket.

Each lists its profile's MIG devices by UUID, healthy when their GPU is, and gives a container
its part of the MIG devices schedext chose for its pod (``schedext.io/mig-uuids``; init and
sidecar containers as :mod:`extender.devices.containers` says): ``NVIDIA_VISIBLE_DEVICES``
names them, and the answer carries their GPU's node (``/dev/nvidia<minor>``) and their
capability nodes (``/dev/nvidia-caps/nvidia-cap<N>``, from the driver's ``mig-minors``:
:mod:`extender.devices.device_nodes`) where those are known. Every decision is the core's
(:mod:`extender.devices.mig_allocation`). The profiles are read at start: a GPU's MIG layout
is changed by an administrator (``nvidia-smi mig``, NVIDIA's MIG manager) with its pods
drained, and the agent restarted; schedext never changes it.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path

from app.agent.deviceplugin.v1beta1 import api_pb2
from app.agent.ports import Devices
from app.agent.registration import Endpoint
from app.agent.servicer import DEFAULT_ANSWERS, Answers, listed_device
from extender.devices.allocation import Grant, NodePod
from extender.devices.device_nodes import mig_capability_nodes, parse_mig_minors
from extender.devices.mig_allocation import grant_mig, mig_devices, preferred_mig
from extender.devices.mig_slices import resource_name

__all__ = ["MigAllocator", "mig_allocators", "mig_endpoint", "read_mig_minors"]

log = logging.getLogger("schedext.agent.mig")


class MigAllocator:
    """The MIG devices of one profile. ``caps``: the driver's capability minors
    (:func:`read_mig_minors`)."""

    def __init__(
        self,
        profile: str,
        devices: Devices,
        *,
        caps: Mapping[str, int] | None = None,
        answers: Answers = DEFAULT_ANSWERS,
    ) -> None:
        self.profile, self.devices, self.resource = profile, devices, resource_name(profile)
        self._caps, self._answers = dict(caps or {}), answers

    def listed(self) -> list[api_pb2.Device]:
        """This profile's MIG devices, healthy when their GPU is."""
        return [
            listed_device(d.uuid, d.healthy, d.numa_node)
            for d in mig_devices(self.devices.current())
            if d.profile == self.profile
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
        return preferred_mig(
            pods, gpus, self.profile, available=available, must_include=must_include, size=size
        )

    def grant(self, pods: Sequence[NodePod], requested: Sequence[str]) -> Grant:
        return grant_mig(pods, self.devices.current(), self.profile, requested)

    def answer(self, granted: Grant) -> api_pb2.ContainerAllocateResponse:
        gpus = self.devices.current()
        found = {mig.uuid: (gpu, mig) for gpu in gpus for mig in gpu.migs}
        on = [found[u] for u in granted.uuids if u in found]
        # The parent GPUs' nodes, then the devices' capability nodes where known (else the
        # NVIDIA container runtime adds them from NVIDIA_VISIBLE_DEVICES).
        parents = [gpu.device_node for gpu, _ in on]
        caps = [node for gpu, mig in on for node in mig_capability_nodes(gpu, mig, self._caps)]
        return self._answers.answer(granted.uuids, [*parents, *caps])


def mig_allocators(
    devices: Devices, *, caps: Mapping[str, int] | None = None
) -> list[MigAllocator]:
    """An allocator per MIG profile this node's GPUs have now."""
    profiles = sorted({d.profile for d in mig_devices(devices.current())})
    return [MigAllocator(profile, devices, caps=caps) for profile in profiles]


def mig_endpoint(whole: Endpoint, profile: str) -> Endpoint:
    """Where the plugin of ``profile`` listens: beside the whole-GPU plugin's socket."""
    return dataclasses.replace(
        whole, socket_name=f"schedext-mig-{profile}.sock", resource_name=resource_name(profile)
    )


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
