"""Shared pieces of the cluster-scale benchmarks (``loadtests.sync``, ``loadtests.throughput``).

- the real loopback control plane of the end-to-end harness (etcd, kube-apiserver and, on
  demand, kube-scheduler built from Go modules), with the project's CRDs installed;
- a concurrent REST client: one httpx client with HTTP/1.1 keep-alive connections shared by a
  thread pool, optionally paced to a fixed request rate;
- ``schedext serve --kubeconfig`` as a child process in its own process group, with CPU time
  and memory read from /proc;
- creatable node and pod objects adapted from :mod:`loadtests.payloads`;
- a small Prometheus text-format parser, for before/after differences of counters.

Run the benchmarks from the repository root: they import the harness from ``testbed``.
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import math
import os
import random
import re
import signal
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
import yaml

from loadtests import payloads
from testbed.controlplane import ControlPlane, find_binaries
from testbed.kubeapi import ApiError
from testbed.processes import free_port
from testbed.waiting import wait_for

__all__ = [
    "GPU",
    "GPU_IDS",
    "Batch",
    "Call",
    "CpuMeter",
    "PySpy",
    "RestPool",
    "RssSampler",
    "Sampler",
    "SchedextProcess",
    "Scrape",
    "control_plane",
    "cpu_seconds",
    "exit_on_signals",
    "gpu_node",
    "machine_info",
    "percentile",
    "plain_pod",
    "pod_object",
    "print_stacks",
    "process_ids",
    "scheduler_config",
    "status_kib",
    "summarize_stacks",
]

JSON = dict[str, Any]
ROOT = Path(__file__).resolve().parents[1]
CRDS = ROOT / "manifests" / "crds"
SCHEDULER_CONFIG = ROOT / "manifests" / "scheduler-config.yaml"
MANIFEST_EXTENDER_URL = "http://127.0.0.1:8888"
MANIFEST_KUBECONFIG = "/etc/kubernetes/scheduler.conf"
GPU = "nvidia.com/gpu"
GPU_IDS = "schedext.io/gpu-ids"
CLK_TCK = os.sysconf("SC_CLK_TCK")
# Answers worth retrying: throttling, timeouts and an apiserver/etcd under pressure.
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
RETRIES = 5


# ---------------------------------------------------------------------------------------------
# Signals and /proc
# ---------------------------------------------------------------------------------------------


def exit_on_signals() -> None:
    """SIGTERM and SIGHUP raise KeyboardInterrupt like Ctrl-C, so every ``with`` block (the
    control plane, schedext) tears down on the way out."""

    def interrupt(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, interrupt)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process, all threads (clock-tick resolution)."""
    # The command name in parentheses may hold spaces: split after its closing parenthesis,
    # where utime and stime are the 12th and 13th fields.
    stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(stat[11]) + int(stat[12])) / CLK_TCK


def status_kib(pid: int, key: str) -> int:
    """A ``/proc/<pid>/status`` memory field such as VmRSS or VmHWM, in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{key}:"):
            return int(line.split()[1])
    raise KeyError(f"{key} not in /proc/{pid}/status")


def process_ids(names: Iterable[str]) -> dict[str, int]:
    """PIDs of this process's children with these command names (the control-plane binaries
    the harness started), found through /proc so that no harness internals are needed."""
    wanted, found = set(names), {}
    me = os.getpid()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            text = (entry / "stat").read_text()
        except OSError:
            continue
        comm = text[text.index("(") + 1 : text.rindex(")")]
        parent = int(text.rsplit(")", 1)[1].split()[1])
        if parent == me and comm in wanted:
            found[comm] = int(entry.name)
    return found


def machine_busy_seconds() -> float:
    """CPU seconds spent, all processes and CPUs, since boot (/proc/stat; idle and iowait
    excluded): shows how much of a window other work on a shared machine took."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    ticks = [int(f) for f in fields]
    idle = ticks[3] + ticks[4]
    # guest time is already counted in user time
    return (sum(ticks[:8]) - idle) / CLK_TCK


