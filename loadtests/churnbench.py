"""Filter latency while pods churn, against idle, in one run: does a verb wait behind watch work
(issue 34)?

Against the end-to-end harness's real etcd + kube-apiserver (loopback only) it:

1. creates N GPU nodes and M pods already bound, as ``loadtests.sync`` does (``sync.Plan``:
   the first pods of each GPU node hold 2, 1, 2, 1... GPUs, here until ``--gpu-fill`` of the
   node's GPUs are held, 0.5 by default, so that the churn and the probe find free GPUs); then
   ``--churn-pods`` bound churn pods holding one free GPU each (the backlog the churn's deletes
   take from), and a sentinel node of its own GPU model that nothing else touches;
2. starts ``schedext serve --kubeconfig`` and waits for /readyz;
3. probes: a process of its own (so that the benchmark's REST threads cannot delay it behind
   Python's GIL) sends kube-scheduler's filter request over one keep-alive HTTP connection at a
   fixed rate (``--probe-rate``, call i due at t0 + i/rate): a pending pod asking 1 GPU, a new
   pod name and uid each call as kube-scheduler sends each pending pod once, ``NodeNames`` every
   node with GPUs (``nodeCacheCapable``: kube-scheduler sends the names of the nodes that passed
   its in-tree filters, and a node without ``nvidia.com/gpu`` fails NodeResourcesFit). Each round
   trip is timed (send to last byte of the answer) and the answer checked: a 200 with no Error
   and a node;
4. alternates ``--blocks`` pairs of an idle block and a churn block while the probe runs. Idle:
   ``--block-s`` seconds of nothing but the probe. Churn: ``--block-s`` x ``--rate`` pod calls
   at ``--rate`` per second, each making exactly one pod watch event, in the repeating mix
   create, patch, delete, patch (:data:`MIX`): a quarter creates of a bound pod holding one free
   GPU (it takes inventory), a quarter deletes (grace 0) of the oldest churn pod (it frees
   inventory), half label PATCHes to bound pods, each a value never used before. After the
   calls the block lasts until schedext shows the sentinel toggled (the sentinel pod created or
   deleted: its event follows every churn event on the same watch), and schedext's held GPU
   count must then equal what the cluster holds; the churn block is that whole window, calls
   and catch-up;
5. reports per tree and condition (idle, churn; all blocks of each pooled) the filter round
   trip's p50, p90, p99 and max, the ratios churn/idle of p99 and p50 (target p99 <= 1.5x),
   the probes counted, the events per second achieved, schedext's CPU per 1,000 events (less
   its CPU rate in the idle blocks, which includes answering the probe), and, from schedext's
   ``schedext_request_stage_seconds``, where a filter spent its time on the server (body read,
   queue until its handler starts, handler) in each condition.

With ``--control`` each round has a third block: the same mix at the same rate on ConfigMaps of
about a churn pod's size, which schedext does not watch. It loads the API server, etcd and this
benchmark as the churn does, without a pod event: churn against control is what schedext's
watch work costs filter, control against idle what sharing the machine's CPUs costs it.

With ``--baseline DIR`` another checkout's schedext is measured on the same cluster: each rep
runs this tree's schedext, then the baseline's (the order alternating rep by rep), each a fresh
process through the whole block sequence, stopped before the other starts (only one schedext
watches the churn at a time). The churn carries on from one measurement to the next.

    python -m loadtests.churnbench                        # 1,000 nodes, 10,000 pods, 6 pairs
    python -m loadtests.churnbench --nodes 500 --pods 5000 --blocks 3 --block-s 8
    python -m loadtests.churnbench --baseline ../schedext-before --json churn.json
    python -m loadtests.churnbench --nodes 500 --pods 5000 --control   # + ConfigMap churn

Bounded: every block ends by itself (the catch-up within ``--catch-up-timeout`` or an error),
the probe process stops when told or at its own deadline.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import itertools
import json
import math
import multiprocessing
import random
import sys
import tempfile
import time
from collections import deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any

import orjson

from loadtests import kubeload, payloads, sync
from loadtests.kubeload import Call, RestPool, SchedextProcess
from testbed.controlplane import ControlPlane

JSON = dict[str, Any]
NAMESPACE = sync.NAMESPACE  # sync.Plan's pods live there; the churn pods too
PROBE_NAMESPACE = "churn-probe"  # the probe's pods are never created
CREATE, PATCH, DELETE = "create", "patch", "delete"
# The churn's calls, in this order again and again: as many creates as deletes, so that the
# churn pods stay at --churn-pods, and as many label PATCHes as the two together.
MIX = (CREATE, PATCH, DELETE, PATCH)
CHURN_LABEL = "schedext-bench/churn"
TICK_LABEL = "churn-tick"
SENTINEL_MODEL = "NVIDIA-SENTINEL-TEST"
SENTINEL_NODE = "churn-sentinel"
SENTINEL_POD = "churn-sentinel"
TARGET_RATIO = 1.5
CONTROL_BYTES = 4000  # a churn pod as the API server stores it is about 4 KB
PATCH_STRIDE = 7919  # a large prime: consecutive PATCHes land on pods of other nodes
IDLE, CHURN, CONTROL = "idle", "churn", "control"
CONDITIONS = (IDLE, CHURN, CONTROL)
STAGES = ("body", "queue", "handler", "total")
STAGE_METRIC = "schedext_request_stage_seconds"
OK, REFUSED, FAILED = "ok", "no node", "failed"
OTHERS_WARN = 0.15  # a share of the machine's CPU time (all CPUs) taken by other processes
CPU_NAMES = ("schedext", "kube-apiserver", "etcd", "probe", "benchmark", "others")

Slot = tuple[int, int]  # (node index in the plan, GPU id)


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:  # before anything starts: a plan that cannot be is a usage error
        check_args(args)
        plan = sync.Plan.build(args.nodes, args.pods, gpu_fill=args.gpu_fill, compact=True)
        churn = Churn.build(plan, args.churn_pods)
    except ValueError as error:
        parser.error(str(error))
    kubeload.exit_on_signals()
    report: JSON = {"machine": kubeload.machine_info(), "params": _params(args)}
    trees = {"current": kubeload.ROOT}
    if args.baseline is not None:
        trees["baseline"] = args.baseline.resolve()
    started = time.monotonic()
    with (
        tempfile.TemporaryDirectory(prefix="schedext-churn-") as workdir,
        kubeload.control_plane(args.apiserver_arg) as cp,
        RestPool(cp, args.concurrency) as pool,
    ):
        report["cluster"] = plan.summary() | {"churn_pods": args.churn_pods}
        control = ControlChurn() if args.control else None
        mixes: list[Mix] = [churn] if control is None else [churn, control]
        report["fill"] = _fill(pool, plan, mixes, args.churn_pods)
        sentinel = Sentinel(pool)
        runs: dict[str, list[JSON]] = {name: [] for name in trees}
        for rep in range(args.reps):
            order = list(trees.items())
            for name, root in order if rep % 2 == 0 else reversed(order):
                log = Path(workdir) / f"schedext-{name}-{rep}.log"
                with _schedext(cp, log, root) as schedext:
                    run = _measure(
                        pool,
                        schedext,
                        args,
                        plan=plan,
                        churn=churn,
                        control=control,
                        sentinel=sentinel,
                    )
                runs[name].append(run | {"rep": rep})
        report["runs"] = runs
        report["by_tree"] = {name: pooled(tree_runs) for name, tree_runs in runs.items()}
    report["total_s"] = round(time.monotonic() - started, 1)
    print(format_report(report))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    return 0


@contextlib.contextmanager
def _schedext(cp: ControlPlane, log: Path, root: Path) -> Iterator[SchedextProcess]:
    schedext = SchedextProcess(cp.kubeconfig, log, root=root)
    try:
        yield schedext
    except BaseException:
        print(f"schedext log tail:\n{schedext.tail()}", file=sys.stderr)
        raise
    finally:
        schedext.stop()


# ---------------------------------------------------------------------------------------------
# Arguments
# ---------------------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m loadtests.churnbench", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--nodes", type=int, default=1000, help="N nodes (default 1000)")
    parser.add_argument("--pods", type=int, default=10_000, help="M bound pods (default 10000)")
    parser.add_argument(
        "--gpu-fill", type=float, default=0.5, help="share of each node's GPUs held (0..1)"
    )
    parser.add_argument(
        "--churn-pods",
        type=int,
        default=500,
        help="churn pods alive at any time (default 500): each delete takes the oldest",
    )
    parser.add_argument("--rate", type=float, default=200.0, help="churn events per second")
    parser.add_argument("--probe-rate", type=float, default=50.0, help="filter calls per second")
    parser.add_argument("--blocks", type=int, default=6, help="pairs of idle and churn blocks")
    parser.add_argument("--block-s", type=float, default=10.0, help="seconds per block")
    parser.add_argument(
        "--warmup-s", type=float, default=2.0, help="probing before the first block (not counted)"
    )
    parser.add_argument(
        "--catch-up-timeout", type=float, default=120.0, help="seconds for the watch to catch up"
    )
    parser.add_argument(
        "--control",
        action="store_true",
        help="a third block in each round: the same mix at the same rate on ConfigMaps, which "
        "schedext does not watch (the API server's and the benchmark's load without pod events)",
    )
    parser.add_argument("--concurrency", type=int, default=32, help="API requests in flight")
    parser.add_argument("--reps", type=int, default=1, help="measurements per source tree")
    parser.add_argument("--ready-timeout", type=float, default=300.0, help="seconds")
    parser.add_argument(
        "--apiserver-arg", action="append", default=[], help="extra kube-apiserver flag"
    )
    parser.add_argument(
        "--baseline",
        type=Path,
        help="another checkout of schedext (e.g. a git worktree of an earlier commit), measured "
        "on the same cluster after this tree's, the order alternating rep by rep",
    )
    parser.add_argument("--json", type=Path, help="write the figures here as JSON")
    return parser


def check_args(args: argparse.Namespace) -> None:
    """ValueError for figures no run can have."""
    positive = ("nodes", "pods", "rate", "probe_rate", "blocks", "block_s", "reps", "concurrency")
    for name in positive:
        if getattr(args, name) <= 0:
            raise ValueError(f"--{name.replace('_', '-')} must be > 0")
    if args.churn_pods < 1:
        raise ValueError("--churn-pods must be >= 1")
    if not 0 <= args.gpu_fill < 1:
        raise ValueError("--gpu-fill must be in [0, 1): the churn needs free GPUs")
    if args.warmup_s < 0 or args.catch_up_timeout <= 0:
        raise ValueError("--warmup-s must be >= 0 and --catch-up-timeout > 0")


def _params(args: argparse.Namespace) -> JSON:
    return {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}


# ---------------------------------------------------------------------------------------------
# The churn
# ---------------------------------------------------------------------------------------------


def free_slots(plan: sync.Plan) -> list[Slot]:
    """The GPUs no pod of the plan holds, the nodes interleaved (each node's first free GPU,
    then each node's second...), so that consecutive creates land on different nodes."""
    per_node = []
    for index, node in enumerate(plan.nodes):
        held = {gpu for ids in plan.layouts[index] for gpu in ids}
        per_node.append(
            [(index, gpu) for gpu in range(kubeload.node_gpus(node)) if gpu not in held]
        )
    rounds = itertools.zip_longest(*per_node)
    return [slot for row in rounds for slot in row if slot is not None]


class Mix:
    """The call mix over a churn's objects: :data:`MIX` again and again, carried over blocks."""

    tick: int

    def create(self) -> Call:
        raise NotImplementedError

    def delete(self) -> Call:
        raise NotImplementedError

    def patch(self) -> Call:
        raise NotImplementedError

    def backlog(self, count: int) -> list[Call]:
        """``count`` creates: the objects the first deletes take."""
        return [self.create() for _ in range(count)]

    def calls(self, count: int) -> tuple[list[Call], dict[str, int]]:
        """The next ``count`` calls of the mix, and how many of each kind."""
        calls, kinds = [], dict.fromkeys(MIX, 0)
        for _ in range(count):
            kind = MIX[self.tick % len(MIX)]
            self.tick += 1
            kinds[kind] += 1
            if kind == CREATE:
                calls.append(self.create())
            elif kind == DELETE:
                calls.append(self.delete())
            else:
                calls.append(self.patch())
        return calls, kinds


@dataclass
class Churn(Mix):
    """The churn's state from one block to the next: the free GPUs (a freed one goes last, so it
    is taken again only after every other), the churn pods alive (oldest first), and counters
    that make every name and label value new."""

    plan: sync.Plan
    free: deque[Slot]
    live: deque[tuple[str, Slot]] = field(default_factory=deque)
    tick: int = 0  # position in MIX, carried over blocks
    serial: int = 0  # churn pod names
    patches: int = 0  # PATCH targets and values

    @classmethod
    def build(cls, plan: sync.Plan, live: int) -> Churn:
        """ValueError unless there are free GPUs for twice ``live`` churn pods (a freed GPU is
        then taken again at least ``live`` creates later, its pod long deleted)."""
        slots = free_slots(plan)
        if len(slots) < 2 * live:
            raise ValueError(
                f"--churn-pods {live}: needs {2 * live:,} free GPUs, the plan leaves "
                f"{len(slots):,} (more --nodes, a lower --gpu-fill or fewer --churn-pods)"
            )
        return cls(plan, deque(slots))

    def create(self) -> Call:
        slot = self.free.popleft()
        name = f"churn-{self.serial:07d}"
        self.serial += 1
        self.live.append((name, slot))
        node, gpu = slot
        pod = kubeload.pod_object(
            name,
            NAMESPACE,
            node=self.plan.nodes[node]["metadata"]["name"],
            gpu_ids=(gpu,),
            labels={CHURN_LABEL: "true"},
        )
        return "POST", f"/api/v1/namespaces/{NAMESPACE}/pods", pod, sync.CREATE

    def delete(self) -> Call:
        if not self.live:
            raise RuntimeError("no churn pod left to delete (the mix creates before it deletes)")
        name, slot = self.live.popleft()
        self.free.append(slot)
        return "DELETE", f"/api/v1/namespaces/{NAMESPACE}/pods/{name}", sync.DELETE_NOW, sync.CREATE

    def patch(self) -> Call:
        """A new label value on a pod of the plan (never deleted): always a change, one event."""
        index = self.patches * PATCH_STRIDE % self.plan.pods
        body = {"metadata": {"labels": {TICK_LABEL: str(self.patches)}}}
        self.patches += 1
        path = f"/api/v1/namespaces/{NAMESPACE}/pods/{self.plan.name(index)}"
        return "PATCH", path, body, sync.MERGE_PATCH

    @property
    def held_gpus(self) -> int:
        """GPUs the churn pods hold (one each)."""
        return len(self.live)


@dataclass
class ControlChurn(Mix):
    """``--control``: the same mix on ConfigMaps of about a churn pod's size, which schedext
    does not watch: the API server's, etcd's and this benchmark's work of a churn block without
    its pod events. A PATCH changes a label of the middle ConfigMap alive (not the next one a
    delete takes)."""

    live: deque[str] = field(default_factory=deque)
    tick: int = 0
    serial: int = 0
    patches: int = 0

    PATH = f"/api/v1/namespaces/{NAMESPACE}/configmaps"

    def create(self) -> Call:
        name = f"control-{self.serial:07d}"
        self.serial += 1
        self.live.append(name)
        body = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": name, "labels": {CHURN_LABEL: "control"}},
            "data": {"payload": "x" * CONTROL_BYTES},
        }
        return "POST", self.PATH, body, sync.CREATE

    def delete(self) -> Call:
        if not self.live:
            raise RuntimeError("no ConfigMap left to delete (the mix creates before it deletes)")
        return "DELETE", f"{self.PATH}/{self.live.popleft()}", sync.DELETE_NOW, sync.CREATE

    def patch(self) -> Call:
        name = self.live[len(self.live) // 2]
        body = {"metadata": {"labels": {TICK_LABEL: str(self.patches)}}}
        self.patches += 1
        return "PATCH", f"{self.PATH}/{name}", body, sync.MERGE_PATCH


class Sentinel:
    """A pod on a node of a GPU model of its own, created and deleted in turn: when schedext's
    free count of that model shows the latest toggle, it has taken every pod event before it
    (one watch, in resourceVersion order)."""

    def __init__(self, pool: RestPool) -> None:
        self.pool = pool
        self.alive = False

    @staticmethod
    def node() -> JSON:
        node = payloads.make_node(
            0, random.Random(11), gpu=(SENTINEL_MODEL, 1024, 8, [[0, 1, 2, 3], [4, 5, 6, 7]])
        )
        node["metadata"]["name"] = SENTINEL_NODE
        node["metadata"]["labels"]["kubernetes.io/hostname"] = SENTINEL_NODE
        for key in ("uid", "resourceVersion", "creationTimestamp"):
            del node["metadata"][key]
        return node

    def toggle(self) -> int:
        """Create or delete the sentinel pod; the sentinel node's free GPUs once seen."""
        path = f"/api/v1/namespaces/{NAMESPACE}/pods"
        if self.alive:
            self.pool.call("DELETE", f"{path}/{SENTINEL_POD}", sync.DELETE_NOW)
        else:
            pod = kubeload.pod_object(SENTINEL_POD, NAMESPACE, node=SENTINEL_NODE, gpu_ids=(0,))
            self.pool.call("POST", path, pod)
        self.alive = not self.alive
        return 8 - self.held_gpus

    @property
    def held_gpus(self) -> int:
        return 1 if self.alive else 0


def _fill(pool: RestPool, plan: sync.Plan, churns: Sequence[Mix], churn_pods: int) -> JSON:
    kubeload.create_namespace(pool, NAMESPACE)
    kubeload.create_priority_class(pool, *sync.PRIORITY_CLASS)
    node_calls = [("POST", "/api/v1/nodes", n, sync.CREATE) for n in plan.nodes]
    nodes = _checked(pool.run("nodes", [*node_calls, ("POST", "/api/v1/nodes", Sentinel.node(),
                                                      sync.CREATE)]))  # fmt: skip
    path = f"/api/v1/namespaces/{NAMESPACE}/pods"
    pod_calls = (("POST", path, plan.pod(i), sync.CREATE) for i in range(plan.pods))
    pods = _checked(pool.run("pods", pod_calls, progress_s=15))
    backlog = [churn.backlog(churn_pods) for churn in churns]
    created = _checked(pool.run("churn objects", itertools.chain.from_iterable(backlog)))
    return {"nodes": nodes.summary(), "pods": pods.summary(), "churn_objects": created.summary()}


def _checked(batch: kubeload.Batch) -> kubeload.Batch:
    if batch.failed:
        raise RuntimeError(f"{batch.label}: {batch.failed} requests failed: {batch.errors[:3]}")
    return batch


# ---------------------------------------------------------------------------------------------
# The probe
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ProbeRecord:
    """One filter call: when it was sent (monotonic seconds, the same clock in every process
    on Linux), its round trip, how late it was sent after its due time, and its verdict."""

    sent: float
    ms: float
    late_ms: float
    verdict: str


def filter_body(index: int, names: bytes) -> bytes:
    """kube-scheduler's ExtenderArgs for pending pod ``index`` (its own name and uid) asking 1
    GPU, ``names`` the JSON array of node names (encoded once)."""
    pod = kubeload.gpu_pod(f"probe-{index}", PROBE_NAMESPACE, gpus=1, labels={"app": "probe"})
    pod["metadata"]["uid"] = f"00000000-0000-4000-9000-{index:012d}"
    pod["metadata"]["creationTimestamp"] = "2026-11-28T10:00:00Z"
    pod["status"] = {"phase": "Pending"}
    return b'{"Pod":' + orjson.dumps(pod) + b',"Nodes":null,"NodeNames":' + names + b"}"


def verdict(status: int, body: bytes) -> str:
    """OK: a 200 naming a node and no Error; REFUSED: a 200 naming none; else FAILED with why."""
    if status != 200:
        return f"{FAILED}: HTTP {status} {body[:120]!r}"
    try:
        answer = orjson.loads(body)
    except orjson.JSONDecodeError:
        return f"{FAILED}: not JSON {body[:120]!r}"
    if not isinstance(answer, dict):
        return f"{FAILED}: not an object {body[:120]!r}"
    if answer.get("Error"):
        return f"{FAILED}: {str(answer['Error'])[:120]}"
    return OK if answer.get("NodeNames") else REFUSED


@dataclass(frozen=True)
class ProbeSpec:
    """What the probe process needs: schedext's port, the node names (a JSON array), the
    calls per second, and the seconds after which it stops by itself."""

    port: int
    names: bytes
    rate: float
    limit_s: float


def probe_loop(spec: ProbeSpec, stop: Event, results: Connection) -> None:
    """The probe process: filter calls on one keep-alive connection, call i due at t0 + i/rate,
    until ``stop`` is set or ``limit_s`` have passed; then the records, sent on ``results``."""
    port, names, rate, limit_s = spec.port, spec.names, spec.rate, spec.limit_s
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    headers = {"Content-Type": "application/json"}
    records: list[tuple[float, float, float, str]] = []
    began = time.monotonic()
    for index in itertools.count():
        due = began + index / rate
        if due - began > limit_s or stop.wait(max(0.0, due - time.monotonic())):
            break
        body = filter_body(index, names)
        sent = time.monotonic()
        clock = time.perf_counter()
        try:
            connection.request("POST", "/filter", body, headers)
            response = connection.getresponse()
            status, answer = response.status, response.read()
        except (OSError, http.client.HTTPException) as error:
            connection.close()  # the next request opens a new one
            status, answer = 0, repr(error).encode()
        ms = (time.perf_counter() - clock) * 1000
        records.append((sent, ms, max(0.0, sent - due) * 1000, verdict(status, answer)))
    connection.close()
    results.send(records)
    results.close()


class Probe:
    """:func:`probe_loop` in a process of its own (spawned: no thread of this one is copied)."""

    def __init__(self, port: int, names: Sequence[str], rate: float, limit_s: float) -> None:
        context = multiprocessing.get_context("spawn")
        self._stop = context.Event()
        self._results, child = context.Pipe(duplex=False)
        self.process = context.Process(
            target=probe_loop,
            args=(ProbeSpec(port, orjson.dumps(list(names)), rate, limit_s), self._stop, child),
            name="filter-probe",
            daemon=True,
        )
        self.process.start()
        child.close()

    @property
    def pid(self) -> int:
        return self.process.pid or 0

    def stop(self, timeout: float = 60.0) -> list[ProbeRecord]:
        self._stop.set()
        if not self._results.poll(timeout):
            self.process.kill()
            raise RuntimeError("the filter probe sent no records")
        records = [ProbeRecord(*r) for r in self._results.recv()]
        self.process.join(10)
        return records


# ---------------------------------------------------------------------------------------------
# One measurement: a schedext through the block sequence
# ---------------------------------------------------------------------------------------------


@dataclass
class Block:
    """One idle or churn block: its window (monotonic seconds) and what was measured in it."""

    kind: str
    began: float
    ended: float = 0.0
    schedext_cpu_s: float = 0.0
    cpu: JSON = field(default_factory=dict)  # CpuMeter's reading
    stages: dict[str, tuple[float, float]] = field(default_factory=dict)  # stage: (count, s)
    events: int = 0
    kinds: dict[str, int] = field(default_factory=dict)
    stream_s: float = 0.0
    catch_up_s: float = 0.0
    skipped: float = 0.0  # pod events schedext's intake found to change nothing

    @property
    def seconds(self) -> float:
        return self.ended - self.began


def _measure(
    pool: RestPool,
    schedext: SchedextProcess,
    args: argparse.Namespace,
    *,
    plan: sync.Plan,
    churn: Churn,
    control: ControlChurn | None,
    sentinel: Sentinel,
) -> JSON:
    """One schedext through ``--blocks`` rounds of idle, churn (and control) blocks."""
    schedext.start()
    ready = schedext.wait_ready(args.ready_timeout)
    model = _sentinel_model(schedext)
    expected = plan.summary()["held_gpus"]

    def catch_up() -> float:
        began = time.monotonic()
        _catch_up(
            schedext,
            churn=churn,
            sentinel=sentinel,
            model=model,
            plan_held=expected,
            timeout=args.catch_up_timeout,
        )
        return time.monotonic() - began

    catch_up()
    names = [n["metadata"]["name"] for n in plan.nodes if kubeload.node_gpus(n)]
    mixes: dict[str, Mix] = {CHURN: churn} | ({CONTROL: control} if control else {})
    per_round = args.block_s * (1 + len(mixes)) + args.catch_up_timeout * len(mixes)
    probe = Probe(schedext.port, names, args.probe_rate, args.warmup_s + args.blocks * per_round)
    pids = kubeload.process_ids(("kube-apiserver", "etcd")) | {"schedext": schedext.pid}
    meter_pids = pids | {"probe": probe.pid}
    blocks: list[Block] = []
    try:
        time.sleep(args.warmup_s)
        for _ in range(args.blocks):
            with _block(IDLE, schedext, meter_pids) as idle:
                time.sleep(args.block_s)
            blocks.append(idle)
            for kind, mix in mixes.items():
                with _block(kind, schedext, meter_pids) as block:
                    calls, block.kinds = mix.calls(round(args.rate * args.block_s))
                    stream = _checked(pool.run(kind, calls, rate=args.rate))
                    block.events, block.stream_s = stream.done, stream.seconds
                    block.catch_up_s = catch_up()
                blocks.append(block)
    finally:
        records = probe.stop()
    return {
        "ready_s": round(ready.ready_s, 2),
        "probe_nodes": len(names),
        **summarize(records, blocks),
    }


def _sentinel_model(schedext: SchedextProcess) -> str:
    models = schedext.scrape().by_label("schedext_inventory_gpus", "model")
    found = [m for m in models if "SENTINEL" in m.upper()]
    if len(found) != 1:
        raise RuntimeError(f"no single sentinel GPU model in schedext's inventory: {models}")
    return found[0]


def _catch_up(
    schedext: SchedextProcess,
    *,
    churn: Churn,
    sentinel: Sentinel,
    model: str,
    plan_held: int,
    timeout: float,
) -> None:
    """Toggle the sentinel and wait until schedext shows it; then schedext must hold exactly
    the GPUs the cluster's pods hold."""
    wanted = sentinel.toggle()
    deadline = time.monotonic() + timeout
    while True:
        scrape = schedext.scrape()
        if scrape.total("schedext_inventory_gpus_free", model=model) == wanted:
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"schedext did not see the sentinel toggled within {timeout:g} s")
        time.sleep(0.01)
    held = scrape.total("schedext_inventory_gpus") - scrape.total("schedext_inventory_gpus_free")
    expected = plan_held + churn.held_gpus + sentinel.held_gpus
    if held != expected:
        raise RuntimeError(f"schedext holds {held:g} GPUs after catching up, the pods {expected}")


