"""CUDA MPS control daemons, one per GPU, run by the agent when ``SCHEDEXT_AGENT_MPS`` is on:
what makes a share's limits (``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``,
``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``) bind. docs/gpu-sharing.md, "GPU shares on the node",
has the isolation model: what MPS enforces and what it does not.

One daemon per GPU rather than one for the node: a GPU's clients then share a server with
that GPU's clients only, and a daemon that fails takes one GPU's shares with it. Each runs as
``nvidia-cuda-mps-control -f`` (foreground, so the agent owns the process and sees it exit)
with ``CUDA_VISIBLE_DEVICES=<uuid>`` and its own pipe and log directories under ``mps_dir``
(:class:`MpsLayout`); a share's container gets that GPU's pipe directory mounted. Stopping
sends ``quit`` through ``nvidia-cuda-mps-control`` as the documentation says, then kills the
process after a grace period.

:class:`MpsDaemons` keeps one running per healthy, non-MIG GPU: started, and listening on its
``control`` socket, before the share plugin registers (a client that finds no daemon runs
without MPS, unlimited); restarted when it exits, with a backoff that doubles while it keeps dying
young (bounded by ``retry_max_s``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from extender.devices.gpus import Gpu
from extender.devices.share_handle import sharable

__all__ = [
    "CONTAINER_PIPE_DIRECTORY",
    "MPS_CONTROL",
    "MpsControl",
    "MpsDaemons",
    "MpsError",
    "MpsLayout",
    "SubprocessMps",
]

log = logging.getLogger("schedext.agent.mps")

MPS_CONTROL = "nvidia-cuda-mps-control"
# Where a share's container finds its GPU's pipes: CUDA's own default, so that a client
# reaches the daemon even if an image resets CUDA_MPS_PIPE_DIRECTORY.
CONTAINER_PIPE_DIRECTORY = "/tmp/nvidia-mps"  # noqa: S108 (a path inside the container)
# MPS clients and their server share POSIX shared memory: the containers get the daemons'
# /dev/shm (the DaemonSet mounts <mps_dir>/shm there), as NVIDIA's device plugin does.
# The daemon's socket in its pipe directory, where clients (and `quit`) reach it.
CONTROL_SOCKET = "control"
CONTAINER_SHM = "/dev/shm"  # noqa: S108 (a path inside the container)


class MpsError(RuntimeError):
    """A daemon could not be started (the message says why, for the log)."""


@dataclass(frozen=True, slots=True)
class MpsLayout:
    """The daemons' directories on the host (the agent's container mounts them at the same
    path, so that what it creates is what the kubelet mounts into a share's container)."""

    base: Path

    def pipe(self, uuid: str) -> Path:
        return self.base / uuid / "pipe"

    def log(self, uuid: str) -> Path:
        return self.base / uuid / "log"

    @property
    def shm(self) -> Path:
        return self.base / "shm"


class MpsControl(Protocol):
    """One MPS control daemon per GPU, by UUID. Called from the event loop's thread."""

    async def start(self, uuid: str) -> None:
        """Start the daemon for ``uuid`` (nothing when it runs) and wait until it listens;
        :class:`MpsError` if it cannot be started."""
        ...

    async def stop(self, uuid: str) -> None:
        """Stop it, if it runs."""
        ...

    def running(self, uuid: str) -> bool: ...


