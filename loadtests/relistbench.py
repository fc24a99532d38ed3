"""A cold sync in-process: the pod list's pages, as kube-apiserver serves them, decoded and
relisted by the core, timed by stage on the CPU clock.

No API server and no HTTP (``loadtests.sync`` measures the whole, against a real one; reading a
page off the socket costs about 17 µs a pod more, section 3 of docs/performance.md). The
cluster is ``loadtests.sync``'s (``sync.Plan``: GPU nodes whose first pods hold 2, 1, 2, 1...
GPUs, CPU pods after), each pod as the API server serves it to a list (defaults,
``managedFields``, a kubelet's status: about 7.5 KB), in pages of ``--page`` pods. Stages:

- ``nodes``: the node list decoded and relisted;
- ``decode``: every pod page through the pod informer's msgspec decoder;
- ``add``: the pages handed to ``Scheduler.pod_relist().add`` in batches of 50, as the
  informer does (each pod's holding decoded);
- ``commit``: the relist committed (the inventory built).

The cyclic collector is set as the service sets it: ``--collector service`` its thresholds
(50,000, 20, 100) all along, as before issue 34; ``paused`` off until the sync is done, as the
service now does. Each figure is the median over ``--reps`` of the stage's CPU seconds; with
``--baseline DIR`` both trees run the same input in their own processes, alternated rep by rep.
The last column checks the result: the GPUs the inventory holds once committed.

    python -m loadtests.relistbench                              # 1,000 nodes, 20,000 pods
    python -m loadtests.relistbench --collector service,paused   # both, side by side
    python -m loadtests.relistbench --baseline ../schedext-before --collector service
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson

JSON = dict[str, Any]
STAGES = ("nodes", "decode", "add", "commit")
COLLECTORS = ("service", "paused")
BATCH = 50  # items handed to the relist at a time, as app.kube.watch does


def build_input(nodes: int, pods: int, page: int) -> JSON:
    """The node list and the pod pages, as bytes the API server would send."""
    from loadtests import intakebench, sync  # noqa: PLC0415 (the child imports no loadtests)

    plan = sync.Plan.build(nodes, pods, gpu_fill=1.0, compact=True)
    items = []
    for i in range(pods):
        pod = intakebench._served(plan.pod(i), uid=f"00000000-0000-4000-8000-{i:012d}", version=9)
        pod["status"] = intakebench._kubelet_status(pod, running=True, ts="2026-11-28T10:00:05Z")
        items.append(pod)
    meta = {"resourceVersion": "99"}
    pages = [
        orjson.dumps({"kind": "PodList", "metadata": meta, "items": items[s : s + page]}).decode()
        for s in range(0, pods, page)
    ]
    node_list = orjson.dumps({"kind": "NodeList", "metadata": meta, "items": plan.nodes}).decode()
    held = sum(len(plan.gpu_ids(i)) for i in range(pods))
    return {"nodes": node_list, "pages": pages, "held_gpus": held}


def measure(data: JSON, collector: str) -> JSON:
    """One cold sync of ``data`` by a fresh core; CPU seconds per stage."""
    from app.service.cluster import NODES, PODS  # noqa: PLC0415 (the tree PYTHONPATH names)
    from extender.scheduler import Scheduler  # noqa: PLC0415

    pages = [page.encode() for page in data["pages"]]
    node_list = data["nodes"].encode()
    gc.collect()
    gc.set_threshold(50_000, 20, 100)
    if collector == "paused":
        gc.disable()
    clock = time.process_time
    try:
        core = Scheduler()
        began = clock()
        nodes = core.node_relist()
        nodes.add(NODES.decode_page(node_list)["items"])
        nodes.commit()
        took = {"nodes": clock() - began, "decode": 0.0, "add": 0.0}
        relist = core.pod_relist()
        for page in pages:
            began = clock()
            items = PODS.decode_page(page)["items"]
            took["decode"] += clock() - began
            began = clock()
            for start in range(0, len(items), BATCH):
                relist.add(items[start : start + BATCH])
            took["add"] += clock() - began
            del items
        began = clock()
        relist.commit()
        took["commit"] = clock() - began
        held = int(sum(core.inventory.arrays.gpu_total - core.inventory.arrays.gpu_free))
    finally:
        gc.enable()
    return {**took, "held_gpus": held}


def child(path: str, collectors: Sequence[str]) -> None:
    data = orjson.loads(Path(path).read_bytes())
    result = {collector: measure(data, collector) for collector in collectors}
    sys.stdout.write(orjson.dumps(result).decode() + "\n")


def _run(tree: Path, path: str, collectors: Sequence[str]) -> JSON:
    from loadtests.child import run_child  # noqa: PLC0415 (the parent's: the child has no loadtests)

    return run_child(__file__, tree, ["--child", path, "--collector", ",".join(collectors)])


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m loadtests.relistbench", description=__doc__)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--pods", type=int, default=20_000)
    parser.add_argument("--page", type=int, default=5000, help="pods per list page")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--collector", default="service,paused", help="service, paused or both")
    parser.add_argument("--baseline", type=Path, help="another checkout, measured beside")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    collectors = [c for c in args.collector.split(",") if c]
    if not collectors or any(c not in COLLECTORS for c in collectors):
        raise SystemExit(f"--collector: one or more of {', '.join(COLLECTORS)}")
    if args.child:
        child(args.child, collectors)
        return 0
    here = Path(__file__).resolve().parent.parent
    trees = {"this": here} | ({"base": args.baseline.resolve()} if args.baseline else {})
    data = build_input(args.nodes, args.pods, args.page)
    runs: dict[str, list[JSON]] = {name: [] for name in trees}
    with tempfile.TemporaryDirectory() as scratch:
        path = str(Path(scratch) / "input.json")
        Path(path).write_bytes(orjson.dumps(data))
        for rep in range(args.reps):
            order = list(trees.items()) if rep % 2 == 0 else list(trees.items())[::-1]
            for name, tree in order:
                runs[name].append(_run(tree, path, collectors))
    print(
        f"{args.nodes:,} nodes, {args.pods:,} pods in pages of {args.page:,}; CPU seconds "
        f"per stage, median of {args.reps}; µs per pod in the total column"
    )
    for name, tree in trees.items():
        print(f"  {name}: {tree}")
    print(f"{'tree':6} {'collector':9} " + " ".join(f"{s:>7}" for s in STAGES)
          + f" {'total':>7} {'µs/pod':>7} {'GPUs held':>10}")  # fmt: skip
    for name in trees:
        for collector in collectors:
            each = [run[collector] for run in runs[name]]
            stages = {s: statistics.median(r[s] for r in each) for s in STAGES}
            total = statistics.median(sum(r[s] for s in STAGES) for r in each)
            held = {r["held_gpus"] for r in each}
            check = "ok" if held == {data["held_gpus"]} else f"WRONG {sorted(held)}"
            print(f"{name:6} {collector:9} " + " ".join(f"{stages[s]:7.3f}" for s in STAGES)
                  + f" {total:7.3f} {total / args.pods * 1e6:7.1f} {check:>10}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