@contextlib.contextmanager
def _block(kind: str, schedext: SchedextProcess, pids: Mapping[str, int]) -> Iterator[Block]:
    before = schedext.scrape()
    meter = kubeload.CpuMeter(pids).start()
    cpu_before = kubeload.cpu_seconds(schedext.pid)
    block = Block(kind, time.monotonic())
    yield block
    block.ended = time.monotonic()
    block.schedext_cpu_s = kubeload.cpu_seconds(schedext.pid) - cpu_before
    block.cpu = meter.read()
    after = schedext.scrape()
    block.stages = stage_window(before, after)
    skipped = "schedext_pod_events_skipped_total"
    block.skipped = after.total(skipped) - before.total(skipped)


def stage_window(before: kubeload.Scrape, after: kubeload.Scrape) -> dict[str, tuple[float, float]]:
    """(count, seconds) of each stage of filter over a window; empty for a schedext without
    the metric."""
    figures = {}
    for stage in STAGES:
        labels = {"verb": "filter", "stage": stage}
        count = after.total(f"{STAGE_METRIC}_count", **labels) - before.total(
            f"{STAGE_METRIC}_count", **labels
        )
        if count:
            seconds = after.total(f"{STAGE_METRIC}_sum", **labels) - before.total(
                f"{STAGE_METRIC}_sum", **labels
            )
            figures[stage] = (count, seconds)
    return figures


