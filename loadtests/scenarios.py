"""Every verb over seeded random clusters, for ``loadtests.answers``: one JSON line of answers
per scenario.

``loadtests.answers`` runs this file as a script (not ``-m``) once per source tree, with
``PYTHONPATH`` set to that checkout, so that ``extender`` and the test builders are imported
from it. It therefore uses only what has long been stable there: the ``Scheduler`` verbs and
intake, ``PolicyConfig``, ``GangVictims``, ``Victim``, and ``testbed.builders`` (which
``loadtests.answers`` finds in ``tests/`` in a checkout from before ``testbed/``).

    python loadtests/scenarios.py SCENARIOS [FIRST_SEED]

A scenario: 2-8 nodes (0, 2, 4 or 8 GPUs of three models, NVLink groups, racks, some GPUs
held whole or shared; some with a GPU in MIG mode), two IP pools and a sticky claim, two
PodGroups, 3-8 pending pods (plain, CPU, gang, model-hinted, address, a GPU share, MIG
devices), then 12 random steps (filter, prioritize, preempt, bind with
confirm or abort, explain, expiry, delete), each followed by the gang events, the groups'
status, the reservation and pending counts and the claims to release.
"""

from __future__ import annotations

import random
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from extender.devices import Gpu, MigSlice, Topology, encode_topology
from extender.errors import BindRefusedError
from extender.model import FilterVerdict, Victim
from extender.names import GPU_TOPOLOGY
from extender.policy import GpuScoring, PolicyConfig
from extender.preemption import GangVictims
from extender.scheduler import Scheduler
from testbed.builders import (
    bound_ip_pod,
    gang_pod,
    ip_pod,
    make_ip_claim,
    make_ip_pool,
    make_node,
    make_pod,
    make_pod_group,
    name_of,
    share_pod,
    uid_of,
)

STEPS = 12


