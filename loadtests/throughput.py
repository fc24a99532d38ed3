"""kube-scheduler throughput with and without schedext, on one real control plane.

Against the end-to-end harness's etcd + kube-apiserver (loopback only) it creates GPU nodes
(8 GPUs each, ``nvidia.com/gpu`` in allocatable, GPU feature-discovery labels), then runs
alternating phases, each with a fresh kube-scheduler and a fresh namespace:

- A: kube-scheduler with manifests/scheduler-config.yaml pointing at a fresh
  ``schedext serve --kubeconfig`` (filter, prioritize and bind through schedext);
- B: the same configuration without its ``extenders:`` block (kube-scheduler alone);
- with ``--floor``, the protocol's floor: as A, with an extender that decides nothing in
  schedext's place (P: ``loadtests/nullextender.py``, on schedext's serving stack; G:
  ``loadtests/goextender``, Go's standard library). What kube-scheduler loses to them is what
  the extender protocol itself costs on this machine, whatever the extender does; A/P
  compares schedext with the floor of its own serving stack;
- with ``--baseline DIR``, C: as A, with another checkout's schedext (before/after figures);
- with ``--variants LIST``, V1, V2 ...: as A, with the scheduler configuration and schedext's
  settings changed (``loadtests/variants.py``): ``full`` (prioritize registered, schedext in
  full mode), ``shortlist:K`` (no prioritize, filter answers the K best nodes), ``native``
  (kube-scheduler's NodeResourcesFit packs with MostAllocated), combined with ``+``. Each is
  compared with B and with A, run by run.

Each phase first binds one warm-up pod (leader election, connections), then creates the pods
from many threads at once and watches the namespace: pods/s = pods / (first create sent ->
last pod seen bound on the watch). The pods ask for 1 or 2 GPUs, alternately; with
``--gpu-share F`` only that fraction does, evenly interleaved, and the rest are plain pods
(1 CPU, 2 GiB) that the shipped ``managedResources`` keeps away from schedext
(``loadtests/mix.py``): pods/s and the ratios then cover the whole mix. It scrapes
kube-scheduler's /metrics (secure port, admin token) and schedext's /metrics before and
after, to attribute the time; lists the phase's pods for the placement-quality report (nodes
used and full, GPUs stranded, NVLink fit, how often kube-scheduler chose schedext's best
node: ``loadtests/quality.py``); then deletes the pods (grace 0) and waits until they are
gone. The figures and tables are ``loadtests/report.py``'s.

The shipped file sets no clientConnection qps/burst, so kube-scheduler's client is limited to
50 requests/s (burst 100). Without an extender kube-scheduler posts every Binding itself
through that limiter; with schedext as binder it does not. By default both phases therefore
run with qps/burst raised (``--client-qps``/``--client-burst``), so that the comparison is of
scheduling work, not of a client-side rate limit; ``--shipped-client-limits`` keeps the file's
(absent) limits in both phases.

    python -m loadtests.throughput                       # 1,000 nodes, 2,000 pods, 3 x (A, B)
    python -m loadtests.throughput --reps 2 --json throughput.json
    python -m loadtests.throughput --floor python,go     # adds phases P and G to every rep
    python -m loadtests.throughput --variants full,shortlist:8,shortlist:8+native \\
        --gpu-share 0.2                                  # V1, V2, V3 on a 20 % GPU mix
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import orjson
import yaml

from loadtests import kubeload, quality, report
from loadtests.kubeload import Call, CpuMeter, RestPool, SchedextProcess, Scrape
from loadtests.mix import Mix
from loadtests.variants import Variant, VariantError, parse_variants
from testbed.controlplane import ControlPlane

JSON = dict[str, Any]
APP_LABEL = {"app": "throughput"}
SELECTOR = "app=throughput"
CREATE = "application/json"
DELETE_NOW = {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0}
# The extenders that decide nothing (--floor), by phase letter.
FLOORS = report.FLOORS
GO_EXTENDER = kubeload.ROOT / "loadtests" / "goextender"
# A prebuilt goextender binary to use instead of building one with go.
GO_EXTENDER_BIN = "SCHEDEXT_GOEXTENDER_BIN"


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    kubeload.exit_on_signals()
    mix = Mix(args.gpu_share)
    results: JSON = {
        "machine": kubeload.machine_info(),
        "params": _params(args),
        "mix": {"gpu_share": mix.share, **dict(zip(("gpu_pods", "plain_pods"),
                                                   mix.counts(args.pods), strict=True))},
        "variants": {
            report.variant_kind(i): {"name": v.name, "changes": v.describe(), "env": v.env}
            for i, v in enumerate(args.variants)
        },
        "runs": [],
    }  # fmt: skip
    started = time.monotonic()
    try:
        with tempfile.TemporaryDirectory(prefix="schedext-throughput-") as workdir:
            floors = Floors(Path(workdir), args.floor)  # builds the Go one before anything
            with kubeload.control_plane() as cp, RestPool(cp, args.concurrency) as pool:
                results["nodes"] = _create_nodes(pool, args.nodes)
                nodes = [quality.node_record(n) for n in list_all(pool, "/api/v1/nodes")]
                _run_phases(
                    cp,
                    pool,
                    args,
                    workdir=Path(workdir),
                    floors=floors,
                    nodes=nodes,
                    results=results,
                )
    except KeyboardInterrupt:
        # Stopped from outside (a time limit): keep the phases that finished.
        results["interrupted"] = True
        if args.json:
            args.json.write_text(json.dumps(results, indent=1))
        raise
    results["summary"] = report.summarize(results["runs"])
    results["total_s"] = round(time.monotonic() - started, 1)
    report.print_report(results)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


def _run_phases(
    cp: ControlPlane,
    pool: RestPool,
    args: argparse.Namespace,
    *,
    workdir: Path,
    floors: Floors,
    nodes: Sequence[quality.NodeRecord],
    results: JSON,
) -> None:
    phases = ["A", "B"]
    if args.baseline is not None:
        phases.append("C")
    phases += floors.phases
    variants = {report.variant_kind(i): v for i, v in enumerate(args.variants)}
    phases += list(variants)
    for rep in range(args.reps):
        for phase in phases:
            variant = variants.get(phase)
            name = phase_name(phase, rep)
            if phase in floors.phases:
                extender: SchedextProcess | None = floors.process(phase, cp, rep)
            elif phase == "B":
                extender = None
            else:
                root = args.baseline.resolve() if phase == "C" else kubeload.ROOT
                log = workdir / f"schedext-{name}.log"
                env = variant.env if variant is not None else None
                profile = (
                    args.profile_dir / f"schedext-{name}.prof"
                    if args.profile_dir is not None and phase != "C"
                    else None
                )
                extender = SchedextProcess(cp.kubeconfig, log, root=root, env=env, profile=profile)
            run = Phase(
                cp,
                pool,
                workdir,
                args,
                rep=rep,
                phase=phase,
                extender=extender,
                variant=variant,
                nodes=nodes,
            )
            result = run.execute()
            results["runs"].append(result)
            report.print_run(result)


def phase_name(kind: str, rep: int) -> str:
    """A1, B2, P1 ...; a variant's kind is already numbered: V1.1, V2.3 (kind.rep)."""
    return f"{kind}.{rep + 1}" if report.is_variant(kind) else f"{kind}{rep + 1}"


