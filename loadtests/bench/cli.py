"""The command line: which sizes, scenarios and trees, plain or under load; the runs, then
the report, and the figures as JSON."""

from __future__ import annotations

import argparse
import json
import subprocess
from collections.abc import Sequence
from pathlib import Path

from loadtests import bench
from loadtests.bench import report
from loadtests.bench.loaded import bench_size_loaded
from loadtests.bench.runs import bench_size
from loadtests.bench.servers import ROOT, shared_cpu
from loadtests.bench.workload import (
    BASELINE,
    DRA_SCENARIOS,
    PODS,
    SCENARIOS,
    THIS,
    WHOLE,
    Row,
    Workload,
)


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
    cpu = shared_cpu() if len(trees) * len(scenarios) > 1 else None
    _print_setup(args, scenarios, cpu)
    with_tree, with_scenario = len(trees) > 1, len(scenarios) > 1
    results: list[Row] = []
    if args.load:
        # The servers on a CPU of their own where they can be (schedext has a core to itself
        # in a throughput run on a large machine), the stand-ins and this client on the others.
        server_cpu = cpu if cpu is not None else shared_cpu()
        for size in sizes:
            results += bench_size_loaded(
                size,
                [Workload.build(s, size, PODS[args.pod]) for s in scenarios],
                trees,
                rounds=args.rounds,
                warmup=args.warmup,
                cpu=server_cpu,
                write_size=args.write_size,
                lead_s=args.bind_lead_ms / 1000,
                delay_ms=args.binding_delay_ms,
            )
        report.print_loaded(results, with_tree=with_tree, with_scenario=with_scenario)
    else:
        for size in sizes:
            results += bench_size(
                size,
                [Workload.build(s, size, PODS[args.pod]) for s in scenarios],
                trees,
                rounds=args.rounds,
                warmup=args.warmup,
                cpu=cpu,
                write_size=args.write_size,
            )
        report.print_rows(results, with_tree=with_tree, with_scenario=with_scenario)
        if with_tree:
            report.print_comparison(results)
        if WHOLE in scenarios and with_scenario:
            report.print_scenarios(results)
        if any("p50_vs_no_dra" in r for r in results):
            report.print_dra(results)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


def _print_setup(args: argparse.Namespace, scenarios: list[str], cpu: int | None) -> None:
    """What runs where: the trees or the scenarios, the CPU they share, and where the
    servers' clusters come from."""
    on_cpu = f"; every server and core on CPU {cpu}" if cpu is not None else ""
    if args.baseline is not None:
        print(f"this tree: {_describe(ROOT)}; baseline: {_describe(args.baseline)}{on_cpu}")
    elif len(scenarios) > 1:
        print(f"scenarios: {', '.join(scenarios)}{on_cpu}")
    if DRA_SCENARIOS & set(scenarios) and not args.load:
        print(
            "served from a stand-in API server's list+watch per scenario (resource.k8s.io/v1 "
            "included), not from snapshots"
        )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m loadtests.bench", description=(bench.__doc__ or "").split("\n\n")[0]
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
        "ElasticQuotas, the pod's namespace borrowing over its min); claim (whole's cluster, "
        "a pod asking for --pod's GPUs through a ResourceClaim, not yet allocated); dra (half "
        "the nodes' GPUs published by NVIDIA's DRA driver in ResourceSlices, 8 per node, about "
        "40 %% held by allocated claims of bound pods; the other half whole's; --pod's pod); "
        "dra-claim (dra's cluster, claim's pod). The DRA scenarios are served from a stand-in "
        "API server, and so is every scenario beside them. Default: whole",
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
