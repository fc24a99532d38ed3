"""``python -m loadtests.soak``: see docs/reliability.md. Exits 1 on any invariant violation
(and prints the seed to replay), 0 otherwise."""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from loadtests.soak.faults import FaultKind, parse_kinds
from loadtests.soak.figures import figures, render
from loadtests.soak.rig import Layout
from loadtests.soak.run import Options, soak
from loadtests.soak.workload import DEFAULT_MIX, Workload, parse_mix


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m loadtests.soak",
        description="A seeded fault soak: two schedext replicas behind a real kube-scheduler, "
        "a random stream of pods and faults, and an invariant checker over the API server.",
    )
    mix = ",".join(f"{k.value}={v}" for k, v in DEFAULT_MIX.items())
    kinds = ",".join(k.value for k in FaultKind)
    add = parser.add_argument
    add("--seed", type=int, default=None, help="replays a run (default: a random one, printed)")
    add("--duration", type=float, default=150.0, help="seconds of stream and faults (150)")
    add("--rate", type=float, default=1.5, help="units per second (1.5, about 2.4 pods/s)")
    add("--mix", default=mix, help=f"unit kinds and weights ({mix})")
    add("--lifetime", type=float, default=20.0, help="mean seconds a placed unit lives (20)")
    add("--faults", default="all", help=f"all, none, or some of: {kinds}")
    add("--fault-interval", type=float, default=12.0, help="mean seconds between faults (12)")
    add("--gpu-nodes", type=int, default=12, help="nodes of 8 H100s (12)")
    add("--share-nodes", type=int, default=2, help="nodes of 4 H100s that take shares (2)")
    add("--pool-size", type=int, default=24, help="addresses in each of the two pools (24)")
    add("--json", type=Path, help="also write the figures here")
    add("--keep", type=Path, help="keep the logs (schedext's, the control plane's) here")
    add(
        "--plant-double-allocation",
        action="store_true",
        help="replicas that ignore schedext.io/gpu-ids: the checker must report gpu-twice",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1, 10**6)
    try:
        workload = Workload(seed, parse_mix(args.mix), lifetime_s=args.lifetime)
        kinds = parse_kinds(args.faults)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    options = Options(
        seed=seed,
        duration_s=args.duration,
        rate=args.rate,
        fault_interval_s=args.fault_interval,
        faults=kinds,
        workload=workload,
        layout=Layout(args.gpu_nodes, args.share_nodes, args.pool_size),
        plant=args.plant_double_allocation,
    )
    print(f"soak: seed {seed}", flush=True)
    work = Path(tempfile.mkdtemp(prefix="schedext-soak-"))
    try:
        outcome = soak(options, work)
    finally:
        if args.keep is not None:
            shutil.copytree(work, args.keep, dirs_exist_ok=True)
        shutil.rmtree(work, ignore_errors=True)
    data = figures(outcome)
    print(render(data), flush=True)
    if args.json is not None:
        args.json.write_text(json.dumps(data, indent=2))
    if data["violations"]:
        print(f"soak: {data['violations']} violations; replay with --seed {seed}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
