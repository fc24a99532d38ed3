"""Tight single-connection latency benchmark of filter and prioritize.

For each cluster size it starts ``schedext serve`` on a generated snapshot (loopback only),
then sends interleaved rounds over ONE keep-alive connection: the constant-answer endpoint
(same server, same body, no decision: the floor), filter (names mode, node order shuffled as
kube-scheduler's parallel filters do), and prioritize (with exactly the list filter returned,
as kube-scheduler sends it). It prints p50/p90/p99 per verb and N, and the ratios to the floor.
It also times the core alone, in a process of its own, on the same data (loadtests/corebench.py).

``--scenarios whole,shares`` measures two workloads in the same run, a server each, their
rounds interleaved: *whole*, the cluster of ``payloads.make_cluster`` and a pod asking for
whole GPUs (``--pod``); *shares*, 8-GPU nodes with half their GPUs holding shares
(``payloads.make_share_cluster``) and a pod asking for a share (10 GiB and 25 % of the cores
of one GPU). ``quotas`` is the whole scenario with team quotas: the same cluster and pod plus
50 ElasticQuotas (``payloads.make_quota_cluster``), the pod's namespace under one of them and
borrowing over its min. Each has its floor (its own server's constant answer), and it then
also prints, per size, each scenario over whole. Whenever more than one server runs (two
scenarios, or a baseline), all of them share one CPU, and so do the cores.

With ``--baseline DIR`` (another checkout of schedext, e.g. ``git worktree add --detach
../schedext-before <commit>``, its compiled part built with ``setup.py build_ext --inplace``)
both trees' servers run on the same snapshot, each on its own connection, and every round
sends the same bodies to both, the tree that goes first swapped every round; the core is
timed for both, in alternating batches. Both servers share one CPU, and so do both cores:
on a shared machine two CPUs can differ in speed for minutes. It then also prints, per size,
this tree's p50 over the baseline's.

With ``--load`` the servers run as in a throughput run instead, against a stand-in API server
each (``loadtests/standin.py``: list+watch of the same cluster, Bindings answered), and
every round's pod is a new one (``load-pod-N``, the ``--pod`` shape): filter, prioritize
with filter's answer, then the constant answer. Rounds come in blocks, idle and loaded
alternating. A loaded round first binds the pod filtered in the round before, on a connection
of its own, and does not wait for the answer: kube-scheduler binds pod N while it schedules
pod N+1, its filter call coming after its own filter plugins (``--bind-lead-ms`` later). The
stand-in answers the Binding after ``--binding-delay-ms`` (kube-apiserver's write), then sends
two pod watch events (the pod bound, another created). That bind, its Binding POST and answer
and those events share schedext's event loop with the rounds' requests. It prints each verb's
round trip idle and loaded, and where schedext's own ``schedext_request_stage_seconds``
(scraped around every block) says the time went.

    python -m loadtests.bench --nodes 100,1000,5000 --rounds 2000
    python -m loadtests.bench --nodes 5000 --rounds 1000 --baseline ../schedext-before
    python -m loadtests.bench --nodes 5000 --rounds 2000 --scenarios whole,shares
    python -m loadtests.bench --nodes 5000 --rounds 1000 --scenarios whole,quotas
    python -m loadtests.bench --nodes 1000 --rounds 1000 --pod any --load
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import random
import re
import select
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from loadtests import payloads
from loadtests.standin import StandIn, load_pod

ROOT = Path(__file__).resolve().parents[1]  # this tree
CORE_SCRIPT = Path(__file__).resolve().with_name("corebench.py")
THIS, BASELINE = "this", "baseline"
WHOLE, SHARES, QUOTAS = "whole", "shares", "quotas"
SCENARIOS = (WHOLE, SHARES, QUOTAS)
VERBS = ("constant", "filter", "prioritize")
CORE_VERBS = ("filter", "prioritize")
VARIANTS = 8  # distinct node orders, cycled (kube-scheduler's order varies per cycle)
CORE_BATCHES = 10  # the core's rounds in this many batches, the trees alternating
CORE_TIMEOUT_S = 300.0  # for any one answer of the core's process (the pure-Python twin is slow)
PODS = {
    "h100": payloads.make_pod("bench-pod", gpus=2, model="H100", uid="bench-pod-uid"),
    "any": payloads.make_pod("bench-pod", gpus=2, model=None, uid="bench-pod-uid"),
}
SHARE_POD = payloads.make_share_pod("bench-pod", uid="bench-pod-uid")
Row = dict[str, Any]
Arm = tuple[str, str]  # (tree, scenario): one server, one core process
IDLE, LOADED = "idle", "loaded"
LOAD_VERBS = ("filter", "prioritize", "constant")  # a load round's requests, in this order
LOAD_BLOCK = 20  # rounds per block, idle and loaded blocks alternating; the first settles
STAGES = ("body", "queue", "handler", "total")
BIND_CONNECTIONS = 4  # binds in flight at most, each on a connection of its own


@dataclass(frozen=True, slots=True)
class Workload:
    """One scenario at one size: the cluster, the pod under test, and the node orders of its
    filter requests (the same for every tree)."""

    scenario: str
    cluster: dict[str, Any]
    pod: dict[str, Any]
    orders: list[list[str]]

    @classmethod
    def build(cls, scenario: str, size: int, pod: dict[str, Any]) -> Workload:
        if scenario == SHARES:
            cluster, pod = payloads.make_share_cluster(size), SHARE_POD
        elif scenario == QUOTAS:
            cluster = payloads.make_quota_cluster(size)
        else:
            cluster = payloads.make_cluster(size)
        names = [i["metadata"]["name"] for i in cluster["items"] if i["kind"] == "Node"]
        rng = random.Random(size)
        orders = [rng.sample(names, len(names)) for _ in range(VARIANTS)]
        return cls(scenario, cluster, pod, orders)

    def filter_bodies(self) -> list[bytes]:
        return [orjson.dumps({"Pod": self.pod, "Nodes": None, "NodeNames": o}) for o in self.orders]


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    sizes = [int(n) for n in args.nodes.split(",") if n.strip()]
    if args.rounds < 100 or not sizes or min(sizes) < 2:
        parser.error("need --rounds >= 100 and cluster sizes >= 2")
    scenarios = args.scenarios
    trees = {THIS: ROOT}
    if args.baseline is not None:
        trees[BASELINE] = args.baseline
    cpu = _shared_cpu() if len(trees) * len(scenarios) > 1 else None
    on_cpu = f"; every server and core on CPU {cpu}" if cpu is not None else ""
    if args.baseline is not None:
        print(f"this tree: {_describe(ROOT)}; baseline: {_describe(args.baseline)}{on_cpu}")
    elif len(scenarios) > 1:
        print(f"scenarios: {', '.join(scenarios)}{on_cpu}")
    if args.load:
        return _main_loaded(args, sizes, trees, cpu)
    results: list[Row] = []
    for size in sizes:
        rows = _bench_size(
            size,
            [Workload.build(s, size, PODS[args.pod]) for s in scenarios],
            trees,
            rounds=args.rounds,
            warmup=args.warmup,
            cpu=cpu,
            write_size=args.write_size,
        )
        results.extend(rows)
    _print(results, with_tree=len(trees) > 1, with_scenario=len(scenarios) > 1)
    if len(trees) > 1:
        _print_comparison(results)
    if WHOLE in scenarios and len(scenarios) > 1:
        _print_scenarios(results)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m loadtests.bench", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--nodes", default="100,1000,5000", help="comma-separated cluster sizes")
    parser.add_argument("--rounds", type=int, default=2000, help="measured rounds per size")
    parser.add_argument("--warmup", type=int, default=300, help="unmeasured rounds first")
    parser.add_argument(
        "--pod",
        choices=sorted(PODS),
        default="h100",
        help="the whole scenario's pod. h100: asks for 2 H100 GPUs (1 node in 3 has them, the "
        "rest are rejected with reasons: the costly answer); any: 2 GPUs of any model (most "
        "nodes pass)",
    )
    parser.add_argument(
        "--scenarios",
        type=_scenarios,
        default=[WHOLE],
        metavar="LIST",
        help="comma-separated, measured side by side: whole (the cluster of 3 GPU models, "
        "40 %% of the GPUs held, a pod asking for whole GPUs); shares (8 GPUs of 80 GiB per "
        "node, half of them holding shares, a pod asking for a 10 GiB share with 25 %% of the "
        "cores; one node in three has room); quotas (whole's cluster and pod, plus 50 "
        "ElasticQuotas, the pod's namespace borrowing over its min). Default: whole",
    )
    parser.add_argument(
        "--baseline",
        type=_checkout,
        metavar="DIR",
        help="another checkout of schedext (e.g. a git worktree of an earlier commit): its "
        "server alternates with this tree's, round by round, for before/after figures",
    )
    parser.add_argument(
        "--write-size",
        type=int,
        default=0,
        metavar="BYTES",
        help="send each verb request in writes of this many bytes, as kube-scheduler's Go "
        "client does (4096: its buffer); default: one write",
    )
    parser.add_argument(
        "--load",
        action="store_true",
        help="serve as in a throughput run, against a stand-in API server, and measure each "
        "verb idle and while the pod before is being bound (its Binding POST and pod watch "
        "events on the same event loop), side by side; the core is not timed",
    )
    parser.add_argument(
        "--bind-lead-ms",
        type=float,
        default=0.5,
        metavar="MS",
        help="with --load: how long before the round's filter its bind is sent: kube-scheduler "
        "runs its own filter plugins in between (default %(default)s; 0: right behind it)",
    )
    parser.add_argument(
        "--binding-delay-ms",
        type=float,
        default=2.0,
        metavar="MS",
        help="with --load: how long the stand-in API server takes to answer a Binding, as "
        "kube-apiserver writing it to etcd (default %(default)s)",
    )
    parser.add_argument("--json", type=Path, help="also write the figures as JSON here")
    return parser


def _scenarios(value: str) -> list[str]:
    """--scenarios' type: known names, each once, in the order given."""
    chosen = list(dict.fromkeys(v.strip() for v in value.split(",") if v.strip()))
    unknown = [v for v in chosen if v not in SCENARIOS]
    if unknown or not chosen:
        raise argparse.ArgumentTypeError(
            f"{value!r}: scenarios are {', '.join(SCENARIOS)}, comma-separated"
        )
    return chosen


