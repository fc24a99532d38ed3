"""The processes measured: a tree's ``schedext serve`` and its core alone
(loadtests/corebench.py), each run from that tree alone and pinned where trees are compared,
so that two trees share one CPU and are measured on equal terms."""

from __future__ import annotations

import contextlib
import http.client
import os
import select
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

from loadtests.bench.workload import CORE_VERBS

ROOT = Path(__file__).resolve().parents[2]  # this tree
CORE_SCRIPT = ROOT / "loadtests" / "corebench.py"
CORE_TIMEOUT_S = 300.0  # for any one answer of the core's process (the pure-Python twin is slow)


@contextlib.contextmanager
def connection(
    snapshot: Path, log: Path, root: Path, cpu: int | None, *, kubeconfig: Path | None = None
) -> Iterator[http.client.HTTPConnection]:
    """A keep-alive connection to ``root``'s schedext serving ``snapshot`` (with
    ``kubeconfig``, the cluster it points to instead)."""
    with Server(snapshot, log, root, cpu, kubeconfig=kubeconfig) as server:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
        try:
            yield conn
        finally:
            conn.close()


class Server:
    """``schedext serve`` of the tree at ``root`` on a snapshot (or, with ``kubeconfig``, the
    cluster it points to), on a free loopback port, for the benchmark's life."""

    def __init__(
        self,
        snapshot: Path | None,
        log: Path,
        root: Path = ROOT,
        cpu: int | None = None,
        *,
        kubeconfig: Path | None = None,
    ) -> None:
        self.log, self.root, self.cpu = log, root, cpu
        self.source = (
            ["--snapshot", str(snapshot)]
            if kubeconfig is None
            else ["--kubeconfig", str(kubeconfig)]
        )
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = int(sock.getsockname()[1])

    def __enter__(self) -> Server:
        command = [
            sys.executable, "-m", "app.cli", "serve", *self.source,
            "--port", str(self.port), "--bench-endpoints", "--log-level", "warning",
        ]  # fmt: skip
        self._log = self.log.open("wb")
        # our own CLI with arguments built here, not user input; cwd and PYTHONPATH pick the tree
        with _pinned(self.cpu):
            self.process = subprocess.Popen(  # noqa: S603
                command,
                cwd=self.root,
                env=_env(self.root),
                stdout=self._log,
                stderr=subprocess.STDOUT,
            )
        try:
            self._wait_ready(timeout=120)
        except BaseException:
            self.__exit__()
            raise
        return self

    def _wait_ready(self, *, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"schedext ({self.root}) exited: {self.log.read_text()[-2000:]}")
            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=1)
            try:
                conn.request("GET", "/readyz")
                if conn.getresponse().status == 200:
                    return
            except OSError:
                pass
            finally:
                conn.close()
            time.sleep(0.1)
        raise RuntimeError(
            f"schedext ({self.root}) did not become ready within {timeout:g} s: "
            f"{self.log.read_text()[-2000:]}"
        )

    def __exit__(self, *_: object) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self._log.close()


class CoreProcess:
    """loadtests/corebench.py holding the cluster with ``root``'s extender, for the
    benchmark's life: one JSON line in answer to each batch of rounds."""

    def __init__(self, data: Path, root: Path, log: Path, cpu: int | None = None) -> None:
        self.data, self.root, self.log, self.cpu = data, root, log, cpu
        self.compiled = False

    def __enter__(self) -> CoreProcess:
        self._log = self.log.open("wb")
        # our own script and interpreter, arguments built here; cwd and PYTHONPATH pick the tree
        with _pinned(self.cpu):
            self.process = subprocess.Popen(  # noqa: S603
                [sys.executable, str(CORE_SCRIPT), str(self.data)],
                cwd=self.root,
                env=_env(self.root),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=self._log,
            )
        try:
            hello = self._answer()
            # PYTHONPATH must have won over whatever schedext is installed: check, not hope
            if not Path(hello["extender"]).is_relative_to(self.root):
                raise RuntimeError(f"core timing for {self.root} imported {hello['extender']}")
            self.compiled = bool(hello["compiled"])
        except BaseException:
            self.__exit__()
            raise
        return self

    def run(self, rounds: int) -> dict[str, list[float]]:
        """ms of every call per verb, over ``rounds`` rounds."""
        if rounds <= 0:
            return {verb: [] for verb in CORE_VERBS}
        assert self.process.stdin is not None
        self.process.stdin.write(f"{rounds}\n".encode())
        self.process.stdin.flush()
        times: dict[str, list[float]] = self._answer()
        return times

    def _answer(self, timeout: float = CORE_TIMEOUT_S) -> Any:
        assert self.process.stdout is not None
        ready, _, _ = select.select([self.process.stdout], [], [], timeout)
        line = self.process.stdout.readline() if ready else b""
        if not line:
            what = "exited" if ready else f"gave no answer within {timeout:g} s"
            raise RuntimeError(f"core timing ({self.root}) {what}: {self._tail()}")
        return orjson.loads(line)

    def _tail(self) -> str:
        return self.log.read_text(errors="replace")[-2000:]

    def __exit__(self, *_: object) -> None:
        assert self.process.stdin is not None
        with contextlib.suppress(OSError):  # the end of stdin is its signal to exit
            self.process.stdin.close()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        if self.process.stdout is not None:
            self.process.stdout.close()
        self._log.close()


def shared_cpu() -> int | None:
    """The one CPU for both trees' processes in a comparison (the last this process may use).
    A process mostly stays on the CPU it last ran on, and on a shared machine two CPUs can
    differ in speed for minutes (a busy neighbour): two trees on two CPUs would compare the
    CPUs. None where affinity cannot be set."""
    if not hasattr(os, "sched_getaffinity"):
        return None
    return max(os.sched_getaffinity(0))


@contextlib.contextmanager
def _pinned(cpu: int | None) -> Iterator[None]:
    """This process on ``cpu`` alone while it starts processes, which inherit that."""
    if cpu is None:
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {cpu})
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def _env(root: Path) -> dict[str, str]:
    """The environment that runs ``root``'s code: it alone on PYTHONPATH, before anything
    installed (an editable install of this tree included). The verbs are measured in full
    mode (filter answers every feasible node, prioritize scores them), as kube-scheduler calls
    them with prioritizeVerb registered; a tree that has shortlist mode is told so (an older
    one, without the setting, would refuse it)."""
    env = {**os.environ, "PYTHONPATH": str(root)}
    settings = root / "app" / "service" / "settings.py"
    if not settings.is_file():  # a tree from before app/service/
        settings = root / "app" / "settings.py"
    if "shortlist" in settings.read_text():
        env.setdefault("SCHEDEXT_POLICY__SHORTLIST", "0")
    return env


@contextlib.contextmanager
def pinned_away(cpu: int | None) -> Iterator[None]:
    """This process (the client) off ``cpu``, the servers', where there are others."""
    if cpu is None:
        yield
        return
    before = os.sched_getaffinity(0)
    others = before - {cpu}
    if others:
        os.sched_setaffinity(0, others)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)