def list_all(pool: RestPool, path: str, params: dict[str, str] | None = None) -> list[JSON]:
    """Every item of a collection, in pages of 500 (one paged LIST)."""
    items: list[JSON] = []
    query = {**(params or {}), "limit": "500"}
    while True:
        page = pool.call("GET", path, params=query)
        items += page.get("items") or []
        token = (page.get("metadata") or {}).get("continue")
        if not token:
            return items
        query["continue"] = token


def _variants(text: str) -> list[Variant]:
    try:
        return parse_variants(text)
    except VariantError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _gpu_share(text: str) -> float:
    try:
        return Mix(float(text)).share
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"--gpu-share {text}: {error}") from None


def _floors(text: str) -> list[str]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = sorted(set(names) - set(FLOORS))
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown floor {', '.join(unknown) or repr(text)}: choose from {', '.join(FLOORS)}"
        )
    return list(dict.fromkeys(names))


def build_go_extender(binary: Path) -> None:
    """``go build`` of loadtests/goextender into ``binary``; RuntimeError, with go's message,
    when it cannot be built."""
    go = shutil.which("go")
    if go is None:
        raise RuntimeError("needs the go command on PATH (the one that builds the control plane)")
    env = {**os.environ, "GOTOOLCHAIN": "local", "GOFLAGS": "-mod=mod"}
    # go and its arguments are ours; the module has no dependencies to fetch.
    built = subprocess.run(  # noqa: S603
        [go, "build", "-trimpath", "-o", str(binary), "."],
        cwd=GO_EXTENDER,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if built.returncode != 0:
        raise RuntimeError(f"building {GO_EXTENDER.name} failed:\n{built.stderr}")


class Floors:
    """The null extenders of ``--floor``: built (Go) and given the API server's token."""

    def __init__(self, workdir: Path, names: Sequence[str]) -> None:
        self.workdir = workdir
        self.phases = [FLOORS[name] for name in names]
        self.go_binary = workdir / "goextender"
        prebuilt = os.environ.get(GO_EXTENDER_BIN)
        if prebuilt:
            # Built elsewhere (scripts/device-check carries one to a machine without Go).
            self.go_binary = Path(prebuilt)
            if not os.access(self.go_binary, os.X_OK):
                raise SystemExit(f"--floor go: {GO_EXTENDER_BIN}={prebuilt} is not executable")
        elif "G" in self.phases:
            try:
                build_go_extender(self.go_binary)
            except RuntimeError as error:
                raise SystemExit(f"--floor go: {error}") from None

    def process(self, phase: str, cp: ControlPlane, rep: int) -> SchedextProcess:
        token = self.workdir / "floor-token"
        if not token.exists():
            token.touch(mode=0o600)
            token.write_text(cp.token)
        log = self.workdir / f"floor-{phase}{rep + 1}.log"
        return NullExtenderProcess(phase, log, cp=cp, token=token, floors=self)


# The shipped configuration registers no prioritizeVerb: schedext in shortlist mode (its
# policy.shortlist, 1 by default). The floors then answer filter as it does, with one node.
SHIPPED_SHORTLIST = (
    "prioritizeVerb" not in yaml.safe_load(kubeload.SCHEDULER_CONFIG.read_text())["extenders"][0]
)


class NullExtenderProcess(SchedextProcess):
    """A null extender (phase P or G) in schedext's place: same port, readiness and stop."""

    def __init__(
        self, phase: str, log_path: Path, *, cp: ControlPlane, token: Path, floors: Floors
    ) -> None:
        # One P, as a sidecar limited to one CPU gets from Go's container-aware default: with
        # more, its idle Ps spin looking for work on the CPUs the rest of the stack needs.
        env = {"GOMAXPROCS": "1"} if phase == "G" else None
        super().__init__(cp.kubeconfig, log_path, env=env)
        self.phase, self.floors = phase, floors
        self.server, self.ca_cert, self.token = cp.server, cp.ca_cert, token

    def command(self) -> list[str]:
        common = ["--port", str(self.port), "--server", self.server]
        common += ["--ca-file", str(self.ca_cert), "--token-file", str(self.token)]
        if SHIPPED_SHORTLIST:
            # The call pattern of schedext as shipped: filter passes one node, no prioritize.
            common += ["--shortlist", "1"]
        if self.phase == "G":
            return [str(self.floors.go_binary), *common]  # Go's flags take "--" too
        return [sys.executable, "-m", "loadtests.nullextender", *common]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m loadtests.throughput", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--nodes", type=int, default=1000, help="8-GPU nodes (default 1000)")
    parser.add_argument("--pods", type=int, default=2000, help="pods per phase (default 2000)")
    parser.add_argument(
        "--reps", type=int, default=3, help="rounds of the phases, alternating (default 3)"
    )
    parser.add_argument("--concurrency", type=int, default=32, help="creates in flight")
    parser.add_argument("--client-qps", type=float, default=1000.0, help="kube-scheduler qps")
    parser.add_argument("--client-burst", type=int, default=2000, help="kube-scheduler burst")
    parser.add_argument(
        "--shipped-client-limits",
        action="store_true",
        help="keep the shipped file's client limits (none: kube-scheduler's 50 qps/100 burst)",
    )
    parser.add_argument("--bind-timeout", type=float, default=300.0, help="seconds per phase")
    parser.add_argument(
        "--py-spy", type=Path, help="py-spy binary: sample schedext during each timed A phase"
    )
    parser.add_argument("--py-spy-dir", type=Path, help="keep py-spy's raw stacks here")
    parser.add_argument(
        "--profile-dir",
        type=Path,
        help="run this tree's schedext under cProfile in each phase; its stats go here",
    )
    parser.add_argument(
        "--pprof-dir",
        type=Path,
        help="save a kube-scheduler CPU profile (/debug/pprof) of each timed phase here",
    )
    parser.add_argument(
        "--pprof-s", type=int, default=8, help="seconds per kube-scheduler profile (default 8)"
    )
    parser.add_argument(
        "--baseline",
        type=Path,
        help="another checkout of schedext (e.g. a git worktree of an earlier commit): adds a "
        "phase C per pair, kube-scheduler with that tree's schedext, for before/after figures",
    )
    parser.add_argument(
        "--floor",
        type=_floors,
        default=[],
        metavar="python,go",
        help="add the protocol's floor to every rep: kube-scheduler with an extender that "
        "decides nothing, in Python on schedext's stack (phase P) and/or in Go (phase G)",
    )
    parser.add_argument(
        "--variants",
        type=_variants,
        default=[],
        metavar="LIST",
        help="add to every rep one phase per variant of A (V1, V2, ... in the order given), "
        "comma-separated: full (prioritizeVerb registered, SCHEDEXT_POLICY__SHORTLIST=0), "
        "shortlist:K (no prioritizeVerb, SCHEDEXT_POLICY__SHORTLIST=K), native "
        "(NodeResourcesFit MostAllocated, GPUs weighted 3); combine with +, e.g. "
        "full,shortlist:8+native",
    )
    parser.add_argument(
        "--gpu-share",
        type=_gpu_share,
        default=1.0,
        metavar="F",
        help="the fraction of the pods that ask for GPUs (0 < F <= 1, default 1); the rest "
        "are plain pods (1 CPU, 2 GiB) that kube-scheduler places without schedext",
    )
    parser.add_argument("--json", type=Path, help="write the figures here as JSON")
    return parser