# ---------------------------------------------------------------------------------------------
# Figures
# ---------------------------------------------------------------------------------------------


def kinds_of(blocks: Sequence[Block]) -> list[str]:
    """The conditions the blocks measured, idle and churn always, in :data:`CONDITIONS` order."""
    seen = {b.kind for b in blocks} | {IDLE, CHURN}
    return [kind for kind in CONDITIONS if kind in seen]


def in_blocks(records: Sequence[ProbeRecord], blocks: Sequence[Block]) -> dict[str, list[float]]:
    """The round trips of the OK probes sent within a block, per block kind (probes sent
    before the first block, between blocks or after the last are left out)."""
    latencies: dict[str, list[float]] = {kind: [] for kind in kinds_of(blocks)}
    windows = sorted((b.began, b.ended, b.kind) for b in blocks)
    for record in records:
        if record.verdict != OK:
            continue
        for began, ended, kind in windows:
            if began <= record.sent < ended:
                latencies[kind].append(record.ms)
                break
    return latencies


def latency_figures(values: Sequence[float]) -> JSON:
    """Count, p50, p90, p99 (nearest rank), max and mean, in ms."""
    figures: JSON = {"count": len(values)}
    for q in (50, 90, 99):
        figures[f"p{q}_ms"] = round(kubeload.percentile(values, q), 3)
    figures["max_ms"] = round(max(values, default=math.nan), 3)
    figures["mean_ms"] = round(sum(values) / len(values), 3) if values else math.nan
    return figures