class CpuMeter:
    """CPU seconds of this benchmark, the control-plane processes, schedext and the whole
    machine over a window: ``start()`` then ``read()``."""

    def __init__(self, pids: Mapping[str, int]) -> None:
        self.pids = {"benchmark": os.getpid(), **pids}
        self._began = 0.0
        self._before: dict[str, float] = {}

    def _now(self) -> dict[str, float]:
        now = {"machine": machine_busy_seconds()}
        for name, pid in self.pids.items():
            with contextlib.suppress(OSError):
                now[name] = cpu_seconds(pid)
        return now

    def start(self) -> CpuMeter:
        self._began, self._before = time.monotonic(), self._now()
        return self

    def add_new(self, name: str, pid: int) -> None:
        """A process started after start(): all its CPU time falls in the window."""
        self.pids[name] = pid
        self._before[name] = 0.0

    def read(self) -> dict[str, float]:
        """Seconds per process since start(), ``machine`` for everything, ``wall``, and
        ``others`` (the machine less the processes measured here)."""
        now = self._now()
        spent = {k: round(v - self._before[k], 2) for k, v in now.items() if k in self._before}
        spent["others"] = round(
            spent["machine"] - sum(v for k, v in spent.items() if k != "machine"), 2
        )
        spent["wall"] = round(time.monotonic() - self._began, 2)
        return spent


def machine_info() -> JSON:
    """What the figures were measured on."""
    cpuinfo = Path("/proc/cpuinfo").read_text().splitlines()
    model = next((ln.split(":", 1)[1].strip() for ln in cpuinfo if ln.startswith("model name")), "")
    mhz = next((ln.split(":", 1)[1].strip() for ln in cpuinfo if ln.startswith("cpu MHz")), "")
    meminfo = Path("/proc/meminfo").read_text().splitlines()
    total_kib = next(int(ln.split()[1]) for ln in meminfo if ln.startswith("MemTotal:"))
    return {
        "nproc": len(os.sched_getaffinity(0)),
        "cpu_model": model,
        "cpu_mhz": mhz,
        "mem_total_gib": round(total_kib / 2**20, 1),
        "loadavg_1m_at_start": round(os.getloadavg()[0], 2),
        "python": sys.version.split()[0],
    }


class RssSampler:
    """Samples a process's VmRSS every ``interval`` seconds on a thread, while in ``with``."""

    def __init__(self, pid: int, interval: float = 0.2) -> None:
        self.pid, self.interval = pid, interval
        self.samples: list[tuple[float, int]] = []  # (monotonic time, KiB)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    @property
    def peak_kib(self) -> int:
        return max((kib for _, kib in self.samples), default=0)

    def _run(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(OSError, KeyError, ValueError):
                self.samples.append((time.monotonic(), status_kib(self.pid, "VmRSS")))
            self._stop.wait(self.interval)


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100); NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, math.ceil(q / 100 * len(ordered)) - 1))
    return ordered[rank]


# ---------------------------------------------------------------------------------------------
# Control plane
# ---------------------------------------------------------------------------------------------


@contextlib.contextmanager
def control_plane(apiserver_args: Sequence[str] = ()) -> Iterator[ControlPlane]:
    """The e2e harness's etcd + kube-apiserver, with manifests/crds installed; stopped (process
    groups, work dir removed) on the way out, whatever happened."""
    with ControlPlane(find_binaries(), apiserver_args=apiserver_args) as cp:
        install_crds(cp)
        yield cp


def install_crds(cp: ControlPlane) -> None:
    """The project's CRDs, applied and servable, as tests/e2e/conftest.py ``install_crds``
    does (copied rather than imported: that module is a pytest conftest)."""
    path = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
    for manifest in sorted(CRDS.glob("*.yaml")):
        crd = yaml.safe_load(manifest.read_text())
        cp.api.apply_raw("POST", path, crd)
        spec = crd["spec"]
        collection = (
            f"/apis/{spec['group']}/{spec['versions'][0]['name']}/{spec['names']['plural']}"
        )
        # Established is not yet servable: wait until the collection answers a list.
        wait_for(
            _lister(cp, collection),
            timeout=60,
            message=f"{collection} not servable",
            retry_on=(httpx.TransportError, ApiError),
        )


