"""A gang member's filter at scale, with and without a required topology domain, and what a
starving gang's hold costs (issue 32).

    python -m loadtests.gangbench [--nodes 1000] [--rounds 400]

One process, the core in-process (no HTTP): a cluster of 8-GPU nodes labelled with four
topology levels (an NVLink clique per 4 nodes, a rack per 16, a spine block per 128, a zone per
500), a third of its GPUs held by bound pods, and two PodGroups of 8 members of 4 GPUs each:
one without topology, one that requires a rack. Each round first changes the inventory (a pod
bound or deleted on a node far from the gang's racks), so that no whole-group answer is
cached, as when kube-scheduler's pods keep landing; then times one member's filter of each
group, alternating which goes first. It prints each variant's median and p90 in ms and the
ratio of the medians, measured side by side in the one run.

Holds: two copies of a cluster where every node also runs a 1-GPU pod (so a gang of 8 x 8
GPUs fits nowhere now, and would if those finished), one with holds on and one with them off.
It times the review that chooses the gang's hold, and then a 1-GPU pod's filter on each copy,
alternating (the pod is kept off the held nodes on one copy), with the ratio of the medians.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Sequence
from typing import Any

from extender import names
from extender.gang.hold_keeper import HoldTimes
from extender.scheduler import Scheduler
from testbed.builders import gang_pod, make_node, make_pod, make_pod_group

Obj = dict[str, Any]
GPUS = 8


def labels(index: int) -> dict[str, str]:
    return {
        names.CLIQUE_LABEL: f"clique-{index // 4}",
        names.RACK_LABEL: f"rack-{index // 16}",
        names.SPINE_LABEL: f"spine-{index // 128}",
        names.ZONE_LABEL: f"zone-{index // 500}",
    }


def cluster(
    nodes: int, rng: random.Random, *, holds: HoldTimes | None = None, busy: bool = False
) -> tuple[Scheduler, list[str]]:
    """``busy``: every node also runs a 1-GPU pod on its last GPU."""
    scheduler = Scheduler(gang_holds=holds)
    node_names = [f"n{i:05d}" for i in range(nodes)]
    for index, name in enumerate(node_names):
        scheduler.upsert_node(make_node(name, gpus=GPUS, labels=labels(index)))
    for index, name in enumerate(node_names):
        held = rng.choice((0, 0, 2, 4, 7 if busy else 8))  # about a third of the GPUs held
        if held:
            pod = make_pod(f"load-{index}", gpus=held, node=name, gpu_ids=list(range(held)))
            scheduler.upsert_pod(pod)
        if busy:
            scheduler.upsert_pod(make_pod(f"busy-{index}", gpus=1, node=name, gpu_ids=[7]))
    return scheduler, node_names


def group(scheduler: Scheduler, name: str, annotations: dict[str, str], gpus: int = 4) -> Obj:
    scheduler.upsert_pod_group(make_pod_group(name, min_member=8, annotations=annotations))
    members = [gang_pod(f"{name}-{i}", name, gpus=gpus) for i in range(8)]
    for member in members:
        scheduler.upsert_pod(member)
    return members[0]


def run(nodes: int, rounds: int, seed: int = 32) -> dict[str, list[float]]:
    rng = random.Random(seed)
    scheduler, node_names = cluster(nodes, rng)
    variants = {
        "no topology": group(scheduler, "plain", {}),
        "required rack": group(scheduler, "racked", {names.TOPOLOGY_REQUIRED: names.RACK_LABEL}),
    }
    churn = node_names[-16:]  # one rack's nodes, kept for the churn
    times: dict[str, list[float]] = {name: [] for name in variants}
    order = list(variants)
    placed: str | None = None  # the churn pod bound last round, deleted this one
    for round_ in range(rounds):
        if placed is not None:
            scheduler.delete_pod(placed)
            placed = None
        else:
            pod = make_pod(f"churn-{round_}", gpus=1, node=rng.choice(churn), gpu_ids=[7])
            scheduler.upsert_pod(pod)
            placed = pod["metadata"]["uid"]
        order.reverse()
        for name in order:
            start = time.perf_counter()
            scheduler.filter(variants[name], node_names)
            times[name].append((time.perf_counter() - start) * 1000)
    return times


T0 = 1_800_000_000.0


def run_holds(nodes: int, rounds: int, seed: int = 32) -> tuple[float, dict[str, list[float]]]:
    """The review that starts the hold (ms), and a 1-GPU pod's filter with and without it."""
    copies = {}
    review_ms = 0.0
    for name, times in (("no hold", HoldTimes(0, 1)), ("hold standing", HoldTimes(60, 1e9))):
        scheduler, node_names = cluster(nodes, random.Random(seed), holds=times, busy=True)
        group(scheduler, "big", {}, gpus=GPUS)
        scheduler.review_holds(T0)
        start = time.perf_counter()
        events = scheduler.review_holds(T0 + 61)
        if events:
            review_ms = (time.perf_counter() - start) * 1000
        copies[name] = scheduler
    assert copies["hold standing"].gang_holds(), "the gang got no hold"
    small = make_pod("small", gpus=1)
    samples: dict[str, list[float]] = {name: [] for name in copies}
    order = list(copies)
    for _ in range(rounds):
        order.reverse()
        for name in order:
            start = time.perf_counter()
            copies[name].filter(small, node_names)
            samples[name].append((time.perf_counter() - start) * 1000)
    return review_ms, samples


def report(times: dict[str, list[float]], nodes: int, title: str = "") -> str:
    lines = [title or f"gang member filter, {nodes} nodes of {GPUS} GPUs, 4 topology levels"]
    medians = {}
    for name, samples in times.items():
        ordered = sorted(samples)
        medians[name] = statistics.median(ordered)
        p90 = ordered[int(0.9 * (len(ordered) - 1))]
        lines.append(
            f"  {name:<14} p50 {medians[name]:.3f} ms  p90 {p90:.3f} ms  (n={len(samples)})"
        )
    first, second = list(medians)
    lines.append(f"  {second} / {first}: {medians[second] / medians[first]:.2f}x")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=400)
    args = parser.parse_args(argv)
    print(report(run(args.nodes, args.rounds), args.nodes))
    review_ms, samples = run_holds(args.nodes, args.rounds)
    title = f"1-GPU pod filter beside a gang's hold of 64 GPUs, {args.nodes} nodes"
    print(report(samples, args.nodes, title))
    print(f"  the review that chose the hold: {review_ms:.1f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
