"""Child processes that cannot outlive the run: each in its own process group, killed with
its parent (PDEATHSIG), stopped by group with a grace period, logging to a file; and free
loopback ports to start them on."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

STOP_GRACE_SECONDS = 10.0
KILL_WAIT_SECONDS = 10.0


class ComponentError(RuntimeError):
    """A control-plane process exited early or never became ready."""


def free_ports(count: int) -> list[int]:
    """``count`` distinct loopback TCP ports that were free a moment ago."""
    # Keep every socket bound until all are chosen, so the kernel cannot hand out one twice.
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(count)]
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return [int(sock.getsockname()[1]) for sock in socks]


def free_port() -> int:
    """A loopback TCP port that was free a moment ago."""
    return free_ports(1)[0]


# Looked up in the parent: the child may only make the call between fork and exec.
_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform == "linux" else None
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    # Runs in the child between fork and exec: ask Linux to SIGKILL it if the test process dies
    # without tearing down (e.g. CI kills pytest), so no etcd/apiserver outlives the run.
    if _LIBC is not None:
        _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


class Component:
    """One child process in its own process group, logging to a file."""

    def __init__(self, name: str, log_path: Path) -> None:
        self.name = name
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, argv: Sequence[str], env: Mapping[str, str]) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            log.write(f"\n===== {time.strftime('%H:%M:%S')} {' '.join(argv)}\n".encode())
            log.flush()
            # PDEATHSIG fires when the *thread* that forked exits: only use it from the main one.
            in_main = threading.current_thread() is threading.main_thread()
            self.proc = subprocess.Popen(  # noqa: S603 (the caller's binaries and arguments)
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=dict(env),
                start_new_session=True,  # own process group: stop() kills the whole group
                preexec_fn=_die_with_parent if in_main else None,  # noqa: PLW1509
            )

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def check_alive(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            raise ComponentError(
                f"{self.name} exited with code {self.proc.returncode}; "
                f"log tail ({self.log_path}):\n{self.tail(60)}"
            )

    def stop(self, grace: float = STOP_GRACE_SECONDS) -> None:
        """SIGTERM the process group, SIGKILL it after ``grace`` seconds (at once if 0)."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        steps = [(signal.SIGKILL, KILL_WAIT_SECONDS)]
        if grace > 0:
            steps.insert(0, (signal.SIGTERM, grace))
        for sig, wait in steps:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, sig)  # pgid == pid because of start_new_session
            try:
                proc.wait(wait)
            except subprocess.TimeoutExpired:
                continue
            break
        else:
            raise ComponentError(f"{self.name} (pid {proc.pid}) survived SIGKILL")

    def tail(self, lines: int = 200) -> str:
        try:
            data = self.log_path.read_bytes()
        except FileNotFoundError:
            return "<no log>"
        return "\n".join(data.decode(errors="replace").splitlines()[-lines:])