def _lister(cp: ControlPlane, collection: str) -> Callable[[], JSON]:
    return lambda: cp.api.apply_raw("GET", collection)


def scheduler_config(
    extender_url: str | None,
    *,
    qps: float | None = None,
    burst: int | None = None,
    transform: Callable[[JSON], JSON] | None = None,
) -> str:
    """manifests/scheduler-config.yaml templated as tests/e2e/conftest.py ``scheduler_config``
    does (extender URL, ``{{KUBECONFIG}}`` for the harness). ``extender_url=None`` drops the
    ``extenders:`` block (kube-scheduler alone); ``qps``/``burst`` set clientConnection's
    client-side rate limit, which the shipped file leaves at kube-scheduler's default;
    ``transform`` changes the parsed document (a benchmark variant), before the rest."""
    text = SCHEDULER_CONFIG.read_text()
    if text.count(MANIFEST_EXTENDER_URL) != 1 or MANIFEST_KUBECONFIG not in text:
        raise RuntimeError(f"{SCHEDULER_CONFIG}: layout changed, cannot template it")
    if extender_url is None or qps is not None or burst is not None or transform is not None:
        config = yaml.safe_load(text)
        if transform is not None:
            config = transform(config)
        if extender_url is None:
            del config["extenders"]
        connection = config.setdefault("clientConnection", {})
        if qps is not None:
            connection["qps"] = qps
        if burst is not None:
            connection["burst"] = burst
        # Otherwise the shipped file, byte for byte but for the two addresses.
        text = str(yaml.safe_dump(config, sort_keys=False))
    if extender_url is not None:
        text = text.replace(MANIFEST_EXTENDER_URL, extender_url)
    # Substituted last: the placeholder is not valid YAML.
    return text.replace(MANIFEST_KUBECONFIG, "{{KUBECONFIG}}")


# ---------------------------------------------------------------------------------------------
# Concurrent REST
# ---------------------------------------------------------------------------------------------

# (method, path, JSON body or None, content type); bodies are built lazily by the workers.
Call = tuple[str, str, JSON | None, str]


@dataclass
class Batch:
    """The outcome of :meth:`RestPool.run`."""

    label: str
    done: int = 0
    failed: int = 0
    retried: int = 0
    seconds: float = 0.0
    latencies_ms: list[float] = field(default_factory=list, repr=False)
    errors: list[str] = field(default_factory=list)

    @property
    def rate(self) -> float:
        return self.done / self.seconds if self.seconds > 0 else 0.0

    def summary(self) -> JSON:
        return {
            "label": self.label,
            "done": self.done,
            "failed": self.failed,
            "retried": self.retried,
            "seconds": round(self.seconds, 3),
            "per_second": round(self.rate, 1),
            "latency_p50_ms": round(percentile(self.latencies_ms, 50), 2),
            "latency_p99_ms": round(percentile(self.latencies_ms, 99), 2),
            "errors": self.errors[:5],
        }