def _params(args: argparse.Namespace) -> JSON:
    def plain(value: Any) -> Any:
        if isinstance(value, Path):
            return str(value)
        if isinstance(value, list):
            return [v.name if isinstance(v, Variant) else v for v in value]
        return value

    return {k: plain(v) for k, v in vars(args).items()}


def _create_nodes(pool: RestPool, count: int) -> JSON:
    rng = random.Random(11)
    calls = (
        ("POST", "/api/v1/nodes", kubeload.gpu_node(i, rng, eight_gpus=True), CREATE)
        for i in range(count)
    )
    batch = pool.run("nodes", calls)
    if batch.failed:
        raise RuntimeError(f"node creation failed: {batch.errors[:3]}")
    return batch.summary()


# ---------------------------------------------------------------------------------------------
# One phase
# ---------------------------------------------------------------------------------------------


class Phase:
    """One timed phase: a fresh namespace, kube-scheduler (and its extender, but for B),
    warm-up, the timed batch, metrics, clean-up."""

    def __init__(
        self,
        cp: ControlPlane,
        pool: RestPool,
        workdir: Path,
        args: argparse.Namespace,
        *,
        rep: int,
        phase: str,
        extender: SchedextProcess | None,
        variant: Variant | None = None,
        nodes: Sequence[quality.NodeRecord] = (),
    ) -> None:
        """``phase``: A (this tree's schedext), B (no extender), C (the baseline tree's), P or
        G (a null extender), V1, V2 ... (a variant of A: ``variant``); ``extender``: the
        process kube-scheduler calls, None for B; ``nodes``: the cluster's, for the quality
        report."""
        self.cp, self.pool, self.args = cp, pool, args
        self.kind, self.rep, self.variant, self.nodes = phase, rep + 1, variant, nodes
        self.name = phase_name(phase, rep)
        self.namespace = f"throughput-{self.name.lower().replace('.', '-')}"
        self.schedext = extender
        self.mix = Mix(args.gpu_share)
        # py-spy reads Python stacks: not those of the Go floor.
        spy = args.py_spy if phase != "G" else None
        self.sampler = kubeload.Sampler(spy, args.py_spy_dir or workdir)

    def execute(self) -> JSON:
        kubeload.create_namespace(self.pool, self.namespace)
        try:
            ready_s = self._start_schedext()
            self.cp.start_scheduler(self._config())
            warmup_s = self._warm_up()
            result = self._timed()
            result |= {
                "phase": self.name,
                "kind": self.kind,
                "rep": self.rep,
                "variant": self.variant.name if self.variant is not None else None,
                "schedext_ready_s": ready_s,
                "warmup_s": warmup_s,
            }
        except BaseException:
            if self.schedext is not None:
                print(f"schedext log tail:\n{self.schedext.tail()}", file=sys.stderr)
            print(self.cp.logs_tail("kube-scheduler", 40), file=sys.stderr)
            raise
        finally:
            self.cp.stop_scheduler()
            if self.schedext is not None:
                self.schedext.stop()
        result["cleanup_s"] = round(kubeload.timed(self._delete_all), 2)
        return result

    def _start_schedext(self) -> float | None:
        if self.schedext is None:
            return None
        self.schedext.start()
        return round(self.schedext.wait_ready(120).ready_s, 2)

    def _config(self) -> str:
        url = self.schedext.url if self.schedext is not None else None
        transform = self.variant.apply if self.variant is not None else None
        if self.args.shipped_client_limits:
            return kubeload.scheduler_config(url, transform=transform)
        return kubeload.scheduler_config(
            url, qps=self.args.client_qps, burst=self.args.client_burst, transform=transform
        )

    def _pods_path(self) -> str:
        return f"/api/v1/namespaces/{self.namespace}/pods"

    def _warm_up(self) -> float:
        """One pod bound end to end (kube-scheduler may first wait for its leader lease)."""
        began = time.monotonic()
        pod = kubeload.gpu_pod("warmup", self.namespace, gpus=1, labels={"app": "warmup"})
        self.pool.call("POST", self._pods_path(), pod)
        path = f"{self._pods_path()}/warmup"
        deadline = began + 120
        while not self.pool.call("GET", path).get("spec", {}).get("nodeName"):
            if time.monotonic() > deadline:
                raise RuntimeError("warm-up pod not bound within 120 s")
            time.sleep(0.1)
        elapsed = time.monotonic() - began
        self.pool.call("DELETE", path, DELETE_NOW)
        return round(elapsed, 2)

    def _timed(self) -> JSON:
        count = self.args.pods
        names = [f"p-{i:05d}" for i in range(count)]
        calls: Iterator[Call] = (
            ("POST", self._pods_path(), self._pod(i, name), CREATE) for i, name in enumerate(names)
        )
        created: dict[int, float] = {}
        before = self._scrapes()
        meter = CpuMeter(self._pids())
        with BindWatch(self.cp, self.namespace) as watch, self._pprof():
            if self.schedext is not None:
                self.sampler.start(self.schedext.pid, f"throughput-{self.name}")
            meter.start()
            began = time.monotonic()
            batch = self.pool.run("create", calls, on_answer=created.__setitem__)
            if batch.failed:
                raise RuntimeError(f"{self.name}: {batch.failed} creates failed: {batch.errors}")
            bound = watch.wait(set(names), self.args.bind_timeout)
            cpu = meter.read()
            spy = self.sampler.stop()
        after = self._scrapes()
        ours = stages = None
        if before[1] is not None and after[1] is not None:
            ours = report.schedext_figures(before[1], after[1])
            stages = report.schedext_stages(before[1], after[1])
        last = max(bound.values())
        latencies = [(bound[n] - created[i]) * 1000 for i, n in enumerate(names)]
        return {
            "pods": count,
            "seconds": round(last - began, 3),
            "pods_per_s": round(count / (last - began), 1),
            "create": batch.summary(),
            "first_bound_s": round(min(bound.values()) - began, 3),
            "create_to_bound_p50_ms": round(kubeload.percentile(latencies, 50), 1),
            "create_to_bound_p99_ms": round(kubeload.percentile(latencies, 99), 1),
            "cpu_s": cpu,
            "kube_scheduler": report.scheduler_figures(before[0], after[0]),
            "schedext_stages": stages,
            "schedext": ours,
            "schedext_py_spy": spy,
            "quality": self._quality(before[1], after[1]),
        }

    def _pod(self, index: int, name: str) -> JSON:
        gpus = self.mix.gpus(index)
        if gpus:
            return kubeload.gpu_pod(name, self.namespace, gpus=gpus, labels=APP_LABEL)
        return kubeload.plain_pod(name, self.namespace, labels=APP_LABEL)

    def _quality(self, before: Scrape | None, after: Scrape | None) -> JSON:
        """The placement figures of the phase's pods, while they are all still bound."""
        pods = list_all(self.pool, self._pods_path(), {"labelSelector": SELECTOR})
        choices = None
        if before is not None and after is not None:
            choices = quality.choice_counts(
                before.by_label(quality.CHOICE_METRIC, "choice"),
                after.by_label(quality.CHOICE_METRIC, "choice"),
            )
        records = [quality.pod_record(pod) for pod in pods]
        return quality.placement_quality(records, self.nodes, choices).as_json()

    @contextlib.contextmanager
    def _pprof(self) -> Iterator[None]:
        """kube-scheduler's CPU profile of the first ``--pprof-s`` seconds of the window, on a
        thread (the endpoint answers when the profile is done)."""
        directory = self.args.pprof_dir
        if directory is None:
            yield
            return
        directory.mkdir(parents=True, exist_ok=True)
        url = f"https://127.0.0.1:{self.cp.scheduler_port}/debug/pprof/profile"
        target = directory / f"kube-scheduler-{self.name}.pprof"

        def fetch() -> None:
            response = httpx.get(
                url,
                params={"seconds": str(self.args.pprof_s)},
                verify=ssl.create_default_context(cafile=str(self.cp.ca_cert)),
                headers={"Authorization": f"Bearer {self.cp.token}"},
                timeout=self.args.pprof_s + 30,
            )
            if response.status_code == 200:
                target.write_bytes(response.content)
            else:
                print(f"pprof: {response.status_code} {response.text[:200]}", file=sys.stderr)

        thread = threading.Thread(target=fetch, name="pprof", daemon=True)
        thread.start()
        try:
            yield
        finally:
            thread.join(timeout=self.args.pprof_s + 40)

    def _pids(self) -> dict[str, int]:
        pids = kubeload.process_ids(("kube-apiserver", "etcd", "kube-scheduler"))
        if self.schedext is not None:
            pids["schedext"] = self.schedext.pid
        return pids

    def _scrapes(self) -> tuple[Scrape, Scrape | None]:
        context = ssl.create_default_context(cafile=str(self.cp.ca_cert))
        response = httpx.get(
            f"https://127.0.0.1:{self.cp.scheduler_port}/metrics",
            verify=context,
            headers={"Authorization": f"Bearer {self.cp.token}"},
            timeout=30,
        )
        response.raise_for_status()
        ours = self.schedext.scrape() if self.schedext is not None else None
        return Scrape(response.text), ours

    def _delete_all(self) -> None:
        """Every pod of the namespace, grace 0 (no kubelet), gone before the next phase."""
        self.pool.call("DELETE", self._pods_path(), DELETE_NOW)
        deadline = time.monotonic() + 180
        while self.pool.call("GET", self._pods_path(), params={"limit": "1"}).get("items"):
            if time.monotonic() > deadline:
                raise RuntimeError(f"pods of {self.namespace} not gone within 180 s")
            time.sleep(0.5)