def _checkout(value: str) -> Path:
    """--baseline's type: checked before anything starts, so a typo costs no server start."""
    path = Path(value).resolve()
    if not path.is_dir():
        raise argparse.ArgumentTypeError(f"{value}: no such directory")
    if not (path / "app" / "cli.py").is_file():
        raise argparse.ArgumentTypeError(f"{value}: not a schedext checkout (no app/cli.py)")
    return path


def _describe(root: Path) -> str:
    """The checkout's commit (marked when it has uncommitted changes), else its path."""
    head = _git(root, "rev-parse", "--short", "HEAD")
    if not head:
        return str(root)
    dirty = _git(root, "status", "--porcelain", "--untracked-files=no")
    return f"{head}{' with uncommitted changes' if dirty else ''}"


def _git(root: Path, *args: str) -> str | None:
    """git's stripped output in ``root``, None where it fails (not a checkout, no git)."""
    try:
        # git with fixed arguments, on a directory the user named
        result = subprocess.run(  # noqa: S603
            ["git", "-C", str(root), *args],  # noqa: S607 (git from PATH, as a user runs it)
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return result.stdout.strip() if result.returncode == 0 else None


def _bench_size(
    size: int,
    workloads: list[Workload],
    trees: dict[str, Path],
    *,
    rounds: int,
    warmup: int,
    cpu: int | None,
    write_size: int = 0,
) -> list[Row]:
    """Every tree's server on every workload, their rounds interleaved; then the cores."""
    arms: list[Arm] = [(tree, w.scenario) for w in workloads for tree in trees]
    filter_bodies = {w.scenario: w.filter_bodies() for w in workloads}
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        workdir = Path(tmp)
        conns: dict[Arm, http.client.HTTPConnection] = {}
        for workload in workloads:
            snapshot = workdir / f"{workload.scenario}.json"
            snapshot.write_bytes(orjson.dumps(workload.cluster))
            for tree, root in trees.items():
                log = workdir / f"{tree}-{workload.scenario}.log"
                conns[(tree, workload.scenario)] = stack.enter_context(
                    _connection(snapshot, log, root, cpu)
                )
        passed = {
            arm: [
                orjson.loads(_post(conn, "/filter", b))["NodeNames"] for b in filter_bodies[arm[1]]
            ]
            for arm, conn in conns.items()
        }
        for workload in workloads:
            scenario = workload.scenario
            _warn_if_answers_differ({tree: passed[(tree, scenario)] for tree in trees}, scenario)
        # every tree gets this tree's filter answers, so that their prioritize bodies are equal
        bodies = {
            w.scenario: {
                "constant": filter_bodies[w.scenario],
                "filter": filter_bodies[w.scenario],
                "prioritize": [
                    orjson.dumps({"Pod": w.pod, "Nodes": None, "NodeNames": p})
                    for p in passed[(THIS, w.scenario)]
                ],
            }
            for w in workloads
        }
        samples = _rounds(conns, bodies, rounds=rounds, warmup=warmup, write_size=write_size)
    # the cores after the servers are gone, so that they take no CPU from them
    core = _core_times(
        trees,
        workloads,
        {w.scenario: passed[(THIS, w.scenario)] for w in workloads},
        rounds=min(rounds, 1000),
        warmup=min(warmup, 300),
        cpu=cpu,
    )
    rows: list[Row] = []
    for arm in arms:
        feasible = len(passed[arm][0])
        rows.extend(_rows(arm, size, feasible, samples[arm], core[arm]))
    if len(trees) > 1:
        _add_baseline_ratios(rows)
    if len(workloads) > 1 and WHOLE in {w.scenario for w in workloads}:
        _add_whole_ratios(rows)
    return rows


def _rounds(
    conns: dict[Arm, http.client.HTTPConnection],
    bodies: dict[str, dict[str, list[bytes]]],
    *,
    rounds: int,
    warmup: int,
    write_size: int = 0,
) -> dict[Arm, dict[str, list[float]]]:
    """ms per request, per arm (tree and scenario) and verb. Within a round every arm gets
    its scenario's bodies, one arm after the other; the order reverses every round, so that
    none always follows another's requests (and their cache effects)."""
    paths = {"constant": "/bench/constant", "filter": "/filter", "prioritize": "/prioritize"}
    samples: dict[Arm, dict[str, list[float]]] = {a: {v: [] for v in VERBS} for a in conns}
    order = list(conns)
    for round_ in range(warmup + rounds):
        k = round_ % VARIANTS
        for arm in order if round_ % 2 == 0 else reversed(order):
            for verb in VERBS:
                started = time.perf_counter_ns()
                _post(conns[arm], paths[verb], bodies[arm[1]][verb][k], write_size)
                if round_ >= warmup:
                    samples[arm][verb].append((time.perf_counter_ns() - started) / 1e6)
    return samples


# ---------------------------------------------------------------------------------------------
# --load: idle and loaded rounds, side by side
# ---------------------------------------------------------------------------------------------


def _main_loaded(
    args: argparse.Namespace, sizes: list[int], trees: dict[str, Path], cpu: int | None
) -> int:
    # The servers on a CPU of their own where they can be (schedext has a core to itself in a
    # throughput run on a large machine), the stand-ins and this client on the others.
    server_cpu = cpu if cpu is not None else _shared_cpu()
    results: list[Row] = []
    for size in sizes:
        workloads = [Workload.build(s, size, PODS[args.pod]) for s in args.scenarios]
        results.extend(
            _bench_size_loaded(
                size,
                workloads,
                trees,
                rounds=args.rounds,
                warmup=args.warmup,
                cpu=server_cpu,
                write_size=args.write_size,
                lead_s=args.bind_lead_ms / 1000,
                delay_ms=args.binding_delay_ms,
            )
        )
    _print_loaded(results, with_tree=len(trees) > 1, with_scenario=len(args.scenarios) > 1)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


@dataclass(slots=True)
class _LoadArm:
    """One server under load: its connections (the verbs; binds; scrapes) and what its
    rounds measured."""

    workload: Workload
    standin: StandIn
    verbs: http.client.HTTPConnection
    binds: list[http.client.HTTPConnection]  # used in turn; each answer read before reuse
    scrapes: http.client.HTTPConnection
    samples: dict[str, dict[str, list[float]]]
    splits: dict[str, dict[str, list[Split]]]  # state -> verb -> each round trip's parts
    stages: dict[str, dict[tuple[str, str], list[float]]]  # state -> (verb, stage) -> sum, n
    to_bind: tuple[str, str, str] | None = None  # the pod filtered last: name, uid, node
    bind_failures: int = 0
    binds_sent: int = 0
    unread: set[int] = field(default_factory=set)  # binds whose answer is still to read

    def send_bind(self, name: str, uid: str, node: str) -> None:
        """On the next bind connection, its answer left to read later (kube-scheduler does
        not wait for a bind before it schedules the next pod)."""
        turn = self.binds_sent % len(self.binds)
        self.read_bind(turn)
        args = {"PodName": name, "PodNamespace": "ml", "PodUID": uid, "Node": node}
        self.binds[turn].request(
            "POST", "/bind", body=orjson.dumps(args), headers={"Content-Type": "application/json"}
        )
        self.unread.add(turn)
        self.binds_sent += 1

    def read_bind(self, turn: int) -> None:
        if turn not in self.unread:
            return
        self.unread.discard(turn)
        response = self.binds[turn].getresponse()
        if response.status != 200 or orjson.loads(response.read())["Error"]:
            self.bind_failures += 1

    def read_binds(self) -> None:
        for turn in list(self.unread):
            self.read_bind(turn)


def _bench_size_loaded(
    size: int,
    workloads: list[Workload],
    trees: dict[str, Path],
    *,
    rounds: int,
    warmup: int,
    cpu: int | None,
    write_size: int,
    lead_s: float,
    delay_ms: float,
) -> list[Row]:
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        workdir = Path(tmp)
        arms: dict[Arm, _LoadArm] = {}
        for workload in workloads:
            cluster = workdir / f"{workload.scenario}.json"
            cluster.write_bytes(orjson.dumps(workload.cluster))
            template = workdir / f"{workload.scenario}-pod.json"
            template.write_bytes(orjson.dumps(workload.pod))
            for tree, root in trees.items():
                name = f"{tree}-{workload.scenario}"
                with _pinned_away(cpu):  # off the servers' CPU, as the API server would be
                    standin = stack.enter_context(
                        StandIn(cluster, template, workdir, name=name, delay_ms=delay_ms)
                    )
                server = stack.enter_context(
                    _Server(None, workdir / f"{name}.log", root, cpu, kubeconfig=standin.kubeconfig)
                )
                verbs, scrapes, *binds = (
                    stack.enter_context(
                        contextlib.closing(
                            http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
                        )
                    )
                    for _ in range(2 + BIND_CONNECTIONS)
                )
                arms[(tree, workload.scenario)] = _LoadArm(
                    workload,
                    standin,
                    verbs,
                    binds,
                    scrapes,
                    samples={s: {v: [] for v in LOAD_VERBS} for s in (IDLE, LOADED)},
                    splits={s: {v: [] for v in LOAD_VERBS} for s in (IDLE, LOADED)},
                    stages={IDLE: {}, LOADED: {}},
                )
        with _pinned_away(cpu):
            _load_rounds(arms, rounds=rounds, warmup=warmup, write_size=write_size, lead_s=lead_s)
        stats = {arm: load.standin.stats() for arm, load in arms.items()}
    rows: list[Row] = []
    for (tree, scenario), load in arms.items():
        for state in (IDLE, LOADED):
            for verb, values in load.samples[state].items():
                stages = {
                    f"{stage}_mean_us": _stage_mean(load.stages[state], verb, stage)
                    for stage in STAGES
                }
                split = load.splits[state][verb]
                parts = np.median(np.array(split), axis=0).tolist() if split else [None] * 3
                names = ("before_p50_us", "server_p50_us", "after_p50_us")
                stages |= dict(zip(names, parts, strict=True))
                rows.append(
                    {
                        "verb": verb,
                        "nodes": size,
                        "state": state,
                        **_percentiles(values),
                        "mean_ms": float(np.mean(values)),
                        **stages,
                        "tree": tree,
                        "scenario": scenario,
                        "bind_failures": load.bind_failures,
                        "standin": stats[(tree, scenario)],
                    }
                )
    idle = {(r["tree"], r["scenario"], r["verb"]): r for r in rows if r["state"] == IDLE}
    for row in rows:
        if row["state"] == LOADED:
            before = idle[(row["tree"], row["scenario"], row["verb"])]
            row["p50_vs_idle"] = row["p50_ms"] / before["p50_ms"]
            row["p99_vs_idle"] = row["p99_ms"] / before["p99_ms"]
    return rows


def _load_rounds(
    arms: dict[Arm, _LoadArm], *, rounds: int, warmup: int, write_size: int, lead_s: float
) -> None:
    """Blocks of LOAD_BLOCK rounds, idle and loaded alternating, until each state has at
    least ``rounds`` measured rounds after ``warmup`` unmeasured ones. Each arm (server) runs
    the block in turn, the order reversing every block, so that one server's trailing work
    (the watch events of its last bind) falls into another's first round, which, as every
    block's first round, is not measured. schedext's stage histograms are scraped after that
    round and at the block's end, so that their difference is the measured rounds'."""
    order = list(arms)
    counts = {IDLE: 0, LOADED: 0}
    start = 0  # the block's first pod: load-pod-<start>
    for block in range(1_000_000):
        if min(counts.values()) >= rounds:
            break
        state = LOADED if block % 2 else IDLE
        measured = start >= warmup
        for arm in order if block % 2 == 0 else reversed(order):
            load = arms[arm]
            for i in range(LOAD_BLOCK):
                if measured and i == 1:
                    before = _scrape_stages(load.scrapes)
                times = _load_round(
                    load, start + i, loaded=state == LOADED, write_size=write_size, lead_s=lead_s
                )
                if measured and i > 0:
                    for verb, (ms, split) in times.items():
                        load.samples[state][verb].append(ms)
                        if split is not None:
                            load.splits[state][verb].append(split)
            load.read_binds()  # all answered before the next block (the next server's)
            if measured:
                sums = load.stages[state]
                for key, (total, count) in _scrape_stages(load.scrapes).items():
                    was = before.get(key, (0.0, 0.0))
                    into = sums.setdefault(key, [0.0, 0.0])
                    into[0] += total - was[0]
                    into[1] += count - was[1]
        if measured:
            counts[state] += LOAD_BLOCK - 1
        start += LOAD_BLOCK


def _load_round(
    load: _LoadArm, index: int, *, loaded: bool, write_size: int, lead_s: float
) -> dict[str, tuple[float, Split | None]]:
    """One pod's filter, prioritize (with filter's answer) and the constant answer: each one's
    round trip (ms) and its parts; in a loaded round, the pod before is bound meanwhile."""
    workload = load.workload
    pod = load_pod(workload.pod, index)
    body = orjson.dumps({"Pod": pod, "Nodes": None, "NodeNames": workload.orders[index % VARIANTS]})
    if loaded and load.to_bind is not None:
        load.send_bind(*load.to_bind)
        if lead_s > 0:
            time.sleep(lead_s)
    times: dict[str, tuple[float, Split | None]] = {}
    answer, ms, split = _timed(load.verbs, "/filter", body, write_size)
    times["filter"] = (ms, split)
    passed = orjson.loads(answer)["NodeNames"]
    ranked = orjson.dumps({"Pod": pod, "Nodes": None, "NodeNames": passed})
    for verb, path, sent in (
        ("prioritize", "/prioritize", ranked),
        ("constant", "/bench/constant", body),
    ):
        _, ms, split = _timed(load.verbs, path, sent, write_size)
        times[verb] = (ms, split)
    meta = pod["metadata"]
    load.to_bind = (meta["name"], meta["uid"], passed[index % len(passed)]) if passed else None
    return times


_SAMPLE = re.compile(rb"^schedext_request_stage_seconds_(sum|count)\{([^}]*)\} (\S+)$", re.M)
_LABEL = re.compile(rb'(\w+)="([^"]*)"')


def _scrape_stages(conn: http.client.HTTPConnection) -> dict[tuple[str, str], tuple[float, float]]:
    """schedext_request_stage_seconds: (sum, count) per (verb, stage); empty for a tree
    without it."""
    conn.request("GET", "/metrics")
    text = conn.getresponse().read()
    found: dict[tuple[str, str], list[float]] = {}
    for kind, labels, value in _SAMPLE.findall(text):
        named = {k.decode(): v.decode() for k, v in _LABEL.findall(labels)}
        entry = found.setdefault((named["verb"], named["stage"]), [0.0, 0.0])
        entry[0 if kind == b"sum" else 1] = float(value)
    return {key: (total, count) for key, (total, count) in found.items()}


def _stage_mean(sums: dict[tuple[str, str], list[float]], verb: str, stage: str) -> float | None:
    total, count = sums.get((verb, stage), (0.0, 0.0))
    return total / count * 1e6 if count else None


@contextlib.contextmanager
def _pinned_away(cpu: int | None) -> Iterator[None]:
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


def _print_loaded(rows: list[Row], *, with_tree: bool, with_scenario: bool) -> None:
    tree_header = f"{'tree':<10}" if with_tree else ""
    scenario_header = f"{'scenario':<9}" if with_scenario else ""
    header = (
        f"{tree_header}{scenario_header}{'verb':<11}{'nodes':>6}{'state':>8}{'p50 ms':>9}"
        f"{'p90 ms':>9}{'p99 ms':>9}{'mean ms':>9}{'p50/idle':>10}{'p99/idle':>10}"
    )
    print(header)
    print("-" * len(header))
    for r in rows:
        tree = f"{r['tree']:<10}" if with_tree else ""
        scenario = f"{r['scenario']:<9}" if with_scenario else ""
        ratios = f"{r['p50_vs_idle']:>9.2f}x{r['p99_vs_idle']:>9.2f}x" if "p50_vs_idle" in r else ""
        print(
            f"{tree}{scenario}{r['verb']:<11}{r['nodes']:>6}{r['state']:>8}{r['p50_ms']:>9.3f}"
            f"{r['p90_ms']:>9.3f}{r['p99_ms']:>9.3f}{r['mean_ms']:>9.3f}{ratios}"
        )
    print(
        f"blocks of {LOAD_BLOCK} rounds, idle and loaded alternating; loaded: the pod before "
        "is bound meanwhile (Binding POST, two pod watch events)"
    )
    split = [r for r in rows if r["server_p50_us"] is not None]
    if split:
        print(
            "\nwhere the round trip goes, medians in µs, from schedext's timing headers: before "
            "its event loop read the request (sending, the kernel, and waiting for the loop to "
            "finish what it was doing), in schedext (first read to answer handed to the "
            "socket), after (the kernel, this client reading the answer)"
        )
        print(
            f"{tree_header}{scenario_header}{'verb':<11}{'nodes':>6}{'state':>8}{'before':>8}"
            f"{'schedext':>10}{'after':>8}{'round trip':>12}"
        )
        for r in split:
            tree = f"{r['tree']:<10}" if with_tree else ""
            scenario = f"{r['scenario']:<9}" if with_scenario else ""
            print(
                f"{tree}{scenario}{r['verb']:<11}{r['nodes']:>6}{r['state']:>8}"
                f"{r['before_p50_us']:>8.0f}{r['server_p50_us']:>10.0f}{r['after_p50_us']:>8.0f}"
                f"{r['p50_ms'] * 1000:>12.0f}"
            )
    staged = [r for r in rows if r["verb"] != "constant" and r["total_mean_us"] is not None]
    if staged:
        print(
            "\nin schedext, means in µs, from its schedext_request_stage_seconds: the body "
            "(first read to last byte read), queue (to the handler's start), handler (to the "
            "answer handed to the socket), total"
        )
        print(
            f"{tree_header}{scenario_header}{'verb':<11}{'nodes':>6}{'state':>8}"
            f"{'body':>8}{'queue':>8}{'handler':>9}{'total':>8}"
        )
        for r in staged:
            tree = f"{r['tree']:<10}" if with_tree else ""
            scenario = f"{r['scenario']:<9}" if with_scenario else ""
            print(
                f"{tree}{scenario}{r['verb']:<11}{r['nodes']:>6}{r['state']:>8}"
                f"{r['body_mean_us']:>8.1f}{r['queue_mean_us']:>8.1f}{r['handler_mean_us']:>9.1f}"
                f"{r['total_mean_us']:>8.1f}"
            )
    if with_tree:
        baseline = {
            (r["nodes"], r["scenario"], r["state"], r["verb"]): r
            for r in rows
            if r["tree"] == BASELINE
        }
        print("\nthis / baseline (after / before), p50 and p99:")
        for r in rows:
            if r["tree"] != THIS:
                continue
            before = baseline[(r["nodes"], r["scenario"], r["state"], r["verb"])]
            scenario = f"{r['scenario']:<9}" if with_scenario else ""
            print(
                f"{scenario}{r['verb']:<11}{r['nodes']:>6}{r['state']:>8}  p50 {r['p50_ms']:.3f} / "
                f"{before['p50_ms']:.3f} ms = {r['p50_ms'] / before['p50_ms']:.2f}x   p99 "
                f"{r['p99_ms']:.3f} / {before['p99_ms']:.3f} ms = "
                f"{r['p99_ms'] / before['p99_ms']:.2f}x"
            )
    for (tree, scenario), r in {(r["tree"], r["scenario"]): r for r in rows}.items():
        stats = r["standin"]
        line = (
            f"{tree}/{scenario}: {stats['bindings']} Bindings, {stats['events']} pod watch "
            f"events, {r['bind_failures']} binds refused"
        )
        if stats["unexpected"]:
            line += f"; the stand-in was asked what it does not serve: {stats['unexpected'][:5]}"
        print(line)


def _warn_if_answers_differ(passed: dict[str, list[list[str]]], scenario: str) -> None:
    """The trees measured different work if filter passed different nodes: say so."""
    if len(passed) < 2:
        return
    this, baseline = passed[THIS], passed[BASELINE]
    if any(sorted(a) != sorted(b) for a, b in zip(this, baseline, strict=True)):
        print(
            f"warning: the trees' filter answers differ in the {scenario} scenario "
            f"({len(this[0])} and {len(baseline[0])} nodes pass); both get this tree's list "
            "to prioritize",
            file=sys.stderr,
        )


def _rows(
    arm: Arm, size: int, feasible: int, samples: dict[str, list[float]], core: dict[str, Any]
) -> list[Row]:
    tree, scenario = arm
    floor = _percentiles(samples["constant"])
    rows: list[Row] = []
    for verb, values in samples.items():
        figures = _percentiles(values)
        rows.append(
            {
                "verb": verb,
                "nodes": size,
                "feasible": feasible,
                **figures,
                "p50_ratio": figures["p50_ms"] / floor["p50_ms"],
                "p99_ratio": figures["p99_ms"] / floor["p99_ms"],
                "core_p50_ms": core.get(verb),
                "tree": tree,
                "scenario": scenario,
                "compiled": core["compiled"],
            }
        )
    return rows


def _add_baseline_ratios(rows: list[Row]) -> None:
    """On this tree's rows: p50 this / p50 baseline (after / before), served and core."""
    baseline = {(r["scenario"], r["verb"]): r for r in rows if r["tree"] == BASELINE}
    for row in rows:
        if row["tree"] != THIS:
            continue
        before = baseline[(row["scenario"], row["verb"])]
        row["p50_vs_baseline"] = row["p50_ms"] / before["p50_ms"]
        core_pair = (row["core_p50_ms"], before["core_p50_ms"])
        row["core_p50_vs_baseline"] = None if None in core_pair else core_pair[0] / core_pair[1]


def _add_whole_ratios(rows: list[Row]) -> None:
    """On every other scenario's rows: p50 and p99 over whole's (the same tree and verb),
    served and core."""
    whole = {(r["tree"], r["verb"]): r for r in rows if r["scenario"] == WHOLE}
    for row in rows:
        if row["scenario"] == WHOLE:
            continue
        other = whole[(row["tree"], row["verb"])]
        row["p50_vs_whole"] = row["p50_ms"] / other["p50_ms"]
        row["p99_vs_whole"] = row["p99_ms"] / other["p99_ms"]
        core_pair = (row["core_p50_ms"], other["core_p50_ms"])
        row["core_p50_vs_whole"] = None if None in core_pair else core_pair[0] / core_pair[1]


def _core_times(
    trees: dict[str, Path],
    workloads: list[Workload],
    passed: dict[str, list[list[str]]],
    *,
    rounds: int,
    warmup: int,
    cpu: int | None,
) -> dict[Arm, dict[str, Any]]:
    """The core alone (loadtests/corebench.py): one process per tree and scenario,
    ``extender`` imported from the tree, the same script for every tree. Their batches
    alternate like the servers' rounds (an arm timed after the others only would take all of
    a noisy moment); p50 over all calls."""
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        cores: dict[Arm, _CoreProcess] = {}
        for workload in workloads:
            scenario = workload.scenario
            data = Path(tmp) / f"{scenario}.json"
            data.write_bytes(
                orjson.dumps(
                    {
                        "cluster": workload.cluster,
                        "pod": workload.pod,
                        "orders": workload.orders,
                        "passed": passed[scenario],
                    }
                )
            )
            for tree, root in trees.items():
                log = Path(tmp) / f"{tree}-{scenario}.log"
                cores[(tree, scenario)] = stack.enter_context(_CoreProcess(data, root, log, cpu))
        for core in cores.values():
            core.run(warmup)  # the first calls build the name table: not measured
        samples: dict[Arm, dict[str, list[float]]] = {a: {v: [] for v in CORE_VERBS} for a in cores}
        order = list(cores)
        for batch, size in enumerate(_split(rounds, CORE_BATCHES)):
            for arm in order if batch % 2 == 0 else reversed(order):
                for verb, values in cores[arm].run(size).items():
                    samples[arm][verb].extend(values)
    return {
        arm: {
            **{verb: float(np.percentile(values, 50)) for verb, values in by_verb.items()},
            "compiled": cores[arm].compiled,
        }
        for arm, by_verb in samples.items()
    }


def _split(total: int, parts: int) -> list[int]:
    """``total`` in ``parts`` nearly equal positive sizes (fewer where total < parts)."""
    return [n for i in range(parts) if (n := total // parts + (i < total % parts)) > 0]


class _CoreProcess:
    """loadtests/corebench.py holding the cluster with ``root``'s extender, for the
    benchmark's life: one JSON line in answer to each batch of rounds."""

    def __init__(self, data: Path, root: Path, log: Path, cpu: int | None = None) -> None:
        self.data, self.root, self.log, self.cpu = data, root, log, cpu
        self.compiled = False

    def __enter__(self) -> _CoreProcess:
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


def _shared_cpu() -> int | None:
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


def _post(conn: http.client.HTTPConnection, path: str, body: bytes, write_size: int = 0) -> bytes:
    """POST ``body`` and read the answer. ``write_size``: send the request in writes of that
    many bytes, the head with the body's first bytes, as Go's HTTP client (kube-scheduler's)
    writes through its 4 KiB buffer; 0: all in one write."""
    return _exchange(conn, path, body, write_size)[0]


def _exchange(
    conn: http.client.HTTPConnection, path: str, body: bytes, write_size: int = 0
) -> tuple[bytes, http.client.HTTPResponse]:
    """:func:`_post`, with the response (its headers) too."""
    if not write_size:
        conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
    else:
        conn.putrequest("POST", path, skip_accept_encoding=True)
        conn.putheader("Content-Type", "application/json")
        conn.putheader("Content-Length", str(len(body)))
        head = len(b"\r\n".join(conn._buffer)) + 4  # type: ignore[attr-defined]
        first = max(0, write_size - head)
        conn.endheaders(message_body=body[:first])
        for start in range(first, len(body), write_size):
            conn.send(body[start : start + write_size])
    response = conn.getresponse()
    data = response.read()
    if response.status != 200:
        raise RuntimeError(f"{path} answered {response.status}: {data[:200]!r}")
    return data, response


Split = tuple[float, float, float]  # µs: before the server read it, in the server, after


def _timed(
    conn: http.client.HTTPConnection, path: str, body: bytes, write_size: int
) -> tuple[bytes, float, Split | None]:
    """The answer, the round trip (ms), and where the server's timing headers (schedext with
    the benchmark endpoints: app.service.routes.verbs.timing_headers) put its parts. Both sides read
    the same monotonic clock."""
    sent = time.perf_counter()
    data, response = _exchange(conn, path, body, write_size)
    received = time.perf_counter()
    read = response.getheader("x-schedext-read")
    answered = response.getheader("x-schedext-answered")
    split = None
    if read is not None and answered is not None:
        at_read, at_answer = float(read), float(answered)
        split = ((at_read - sent) * 1e6, (at_answer - at_read) * 1e6, (received - at_answer) * 1e6)
    return data, (received - sent) * 1000, split


def _percentiles(values: list[float]) -> dict[str, float]:
    p50, p90, p99 = np.percentile(values, [50, 90, 99]).tolist()
    return {"p50_ms": p50, "p90_ms": p90, "p99_ms": p99, "count": len(values)}


def _print(rows: list[Row], *, with_tree: bool, with_scenario: bool) -> None:
    tree_header = f"{'tree':<10}" if with_tree else ""
    scenario_header = f"{'scenario':<9}" if with_scenario else ""
    header = (
        f"{tree_header}{scenario_header}{'verb':<11}{'nodes':>7}{'feasible':>9}{'p50 ms':>9}"
        f"{'p90 ms':>9}{'p99 ms':>9}{'p50/floor':>11}{'p99/floor':>11}{'core p50':>10}"
    )
    print(header)
    print("-" * len(header))
    for r in rows:
        tree = f"{r['tree']:<10}" if with_tree else ""
        scenario = f"{r['scenario']:<9}" if with_scenario else ""
        core = f"{r['core_p50_ms']:.3f}" if r["core_p50_ms"] is not None else "-"
        print(
            f"{tree}{scenario}{r['verb']:<11}{r['nodes']:>7}{r['feasible']:>9}"
            f"{r['p50_ms']:>9.3f}{r['p90_ms']:>9.3f}{r['p99_ms']:>9.3f}"
            f"{r['p50_ratio']:>10.2f}x{r['p99_ratio']:>10.2f}x{core:>10}"
        )
    print("floor = the constant-answer endpoint of the same server, same body, same connection")


def _print_comparison(rows: list[Row]) -> None:
    """Per size, scenario and verb: p50 this / p50 baseline (after / before), served and
    core."""
    baseline = {(r["nodes"], r["scenario"], r["verb"]): r for r in rows if r["tree"] == BASELINE}
    scenarios = {r["scenario"] for r in rows}
    print("\nthis / baseline (after / before), p50:")
    for row in rows:
        if row["tree"] != THIS:
            continue
        before = baseline[(row["nodes"], row["scenario"], row["verb"])]
        scenario = f"{row['scenario']:<9}" if len(scenarios) > 1 else ""
        line = (
            f"{scenario}{row['verb']:<11}{row['nodes']:>7}  served {row['p50_ms']:.3f} / "
            f"{before['p50_ms']:.3f} ms = {row['p50_vs_baseline']:.2f}x"
        )
        if row["core_p50_vs_baseline"] is not None:
            line += (
                f"   core {row['core_p50_ms']:.3f} / {before['core_p50_ms']:.3f} ms"
                f" = {row['core_p50_vs_baseline']:.2f}x"
            )
        print(line)
    for tree in (THIS, BASELINE):
        if not any(r["compiled"] for r in rows if r["tree"] == tree):
            print(
                f"note: {tree} tree runs without its compiled part (extender/_packed), on the "
                "pure-Python twin: build it with setup.py build_ext --inplace in that checkout"
            )


def _print_scenarios(rows: list[Row]) -> None:
    """Per other scenario, tree, size and verb: it over whole, p50 and p99 served, p50 of the
    core (the constant answer's line compares the two servers' floors)."""
    whole = {(r["tree"], r["nodes"], r["verb"]): r for r in rows if r["scenario"] == WHOLE}
    trees = {r["tree"] for r in rows}
    for scenario in dict.fromkeys(r["scenario"] for r in rows if r["scenario"] != WHOLE):
        print(f"\n{scenario} / whole (the same tree, verb and size; each over its own server):")
        for row in (r for r in rows if r["scenario"] == scenario):
            _print_over_whole(row, whole[(row["tree"], row["nodes"], row["verb"])], trees)


def _print_over_whole(row: Row, other: Row, trees: set[str]) -> None:
    tree = f"{row['tree']:<10}" if len(trees) > 1 else ""
    line = (
        f"{tree}{row['verb']:<11}{row['nodes']:>7}  p50 {row['p50_ms']:.3f} / "
        f"{other['p50_ms']:.3f} ms = {row['p50_vs_whole']:.2f}x   p99 {row['p99_ms']:.3f} / "
        f"{other['p99_ms']:.3f} ms = {row['p99_vs_whole']:.2f}x"
    )
    if row["core_p50_vs_whole"] is not None:
        line += (
            f"   core {row['core_p50_ms']:.3f} / {other['core_p50_ms']:.3f} ms"
            f" = {row['core_p50_vs_whole']:.2f}x"
        )
    print(line)


@contextlib.contextmanager
def _connection(
    snapshot: Path, log: Path, root: Path, cpu: int | None
) -> Iterator[http.client.HTTPConnection]:
    """A keep-alive connection to ``root``'s schedext serving ``snapshot``."""
    with _Server(snapshot, log, root, cpu) as server:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
        try:
            yield conn
        finally:
            conn.close()


class _Server:
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

    def __enter__(self) -> _Server:
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


if __name__ == "__main__":
    raise SystemExit(main())