class SubprocessMps:
    """:class:`MpsControl` by ``nvidia-cuda-mps-control`` subprocesses (found on ``PATH``)."""

    def __init__(
        self,
        layout: MpsLayout,
        *,
        binary: str = MPS_CONTROL,
        ready_s: float = 5.0,
        stop_grace_s: float = 5.0,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self._layout, self._binary, self._grace = layout, binary, stop_grace_s
        self._ready_s = ready_s
        self._base_env = dict(os.environ if env is None else env)
        self._processes: dict[str, asyncio.subprocess.Process] = {}

    def _env(self, uuid: str) -> dict[str, str]:
        return {
            **self._base_env,
            "CUDA_VISIBLE_DEVICES": uuid,
            "CUDA_MPS_PIPE_DIRECTORY": str(self._layout.pipe(uuid)),
            "CUDA_MPS_LOG_DIRECTORY": str(self._layout.log(uuid)),
        }

    def running(self, uuid: str) -> bool:
        process = self._processes.get(uuid)
        return process is not None and process.returncode is None

    async def start(self, uuid: str) -> None:
        if self.running(uuid):
            return
        try:
            for directory in (self._layout.pipe(uuid), self._layout.log(uuid)):
                directory.mkdir(parents=True, exist_ok=True)
            # A dead daemon's socket would pass for the new one's.
            (self._layout.pipe(uuid) / CONTROL_SOCKET).unlink(missing_ok=True)
            with (self._layout.log(uuid) / "control.out").open("ab") as output:
                self._processes[uuid] = await asyncio.create_subprocess_exec(
                    self._binary,
                    "-f",
                    env=self._env(uuid),
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=output,
                    stderr=asyncio.subprocess.STDOUT,
                )
        except FileNotFoundError as error:
            if error.filename not in (None, self._binary):
                raise MpsError(f"cannot prepare MPS directories for {uuid}: {error}") from None
            raise MpsError(
                f"{self._binary} is not on PATH: MPS needs the driver's CUDA utilities in the "
                "agent's container (NVIDIA_DRIVER_CAPABILITIES=compute,utility)"
            ) from None
        except OSError as error:
            raise MpsError(f"cannot start {self._binary} for {uuid}: {error}") from None
        await self._until_listening(uuid, self._processes[uuid])

    async def _until_listening(self, uuid: str, process: asyncio.subprocess.Process) -> None:
        """Wait (up to ``ready_s``) for the daemon's ``control`` socket: a share's client that
        finds no daemon runs without MPS, unlimited."""
        control = self._layout.pipe(uuid) / CONTROL_SOCKET
        deadline = time.monotonic() + self._ready_s
        while not control.exists():
            if process.returncode is not None:
                raise MpsError(
                    f"{self._binary} for {uuid} exited with code {process.returncode} at start "
                    f"(its log: {self._layout.log(uuid)})"
                )
            if time.monotonic() >= deadline:
                log.warning("MPS daemon not listening yet", extra={"gpu": uuid})
                return
            await asyncio.sleep(0.02)

    async def stop(self, uuid: str) -> None:
        process = self._processes.pop(uuid, None)
        if process is None or process.returncode is not None:
            return
        try:
            quitter = await asyncio.create_subprocess_exec(
                self._binary,
                env=self._env(uuid),
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.DEVNULL,
            )
            await asyncio.wait_for(quitter.communicate(b"quit\n"), self._grace)
        except (OSError, TimeoutError) as error:
            log.warning("MPS quit failed", extra={"gpu": uuid, "error": str(error)})
        try:
            await asyncio.wait_for(process.wait(), self._grace)
        except TimeoutError:
            log.warning("MPS daemon did not quit; killing it", extra={"gpu": uuid})
            with contextlib.suppress(ProcessLookupError):  # it ended in between
                process.kill()
            await process.wait()


@dataclass(slots=True)
class _Started:
    at: float
    delay: float  # how long after ``at`` a restart may come


class MpsDaemons:
    """Keeps a daemon running for every healthy, non-MIG GPU of ``gpus()``.

    A GPU that turns unhealthy keeps its daemon (its clients may still be ending) but gets no
    restart. The backoff: a daemon may start again ``retry_first_s`` after its last start;
    one that dies within ``stable_s`` of its start waits twice as long the next time, up to
    ``retry_max_s``."""

    def __init__(
        self,
        control: MpsControl,
        gpus: Callable[[], Sequence[Gpu]],
        *,
        check_s: float = 1.0,
        retry_first_s: float = 1.0,
        retry_max_s: float = 60.0,
        stable_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._control, self._gpus, self._clock = control, gpus, clock
        self._check_s, self._first, self._max, self._stable = (
            check_s,
            retry_first_s,
            retry_max_s,
            stable_s,
        )
        self._started: dict[str, _Started] = {}
        self.starts = 0  # daemons started, restarts included (a figure for tests and logs)

    async def check(self) -> None:
        """One pass: start what should run and does not, as the backoff allows."""
        now = self._clock()
        for gpu in self._gpus():
            if not sharable(gpu) or self._control.running(gpu.uuid):
                continue
            last = self._started.get(gpu.uuid)
            if last is not None and now < last.at + last.delay:
                continue
            delay = self._first
            if last is not None:
                log.warning("MPS daemon exited; restarting", extra={"gpu": gpu.uuid})
                if now - last.at < self._stable:
                    delay = min(last.delay * 2, self._max)
            self._started[gpu.uuid] = _Started(at=now, delay=delay)
            try:
                await self._control.start(gpu.uuid)
            except MpsError as error:
                log.warning(
                    "MPS daemon not started",
                    extra={"gpu": gpu.uuid, "error": str(error), "retry_s": delay},
                )
                continue
            self.starts += 1
            log.info("MPS daemon started", extra={"gpu": gpu.uuid, "index": gpu.index})

    async def run(self) -> None:
        """Check every ``check_s`` until cancelled; then stop every daemon started."""
        try:
            while True:
                await self.check()
                await asyncio.sleep(self._check_s)
        finally:
            # Shielded: a cancellation mid-stop must still leave no daemon behind.
            await asyncio.shield(self.stop_all())

    async def stop_all(self) -> None:
        for uuid in list(self._started):
            await self._control.stop(uuid)
        self._started.clear()