class RestPool:
    """One httpx client (HTTP/1.1, up to ``concurrency`` keep-alive connections to
    kube-apiserver, CA-verified TLS, the admin token) shared by a pool of threads."""

    def __init__(self, cp: ControlPlane, concurrency: int) -> None:
        context = ssl.create_default_context(cafile=str(cp.ca_cert))
        self.concurrency = concurrency
        self.client = httpx.Client(
            base_url=cp.server,
            verify=context,
            limits=httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency),
            headers={"Authorization": f"Bearer {cp.token}", "Accept": "application/json"},
            timeout=httpx.Timeout(60.0),
        )

    def close(self) -> None:
        self.client.close()

    def __enter__(self) -> RestPool:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def call(
        self,
        method: str,
        path: str,
        body: JSON | None = None,
        content_type: str = "application/json",
        *,
        params: Mapping[str, str] | None = None,
    ) -> JSON:
        """One request with bounded retries; the decoded answer. Raises RuntimeError."""
        response, _ = self._send(method, path, body, content_type, params)
        if response.status_code >= 300:
            raise RuntimeError(f"{method} {path}: {response.status_code} {response.text[:300]}")
        decoded = orjson.loads(response.content) if response.content else {}
        return decoded if isinstance(decoded, dict) else {"value": decoded}

    def run(
        self,
        label: str,
        calls: Iterable[Call],
        *,
        rate: float | None = None,
        progress_s: float | None = None,
        on_answer: Callable[[int, float], object] | None = None,
    ) -> Batch:
        """Send every call, ``concurrency`` in flight; at most ``rate`` starts per second when
        given (a fixed schedule: call i starts at t0 + i/rate, so slow answers do not lower
        the offered load until every thread is busy). ``progress_s``: print the count to
        stderr that often. ``on_answer(i, t)``: call i was answered (successfully) at
        monotonic time t."""
        batch = Batch(label)
        with _Progress(batch, progress_s):
            self._run(batch, calls, rate, on_answer)
        return batch

    def _run(
        self,
        batch: Batch,
        calls: Iterable[Call],
        rate: float | None,
        on_answer: Callable[[int, float], object] | None,
    ) -> None:
        label = batch.label
        lock = threading.Lock()
        source = iter(calls)
        counter = itertools.count()
        started = time.monotonic()

        def next_call() -> tuple[int, Call] | None:
            with lock:  # generators are not thread-safe
                call = next(source, None)
                return None if call is None else (next(counter), call)

        def worker() -> None:
            while (item := next_call()) is not None:
                index, call = item
                if rate:
                    time.sleep(max(0.0, started + index / rate - time.monotonic()))
                if self._timed(batch, lock, call) and on_answer is not None:
                    on_answer(index, time.monotonic())

        threads = [
            threading.Thread(target=worker, name=f"{label}-{i}", daemon=True)
            for i in range(self.concurrency)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        batch.seconds = time.monotonic() - started

    def _timed(self, batch: Batch, lock: threading.Lock, call: Call) -> bool:
        """Send one call, count it in ``batch``; whether it succeeded."""
        method, path, body, content_type = call
        began = time.perf_counter()
        try:
            response, retries = self._send(method, path, body, content_type, None)
            # A create retried after a lost answer may find its own object: that is success.
            ok = response.status_code < 300 or (retries > 0 and response.status_code == 409)
            error = "" if ok else f"{method} {path}: {response.status_code} {response.text[:200]}"
        except httpx.HTTPError as exc:
            retries, error = RETRIES, f"{method} {path}: {type(exc).__name__}: {exc}"
        elapsed_ms = (time.perf_counter() - began) * 1000
        with lock:
            batch.retried += retries
            batch.latencies_ms.append(elapsed_ms)
            if error:
                batch.failed += 1
                if len(batch.errors) < 20:
                    batch.errors.append(error)
            else:
                batch.done += 1
        return not error

    def _send(
        self,
        method: str,
        path: str,
        body: JSON | None,
        content_type: str,
        params: Mapping[str, str] | None,
    ) -> tuple[httpx.Response, int]:
        content = None if body is None else orjson.dumps(body)
        headers = {"Content-Type": content_type} if content is not None else {}
        for attempt in range(RETRIES + 1):
            try:
                response = self.client.request(
                    method, path, content=content, headers=headers, params=params
                )
            except httpx.TransportError:
                if attempt == RETRIES:
                    raise
            else:
                if response.status_code not in RETRY_STATUSES or attempt == RETRIES:
                    return response, attempt
            time.sleep(min(2.0, 0.1 * 2**attempt))
        raise AssertionError("unreachable")  # the loop returns or raises on its last attempt


class _Progress:
    """Prints a batch's count to stderr every ``interval`` seconds while in ``with``."""

    def __init__(self, batch: Batch, interval: float | None) -> None:
        self._batch, self._interval = batch, interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="progress", daemon=True)

    def __enter__(self) -> None:
        if self._interval:
            self._thread.start()

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def _run(self) -> None:
        began = time.monotonic()
        while not self._stop.wait(self._interval or 10.0):
            done, failed = self._batch.done, self._batch.failed
            elapsed = time.monotonic() - began
            print(
                f"  {self._batch.label}: {done:,} done, {failed} failed, {elapsed:.0f}s "
                f"({done / elapsed:.0f}/s)",
                file=sys.stderr,
                flush=True,
            )