def ratio(numerator: float, denominator: float) -> float | None:
    """numerator / denominator, or None where either is missing (NaN) or the divisor 0."""
    if math.isnan(numerator) or math.isnan(denominator) or denominator <= 0:
        return None
    return round(numerator / denominator, 3)


def _sum_stages(blocks: Sequence[Block]) -> dict[str, list[float]]:
    """[count, seconds] per stage over the blocks' filter calls."""
    return {
        stage: [
            sum(b.stages[stage][0] for b in blocks if stage in b.stages),
            sum(b.stages[stage][1] for b in blocks if stage in b.stages),
        ]
        for stage in STAGES
    }


def stage_means(sums: Mapping[str, Sequence[float]]) -> JSON:
    """Mean ms per stage from [count, seconds] (None where the metric is absent)."""
    return {
        stage: round(seconds / count * 1000, 3) if count else None
        for stage, (count, seconds) in sums.items()
    }


def _sum_cpu(blocks: Sequence[Block]) -> dict[str, float]:
    return _sum_named(block.cpu for block in blocks)


def condition_figures(
    latencies: Sequence[float], blocks: Sequence[Block], idle_cpu_rate: float
) -> JSON:
    """One condition's figures over its blocks. ``idle_cpu_rate``: schedext's CPU seconds per
    second in the idle blocks, subtracted from a churn block's to charge the events alone."""
    seconds = sum(b.seconds for b in blocks)
    cpu_s = sum(b.schedext_cpu_s for b in blocks)
    events = sum(b.events for b in blocks)
    figures: JSON = {
        "filter": latency_figures(latencies),
        "blocks": len(blocks),
        "seconds": round(seconds, 2),
        "schedext_cpu_ms_per_s": round(cpu_s / seconds * 1000, 1) if seconds else None,
        "stages_mean_ms": stage_means(_sum_stages(blocks)),
        "stage_sums": _sum_stages(blocks),
        "cpu_s": _sum_cpu(blocks),
    }
    if events:
        stream_s = sum(b.stream_s for b in blocks)
        net = max(0.0, cpu_s - idle_cpu_rate * seconds)
        figures |= {
            "events": events,
            "kinds": {k: sum(b.kinds.get(k, 0) for b in blocks) for k in (CREATE, DELETE, PATCH)},
            "events_per_s": round(events / stream_s, 1) if stream_s else None,
            "catch_up_s": [round(b.catch_up_s, 3) for b in blocks],
            "events_skipped": int(sum(b.skipped for b in blocks)),
            "cpu_ms_per_1000_events": round(net * 1000 * 1000 / events, 1),
            "cpu_ms_per_1000_events_raw": round(cpu_s * 1000 * 1000 / events, 1),
        }
    return figures


