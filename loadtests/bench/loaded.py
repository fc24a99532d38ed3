"""``--load``: schedext as in a throughput run, against a stand-in API server, each round's
pod a new one; blocks of rounds idle and loaded (the pod before being bound meanwhile)
alternate, and schedext's own stage histograms are scraped around every block."""

from __future__ import annotations

import contextlib
import http.client
import re
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import orjson

from loadtests.bench.runs import percentiles
from loadtests.bench.servers import Server, pinned_away
from loadtests.bench.wire import Split, timed
from loadtests.bench.workload import VARIANTS, Arm, Row, Workload
from loadtests.standin import StandIn, load_pod

IDLE, LOADED = "idle", "loaded"
LOAD_VERBS = ("filter", "prioritize", "constant")  # a load round's requests, in this order
LOAD_BLOCK = 20  # rounds per block, idle and loaded blocks alternating; the first settles
STAGES = ("body", "queue", "handler", "total")
BIND_CONNECTIONS = 4  # binds in flight at most, each on a connection of its own


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


def bench_size_loaded(
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
        dra = any(w.dra for w in workloads)  # resource.k8s.io for every stand-in, or none
        for workload in workloads:
            cluster = workdir / f"{workload.scenario}.json"
            cluster.write_bytes(orjson.dumps(workload.cluster))
            template = workdir / f"{workload.scenario}-pod.json"
            template.write_bytes(orjson.dumps(workload.pod))
            for tree, root in trees.items():
                name = f"{tree}-{workload.scenario}"
                with pinned_away(cpu):  # off the servers' CPU, as the API server would be
                    standin = stack.enter_context(
                        StandIn(cluster, template, workdir, name=name, delay_ms=delay_ms, dra=dra)
                    )
                server = stack.enter_context(
                    Server(None, workdir / f"{name}.log", root, cpu, kubeconfig=standin.kubeconfig)
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
        with pinned_away(cpu):
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
                        **percentiles(values),
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
    answer, ms, split = timed(load.verbs, "/filter", body, write_size)
    times["filter"] = (ms, split)
    passed = orjson.loads(answer)["NodeNames"]
    ranked = orjson.dumps({"Pod": pod, "Nodes": None, "NodeNames": passed})
    for verb, path, sent in (
        ("prioritize", "/prioritize", ranked),
        ("constant", "/bench/constant", body),
    ):
        _, ms, split = timed(load.verbs, path, sent, write_size)
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
