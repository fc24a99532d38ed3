"""The plain runs: every tree's server on every scenario of one size, their rounds
interleaved over one connection each, then the core alone in batches alternating the same
way; the rows of figures, with their ratios to the floor, the baseline and whole."""

from __future__ import annotations

import contextlib
import http.client
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from loadtests.bench.servers import CoreProcess, connection, pinned_away
from loadtests.bench.wire import post
from loadtests.bench.workload import (
    BASELINE,
    CORE_VERBS,
    DRA_PAIRS,
    THIS,
    VARIANTS,
    VERBS,
    WHOLE,
    Arm,
    Row,
    Workload,
)
from loadtests.standin import DRA_KINDS, StandIn

CORE_BATCHES = 10  # the core's rounds in this many batches, the trees alternating


def bench_size(
    size: int,
    workloads: list[Workload],
    trees: dict[str, Path],
    *,
    rounds: int,
    warmup: int,
    cpu: int | None,
    write_size: int = 0,
) -> list[Row]:
    """Every tree's server on every workload, their rounds interleaved; then the cores.
    Served from snapshots; where a workload has DRA's objects, which a snapshot cannot
    hold, every server of the run lists and watches a stand-in API server of its scenario
    instead (``loadtests/standin.py``, with ``resource.k8s.io/v1``), as in a cluster."""
    arms: list[Arm] = [(tree, w.scenario) for w in workloads for tree in trees]
    filter_bodies = {w.scenario: w.filter_bodies() for w in workloads}
    served_by_api = any(w.dra for w in workloads)
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        workdir = Path(tmp)
        conns: dict[Arm, http.client.HTTPConnection] = {}
        standins: list[StandIn] = []
        for workload in workloads:
            snapshot = workdir / f"{workload.scenario}.json"
            snapshot.write_bytes(orjson.dumps(workload.cluster))
            standin = _standin(stack, workload, snapshot, workdir, cpu) if served_by_api else None
            standins += [standin] if standin is not None else []
            kubeconfig = None if standin is None else standin.kubeconfig
            for tree, root in trees.items():
                log = workdir / f"{tree}-{workload.scenario}.log"
                conns[(tree, workload.scenario)] = stack.enter_context(
                    connection(snapshot, log, root, cpu, kubeconfig=kubeconfig)
                )
            if standin is not None:
                _warn_if_dra_unlisted(standin, workload.scenario, len(trees))
        _settle(standins)
        passed = {
            arm: [
                orjson.loads(post(conn, "/filter", b))["NodeNames"] for b in filter_bodies[arm[1]]
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
    _add_dra_ratios(rows)
    return rows


def _standin(
    stack: contextlib.ExitStack, workload: Workload, cluster: Path, workdir: Path, cpu: int | None
) -> StandIn:
    """A stand-in API server serving ``cluster`` (DRA's kinds included) and no pending pod,
    off the servers' CPU."""
    template = workdir / f"{workload.scenario}-pod.json"
    template.write_bytes(orjson.dumps(workload.pod))
    with pinned_away(cpu):
        return stack.enter_context(
            StandIn(cluster, template, workdir, name=workload.scenario, lead=0, dra=True)
        )


def _settle(standins: list[StandIn], *, quiet_s: float = 1.0, limit_s: float = 120.0) -> None:
    """Once synced, a server records its Events (a Warning per node whose agent annotation
    it cannot read, once): a burst of API calls on its event loop. Wait until no stand-in
    has taken an Event for ``quiet_s``, so that the rounds measure the steady state."""
    if not standins:
        return
    deadline = time.monotonic() + limit_s
    last = [s.stats()["recorded"] for s in standins]
    quiet_since = time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.2)
        now = [s.stats()["recorded"] for s in standins]
        if now != last:
            last, quiet_since = now, time.monotonic()
        elif time.monotonic() - quiet_since >= quiet_s:
            break
    if sum(last):
        print(f"(the servers recorded {sum(last):,} Events once synced: waited for them)")


def _warn_if_dra_unlisted(standin: StandIn, scenario: str, servers: int) -> None:
    """Every server, once ready, has listed each DRA collection (a tree from before DRA
    lists none of them, and then measures its scenario without them): say where not."""
    lists = standin.stats()["lists"]
    short = [plural for plural in DRA_KINDS if lists.get(plural, 0) < servers]
    if short:
        print(
            f"warning: in the {scenario} scenario not every server listed {', '.join(short)} "
            f"(lists served: {lists}); a tree without DRA measures it without them",
            file=sys.stderr,
        )


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
                post(conns[arm], paths[verb], bodies[arm[1]][verb][k], write_size)
                if round_ >= warmup:
                    samples[arm][verb].append((time.perf_counter_ns() - started) / 1e6)
    return samples


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
    floor = percentiles(samples["constant"])
    rows: list[Row] = []
    for verb, values in samples.items():
        figures = percentiles(values)
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


def _add_dra_ratios(rows: list[Row]) -> None:
    """On each half-DRA scenario's rows whose cluster without DRA ran too (``DRA_PAIRS``):
    p50 and p99 over that scenario's (the same tree, pod and verb), served and core."""
    by_key = {(r["tree"], r["scenario"], r["verb"]): r for r in rows}
    for row in rows:
        plain = by_key.get((row["tree"], DRA_PAIRS.get(row["scenario"], ""), row["verb"]))
        if plain is None:
            continue
        row["p50_vs_no_dra"] = row["p50_ms"] / plain["p50_ms"]
        row["p99_vs_no_dra"] = row["p99_ms"] / plain["p99_ms"]
        core_pair = (row["core_p50_ms"], plain["core_p50_ms"])
        row["core_p50_vs_no_dra"] = None if None in core_pair else core_pair[0] / core_pair[1]


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
        cores: dict[Arm, CoreProcess] = {}
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
                cores[(tree, scenario)] = stack.enter_context(CoreProcess(data, root, log, cpu))
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


def percentiles(values: list[float]) -> dict[str, float]:
    p50, p90, p99 = np.percentile(values, [50, 90, 99]).tolist()
    return {"p50_ms": p50, "p90_ms": p90, "p99_ms": p99, "count": len(values)}