def summarize(records: Sequence[ProbeRecord], blocks: Sequence[Block]) -> JSON:
    """Figures per condition, the ratios churn/idle, and the probes' verdicts."""
    latencies = in_blocks(records, blocks)
    idle_blocks = [b for b in blocks if b.kind == IDLE]
    idle_s = sum(b.seconds for b in idle_blocks)
    idle_rate = sum(b.schedext_cpu_s for b in idle_blocks) / idle_s if idle_s else 0.0
    conditions = {
        kind: condition_figures(latencies[kind], [b for b in blocks if b.kind == kind], idle_rate)
        for kind in kinds_of(blocks)
    }
    verdicts: dict[str, int] = {}
    for record in records:
        key = record.verdict.split(":", 1)[0]
        verdicts[key] = verdicts.get(key, 0) + 1
    return {
        "conditions": conditions,
        "ratios": _ratios(conditions),
        "probes": len(records),
        "verdicts": verdicts,
        "failures": [r.verdict for r in records if r.verdict.startswith(FAILED)][:5],
        "late_p99_ms": round(kubeload.percentile([r.late_ms for r in records], 99), 3),
        "latencies_ms": latencies,
        "blocks": block_rows(records, blocks),
    }


def block_rows(records: Sequence[ProbeRecord], blocks: Sequence[Block]) -> list[JSON]:
    """Each block on its own, in order: its filter figures, its events, schedext's CPU and the
    CPU seconds of processes not the benchmark's (``others``), to tell a block that shared
    the machine with other work from one that did not."""
    rows = []
    for block in blocks:
        latencies = in_blocks(records, [block])[block.kind]
        rows.append(
            {
                "kind": block.kind,
                "seconds": round(block.seconds, 2),
                "filter": latency_figures(latencies),
                "events": block.events,
                "schedext_cpu_s": round(block.schedext_cpu_s, 2),
                "others_cpu_s": block.cpu.get("others"),
            }
        )
    return rows


