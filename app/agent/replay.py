"""An :class:`~app.agent.nvml.Nvml` that answers from a recording of a real node's NVML.

Tests (and ``schedext agent --nvml-replay FILE`` on a machine without GPUs) drive the same
reader code as the real binding, with the answers a real driver gave, "Not Supported" codes
and bytes included, rather than the answers someone expected.

The file is what ``python -m app.agent.record`` (or the reference ``record.py``) writes::

    {"calls": [{"call": "nvmlDeviceGetName", "args": [], "ok": "NVIDIA H100 80GB HBM3"},
               {"call": "nvmlDeviceGetNumaNodeId", "args": [], "error": "Not Supported",
                "code": 3}, ...]}

An entry is answered for the call of that name with those ``args`` (the non-handle
arguments, as the recorder keeps them); ``ok`` is returned, ``error``/``code`` raised as
:class:`NvmlError`. Which GPU an entry is for:

- ``"device": i`` on the entry, when present (hand-built multi-GPU fixtures);
- else its place: the calls for device i form the i-th block, each starting at
  ``nvmlDeviceGetName`` (entries before the first block are the system's);
- for the pairwise calls (``nvmlDeviceGetP2PStatus.nvlink``,
  ``nvmlDeviceGetTopologyCommonAncestor``) the other GPU is ``"peer": j``, or else, as the
  recorder loops, the k-th such entry of device i is for the k-th index other than i.

When the same call is listed twice for the same GPU and arguments, the later entry wins, so
a fault can be injected by appending an entry. Two entries of our own drive the rest:

- ``{"call": "lost", "device": 3}``: every call on GPU 3 raises GPU_IS_LOST (15), and an
  XID wait on a set that watches it too;
- ``{"call": "xid", "device": 3, "ok": 79}``: an XID event for the next ``xid_wait``. The
  file's ``xid`` entries are a log: each is delivered once, so append to deliver another.

The file is read again whenever it changes on disk (checked by inode, size and mtime at
every call, a ``stat``): a test drives a separate agent process by rewriting the file,
best atomically (write a temporary file, then rename it over). A half-written file that does
not parse is ignored until it does.

The same faults can be set in-process, layered over the file and kept across reloads:
:meth:`ReplayBackend.mark_lost`, :meth:`~ReplayBackend.set_ecc`,
:meth:`~ReplayBackend.set_retired_pages_pending`, :meth:`~ReplayBackend.set_use`,
:meth:`~ReplayBackend.queue_xid`, and :meth:`~ReplayBackend.set_answer` for any call.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app.agent.nvml import (
    ERROR_FUNCTION_NOT_FOUND,
    ERROR_GPU_IS_LOST,
    ERROR_INVALID_ARGUMENT,
    ERROR_TIMEOUT,
    ERROR_UNINITIALIZED,
    ERROR_UNKNOWN,
    EVENT_TYPE_XID_CRITICAL,
    FEATURE_ENABLED,
    MEMORY_ERROR_UNCORRECTED,
    MIB,
    P2P_CAPS_NVLINK,
    VOLATILE_ECC,
    Memory,
    Nvml,
    NvmlError,
)

__all__ = ["ReplayBackend"]

# The recorder's call names, the ones this backend answers.
DRIVER = "nvmlSystemGetDriverVersion"
COUNT = "nvmlDeviceGetCount"
NAME = "nvmlDeviceGetName"
UUID = "nvmlDeviceGetUUID"
MEMORY = "nvmlDeviceGetMemoryInfo"
PCI = "nvmlDeviceGetPciInfo"
NUMA = "nvmlDeviceGetNumaNodeId"
MINOR = "nvmlDeviceGetMinorNumber"
MIG = "nvmlDeviceGetMigMode"
MIG_COUNT = "nvmlDeviceGetMaxMigDeviceCount"
# Calls on a MIG device's handle, by its index on the GPU (the entry's one argument).
MIG_UUID = "nvmlDeviceGetMigDeviceHandleByIndex.uuid"
MIG_NAME = "nvmlDeviceGetMigDeviceHandleByIndex.name"
MIG_GI = "nvmlDeviceGetMigDeviceHandleByIndex.gpuInstanceId"
MIG_CI = "nvmlDeviceGetMigDeviceHandleByIndex.computeInstanceId"
UTILISATION = "nvmlDeviceGetUtilizationRates"
ECC = "nvmlDeviceGetTotalEccErrors.uncorrected.volatile"
RETIRED = "nvmlDeviceGetRetiredPagesPendingStatus"
NVLINK_STATE = "nvmlDeviceGetNvLinkState"
NVLINK_REMOTE = "nvmlDeviceGetNvLinkRemotePciInfo"
P2P = "nvmlDeviceGetP2PStatus.nvlink"
ANCESTOR = "nvmlDeviceGetTopologyCommonAncestor"
REGISTER = "nvmlDeviceRegisterEvents.xid"
WAIT = "nvmlEventSetWait_v2.100ms"
LOST = "lost"
XID = "xid"

_PAIRWISE = (P2P, ANCESTOR)
_ECC_ARGS = (MEMORY_ERROR_UNCORRECTED, VOLATILE_ECC)
_POLL_S = 0.05  # how often a waiting xid_wait looks at the file for new events

_Key = tuple[int | None, str, tuple[Any, ...], int | None]  # device, call, args, peer


@dataclass(slots=True)
class _Recording:
    answers: dict[_Key, Mapping[str, Any]] = field(default_factory=dict)
    lost: set[int] = field(default_factory=set)
    xids: list[tuple[int, int]] = field(default_factory=list)
    wait: Mapping[str, Any] | None = None  # what a wait with nothing pending answers


def _parse(document: object) -> _Recording:
    entries = document.get("calls") if isinstance(document, Mapping) else document
    if not isinstance(entries, list):
        raise ValueError('expected {"calls": [...]}')
    recording = _Recording()
    block: int | None = None
    pairwise_seen: dict[tuple[int | None, str], int] = {}
    for entry in entries:
        if not isinstance(entry, Mapping) or not isinstance(entry.get("call"), str):
            raise ValueError(f"not a call entry: {entry!r}")
        call: str = entry["call"]
        if "device" not in entry and call == NAME:
            block = 0 if block is None else block + 1
        device = int(entry["device"]) if "device" in entry else block
        if call == LOST:
            if device is not None:
                recording.lost.add(device)
            continue
        if call == XID:
            if device is not None:
                recording.xids.append((device, int(entry["ok"])))
            continue
        if call.startswith("nvmlEventSetWait"):
            recording.wait = entry
            continue
        peer = _peer(entry, device, pairwise_seen) if call in _PAIRWISE else None
        args = tuple(entry.get("args", ()))
        recording.answers[device, call, args, peer] = entry
    return recording


def _peer(
    entry: Mapping[str, Any], device: int | None, seen: dict[tuple[int | None, str], int]
) -> int:
    if "peer" in entry:
        return int(entry["peer"])
    # The recorder asks device i about every j != i, in order: the k-th is j = k or k + 1.
    k = seen.get((device, entry["call"]), 0)
    seen[device, entry["call"]] = k + 1
    return k if device is None or k < device else k + 1


def _answer(entry: Mapping[str, Any], what: str) -> Any:
    if "ok" in entry:
        return entry["ok"]
    if entry.get("missing"):
        raise NvmlError(ERROR_FUNCTION_NOT_FOUND, f"{what}: the recorder's pynvml lacked it")
    if "exception" in entry:
        raise NvmlError(ERROR_UNKNOWN, f"{what}: {entry['exception']}")
    code = entry.get("code")
    raise NvmlError(code if isinstance(code, int) else ERROR_UNKNOWN, str(entry.get("error", "")))


class ReplayBackend:
    """NVML's answers from a recording file (``path``) or an in-memory list of entries
    (``calls``, for tests that build a node by hand)."""

    def __init__(
        self, path: str | Path | None = None, *, calls: Sequence[Mapping[str, Any]] = ()
    ) -> None:
        if (path is None) == (not calls):
            raise ValueError("give a recording file or a list of calls, not both")
        self._path = Path(path) if path is not None else None
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)  # an XID queued, a GPU lost
        self._stamp: tuple[int, int, int] | None = None
        self._recording = _Recording()
        self._file_xids_seen = 0
        self._overrides: dict[_Key, Mapping[str, Any]] = {}
        self._wait_override: Mapping[str, Any] | None = None
        self._lost: set[int] = set()  # by mark_lost; the file's own are the recording's
        self._xids: deque[tuple[int, int]] = deque()
        self._watched: set[int] | None = None  # None: no event set open
        self._closed = False
        if self._path is not None:
            self._reload()
            if self._stamp is None:
                raise ValueError(f"{self._path}: not a readable recording")
        else:
            self._load(_parse(list(calls)))

    def __enter__(self) -> ReplayBackend:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    # ---------------------------------------------------------------- faults, for tests

    def mark_lost(self, index: int, lost: bool = True) -> None:
        """Every call on GPU ``index`` raises GPU_IS_LOST, as after it fell off the bus
        (``lost=False`` brings it back, as a reset would)."""
        with self._changed:
            if lost:
                self._lost.add(index)
            else:
                self._lost.discard(index)
            self._changed.notify_all()

    def set_ecc(self, index: int, uncorrected: int) -> None:
        """The GPU's volatile uncorrectable ECC error count."""
        self.set_answer(ECC, device=index, args=_ECC_ARGS, ok=uncorrected)

    def set_retired_pages_pending(self, index: int, pending: bool) -> None:
        self.set_answer(RETIRED, device=index, ok=FEATURE_ENABLED if pending else 0)

    def set_use(self, index: int, utilisation: int, memory_used_mib: int) -> None:
        """The GPU's utilisation (%) and memory in use (MiB; NVML's answer is in bytes, the
        recorded total kept)."""
        with self._lock:
            self._reload()
            recorded = _answer(self._lookup(index, MEMORY, (), None, check_lost=False), MEMORY)
        total = int(recorded["total"])
        used = memory_used_mib * MIB
        self.set_answer(UTILISATION, device=index, ok={"gpu": utilisation, "memory": 0})
        self.set_answer(
            MEMORY, device=index, ok={"total": total, "free": total - used, "used": used}
        )

    def queue_xid(self, index: int, xid: int) -> None:
        """An XID event on GPU ``index`` for the next :meth:`xid_wait` watching it."""
        with self._changed:
            self._xids.append((index, xid))
            self._changed.notify_all()

    def set_answer(
        self,
        call: str,
        *,
        device: int | None,
        args: Sequence[Any] = (),
        peer: int | None = None,
        ok: Any = None,
        error: tuple[int, str] | None = None,
    ) -> None:
        """Answer ``call`` (a recorder's call name) with ``ok``, or fail it with ``error``
        (code, message). For the event wait, ``device`` is ignored, and an error other than
        a timeout is raised at once by every wait (an event set gone bad)."""
        entry: dict[str, Any] = {"call": call, "ok": ok}
        if error is not None:
            entry = {"call": call, "code": error[0], "error": error[1]}
        with self._changed:
            if call.startswith("nvmlEventSetWait"):
                self._wait_override = entry
            else:
                self._overrides[device, call, tuple(args), peer] = entry
            self._changed.notify_all()

    # -------------------------------------------------------------------- the interface

    def driver_version(self) -> str:
        return str(self._ask(None, DRIVER))

    def device_count(self) -> int:
        return int(self._ask(None, COUNT))

    def name(self, index: int) -> str:
        return str(self._ask(index, NAME))

    def uuid(self, index: int) -> str:
        return str(self._ask(index, UUID))

    def memory(self, index: int) -> Memory:
        info = self._ask(index, MEMORY)
        return Memory(total=int(info["total"]), used=int(info["used"]))

    def pci_bus_id(self, index: int) -> str:
        return str(self._ask(index, PCI)["busId"])

    def numa_node(self, index: int) -> int:
        return int(self._ask(index, NUMA))

    def minor_number(self, index: int) -> int:
        return int(self._ask(index, MINOR))

    def mig_mode(self, index: int) -> tuple[int, int]:
        current, pending = self._ask(index, MIG)
        return int(current), int(pending)

    def mig_device_count(self, index: int) -> int:
        return int(self._ask(index, MIG_COUNT))

    def mig_uuid(self, index: int, mig: int) -> str:
        return str(self._ask(index, MIG_UUID, (mig,)))

    def mig_name(self, index: int, mig: int) -> str:
        return str(self._ask(index, MIG_NAME, (mig,)))

    def mig_gpu_instance_id(self, index: int, mig: int) -> int:
        return int(self._ask(index, MIG_GI, (mig,)))

    def mig_compute_instance_id(self, index: int, mig: int) -> int:
        return int(self._ask(index, MIG_CI, (mig,)))

    def utilisation(self, index: int) -> int:
        return int(self._ask(index, UTILISATION)["gpu"])

    def ecc_uncorrected(self, index: int) -> int:
        return int(self._ask(index, ECC, _ECC_ARGS))

    def retired_pages_pending(self, index: int) -> int:
        return int(self._ask(index, RETIRED))

    def nvlink_state(self, index: int, link: int) -> int:
        return int(self._ask(index, NVLINK_STATE, (link,)))

    def nvlink_remote_bus_id(self, index: int, link: int) -> str:
        return str(self._ask(index, NVLINK_REMOTE, (link,))["busId"])

    def p2p_nvlink_status(self, index: int, peer: int) -> int:
        with self._lock:
            if self._is_lost(peer):
                raise NvmlError(ERROR_GPU_IS_LOST, "GPU is lost")
            return int(self._ask(index, P2P, (P2P_CAPS_NVLINK,), peer))

    def xid_open(self) -> None:
        with self._lock:
            self._check_open()
            self._watched = set()

    def xid_register(self, index: int) -> None:
        with self._lock:
            self._ask(index, REGISTER, (EVENT_TYPE_XID_CRITICAL,))
            if self._watched is None:
                raise NvmlError(ERROR_INVALID_ARGUMENT, "no XID event set is open")
            self._watched.add(index)

    def xid_wait(self, timeout_ms: int) -> tuple[int, int]:
        deadline = time.monotonic() + timeout_ms / 1000
        with self._changed:
            while True:
                self._check_open()
                self._reload()
                watched = self._watched
                if watched is None:
                    raise NvmlError(ERROR_INVALID_ARGUMENT, "no XID event set is open")
                if any(self._is_lost(index) for index in watched):
                    raise NvmlError(ERROR_GPU_IS_LOST, "GPU is lost")
                quiet = self._wait_override or self._recording.wait
                quiet = quiet or {"error": "Timeout", "code": ERROR_TIMEOUT}
                if quiet.get("code") != ERROR_TIMEOUT:
                    index, xid = _answer(quiet, WAIT)  # an error, unless a test set an event
                    return int(index), int(xid)
                for event in self._xids:
                    if event[0] in watched:
                        self._xids.remove(event)
                        return event
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    _answer(quiet, WAIT)
                # Wakes at once for an in-process fault; a file is looked at every _POLL_S.
                self._changed.wait(min(remaining, _POLL_S) if self._path else remaining)

    def xid_close(self) -> None:
        with self._lock:
            self._watched = None

    def close(self) -> None:
        with self._changed:
            self._closed = True
            self._watched = None
            self._changed.notify_all()

    # ------------------------------------------------------------------------ the parts

    def _ask(
        self, device: int | None, call: str, args: tuple[Any, ...] = (), peer: int | None = None
    ) -> Any:
        with self._lock:
            self._check_open()
            self._reload()
            return _answer(self._lookup(device, call, args, peer), call)

    def _lookup(
        self,
        device: int | None,
        call: str,
        args: tuple[Any, ...],
        peer: int | None,
        *,
        check_lost: bool = True,
    ) -> Mapping[str, Any]:
        if device is not None and check_lost and self._is_lost(device):
            raise NvmlError(ERROR_GPU_IS_LOST, "GPU is lost")
        key = (device, call, args, peer)
        entry = self._overrides.get(key) or self._recording.answers.get(key)
        if entry is None:
            raise NvmlError(
                ERROR_FUNCTION_NOT_FOUND,
                f"{call}{list(args)} for device {device} is not in the recording",
            )
        return entry

    def _check_open(self) -> None:
        if self._closed:
            raise NvmlError(ERROR_UNINITIALIZED, "Uninitialized")

    def _reload(self) -> None:
        """Read the file again if it changed; keep the last good recording if it does not
        parse (a rewrite caught halfway)."""
        if self._path is None:
            return
        try:
            status = os.stat(self._path)
        except OSError:
            return  # between a delete and a rename: the next call looks again
        stamp = (status.st_ino, status.st_size, status.st_mtime_ns)
        if stamp == self._stamp:
            return
        try:
            recording = _parse(json.loads(self._path.read_text()))
        except (OSError, ValueError, TypeError, KeyError):
            return
        self._stamp = stamp
        self._load(recording)

    def _load(self, recording: _Recording) -> None:
        with self._changed:
            self._recording = recording
            self._xids.extend(recording.xids[self._file_xids_seen :])
            self._file_xids_seen = len(recording.xids)
            self._changed.notify_all()

    def _is_lost(self, index: int) -> bool:
        return index in self._lost or index in self._recording.lost


if TYPE_CHECKING:
    _IS_NVML: type[Nvml] = ReplayBackend  # mypy holds the replay to the interface