# ---------------------------------------------------------------------------------------------
# schedext as a process
# ---------------------------------------------------------------------------------------------

_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform == "linux" else None
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    # Between fork and exec: if the benchmark is SIGKILLed, the kernel kills schedext too.
    if _LIBC is not None:
        _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


@dataclass(frozen=True)
class ReadyTimes:
    """Seconds from process start: first HTTP answer (imports done, port open), /readyz 200."""

    http_up_s: float
    ready_s: float


CPU_PROFILER = Path(__file__).resolve().parent / "cpuprofile.py"


class SchedextProcess:
    """``schedext serve --kubeconfig`` on a free loopback port, in its own process group.

    ``profile``: run it under ``loadtests/cpuprofile.py -o PROFILE`` (cProfile on the CPU
    clock; the stats are written when it exits after SIGTERM). ``root``: the source tree
    to run (another checkout, for before/after comparisons on one cluster); its code comes
    first on the path."""

    def __init__(
        self,
        kubeconfig: Path,
        log_path: Path,
        *,
        profile: Path | None = None,
        env: Mapping[str, str] | None = None,
        root: Path = ROOT,
    ) -> None:
        self.kubeconfig, self.log_path, self.profile = kubeconfig, log_path, profile
        self.root = root
        self.env = {**os.environ, **(env or {})}
        if root != ROOT:
            self.env["PYTHONPATH"] = str(root)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen[bytes] | None = None
        self.started_at = 0.0
        self._http = httpx.Client(base_url=self.url, timeout=httpx.Timeout(30.0))

    @property
    def pid(self) -> int:
        if self.process is None:
            raise RuntimeError("schedext not started")
        return self.process.pid

    def command(self) -> list[str]:
        """What :meth:`start` runs (a subclass may run another extender on the same port)."""
        # CPU time, not wall time: on shared cores a wall-clock profile charges waiting for a
        # CPU to whatever ran last (loadtests/cpuprofile.py).
        # By path: a baseline tree (``root``) may predate it.
        profiler = [str(CPU_PROFILER), "-o", str(self.profile)] if self.profile else []
        return [
            sys.executable, *profiler, "-m", "app.cli", "serve",
            "--kubeconfig", str(self.kubeconfig), "--port", str(self.port),
            "--log-level", "warning",
        ]  # fmt: skip

    def start(self) -> None:
        command = self.command()
        with self.log_path.open("ab") as log:
            self.started_at = time.monotonic()
            # our own CLI with arguments built here, not user input
            self.process = subprocess.Popen(  # noqa: S603
                command,
                cwd=self.root,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # own process group: stop() ends everything it started
                preexec_fn=_die_with_parent,  # noqa: PLW1509 (started from the main thread)
            )

    def wait_ready(
        self,
        timeout: float = 300.0,
        poll: float = 0.05,
        *,
        on_http_up: Callable[[], object] | None = None,
    ) -> ReadyTimes:
        """Poll /readyz until 200; raise RuntimeError (with the log) on exit or timeout.
        ``on_http_up`` runs once, at the first answer (imports done, the sync under way)."""
        http_up: float | None = None
        deadline = self.started_at + timeout
        while time.monotonic() < deadline:
            if self.process is None or self.process.poll() is not None:
                raise RuntimeError(f"schedext exited early:\n{self.tail()}")
            try:
                status = self._http.get("/readyz", timeout=5).status_code
            except httpx.TransportError:
                status = 0
            now = time.monotonic() - self.started_at
            if status and http_up is None:
                http_up = now
                if on_http_up is not None:
                    on_http_up()
            if status == 200:
                return ReadyTimes(http_up_s=http_up or now, ready_s=now)
            time.sleep(poll)
        raise RuntimeError(f"schedext not ready within {timeout:g}s:\n{self.tail()}")

    def get(self, path: str) -> httpx.Response:
        return self._http.get(path)

    def scrape(self) -> Scrape:
        return Scrape(self._http.get("/metrics").text)

    def stop(self, grace: float = 30.0) -> int | None:
        """SIGTERM (SIGINT under cProfile) to the process group, SIGKILL after ``grace`` s;
        the exit code (-15: uvicorn's orderly exit re-raises SIGTERM)."""
        process, self.process = self.process, None
        self._http.close()
        self._http = httpx.Client(base_url=self.url, timeout=httpx.Timeout(30.0))
        if process is None:
            return None
        # uvicorn re-raises the signal it caught once it has shut down: SIGTERM then ends the
        # process before cProfile writes its file, SIGINT becomes a KeyboardInterrupt that
        # cProfile lets pass after writing.
        first = signal.SIGINT if self.profile else signal.SIGTERM
        for sig, wait in ((first, grace), (signal.SIGKILL, 10.0)):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                return process.wait(wait)
        return None

    def tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def __enter__(self) -> SchedextProcess:
        self.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()
        self._http.close()