RATIOS = ((CHURN, IDLE), (CONTROL, IDLE), (CHURN, CONTROL))


def _ratios(conditions: JSON) -> JSON:
    """p50 and p99 of churn/idle as ``p50`` and ``p99``; with a control condition, also
    control/idle and churn/control (``control/idle p99``...)."""
    ratios: JSON = {}
    for top, bottom in RATIOS:
        if top not in conditions or bottom not in conditions:
            continue
        prefix = "" if (top, bottom) == (CHURN, IDLE) else f"{top}/{bottom} "
        for q in (50, 99):
            ratios[f"{prefix}p{q}"] = ratio(
                conditions[top]["filter"][f"p{q}_ms"], conditions[bottom]["filter"][f"p{q}_ms"]
            )
    return ratios


def pooled(runs: Sequence[JSON]) -> JSON:
    """A tree's runs as one: every probe of each condition pooled, the blocks, events, CPU and
    server stages summed; of the per-run rates (events/s, CPU per 1,000 events) the median
    run's (the figures of one run when there is one)."""
    if len(runs) == 1:
        return runs[0]
    conditions: JSON = {}
    for kind in runs[0]["conditions"]:
        each = [run["conditions"][kind] for run in runs]
        merged = dict(each[0])
        merged["filter"] = latency_figures([ms for r in runs for ms in r["latencies_ms"][kind]])
        for key in ("blocks", "seconds", "events", "events_skipped"):
            if key in merged:
                merged[key] = sum(c[key] for c in each)
        for key in ("cpu_ms_per_1000_events", "cpu_ms_per_1000_events_raw", "events_per_s"):
            if key in merged:
                merged[key] = sorted(c[key] for c in each)[(len(each) - 1) // 2]
        merged["cpu_s"] = _sum_named(c["cpu_s"] for c in each)
        merged["stage_sums"] = {
            stage: [sum(c["stage_sums"][stage][i] for c in each) for i in (0, 1)]
            for stage in STAGES
        }
        merged["stages_mean_ms"] = stage_means(merged["stage_sums"])
        if "kinds" in merged:
            merged["kinds"] = _sum_named(c["kinds"] for c in each)
            merged["catch_up_s"] = [s for c in each for s in c["catch_up_s"]]
        schedext_s = merged["cpu_s"].get("schedext", 0.0)
        merged["schedext_cpu_ms_per_s"] = round(schedext_s / merged["seconds"] * 1000, 1)
        conditions[kind] = merged
    return {
        "conditions": conditions,
        "ratios": _ratios(conditions),
        "probes": sum(run["probes"] for run in runs),
        "verdicts": _sum_named(run["verdicts"] for run in runs),
    }


def _sum_named(tables: Iterable[Mapping[str, float]]) -> dict[str, float]:
    """Key-wise sums (rounded to 2 places)."""
    totals: dict[str, float] = {}
    for table in tables:
        for key, value in table.items():
            totals[key] = totals.get(key, 0) + value
    return {key: round(value, 2) for key, value in totals.items()}


# ---------------------------------------------------------------------------------------------
# Output
# ---------------------------------------------------------------------------------------------


def _ms(value: float | None) -> str:
    return "-" if value is None or math.isnan(value) else f"{value:.2f}"


def _times(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def others_share(report: JSON) -> float | None:
    """The share of the machine's CPU time (every CPU) in all blocks of every run that
    processes other than this benchmark's took; None without the figures."""
    nproc = (report.get("machine") or {}).get("nproc")
    others = wall = 0.0
    for runs in (report.get("runs") or {}).values():
        for run in runs:
            for figures in run["conditions"].values():
                cpu = figures["cpu_s"]
                others += cpu.get("others", 0.0)
                wall += cpu.get("wall", 0.0)
    if not nproc or not wall:
        return None
    return others / (wall * int(nproc))


def format_report(report: JSON) -> str:
    """The figures as text: per tree and condition, the filter's percentiles, its stages on the
    server, the churn's rate and CPU; the ratios churn/idle against the target."""
    c, p = report["cluster"], report["params"]
    lines = [
        f"\nschedext filter under pod churn: {c['nodes']:,} nodes ({c['gpus']:,} GPUs), "
        f"{c['pods']:,} bound pods + {c['churn_pods']:,} churn pods",
        f"probe: filter at {p['probe_rate']:g}/s, a new pending pod each; churn at "
        f"{p['rate']:g} events/s (create, patch, delete, patch); {p['blocks']} x "
        f"(idle {p['block_s']:g} s, churn {p['block_s']:g} s + catch-up"
        + (f", control {p['block_s']:g} s: the mix on ConfigMaps)" if p.get("control") else ")"),
    ]
    machine = report.get("machine")
    if machine:
        lines.append(f"machine: {machine['nproc']} CPUs ({machine['cpu_model']})")
    header = (
        f"  {'tree':<9}{'condition':<10}{'probes':>7}{'p50':>8}{'p90':>8}{'p99':>8}{'max':>9}"
        f"{'mean':>8}   {'queue':>6}{'handler':>8}{'total':>7}{'outside':>9}   {'events/s':>8}"
        f"  {'CPU ms/1k ev':>12}"
    )
    lines += [
        "",
        "  filter round trip (ms); on the server, mean ms from the event loop's first read of the",
        "  request: queue (until its handler starts), handler, total; outside: the round trip's",
        "  mean less the server's total (waiting to be read, the client, the wire)",
        header,
    ]
    for name, tree in report["by_tree"].items():
        for kind, figures in tree["conditions"].items():
            f, stages = figures["filter"], figures["stages_mean_ms"]
            rate = figures.get("events_per_s")
            cpu = figures.get("cpu_ms_per_1000_events")
            outside = None if stages["total"] is None else f["mean_ms"] - stages["total"]
            lines.append(
                f"  {name:<9}{kind:<10}{f['count']:>7}{_ms(f['p50_ms']):>8}{_ms(f['p90_ms']):>8}"
                f"{_ms(f['p99_ms']):>8}{_ms(f['max_ms']):>9}{_ms(f['mean_ms']):>8}   "
                f"{_ms(stages['queue']):>6}{_ms(stages['handler']):>8}{_ms(stages['total']):>7}"
                f"{_ms(outside):>9}   {'-' if rate is None else f'{rate:.0f}':>8}"
                f"  {'-' if cpu is None else f'{cpu:.0f}':>12}"
            )
    lines += [
        "",
        "  CPU s in the blocks (others: the machine's busy time less the processes named: other",
        "  processes on a shared machine, the kernel's own work such as loopback networking)",
    ]
    for name, tree in report["by_tree"].items():
        for kind, figures in tree["conditions"].items():
            cpu = figures["cpu_s"]
            parts = ", ".join(f"{k} {cpu[k]:.1f}" for k in CPU_NAMES if k in cpu)
            lines.append(f"  {name:<9}{kind:<10}{parts} in {cpu.get('wall', 0):.0f} s wall")
    busy = others_share(report)
    if busy is not None and busy > OTHERS_WARN:
        lines.append(
            f"  WARNING: others took {busy:.0%} of the machine's CPU in the blocks: other "
            "processes ran beside the benchmark, and the latencies measure them too"
        )
    lines.append("")
    for name, tree in report["by_tree"].items():
        ratios = tree["ratios"]
        verdict = (
            "within" if ratios["p99"] is not None and ratios["p99"] <= TARGET_RATIO else "OVER"
        )
        failed = {k: v for k, v in tree["verdicts"].items() if k != OK}
        lines.append(
            f"  {name}: churn/idle p99 {_times(ratios['p99'])} ({verdict} the target "
            f"<= {TARGET_RATIO:g}x), p50 {_times(ratios['p50'])}; probes not OK: {failed or 0}"
        )
        for top, bottom in RATIOS[1:]:
            key = f"{top}/{bottom} "
            if f"{key}p99" in ratios:
                lines.append(
                    f"  {name}: {top}/{bottom} p99 {_times(ratios[f'{key}p99'])}, "
                    f"p50 {_times(ratios[f'{key}p50'])}"
                )
    lines.append(f"  total benchmark time: {report['total_s']:.0f} s")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
