"""The real :class:`~app.agent.nvml.Nvml`: NVIDIA's own binding (``nvidia-ml-py``).

Kept apart from the interface so that importing the interface, the reader or the replay never
loads ``libnvidia-ml``; only the agent's start on a GPU node imports this module. It is a thin
translation, one NVML call per method, with ``pynvml``'s errors turned into ours: every
decision lives in the reader, where the replayed recordings test it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import pynvml

from app.agent.nvml import (
    EVENT_TYPE_XID_CRITICAL,
    MEMORY_ERROR_UNCORRECTED,
    P2P_CAPS_NVLINK,
    VOLATILE_ECC,
    Memory,
    Nvml,
    NvmlError,
)

__all__ = ["PynvmlBackend"]

T = TypeVar("T")

_HINT = "is the NVIDIA driver installed and the container run with the nvidia runtime?"


def _call(function: Callable[..., T], *args: Any) -> T:
    try:
        return function(*args)
    except pynvml.NVMLError as error:
        raise NvmlError(_code(error), str(error)) from None


def _code(error: Exception) -> int:
    code = getattr(error, "value", None)
    return code if isinstance(code, int) else 999


def _text(value: object) -> str:
    # nvidia-ml-py 12+ decodes strings itself; older releases answered bytes.
    return value.decode() if isinstance(value, bytes) else str(value)


class PynvmlBackend:
    """NVML opened at construction (nvmlInit), closed by :meth:`close` (nvmlShutdown)."""

    def __init__(self) -> None:
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as error:
            raise NvmlError(_code(error), f"NVML could not start: {error}; {_HINT}") from None
        except OSError as error:  # the library found but not loadable (wrong architecture)
            raise NvmlError(12, f"NVML could not start: {error}; {_HINT}") from None
        self._handles: dict[int, Any] = {}
        self._lock = threading.Lock()  # guards the handle cache and the event set
        self._events: Any = None
        self._closed = False

    def __enter__(self) -> PynvmlBackend:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _handle(self, index: int) -> Any:
        with self._lock:
            handle = self._handles.get(index)
        if handle is None:
            handle = _call(pynvml.nvmlDeviceGetHandleByIndex, index)
            with self._lock:
                self._handles[index] = handle
        return handle

    def driver_version(self) -> str:
        return _text(_call(pynvml.nvmlSystemGetDriverVersion))

    def device_count(self) -> int:
        return int(_call(pynvml.nvmlDeviceGetCount))

    def name(self, index: int) -> str:
        return _text(_call(pynvml.nvmlDeviceGetName, self._handle(index)))

    def uuid(self, index: int) -> str:
        return _text(_call(pynvml.nvmlDeviceGetUUID, self._handle(index)))

    def memory(self, index: int) -> Memory:
        info = _call(pynvml.nvmlDeviceGetMemoryInfo, self._handle(index))
        return Memory(total=int(info.total), used=int(info.used))

    def pci_bus_id(self, index: int) -> str:
        return _text(_call(pynvml.nvmlDeviceGetPciInfo, self._handle(index)).busId)

    def numa_node(self, index: int) -> int:
        return int(_call(pynvml.nvmlDeviceGetNumaNodeId, self._handle(index)))

    def minor_number(self, index: int) -> int:
        return int(_call(pynvml.nvmlDeviceGetMinorNumber, self._handle(index)))

    def mig_mode(self, index: int) -> tuple[int, int]:
        current, pending = _call(pynvml.nvmlDeviceGetMigMode, self._handle(index))
        return int(current), int(pending)

    def mig_device_count(self, index: int) -> int:
        return int(_call(pynvml.nvmlDeviceGetMaxMigDeviceCount, self._handle(index)))

    def mig_uuid(self, index: int, mig: int) -> str:
        return _text(_call(pynvml.nvmlDeviceGetUUID, self._mig_handle(index, mig)))

    def mig_name(self, index: int, mig: int) -> str:
        return _text(_call(pynvml.nvmlDeviceGetName, self._mig_handle(index, mig)))

    def mig_gpu_instance_id(self, index: int, mig: int) -> int:
        return int(_call(pynvml.nvmlDeviceGetGpuInstanceId, self._mig_handle(index, mig)))

    def mig_compute_instance_id(self, index: int, mig: int) -> int:
        return int(_call(pynvml.nvmlDeviceGetComputeInstanceId, self._mig_handle(index, mig)))

    def _mig_handle(self, index: int, mig: int) -> Any:
        # Not cached: MIG devices come and go with the GPU's layout, and are read rarely.
        return _call(pynvml.nvmlDeviceGetMigDeviceHandleByIndex, self._handle(index), mig)

    def utilisation(self, index: int) -> int:
        return int(_call(pynvml.nvmlDeviceGetUtilizationRates, self._handle(index)).gpu)

    def ecc_uncorrected(self, index: int) -> int:
        handle = self._handle(index)
        return int(
            _call(
                pynvml.nvmlDeviceGetTotalEccErrors, handle, MEMORY_ERROR_UNCORRECTED, VOLATILE_ECC
            )
        )

    def retired_pages_pending(self, index: int) -> int:
        return int(_call(pynvml.nvmlDeviceGetRetiredPagesPendingStatus, self._handle(index)))

    def nvlink_state(self, index: int, link: int) -> int:
        return int(_call(pynvml.nvmlDeviceGetNvLinkState, self._handle(index), link))

    def nvlink_remote_bus_id(self, index: int, link: int) -> str:
        info = _call(pynvml.nvmlDeviceGetNvLinkRemotePciInfo, self._handle(index), link)
        return _text(info.busId)

    def p2p_nvlink_status(self, index: int, peer: int) -> int:
        handles = self._handle(index), self._handle(peer)
        return int(_call(pynvml.nvmlDeviceGetP2PStatus, *handles, P2P_CAPS_NVLINK))

    def xid_open(self) -> None:
        self.xid_close()
        events = _call(pynvml.nvmlEventSetCreate)
        with self._lock:
            self._events = events

    def xid_register(self, index: int) -> None:
        handle = self._handle(index)
        _call(pynvml.nvmlDeviceRegisterEvents, handle, EVENT_TYPE_XID_CRITICAL, self._open_set())

    def xid_wait(self, timeout_ms: int) -> tuple[int, int]:
        # ctypes lets go of the GIL for the wait, so the main loop keeps reading meanwhile.
        data = _call(pynvml.nvmlEventSetWait_v2, self._open_set(), timeout_ms)
        index = int(_call(pynvml.nvmlDeviceGetIndex, data.device))
        return index, int(data.eventData)

    def xid_close(self) -> None:
        with self._lock:
            events, self._events = self._events, None
        if events is not None:
            _call(pynvml.nvmlEventSetFree, events)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self.xid_close()
        finally:
            _call(pynvml.nvmlShutdown)

    def _open_set(self) -> Any:
        with self._lock:
            events = self._events
        if events is None:
            raise NvmlError(2, "no XID event set is open (call xid_open first)")
        return events


if TYPE_CHECKING:
    _IS_NVML: type[Nvml] = PynvmlBackend  # mypy holds the binding to the interface