class BindWatch:
    """A watch on one namespace's pods, on its own thread: when each was first seen bound
    (``spec.nodeName`` set), by the monotonic clock of this process. A watch that ends
    (server timeout, idle read timeout) resumes from the last resourceVersion."""

    def __init__(self, cp: ControlPlane, namespace: str) -> None:
        self.path = f"/api/v1/namespaces/{namespace}/pods"
        self.bound: dict[str, float] = {}
        self._client = httpx.Client(
            base_url=cp.server,
            verify=ssl.create_default_context(cafile=str(cp.ca_cert)),
            headers={"Authorization": f"Bearer {cp.token}"},
            # A short read timeout lets the thread notice stop() when no event comes.
            timeout=httpx.Timeout(30.0, read=2.0),
        )
        self._version = ""
        self._watching = threading.Event()
        self._stop = threading.Event()
        self._changed = threading.Condition()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="bind-watch", daemon=True)

    def __enter__(self) -> BindWatch:
        listing = self._client.get(self.path, params={"labelSelector": SELECTOR})
        listing.raise_for_status()
        self._version = listing.json()["metadata"]["resourceVersion"]
        self._thread.start()
        if not self._watching.wait(30):
            raise RuntimeError(f"watch of {self.path} did not start: {self._error}")
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self._client.close()

    def wait(self, names: set[str], timeout: float) -> dict[str, float]:
        """Block until every pod in ``names`` was seen bound; their times."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while not names <= self.bound.keys():
                left = deadline - time.monotonic()
                if left <= 0 or self._error is not None or not self._thread.is_alive():
                    missing = len(names - self.bound.keys())
                    raise RuntimeError(f"{missing} pods not bound in time ({self._error})")
                self._changed.wait(min(left, 1.0))
        return {name: self.bound[name] for name in names}

    def _run(self) -> None:
        while not self._stop.is_set():
            params = {
                "watch": "1",
                "labelSelector": SELECTOR,
                "resourceVersion": self._version,
                "allowWatchBookmarks": "true",
                "timeoutSeconds": "300",
            }
            try:
                with self._client.stream("GET", self.path, params=params) as response:
                    response.raise_for_status()
                    self._watching.set()
                    for line in response.iter_lines():
                        self._event(line, time.monotonic())
                        if self._stop.is_set():
                            return
            except httpx.ReadTimeout:
                continue  # idle: look at the stop flag, resume from the last version
            except (httpx.HTTPError, ValueError) as error:
                self._error = error
                return

    def _event(self, line: str, seen: float) -> None:
        if not line.strip():
            return
        event = orjson.loads(line)
        obj = event.get("object") or {}
        if event.get("type") == "ERROR":
            raise ValueError(f"watch error: {obj.get('message', obj)}")
        self._version = obj.get("metadata", {}).get("resourceVersion", self._version)
        name = obj.get("metadata", {}).get("name", "")
        if obj.get("spec", {}).get("nodeName") and name not in self.bound:
            with self._changed:
                self.bound[name] = seen
                self._changed.notify_all()


if __name__ == "__main__":
    raise SystemExit(main())
