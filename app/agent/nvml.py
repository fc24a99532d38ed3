"""The one interface through which the agent asks NVML anything.

Everything in the agent reads GPUs through :class:`Nvml`, never through ``pynvml``: the real
binding (:mod:`app.agent.pynvml_backend`) and a replay of recorded answers
(:mod:`app.agent.replay`) then drive exactly the same reader code, so the tests that replay a
real H100's answers exercise what runs on the node. Each method is one NVML question, named
after the NVML call it makes, answering what NVML answers (raw codes and counts, memory in
bytes) and failing as NVML fails, with :class:`NvmlError` and NVML's code: the decisions
(what "Not Supported" means, which XID is critical) stay in the reader, once.

Importing this module loads no driver and needs no GPU.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, TypeVar

__all__ = [
    "ERROR_FUNCTION_NOT_FOUND",
    "ERROR_GPU_IS_LOST",
    "ERROR_INVALID_ARGUMENT",
    "ERROR_NOT_FOUND",
    "ERROR_NOT_SUPPORTED",
    "ERROR_TIMEOUT",
    "ERROR_UNINITIALIZED",
    "ERROR_UNKNOWN",
    "EVENT_TYPE_XID_CRITICAL",
    "FEATURE_ENABLED",
    "MEMORY_ERROR_UNCORRECTED",
    "MIB",
    "MIG_ENABLED",
    "NVLINK_LINKS",
    "P2P_CAPS_NVLINK",
    "P2P_STATUS_OK",
    "VOLATILE_ECC",
    "Memory",
    "Nvml",
    "NvmlError",
    "optional",
]

T = TypeVar("T")

# NVML's return codes (nvml.h), the ones the agent tells apart.
ERROR_UNINITIALIZED = 1
ERROR_INVALID_ARGUMENT = 2
ERROR_NOT_SUPPORTED = 3
ERROR_NOT_FOUND = 6  # a MIG device index with no MIG device configured there
ERROR_TIMEOUT = 10  # an event wait that saw nothing: the normal answer
ERROR_FUNCTION_NOT_FOUND = 13
ERROR_GPU_IS_LOST = 15  # fell off the bus, or otherwise gone until a reset
ERROR_UNKNOWN = 999

FEATURE_ENABLED = 1  # nvmlEnableState_t, as NvLinkState and RetiredPagesPending answer
MIG_ENABLED = 1  # NVML_DEVICE_MIG_ENABLE
P2P_CAPS_NVLINK = 2  # NVML_P2P_CAPS_INDEX_NVLINK
P2P_STATUS_OK = 0  # NVML_P2P_STATUS_OK
EVENT_TYPE_XID_CRITICAL = 0x8  # nvmlEventTypeXidCriticalError
MEMORY_ERROR_UNCORRECTED = 1  # NVML_MEMORY_ERROR_TYPE_UNCORRECTED
VOLATILE_ECC = 0  # NVML_VOLATILE_ECC: since the last driver load, what a reset clears
NVLINK_LINKS = 18  # links per GPU on Hopper and Blackwell (NVML_NVLINK_MAX_LINKS is larger)
MIB = 1024 * 1024


class NvmlError(Exception):
    """An NVML call failed: NVML's return code and its message ("Not Supported", 3)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"{message} (NVML code {code})")
        self.code = code
        self.message = message


def optional(ask: Callable[[], T]) -> T | None:
    """``ask()``'s answer, or None when NVML cannot tell ("Not Supported", or any other error
    on an optional fact); a lost GPU still raises, so the caller publishes it as lost rather
    than as a GPU with unknown facts."""
    try:
        return ask()
    except NvmlError as error:
        if error.code == ERROR_GPU_IS_LOST:
            raise
        return None


@dataclass(frozen=True, slots=True)
class Memory:
    """nvmlDeviceGetMemoryInfo, in bytes as NVML counts them."""

    total: int
    used: int


