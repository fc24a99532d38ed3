"""A gang starved by a stream of small pods, without and with holds (docs/gangs.md).

    python -m loadtests.starvation [--reps 1] [--window 90] [--hold-after 5]

Against the end-to-end harness's real etcd + kube-apiserver + kube-scheduler (loopback only),
with schedext as kube-scheduler's extender: 6 nodes of 8 GPUs; a stream of 1-GPU pods in no
gang (``testbed.stream``: a backlog of 8 kept pending, each pod deleted 3-5 s after it is
bound, as a short job finishes) fills every GPU; after ``--warmup`` seconds of that, a gang of
4 x 8 GPUs (a PodGroup of minMember 4, the same priority) arrives. The same scenario runs with
holds off (``gang.hold_after_s`` 0: the code path before holds) and on (``--hold-after``),
each on a fresh schedext and kube-scheduler and in a namespace of its own, the order
alternating rep by rep. For each it prints: the time from the gang's arrival to all its
members bound, or "not within" the window; when its hold started; the GPU-seconds the hold
kept idle (``schedext_gang_hold_idle_gpu_seconds_total``); and the small pods placed from
the arrival until the gang was placed (or the window ended), in all and per second, the rate
from the hold's start until then ("per s held": on the nodes it leaves them), and their rate
in the warm-up (every node theirs). Bounded: each variant stops at its window.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from loadtests import kubeload
from loadtests.kubeload import SchedextProcess
from testbed.controlplane import ControlPlane
from testbed.kubeapi import ApiError
from testbed.manifests import pod_manifest
from testbed.stream import SmallPodStream

H100 = "NVIDIA-H100-80GB-HBM3"
GPUS_PER_NODE = 8
GROUP_LABEL = "scheduling.x-k8s.io/pod-group"
GANG_HOLD = "schedext.io/gang-hold"
PODGROUPS = "/apis/scheduling.x-k8s.io/v1alpha1"
GROUP = "starved"
OFF = "holds off"


@dataclass
class Outcome:
    variant: str
    rep: int
    placed_s: float | None  # from the gang's arrival; None: not within the window
    held_s: float | None  # when its hold was first seen, from the arrival
    idle_gpu_s: float
    small_meanwhile: int
    meanwhile_s: float
    small_rate_before: float
    small_held: int = 0  # placed from the hold's start until the gang was placed
    held_for_s: float = 0.0

    @property
    def held_rate(self) -> float | None:
        return self.small_held / self.held_for_s if self.held_for_s else None

    @property
    def small_rate(self) -> float:
        return self.small_meanwhile / self.meanwhile_s if self.meanwhile_s else 0.0


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    kubeload.exit_on_signals()
    variants = {OFF: 0.0, f"holds on ({args.hold_after:g} s)": args.hold_after}
    outcomes: list[Outcome] = []
    with tempfile.TemporaryDirectory(prefix="schedext-starve-") as workdir, (
        kubeload.control_plane()
    ) as cp:  # fmt: skip
        for index in range(args.nodes):
            cp.api.create_node(
                f"gpu-{index}", cpu="32", memory="256Gi", gpus=GPUS_PER_NODE,
                labels={"nvidia.com/gpu.product": H100},
            )  # fmt: skip
        for rep in range(args.reps):
            order = list(variants.items())
            for name, after in order if rep % 2 == 0 else reversed(order):
                outcome = _run(cp, Path(workdir), args, name=name, after=after, rep=rep)
                outcomes.append(outcome)
                print(_row(outcome, args.window), flush=True)
    print()
    print(report(outcomes, args))
    if args.json:
        args.json.write_text(json.dumps([o.__dict__ for o in outcomes], indent=1))
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m loadtests.starvation", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--reps", type=int, default=1, help="runs of each variant")
    parser.add_argument("--nodes", type=int, default=6, help="nodes of 8 GPUs (default 6)")
    parser.add_argument("--members", type=int, default=4, help="gang members of 8 GPUs")
    parser.add_argument("--window", type=float, default=90.0, help="seconds the gang may take")
    parser.add_argument("--hold-after", type=float, default=5.0, help="gang.hold_after_s, on")
    parser.add_argument("--warmup", type=float, default=10.0, help="seconds of stream before")
    parser.add_argument("--backlog", type=int, default=8, help="small pods kept pending")
    parser.add_argument(
        "--lifetime", type=float, nargs=2, default=(3.0, 5.0), metavar=("MIN", "MAX"),
        help="seconds a small pod runs once bound (default 3 5)",
    )  # fmt: skip
    parser.add_argument("--json", type=Path, help="write the outcomes here as JSON")
    return parser


def _run(
    cp: ControlPlane, workdir: Path, args: argparse.Namespace, *, name: str, after: float, rep: int
) -> Outcome:
    namespace = f"starve-{rep}-{'on' if after else 'off'}"
    cp.api.create_namespace(namespace)
    env = {"SCHEDEXT_GANG__HOLD_AFTER_S": f"{after:g}"}
    log = workdir / f"schedext-{namespace}.log"
    with _serving(cp, log, env) as schedext, SmallPodStream(
        cp.server, cp.token, cp.ca_cert, namespace, backlog=args.backlog,
        lifetime_s=tuple(args.lifetime), max_s=args.window + args.warmup + 180,
    ) as stream:  # fmt: skip
        gpus = args.nodes * GPUS_PER_NODE
        _until(lambda: stream.running >= gpus, 60, "the stream never filled the cluster")
        filled = time.monotonic()
        time.sleep(args.warmup)  # the stream's own rate, every GPU in use (bounded)
        arrived = time.monotonic()
        before = len(stream.placements(filled, arrived)) / (arrived - filled)
        members = _gang(cp, namespace, args.members)
        placed_s = held_s = None
        deadline = arrived + args.window
        while time.monotonic() < deadline:
            if held_s is None and _hold(cp, namespace) is not None:
                held_s = time.monotonic() - arrived
            if _all_bound(cp, namespace, members):
                placed_s = time.monotonic() - arrived
                break
            time.sleep(0.2)
        end = arrived + (placed_s if placed_s is not None else args.window)
        meanwhile = len(stream.placements(arrived, end))
        held_from = arrived + held_s if held_s is not None else end
        during_hold = len(stream.placements(held_from, end))
        if after:  # the hold's last review: it ends, and its cost stops growing
            _until(lambda: schedext.scrape().total("schedext_gang_holds") == 0, 30, "hold stays")
        idle = schedext.scrape().total("schedext_gang_hold_idle_gpu_seconds_total")
        stream.stop()
    _clear(cp, namespace)
    return Outcome(
        name, rep + 1, placed_s, held_s, idle, meanwhile, end - arrived, before,
        small_held=during_hold, held_for_s=end - held_from,
    )  # fmt: skip


@contextlib.contextmanager
def _serving(cp: ControlPlane, log: Path, env: dict[str, str]) -> Iterator[SchedextProcess]:
    """schedext with ``env``, and kube-scheduler with it as its extender."""
    schedext = SchedextProcess(cp.kubeconfig, log, env=env)
    try:
        schedext.start()
        schedext.wait_ready(120)
        cp.start_scheduler(kubeload.scheduler_config(schedext.url))
        yield schedext
    except BaseException:
        print(f"schedext log tail:\n{schedext.tail()}", file=sys.stderr)
        raise
    finally:
        cp.stop_scheduler()
        schedext.stop()


def _gang(cp: ControlPlane, namespace: str, members: int) -> list[str]:
    body = {
        "apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup",
        "metadata": {"name": GROUP, "namespace": namespace}, "spec": {"minMember": members},
    }  # fmt: skip
    cp.api.apply_raw("POST", f"{PODGROUPS}/namespaces/{namespace}/podgroups", body)
    names = [f"{GROUP}-{i}" for i in range(members)]
    gpu = {"nvidia.com/gpu": str(GPUS_PER_NODE)}
    for name in names:
        manifest = pod_manifest(
            name, requests={"cpu": "1", "memory": "1Gi", **gpu}, limits=gpu,
            labels={GROUP_LABEL: GROUP},
        )  # fmt: skip
        cp.api.create_pod(namespace, manifest)
    return names


def _hold(cp: ControlPlane, namespace: str) -> str | None:
    group = cp.api.apply_raw("GET", f"{PODGROUPS}/namespaces/{namespace}/podgroups/{GROUP}")
    return (group["metadata"].get("annotations") or {}).get(GANG_HOLD)


def _all_bound(cp: ControlPlane, namespace: str, members: list[str]) -> bool:
    pods = cp.api.list_pods(namespace, label_selector=f"{GROUP_LABEL}={GROUP}")
    bound = {p["metadata"]["name"] for p in pods if p["spec"].get("nodeName")}
    return bound >= set(members)


def _clear(cp: ControlPlane, namespace: str) -> None:
    """Every pod of the run deleted at once (no kubelet: no grace), and its PodGroup."""
    for pod in cp.api.list_pods(namespace):
        cp.api.delete_pod(namespace, pod["metadata"]["name"])
    with contextlib.suppress(ApiError):
        cp.api.apply_raw("DELETE", f"{PODGROUPS}/namespaces/{namespace}/podgroups/{GROUP}")
    _until(lambda: not cp.api.list_pods(namespace), 60, f"pods left in {namespace}")


def _until(predicate: Callable[[], object], timeout: float, message: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() >= deadline:
            raise RuntimeError(f"{message} (waited {timeout:g}s)")
        time.sleep(0.2)


# ---------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------

HEADER = (
    f"{'variant':<18} {'rep':>3}  {'gang placed after':<20} {'hold after':>10} "
    f"{'idle GPU-s':>10} {'small pods meanwhile':>21} {'per s':>6} {'per s held':>10} "
    f"{'per s before':>13}"
)


def _row(o: Outcome, window: float) -> str:
    placed = f"{o.placed_s:.1f} s" if o.placed_s is not None else f"not within {window:g} s"
    held = f"{o.held_s:.1f} s" if o.held_s is not None else "-"
    held_rate = f"{o.held_rate:.2f}" if o.held_rate is not None else "-"
    return (
        f"{o.variant:<18} {o.rep:>3}  {placed:<20} {held:>10} {o.idle_gpu_s:>10.1f} "
        f"{o.small_meanwhile:>21} {o.small_rate:>6.2f} {held_rate:>10} "
        f"{o.small_rate_before:>13.2f}"
    )


def report(outcomes: Sequence[Outcome], args: argparse.Namespace) -> str:
    lines = [
        f"starved gang: {args.nodes} nodes x {GPUS_PER_NODE} GPUs, a gang of {args.members} x "
        f"{GPUS_PER_NODE} GPUs; 1-GPU pods, {args.backlog} kept pending, each deleted "
        f"{args.lifetime[0]:g}-{args.lifetime[1]:g} s after it is bound",
        HEADER,
        *(_row(o, args.window) for o in outcomes),
    ]
    off = [o for o in outcomes if o.variant == OFF]
    on = [o for o in outcomes if o.variant != OFF]
    if off and on:
        rate_off = statistics.median(o.small_rate for o in off)
        rate_on = statistics.median(o.small_rate for o in on)
        placed_off = sum(o.placed_s is not None for o in off)
        placed_on = sum(o.placed_s is not None for o in on)
        lines.append(
            f"gang placed within {args.window:g} s: holds off {placed_off}/{len(off)}, "
            f"holds on {placed_on}/{len(on)}"
        )
        if rate_off:
            lines.append(
                f"small pods per second while the gang waited, on / off (medians): "
                f"{rate_on:.2f} / {rate_off:.2f} = {rate_on / rate_off:.2f}x"
            )
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
