"""Tight single-connection latency benchmark of filter and prioritize.

For each cluster size it starts ``schedext serve`` on a generated snapshot (loopback only),
then sends interleaved rounds over ONE keep-alive connection: the constant-answer endpoint
(same server, same body, no decision: the floor), filter (names mode, node order shuffled as
kube-scheduler's parallel filters do), and prioritize (with exactly the list filter returned,
as kube-scheduler sends it). It prints p50/p90/p99 per verb and N, and the ratios to the floor.
It also times the core alone, in this process, on the same data.

    python -m loadtests.bench --nodes 100,1000,5000 --rounds 2000
    schedext bench -- --nodes 5000
"""

from __future__ import annotations

import argparse
import http.client
import json
import random
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from loadtests import payloads

VARIANTS = 8  # distinct node orders, cycled (kube-scheduler's order varies per cycle)
PODS = {
    "h100": payloads.make_pod("bench-pod", gpus=2, model="H100", uid="bench-pod-uid"),
    "any": payloads.make_pod("bench-pod", gpus=2, model=None, uid="bench-pod-uid"),
}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="schedext bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", default="100,1000,5000", help="comma-separated cluster sizes")
    parser.add_argument("--rounds", type=int, default=2000, help="measured rounds per size")
    parser.add_argument("--warmup", type=int, default=300, help="unmeasured rounds first")
    parser.add_argument(
        "--pod",
        choices=sorted(PODS),
        default="h100",
        help="h100: asks for 2 H100 GPUs (1 node in 3 has them, the rest are rejected with "
        "reasons: the costly answer); any: 2 GPUs of any model (most nodes pass)",
    )
    parser.add_argument("--json", type=Path, help="also write the figures as JSON here")
    args = parser.parse_args([a for a in (argv or sys.argv[1:]) if a != "--"])
    sizes = [int(n) for n in args.nodes.split(",") if n.strip()]
    if args.rounds < 100 or not sizes or min(sizes) < 2:
        parser.error("need --rounds >= 100 and cluster sizes >= 2")
    results: list[dict[str, Any]] = []
    for size in sizes:
        results.extend(_bench_size(size, PODS[args.pod], rounds=args.rounds, warmup=args.warmup))
    _print(results)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


def _bench_size(
    size: int, pod: dict[str, Any], *, rounds: int, warmup: int
) -> list[dict[str, Any]]:
    cluster = payloads.make_cluster(size)
    node_names = [i["metadata"]["name"] for i in cluster["items"] if i["kind"] == "Node"]
    rng = random.Random(size)
    orders = [rng.sample(node_names, len(node_names)) for _ in range(VARIANTS)]
    filter_bodies = [orjson.dumps({"Pod": pod, "Nodes": None, "NodeNames": o}) for o in orders]
    with tempfile.TemporaryDirectory() as workdir:
        snapshot = Path(workdir) / "cluster.json"
        snapshot.write_bytes(orjson.dumps(cluster))
        with _Server(snapshot, Path(workdir) / "server.log") as server:
            conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
            passed = [orjson.loads(_post(conn, "/filter", b))["NodeNames"] for b in filter_bodies]
            prioritize_bodies = [
                orjson.dumps({"Pod": pod, "Nodes": None, "NodeNames": p}) for p in passed
            ]
            samples: dict[str, list[float]] = {"constant": [], "filter": [], "prioritize": []}
            for round_ in range(warmup + rounds):
                k = round_ % VARIANTS
                timings = (
                    ("constant", "/bench/constant", filter_bodies[k]),
                    ("filter", "/filter", filter_bodies[k]),
                    ("prioritize", "/prioritize", prioritize_bodies[k]),
                )
                for verb, path, body in timings:
                    started = time.perf_counter_ns()
                    _post(conn, path, body)
                    if round_ >= warmup:
                        samples[verb].append((time.perf_counter_ns() - started) / 1e6)
            conn.close()
    core = _core_times(cluster, pod, orders, passed, rounds=min(rounds, 1000))
    floor = _percentiles(samples["constant"])
    rows: list[dict[str, Any]] = []
    for verb, values in samples.items():
        figures = _percentiles(values)
        rows.append(
            {
                "verb": verb,
                "nodes": size,
                "feasible": len(passed[0]),
                **figures,
                "p50_ratio": figures["p50_ms"] / floor["p50_ms"],
                "p99_ratio": figures["p99_ms"] / floor["p99_ms"],
                "core_p50_ms": core.get(verb),
            }
        )
    return rows