class Nvml(Protocol):
    """NVML's answers for this node's GPUs, by NVML index; every method may raise
    :class:`NvmlError`. Safe to call from two threads (NVML is), the XID watch blocking in
    :meth:`xid_wait` while the main loop reads."""

    def driver_version(self) -> str:
        """nvmlSystemGetDriverVersion: "580.159.04"."""
        ...

    def device_count(self) -> int:
        """nvmlDeviceGetCount."""
        ...

    def name(self, index: int) -> str:
        """nvmlDeviceGetName: "NVIDIA H100 80GB HBM3"."""
        ...

    def uuid(self, index: int) -> str:
        """nvmlDeviceGetUUID: "GPU-6bd689b3-...", what NVIDIA_VISIBLE_DEVICES takes."""
        ...

    def memory(self, index: int) -> Memory:
        """nvmlDeviceGetMemoryInfo (bytes)."""
        ...

    def pci_bus_id(self, index: int) -> str:
        """nvmlDeviceGetPciInfo().busId: "00000000:00:06.0"."""
        ...

    def numa_node(self, index: int) -> int:
        """nvmlDeviceGetNumaNodeId; Not Supported on many VMs."""
        ...

    def minor_number(self, index: int) -> int:
        """nvmlDeviceGetMinorNumber: N of the GPU's device node ``/dev/nvidiaN``. Not its
        index: NVML orders GPUs by PCI bus, the driver numbers device nodes as it probes
        them, and on many machines the two differ."""
        ...

    def mig_mode(self, index: int) -> tuple[int, int]:
        """nvmlDeviceGetMigMode: (current, pending), each MIG_ENABLED or not; Not Supported
        on GPUs without MIG."""
        ...

    def mig_device_count(self, index: int) -> int:
        """nvmlDeviceGetMaxMigDeviceCount: how many MIG device indices a GPU in MIG mode has
        (7 on an H100), configured or not; 0 with MIG off."""
        ...

    def mig_uuid(self, index: int, mig: int) -> str:
        """nvmlDeviceGetUUID of nvmlDeviceGetMigDeviceHandleByIndex(index, mig): "MIG-...";
        ERROR_NOT_FOUND where no MIG device is configured at that index."""
        ...

    def mig_name(self, index: int, mig: int) -> str:
        """nvmlDeviceGetName of the same MIG device: "NVIDIA H100 80GB HBM3 MIG 1g.10gb",
        its GPU's name and its profile."""
        ...

    def mig_gpu_instance_id(self, index: int, mig: int) -> int:
        """nvmlDeviceGetGpuInstanceId of the same MIG device: its GPU instance, which names
        its capability ``gpu<minor>/gi<id>/access`` (a ``/dev/nvidia-caps`` node)."""
        ...

    def mig_compute_instance_id(self, index: int, mig: int) -> int:
        """nvmlDeviceGetComputeInstanceId of the same MIG device: its compute instance inside
        that GPU instance (``gpu<minor>/gi<gi>/ci<id>/access``)."""
        ...

    def utilisation(self, index: int) -> int:
        """nvmlDeviceGetUtilizationRates().gpu: percent of the last sample period a kernel
        ran; Not Supported with MIG on."""
        ...

    def ecc_uncorrected(self, index: int) -> int:
        """nvmlDeviceGetTotalEccErrors(UNCORRECTED, VOLATILE): uncorrectable ECC errors since
        the driver loaded."""
        ...

    def retired_pages_pending(self, index: int) -> int:
        """nvmlDeviceGetRetiredPagesPendingStatus: FEATURE_ENABLED when retired pages wait
        for a reset (GPUs with row remapping answer Not Supported)."""
        ...

    def nvlink_state(self, index: int, link: int) -> int:
        """nvmlDeviceGetNvLinkState: FEATURE_ENABLED when the link is active."""
        ...

    def nvlink_remote_bus_id(self, index: int, link: int) -> str:
        """nvmlDeviceGetNvLinkRemotePciInfo().busId: what the link's far end is (a GPU, or
        an NVSwitch)."""
        ...

    def p2p_nvlink_status(self, index: int, peer: int) -> int:
        """nvmlDeviceGetP2PStatus(index, peer, P2P_CAPS_NVLINK): P2P_STATUS_OK when the two
        GPUs reach each other over NVLink (through NVSwitches too)."""
        ...

    def xid_open(self) -> None:
        """nvmlEventSetCreate: a fresh event set for XID events, freeing any earlier one."""
        ...

    def xid_register(self, index: int) -> None:
        """nvmlDeviceRegisterEvents(index, EVENT_TYPE_XID_CRITICAL, the open set)."""
        ...

    def xid_wait(self, timeout_ms: int) -> tuple[int, int]:
        """nvmlEventSetWait_v2: ``(GPU index, XID)`` of the next event; NvmlError with
        ERROR_TIMEOUT when none came within ``timeout_ms``."""
        ...

    def xid_close(self) -> None:
        """nvmlEventSetFree of the open set, if any."""
        ...

    def close(self) -> None:
        """nvmlShutdown; nothing may be asked afterwards."""
        ...