class PySpy:
    """``py-spy record`` attached to a running process (raw collapsed stacks, GIL-holding and
    running threads only), from start() until stop()."""

    def __init__(self, binary: Path, pid: int, output: Path, *, rate: int = 200) -> None:
        self.binary, self.pid, self.output, self.rate = binary, pid, output, rate
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        command = [
            str(self.binary), "record", "--pid", str(self.pid), "--rate", str(self.rate),
            "--format", "raw", "--output", str(self.output), "--nonblocking",
        ]  # fmt: skip
        self.output.parent.mkdir(parents=True, exist_ok=True)  # --py-spy-dir may be new
        log = self.output.with_suffix(".log").open("wb")
        # a profiler binary the user named on our command line, with arguments built here
        self.process = subprocess.Popen(  # noqa: S603
            command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
        )
        log.close()

    def stop(self) -> None:
        """SIGINT makes py-spy write its output and exit."""
        process, self.process = self.process, None
        if process is None:
            return
        process.send_signal(signal.SIGINT)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


def summarize_stacks(path: Path, top: int = 25) -> JSON:
    """Top functions of a py-spy raw file (``frame;frame;... count`` per line): by own
    samples (the innermost frame) and by inclusive samples (anywhere on the stack)."""
    own: dict[str, int] = {}
    inclusive: dict[str, int] = {}
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        total += count
        frames = [f for f in stack.split(";") if not f.startswith(("process ", "thread "))]
        if not frames:
            continue
        own[frames[-1]] = own.get(frames[-1], 0) + count
        for frame in set(frames):
            inclusive[frame] = inclusive.get(frame, 0) + count

    def ranked(table: dict[str, int]) -> list[tuple[str, float]]:
        rows = sorted(table.items(), key=lambda kv: -kv[1])[:top]
        return [(frame, round(100 * n / max(total, 1), 1)) for frame, n in rows]

    return {"samples": total, "own_pct": ranked(own), "inclusive_pct": ranked(inclusive)}