def main(argv: Sequence[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    if not 1 <= len(args) <= 2 or not all(a.isdigit() for a in args):
        print("usage: python loadtests/scenarios.py SCENARIOS [FIRST_SEED]", file=sys.stderr)
        return 2
    count, first = int(args[0]), int(args[1]) if len(args) > 1 else 0
    for seed in range(first, first + count):
        answers = scenario(seed)
        sys.stdout.write(orjson.dumps({"seed": seed, "answers": answers}).decode() + "\n")
    return 0


def scenario(seed: int) -> list[Any]:
    rng = random.Random(seed)
    scheduler = Scheduler(
        PolicyConfig(gpu_scoring=rng.choice(list(GpuScoring))),
        gang_victims=rng.choice(list(GangVictims)),
        gang_max_wait_s=5,
    )
    names = _cluster(scheduler, rng)
    pods = _pending(scheduler, rng)
    answers: list[Any] = []
    for step in range(STEPS):
        pod = rng.choice(pods)
        operation = rng.choice(OPERATIONS)
        answers.append(operation(_Step(scheduler, rng, pod, names, float(step))))
        events = scheduler.take_gang_events()
        answers.append([(e.kind.name, e.group, e.reason, e.uids, e.pods) for e in events])
        answers.append(
            [
                [repr(scheduler.group_status(g)) for g in ("default/ga", "default/gb")],
                scheduler.reservation_count,
                scheduler.pending_count,
                sorted(c.name for c in scheduler.claims_to_release()),
            ]
        )
    return answers


def _cluster(scheduler: Scheduler, rng: random.Random) -> list[str]:
    names = []
    for i in range(rng.randint(2, 8)):
        gpus = rng.choice([0, 2, 4, 8])
        groups = [[0, 1, 2, 3], [4, 5, 6, 7]] if gpus == 8 and rng.random() < 0.6 else None
        model = rng.choice([None, "NVIDIA-A100-SXM4-40GB", "Tesla-T4"]) if gpus else None
        labels = {"topology.kubernetes.io/rack": f"r{rng.randint(0, 2)}"}
        cpu = rng.choice(["4", "32"])
        node = make_node(f"n{i}", gpus=gpus, model=model, groups=groups, labels=labels, cpu=cpu)
        mig = gpus and rng.random() < 0.2
        if mig:  # its last GPU in MIG mode, with three MIG devices
            node["metadata"]["annotations"][GPU_TOPOLOGY] = _mig_topology(f"n{i}", gpus)
            node["status"]["allocatable"]["nvidia.com/gpu"] = str(gpus - 1)
        scheduler.upsert_node(node)
        names.append(f"n{i}")
        if gpus and rng.random() < 0.7:
            used = sorted(rng.sample(range(gpus - mig), rng.randint(0, gpus - mig)))
            priority = rng.choice([0, 5, 100])
            if used and rng.random() < 0.3:  # shares of GPU memory instead of whole GPUs
                for index in used:
                    memory = rng.choice([10240, 20480])
                    bound = share_pod(
                        f"s{i}-{index}", memory_mib=memory, node=f"n{i}", gpu_ids=[index],
                        priority=priority,
                    )  # fmt: skip
                    scheduler.upsert_pod(bound)
            elif used:
                bound = make_pod(
                    f"b{i}", gpus=len(used), node=f"n{i}", gpu_ids=used, priority=priority
                )
                scheduler.upsert_pod(bound)
    scheduler.upsert_ip_pool(make_ip_pool("p0", cidr="10.0.0.0/30", rack="r0"))
    scheduler.upsert_ip_pool(make_ip_pool("p1", cidr="10.0.1.0/29", rack="r1"))
    scheduler.upsert_pod(bound_ip_pod("ipb", node="n0", ip="10.0.0.1", pool="p0", priority=1))
    scheduler.upsert_ip_claim(make_ip_claim("p1", "10.0.1.1", "sts/default/db/0", policy="sticky"))
    scheduler.upsert_pod_group(make_pod_group("ga", min_member=2, created="2026-01-01T00:00:00Z"))
    scheduler.upsert_pod_group(make_pod_group("gb", min_member=3, created="2026-01-02T00:00:00Z"))
    return names


def _pending(scheduler: Scheduler, rng: random.Random) -> list[dict[str, Any]]:
    pods = []
    for j in range(rng.randint(3, 8)):
        kind = rng.choice(["plain", "cpu", "gang", "gang", "ip", "model", "share", "mig"])
        gpus = rng.randint(1, 4)
        name = f"q{j}"
        if kind == "plain":
            pod = make_pod(name, gpus=gpus, priority=rng.choice([0, 50, 200]))
        elif kind == "cpu":
            workload = rng.choice(["CPU-intensive", None])
            pod = make_pod(name, workload=workload, cpu=rng.choice(["1", "8"]))
        elif kind == "gang":
            group = rng.choice(["ga", "gb", "gc"])
            pod = gang_pod(name, group, gpus=gpus, priority=rng.choice([0, 200]))
        elif kind == "model":
            pod = make_pod(name, gpus=gpus, model=rng.choice(["A100", "H100", "t4"]))
        elif kind == "share":
            pod = share_pod(
                name, memory_mib=rng.choice([10240, 40960]), cores=rng.choice([None, 30, 80]),
                shares=rng.choice([1, 2]), priority=rng.choice([0, 200]),
            )  # fmt: skip
        elif kind == "mig":
            pod = make_pod(name, priority=rng.choice([0, 200]))
            resources = pod["spec"]["containers"][0]["resources"]
            for profile in rng.sample(_MIG_PROFILES, rng.randint(1, 2)):
                count = str(rng.randint(1, 2))
                resources["limits"][f"nvidia.com/mig-{profile}"] = count
                resources["requests"][f"nvidia.com/mig-{profile}"] = count
        else:
            pool = rng.choice(["p0", "p1", "nope"])
            pod = ip_pod(name, pool=pool, gpus=rng.randint(0, 1), priority=200)
        pods.append(pod)
        scheduler.upsert_pod(pod)
    return pods


@dataclass(frozen=True, slots=True)
class _Step:
    scheduler: Scheduler
    rng: random.Random
    pod: dict[str, Any]
    names: list[str]
    now: float


def _filter(step: _Step) -> list[Any]:
    return ["filter", _verdict(step.scheduler.filter(step.pod, [*step.names, "ghost"]))]


def _prioritize(step: _Step) -> list[Any]:
    try:
        return ["prioritize", step.scheduler.prioritize(step.pod, step.names).tolist()]
    except ValueError as error:  # a pod that cannot be read (PodRequestError)
        return ["refused", str(error)]


def _preempt(step: _Step) -> list[Any]:
    holdings = step.scheduler.inventory.holdings()
    candidates = {n: [Victim(h.uid) for h in holdings if h.node == n][:2] for n in step.names}
    chosen = step.scheduler.preempt(step.pod, candidates, now=step.now)
    return ["preempt", sorted((n, v.uids, v.extra_pdb_violations) for n, v in chosen.items())]


def _bind(step: _Step) -> list[Any]:
    scheduler, pod = step.scheduler, step.pod
    node = step.rng.choice(step.names)
    try:
        plan = scheduler.plan_bind(
            uid=uid_of(pod), namespace="default", name=name_of(pod), node=node, now=step.now
        )
    except BindRefusedError as error:
        return ["refused", str(error)]
    if step.rng.random() < 0.7:
        scheduler.confirm_bind(plan, awaiting_watch=step.rng.random() < 0.5)
    else:
        scheduler.abort_bind(plan)
    claim = [plan.claim.name, plan.claim.exists] if plan.claim else None
    return ["bind", plan.node, plan.gpu_ids, dict(plan.annotations), plan.group, plan.ip, claim]


def _explain(step: _Step) -> list[Any]:
    e = step.scheduler.explain("default", name_of(step.pod))
    if e is None:
        return ["explain", None]
    nodes = [(n.node, n.fits, n.reason, n.resolvable) for n in e.nodes]
    return ["explain", e.state, e.node, dict(e.request), repr(e.group), e.group_reason, nodes]


def _expire(step: _Step) -> list[Any]:
    expired = step.scheduler.expire(step.now + step.rng.choice([0, 10, 100]))
    return ["expire", sorted(h.uid for h in expired)]


def _delete(step: _Step) -> list[Any]:
    step.scheduler.delete_pod(uid_of(step.pod))
    return ["delete"]


# Drawn at random for each step; filter and bind twice as often as the rest.
OPERATIONS: tuple[Callable[[_Step], list[Any]], ...] = (
    _filter, _filter, _prioritize, _preempt, _bind, _bind, _explain, _expire, _delete,
)  # fmt: skip


_MIG_PROFILES = ["1g.10gb", "2g.20gb"]


def _mig_topology(node: str, gpus: int) -> str:
    """The node agent's topology document: GPUs 0..gpus-1, the last in MIG mode."""
    last = gpus - 1
    profiles = ("1g.10gb", "1g.10gb", "2g.20gb")
    slices = tuple(MigSlice(profile, f"MIG-{node}-{m}") for m, profile in enumerate(profiles))
    return encode_topology(
        Topology(
            gpus=tuple(
                Gpu(
                    index=i,
                    uuid=f"GPU-{node}-{i}",
                    mig_enabled=i == last,
                    migs=slices if i == last else (),
                )
                for i in range(gpus)
            )
        )
    )


def _verdict(verdict: FilterVerdict) -> list[Any]:
    rejections = sorted(
        (r.message, r.resolvable, r.reason.name, sorted(r.nodes)) for r in verdict.rejections
    )
    return [list(verdict.passed), rejections]


if __name__ == "__main__":
    raise SystemExit(main())