def _core_times(
    cluster: dict[str, Any],
    pod: dict[str, Any],
    orders: list[list[str]],
    passed: list[list[str]],
    *,
    rounds: int,
) -> dict[str, float]:
    """The core alone: the same decisions without HTTP and JSON. The names are packed, as
    the service's decoder packs kube-scheduler's (extender.packed)."""
    from extender.packed import PackedNames  # noqa: PLC0415
    from extender.scheduler import Scheduler  # noqa: PLC0415

    packed_orders = [PackedNames.of(o) or o for o in orders]
    packed_passed = [PackedNames.of(p) or p for p in passed]

    scheduler = Scheduler()
    items = cluster["items"]
    scheduler.replace_nodes([i for i in items if i["kind"] == "Node"])
    scheduler.replace_pods([i for i in items if i["kind"] == "Pod"])
    times: dict[str, list[float]] = {"filter": [], "prioritize": []}
    for round_ in range(rounds):
        k = round_ % VARIANTS
        started = time.perf_counter_ns()
        scheduler.filter(pod, packed_orders[k])
        times["filter"].append((time.perf_counter_ns() - started) / 1e6)
        started = time.perf_counter_ns()
        scheduler.prioritize(pod, packed_passed[k])
        times["prioritize"].append((time.perf_counter_ns() - started) / 1e6)
    return {verb: float(np.percentile(values, 50)) for verb, values in times.items()}


def _post(conn: http.client.HTTPConnection, path: str, body: bytes) -> bytes:
    conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    data = response.read()
    if response.status != 200:
        raise RuntimeError(f"{path} answered {response.status}: {data[:200]!r}")
    return data


def _percentiles(values: list[float]) -> dict[str, float]:
    p50, p90, p99 = np.percentile(values, [50, 90, 99]).tolist()
    return {"p50_ms": p50, "p90_ms": p90, "p99_ms": p99, "count": len(values)}


def _print(rows: list[dict[str, Any]]) -> None:
    header = (
        f"{'verb':<11}{'nodes':>7}{'feasible':>9}{'p50 ms':>9}{'p90 ms':>9}{'p99 ms':>9}"
        f"{'p50/floor':>11}{'p99/floor':>11}{'core p50':>10}"
    )
    print(header)
    print("-" * len(header))
    for r in rows:
        core = f"{r['core_p50_ms']:.3f}" if r["core_p50_ms"] is not None else "-"
        print(
            f"{r['verb']:<11}{r['nodes']:>7}{r['feasible']:>9}{r['p50_ms']:>9.3f}"
            f"{r['p90_ms']:>9.3f}{r['p99_ms']:>9.3f}{r['p50_ratio']:>10.2f}x{r['p99_ratio']:>10.2f}x"
            f"{core:>10}"
        )
    print("floor = the constant-answer endpoint of the same server, same body, same connection")


class _Server:
    """``schedext serve`` on a snapshot, on a free loopback port, for the benchmark's life."""

    def __init__(self, snapshot: Path, log: Path) -> None:
        self.snapshot, self.log = snapshot, log
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = int(sock.getsockname()[1])

    def __enter__(self) -> _Server:
        command = [
            sys.executable, "-m", "app.cli", "serve", "--snapshot", str(self.snapshot),
            "--port", str(self.port), "--bench-endpoints", "--log-level", "warning",
        ]  # fmt: skip
        self._log = self.log.open("wb")
        # our own CLI with arguments built here, not user input
        self.process = subprocess.Popen(command, stdout=self._log, stderr=subprocess.STDOUT)  # noqa: S603
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"schedext exited: {self.log.read_text()[-2000:]}")
            try:
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=1)
                conn.request("GET", "/readyz")
                if conn.getresponse().status == 200:
                    conn.close()
                    return self
            except OSError:
                pass
            time.sleep(0.1)
        self.__exit__()
        raise RuntimeError("schedext did not become ready within 120 s")

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