class Sampler:
    """py-spy over chosen windows of the schedext process, when ``--py-spy`` names it."""

    def __init__(self, binary: Path | None, directory: Path) -> None:
        self.binary, self.directory = binary, directory
        self._spy: PySpy | None = None

    def start(self, pid: int, name: str) -> None:
        if self.binary is not None:
            output = self.directory / f"py-spy-{name}.txt"
            self._spy = PySpy(self.binary, pid, output)
            self._spy.start()

    def stop(self) -> JSON | None:
        spy, self._spy = self._spy, None
        if spy is None:
            return None
        spy.stop()
        if not spy.output.exists():
            return {"error": spy.output.with_suffix(".log").read_text()[-500:]}
        return summarize_stacks(spy.output)


def print_stacks(title: str, spy: JSON | None, rows: int = 25) -> None:
    """A :func:`summarize_stacks` result as two ranked lists (or py-spy's error)."""
    if not spy:
        return
    if "error" in spy:
        print(f"py-spy failed during {title}: {spy['error']}", file=sys.stderr)
        return
    print(f"\n=== py-spy, schedext during {title}: {spy['samples']:,} samples ===")
    for key, heading in (("inclusive_pct", "inclusive"), ("own_pct", "own")):
        print(f"  -- {heading} % of samples --")
        for frame, pct in spy[key][:rows]:
            print(f"  {pct:6.1f}  {frame}")


# ---------------------------------------------------------------------------------------------
# Prometheus text format
# ---------------------------------------------------------------------------------------------

_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{(.*)\})?\s+(\S+)")
_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')


class Scrape:
    """One /metrics answer, parsed into (name, labels, value) samples."""

    def __init__(self, text: str) -> None:
        self.samples: list[tuple[str, dict[str, str], float]] = []
        for line in text.splitlines():
            match = _SAMPLE.match(line)
            if match is None or line.startswith("#"):
                continue
            name, labels, value = match.groups()
            with contextlib.suppress(ValueError):
                self.samples.append((name, dict(_LABEL.findall(labels or "")), float(value)))

    def total(self, name: str, **labels: str) -> float:
        """Sum of the samples of ``name`` whose labels include ``labels``."""
        return sum(
            value
            for sample, have, value in self.samples
            if sample == name and all(have.get(k) == v for k, v in labels.items())
        )

    def by_label(self, name: str, label: str, **labels: str) -> dict[str, float]:
        """Sums of ``name`` per value of ``label``."""
        sums: dict[str, float] = {}
        for sample, have, value in self.samples:
            if sample == name and all(have.get(k) == v for k, v in labels.items()):
                key = have.get(label, "")
                sums[key] = sums.get(key, 0.0) + value
        return sums

    def names(self, contains: str) -> list[str]:
        return sorted({name for name, _, _ in self.samples if contains in name})


# ---------------------------------------------------------------------------------------------
# Objects
# ---------------------------------------------------------------------------------------------

EIGHT_GPU_MODELS = [m for m in payloads.MODELS if m[2] == 8]


def _creatable(obj: JSON) -> JSON:
    # The API server refuses a create that carries a resourceVersion; uid and creationTimestamp
    # are its to set.
    for key in ("uid", "resourceVersion", "creationTimestamp"):
        obj["metadata"].pop(key, None)
    if obj["kind"] == "Pod":
        del obj["status"]  # a pod's status is the kubelet's; nodes keep theirs (no kubelet)
    return obj


def gpu_node(index: int, rng: random.Random, *, eight_gpus: bool = False) -> JSON:
    """:func:`payloads.make_node`, creatable (status included: there is no kubelet). With
    ``eight_gpus`` every node is an 8-GPU H100 or A100 node; otherwise the payloads mix (H100,
    A100, 4-GPU L4, and one node in ten without GPUs)."""
    node = _creatable(payloads.make_node(index, rng))
    if not eight_gpus:
        return node
    model, memory, count, groups = EIGHT_GPU_MODELS[index % len(EIGHT_GPU_MODELS)]
    labels = node["metadata"]["labels"]
    labels |= {
        "nvidia.com/gpu.product": model,
        "nvidia.com/gpu.memory": str(memory),
        "nvidia.com/gpu.count": str(count),
        "nvidia.com/gpu.present": "true",
    }
    node["metadata"]["annotations"]["schedext.io/gpu-topology"] = orjson.dumps(
        {"groups": groups}
    ).decode()
    for key in ("allocatable", "capacity"):
        node["status"][key][GPU] = str(count)
    return node


