"""A thread that waits for critical XID events on the node's GPUs and reports each fault.

Health read by polling (ECC counts, a lost GPU) is seen at the next read; an XID is an event,
gone unless someone waits for it, so one thread waits in NVML all the time. The wait is
bounded (``wait_ms``), a timeout being NVML's normal "nothing happened", so that
:meth:`XidWatch.stop` ends the thread within about one wait. The thread never dies quietly:
an unexpected error is logged and the watch starts over after a growing pause, and a
callback that raises is logged and the watch goes on.

When the wait answers GPU_IS_LOST the watch asks each watched GPU which one is gone, reports
it as lost, and watches the others on a fresh event set (a set that holds a lost GPU may go
on failing every wait).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from app.agent.discovery import LOST
from app.agent.nvml import ERROR_GPU_IS_LOST, ERROR_TIMEOUT, Nvml, NvmlError
from extender.devices.gpus import GpuHealth
from extender.devices.xids import xid_health

__all__ = ["GpuFault", "XidWatch"]

log = logging.getLogger("schedext.agent.xid")


@dataclass(frozen=True, slots=True)
class GpuFault:
    """GPU ``index`` became unfit: after XID ``xid``, or lost when ``xid`` is None."""

    index: int
    xid: int | None
    health: GpuHealth


class XidWatch:
    """Watches GPUs ``indices`` through ``nvml`` and calls ``on_fault`` (from the watch's own
    thread) for each critical XID and each GPU lost; application XIDs are logged only."""

    def __init__(
        self,
        nvml: Nvml,
        indices: Sequence[int],
        on_fault: Callable[[GpuFault], None],
        *,
        wait_ms: int = 500,
        backoff_s: float = 0.5,
        max_backoff_s: float = 30.0,
    ) -> None:
        if wait_ms < 1 or backoff_s <= 0 or max_backoff_s < backoff_s:
            raise ValueError("wait_ms must be >= 1 and 0 < backoff_s <= max_backoff_s")
        self._nvml = nvml
        self._indices = tuple(indices)
        self._on_fault = on_fault
        self._wait_ms = wait_ms
        self._backoff_s = backoff_s
        self._max_backoff_s = max_backoff_s
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._lost: set[int] = set()
        self._watching = threading.Event()  # set once an event set is open and registered

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("the XID watch runs once")
        self._thread = threading.Thread(target=self._run, name="schedext-xid-watch", daemon=True)
        self._thread.start()

    def watching(self, timeout_s: float) -> bool:
        """Whether the watch has its event set open and waits on it (within ``timeout_s``):
        an event queued before that may find no one registered for it."""
        return self._watching.wait(timeout_s)

    def stop(self, timeout_s: float | None = None) -> bool:
        """Ask the thread to end and wait for it, at most ``timeout_s`` (by default a wait
        and a second); whether it ended."""
        self._stopping.set()
        thread = self._thread
        if thread is None:
            return True
        thread.join(self._wait_ms / 1000 + 1.0 if timeout_s is None else timeout_s)
        return not thread.is_alive()

    # ------------------------------------------------------------------------ the thread

    def _run(self) -> None:
        pause = self._backoff_s
        need_set = True
        try:
            while not self._stopping.is_set():
                try:
                    if need_set:
                        self._open()
                        need_set = False
                    self._wait_once()
                    pause = self._backoff_s
                except NvmlError as error:
                    if error.code == ERROR_GPU_IS_LOST:
                        self._find_lost()
                    else:
                        log.warning(
                            "XID watch: NVML failed, starting over",
                            extra={"error": str(error), "pause_s": pause},
                        )
                    need_set = True
                    self._watching.clear()
                    self._stopping.wait(pause)
                    pause = min(pause * 2, self._max_backoff_s)
                except Exception:  # never die quietly: the agent would stop seeing XIDs
                    log.exception("XID watch: unexpected failure, starting over")
                    need_set = True
                    self._watching.clear()
                    self._stopping.wait(pause)
                    pause = min(pause * 2, self._max_backoff_s)
        finally:
            self._close()

    def _open(self) -> None:
        self._nvml.xid_open()
        for index in self._indices:
            if index in self._lost:
                continue
            try:
                self._nvml.xid_register(index)
            except NvmlError as error:
                if error.code == ERROR_GPU_IS_LOST:
                    self._report(GpuFault(index, None, LOST), lost=True)
                else:  # Not Supported on very old GPUs: the polled health still covers it
                    log.warning(
                        "XID watch: GPU cannot be watched",
                        extra={"gpu": index, "error": str(error)},
                    )
        self._watching.set()

    def _wait_once(self) -> None:
        try:
            index, xid = self._nvml.xid_wait(self._wait_ms)
        except NvmlError as error:
            if error.code == ERROR_TIMEOUT:
                return
            raise
        health = xid_health(xid)
        if health is None:
            log.info("XID ignored: an application error", extra={"gpu": index, "xid": xid})
            return
        log.warning("GPU fault", extra={"gpu": index, "xid": xid, "reason": health.reason})
        self._report(GpuFault(index, xid, health))

    def _find_lost(self) -> None:
        found = False
        for index in self._indices:
            if index in self._lost:
                continue
            try:
                self._nvml.uuid(index)
            except NvmlError as error:
                if error.code == ERROR_GPU_IS_LOST:
                    found = True
                    self._report(GpuFault(index, None, LOST), lost=True)
        if not found:
            log.warning("XID watch: the event wait says a GPU is lost, but none answers so")

    def _report(self, fault: GpuFault, *, lost: bool = False) -> None:
        if lost:
            if fault.index in self._lost:
                return
            self._lost.add(fault.index)
            log.warning("GPU lost", extra={"gpu": fault.index})
        try:
            self._on_fault(fault)
        except Exception:
            log.exception("XID watch: the fault callback failed", extra={"gpu": fault.index})

    def _close(self) -> None:
        self._watching.clear()
        try:
            self._nvml.xid_close()
        except NvmlError as error:
            log.warning("XID watch: freeing the event set failed", extra={"error": str(error)})