def node_gpus(node: JSON) -> int:
    return int(node["status"]["allocatable"].get(GPU, "0"))


def pod_object(
    name: str,
    namespace: str,
    *,
    node: str | None,
    gpu_ids: Sequence[int] = (),
    compact: bool = True,
    labels: Mapping[str, str] | None = None,
) -> JSON:
    """A bound (``node``) pod adapted from :func:`payloads.make_pod`, creatable.

    GPU pods hold ``gpu_ids`` (requests, limits and the ``schedext.io/gpu-ids`` annotation);
    with no ids it is a CPU pod of the same shape. ``compact`` keeps 4 of the 12 env vars, so
    that the object as the API server serves it (defaults and managedFields added) is about
    4 KB instead of 6 KB."""
    gpus = len(gpu_ids)
    pod = _creatable(
        payloads.make_pod(
            name, gpus=max(gpus, 1), model=None, node=node, gpu_ids=list(gpu_ids) or None
        )
    )
    pod["metadata"]["namespace"] = namespace
    pod["metadata"]["labels"] |= dict(labels or {})
    spec = pod["spec"]
    # The Priority admission plugin fills spec.priority from priorityClassName and refuses a
    # pod that sets both.
    spec.pop("priority", None)
    trainer = spec["containers"][0]
    if compact:
        trainer["env"] = trainer["env"][:4]
    if not gpus:
        trainer["resources"] = {
            "requests": {"cpu": "4", "memory": "16Gi"},
            "limits": {"memory": "16Gi"},
        }
        pod["metadata"]["labels"]["workload-type"] = "CPU-intensive"
    return pod


def gpu_pod(name: str, namespace: str, *, gpus: int, labels: Mapping[str, str]) -> JSON:
    """A pending pod asking for ``gpus`` GPUs of any model, with the toleration for the GPU
    taint of :func:`gpu_node`; no volumes, affinity or priority class, so that neither
    scheduler spends time on anything but resources and the extender."""
    resources = {"cpu": "4", "memory": "16Gi", GPU: str(gpus)}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": dict(labels)},
        "spec": {
            "containers": [
                {
                    "name": "trainer",
                    "image": "registry.example.com/ml/trainer:3.4.1",
                    "resources": {"requests": resources, "limits": {GPU: str(gpus)}},
                }
            ],
            "tolerations": [
                {"key": GPU, "operator": "Exists", "effect": "NoSchedule"},
            ],
            # No kubelet: a graceful delete would never complete.
            "terminationGracePeriodSeconds": 0,
        },
    }


def plain_pod(name: str, namespace: str, *, labels: Mapping[str, str]) -> JSON:
    """A pending pod with no GPU (1 CPU, 2 GiB) that tolerates the GPU taint of
    :func:`gpu_node`, so that it can land on any node: kube-scheduler places it alone, as the
    shipped ``managedResources`` sends schedext only pods that ask for a GPU (or opt in)."""
    pod = gpu_pod(name, namespace, gpus=0, labels=labels)
    pod["spec"]["containers"][0]["resources"] = {
        "requests": {"cpu": "1", "memory": "2Gi"},
        "limits": {"memory": "2Gi"},
    }
    return pod


def create_namespace(pool: RestPool, name: str) -> None:
    body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
    pool.call("POST", "/api/v1/namespaces", body)


def create_priority_class(pool: RestPool, name: str, value: int) -> None:
    body = {
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": {"name": name},
        "value": value,
    }
    pool.call("POST", "/apis/scheduling.k8s.io/v1/priorityclasses", body)


def timed(action: Callable[[], object]) -> float:
    """Seconds ``action`` took."""
    began = time.monotonic()
    action()
    return time.monotonic() - began
