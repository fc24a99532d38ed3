"""Informer scale: how fast ``schedext serve --kubeconfig`` syncs a large cluster, how much
memory it needs, and what keeping up with pod updates costs it.

Against the end-to-end harness's real etcd + kube-apiserver (loopback only) it:

1. creates N GPU nodes (``payloads.make_node``, status included) and M pods already bound
   (``spec.nodeName`` set at creation). On GPU nodes the first pods hold 2, 1, 2, 1... GPUs
   (requests, limits and the ``schedext.io/gpu-ids`` annotation) until ``--gpu-fill`` of the
   node's GPUs are held; every further pod on the node is a CPU pod of the same shape (5,000
   nodes carry about 30,000 GPUs, so 100,000 pods cannot all hold one);
2. starts schedext and times process start -> HTTP up -> /readyz 200 (cold sync: nodes, pods,
   CRDs), sampling VmRSS every 0.2 s; checks that its inventory holds exactly the GPUs the pods
   hold; reads VmHWM;
3. sends K label PATCHes to bound pods at a fixed rate and charges schedext's CPU time
   (/proc utime+stime, less an idle baseline) per 1,000 updates: each to a pod of its own
   (the first update of each since the list), or with ``--updated-pods P`` over P pods in
   turn (a pod updated again and again, as the kubelet updates a running pod's status);
4. measures watch lag: deletes a pod that holds GPUs and polls /metrics until schedext's free
   GPU count shows it: once right after the stream, then a few times idle.

With ``--reps R`` step 2 runs R times (the median is reported); with ``--baseline DIR`` another
checkout's schedext is measured on the same cluster, its cold syncs alternating with this
tree's, and its steady state after this tree's.

With ``--claims C`` half the nodes are DRA's (``loadtests.dra_payloads``: 8 GPUs each, no
``nvidia.com/gpu`` allocatable, the node agent's UUIDs), and C of the pods on them each name a
ResourceClaim of their own (``spec.resourceClaims``), the claims spread evenly over the DRA
nodes (at most 8 per node: one GPU each). Step 2 then runs twice on the same nodes and pods:
first before any DRA object exists, then after the DeviceClass ``gpu.nvidia.com``, a
ResourceSlice per DRA node and the C claims are created, each claim allocated on its pod's
node and reserved for that pod through the ``/status`` subresource (a create drops a status),
as kube-scheduler's DynamicResources plugin writes it. The report puts the two side by side;
the steady state follows on the cluster with the claims.

    python -m loadtests.sync                           # 5,000 nodes, 100,000 pods
    python -m loadtests.sync --claims 20000            # and 20,000 claims on 2,500 DRA nodes
    python -m loadtests.sync --reps 3 --baseline ../schedext-before
    python -m loadtests.sync --nodes 500 --pods 10000 --json sync.json
    python -m loadtests.sync --profile sync.prof  # cold sync only, under cProfile
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import itertools
import json
import math
import pstats
import random
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from loadtests import dra_payloads, kubeload
from loadtests.kubeload import Call, RestPool, SchedextProcess
from testbed.controlplane import ControlPlane

JSON = dict[str, Any]
NAMESPACE = "sync-bench"
PRIORITY_CLASS = ("research", 1000)  # payloads.make_pod's priorityClassName
CREATE = "application/json"
MERGE_PATCH = "application/merge-patch+json"
DELETE_NOW = {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0}
DRA = "/apis/resource.k8s.io/v1"
HOLDER_LABEL = "schedext-bench/claim-holder"  # on the pods that name a claim
TARGET_READY_S = 20.0
TARGET_RSS_MIB = 1024.0


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:  # before anything starts: a plan that cannot be is a usage error
        plan = Plan.build(
            args.nodes,
            args.pods,
            gpu_fill=args.gpu_fill,
            compact=not args.fat_pods,
            claims=args.claims,
        )
    except ValueError as error:
        parser.error(str(error))
    kubeload.exit_on_signals()
    report: JSON = {"machine": kubeload.machine_info(), "params": _params(args)}
    started = time.monotonic()
    with (
        tempfile.TemporaryDirectory(prefix="schedext-sync-") as workdir,
        kubeload.control_plane(args.apiserver_arg) as cp,
        RestPool(cp, args.concurrency) as pool,
    ):
        report["cluster"] = plan.summary()
        report["fill"] = fill(pool, plan)
        report["objects"] = _object_sizes(pool, cp.etcd_url)
        trees = {"current": kubeload.ROOT}
        if args.baseline is not None:
            trees["baseline"] = args.baseline.resolve()
        sampler = kubeload.Sampler(args.py_spy, args.py_spy_dir or Path(workdir))
        cold = functools.partial(
            _cold_syncs, cp, Path(workdir), args, trees=trees, plan=plan, sampler=sampler
        )
        # Cold syncs first, the trees alternating (the machine's load drifts), all on the same
        # untouched cluster; then the steady state of each tree, which deletes a few pods.
        runs = cold(prefix="")
        report["cold_sync"] = _median_run(runs["current"])
        report["cold_runs"] = runs
        if plan.claims:
            # The same nodes and pods, now with DRA's objects: slices, claims, the class.
            report["dra_fill"] = _fill_dra(pool, plan)
            dra_runs = cold(prefix="dra-")
            report["dra_cold_sync"] = _median_run(dra_runs["current"])
            report["dra_cold_runs"] = dra_runs
        if args.profile is None:
            report["steady_by_tree"] = {}
            for offset, (name, root) in enumerate(trees.items()):
                log = Path(workdir) / f"schedext-{name}-steady.log"
                with _schedext(cp, log, args, root) as schedext:
                    schedext.start()  # not checked against the plan: earlier runs deleted pods
                    schedext.wait_ready(args.ready_timeout)
                    steady = _steady(pool, schedext, plan, args, sampler, victim_offset=offset)
                    steady["vm_hwm_end_mib"] = _mib(kubeload.status_kib(schedext.pid, "VmHWM"))
                    report["steady_by_tree"][name] = steady
            report["steady"] = report["steady_by_tree"]["current"]
            report["cold_sync"]["vm_hwm_end_mib"] = report["steady"]["vm_hwm_end_mib"]
    report["total_s"] = round(time.monotonic() - started, 1)
    _print(report)
    _print_py_spy(report)
    if args.profile is not None:
        _print_profile(args.profile, args.profile_top)
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    return 0


def _cold_syncs(
    cp: ControlPlane,
    workdir: Path,
    args: argparse.Namespace,
    *,
    trees: dict[str, Path],
    plan: Plan,
    sampler: kubeload.Sampler,
    prefix: str,
) -> dict[str, list[JSON]]:
    """``--reps`` cold syncs of every tree, the trees alternating; each tree's runs.
    ``prefix`` "dra-": DRA's objects exist now (the inventory is checked for them)."""
    runs: dict[str, list[JSON]] = {name: [] for name in trees}
    for rep in range(args.reps):
        for name, root in trees.items() if rep % 2 == 0 else reversed(trees.items()):
            log = workdir / f"schedext-{prefix}{name}-{rep}.log"
            with _schedext(cp, log, args, root) as schedext:
                runs[name].append(
                    _cold_sync(schedext, plan, args.ready_timeout, sampler, dra=prefix == "dra-")
                )
    return runs


@contextlib.contextmanager
def _schedext(
    cp: ControlPlane, log: Path, args: argparse.Namespace, root: Path
) -> Iterator[SchedextProcess]:
    schedext = SchedextProcess(cp.kubeconfig, log, profile=args.profile, root=root)
    try:
        yield schedext
    except BaseException:
        print(f"schedext log tail:\n{schedext.tail()}", file=sys.stderr)
        raise
    finally:
        schedext.stop()


def _median_run(runs: list[JSON]) -> JSON:
    """The run with the median time to ready (the lower middle one of an even count)."""
    return sorted(runs, key=lambda run: run["ready_s"])[(len(runs) - 1) // 2]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m loadtests.sync", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--nodes", type=int, default=5000, help="N nodes (default 5000)")
    parser.add_argument("--pods", type=int, default=100_000, help="M bound pods (default 100000)")
    parser.add_argument(
        "--claims",
        type=int,
        default=0,
        help="C ResourceClaims on half the nodes, made DRA's (default 0: no DRA); cold syncs "
        "before and after they exist",
    )
    parser.add_argument("--updates", type=int, default=5000, help="K pod PATCHes (default 5000)")
    parser.add_argument("--update-rate", type=float, default=200.0, help="PATCHes per second")
    parser.add_argument(
        "--updated-pods",
        type=int,
        default=0,
        help="spread the PATCHes over this many pods, each updated again and again (default 0: "
        "every PATCH to a pod of its own, the first update of each since the list)",
    )
    parser.add_argument("--concurrency", type=int, default=48, help="requests in flight (fill)")
    parser.add_argument(
        "--gpu-fill", type=float, default=1.0, help="share of each node's GPUs held (0..1)"
    )
    parser.add_argument("--lag-samples", type=int, default=5, help="idle watch-lag samples")
    parser.add_argument(
        "--idle-s", type=float, default=10.0, help="idle CPU baseline window (seconds)"
    )
    parser.add_argument("--ready-timeout", type=float, default=600.0, help="seconds")
    parser.add_argument(
        "--fat-pods",
        action="store_true",
        help="payloads.make_pod's 12 env vars (about 6 KB served) instead of 4 (about 4 KB)",
    )
    parser.add_argument(
        "--apiserver-arg", action="append", default=[], help="extra kube-apiserver flag"
    )
    parser.add_argument(
        "--profile",
        type=Path,
        help="run schedext under cProfile, stop it once ready, print the top functions",
    )
    parser.add_argument("--profile-top", type=int, default=30, help="rows per profile table")
    parser.add_argument(
        "--py-spy",
        type=Path,
        help="py-spy binary: sample schedext during the cold sync and the update stream",
    )
    parser.add_argument("--py-spy-dir", type=Path, help="keep py-spy's raw stacks here")
    parser.add_argument(
        "--reps", type=int, default=1, help="cold syncs per source tree; the median is reported"
    )
    parser.add_argument(
        "--baseline",
        type=Path,
        help="another checkout of schedext (e.g. a git worktree of an earlier commit): its cold "
        "syncs alternate with this tree's on the same cluster, and its steady state follows",
    )
    parser.add_argument("--json", type=Path, help="write the figures here as JSON")
    return parser


def _params(args: argparse.Namespace) -> JSON:
    return {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}


# ---------------------------------------------------------------------------------------------
# The cluster
# ---------------------------------------------------------------------------------------------


def gpu_sets(gpus: int, fill: float) -> list[tuple[int, ...]]:
    """GPU indices of the GPU pods of one node: 2, 1, 2, 1... contiguous GPUs until ``fill``
    of them are held."""
    budget = math.floor(gpus * fill)
    sets: list[tuple[int, ...]] = []
    start = 0
    for pattern in itertools.cycle((2, 1)):
        if start >= budget:
            break
        size = min(pattern, budget - start)
        sets.append(tuple(range(start, start + size)))
        start += size
    return sets


def spread_claims(claims: int, dra_nodes: int, per_node: int) -> list[int]:
    """How many of ``claims`` each of ``dra_nodes`` nodes gets: evenly, the first ones one
    more; ValueError if more than ``per_node`` would land on a node."""
    if claims < 0:
        raise ValueError("--claims must be >= 0")
    if claims and claims > dra_nodes * per_node:
        raise ValueError(
            f"--claims {claims}: at most {dra_nodes * per_node:,} here ({dra_nodes:,} DRA "
            f"nodes, {per_node} claims each: one per GPU and per pod of the node)"
        )
    base, extra = divmod(claims, dra_nodes) if dra_nodes else (0, 0)
    return [base + (j < extra) for j in range(dra_nodes)]


@dataclass(frozen=True)
class Plan:
    """Which pod goes where: pod i is the (i // N)-th pod of node i % N. With claims, the
    first ``claims_on[n]`` pods of DRA node n each name a claim holding one of its GPUs."""

    nodes: list[JSON]
    layouts: list[list[tuple[int, ...]]]  # per node: GPU ids of its GPU pods, in order
    pods: int
    compact: bool
    claims_on: tuple[int, ...] = ()  # per node: how many claims (0 on the device plugin's)

    @classmethod
    def build(
        cls, nodes: int, pods: int, *, gpu_fill: float, compact: bool, claims: int = 0
    ) -> Plan:
        rng = random.Random(7)
        objects = []
        for i in range(nodes):
            if claims and dra_payloads.is_dra_index(i):
                node = kubeload.gpu_node(i, rng, eight_gpus=True)
                objects.append(dra_payloads.as_dra_node(node))
            else:
                objects.append(kubeload.gpu_node(i, rng))
        layouts = [gpu_sets(kubeload.node_gpus(n), gpu_fill) for n in objects]
        dra = [i for i in range(nodes) if claims and dra_payloads.is_dra_index(i)]
        per_node = min(dra_payloads.DRA_GPUS, pods // max(nodes, 1))
        counts = dict(zip(dra, spread_claims(claims, len(dra), per_node), strict=True))
        claims_on = tuple(counts.get(i, 0) for i in range(nodes)) if claims else ()
        return cls(objects, layouts, pods, compact, claims_on)

    @property
    def claims(self) -> int:
        return sum(self.claims_on)

    def is_dra(self, node: int) -> bool:
        return bool(self.claims_on) and dra_payloads.is_dra_index(node)

    def claim_name(self, index: int) -> str | None:
        """The claim pod ``index`` names, if it names one: it holds GPU k of the node for
        the node's k-th pod."""
        node, k = self.slot(index)
        if not self.claims_on or k >= self.claims_on[node]:
            return None
        return f"c-{node:05d}-{k}"

    def holder_indices(self) -> Iterator[int]:
        """The pods that name a claim."""
        return (i for i in range(self.pods) if self.claim_name(i) is not None)

    def claim(self, index: int, pod_uid: str | None) -> JSON:
        """The claim of pod ``index``, allocated (GPU k of its node) and reserved for it."""
        node, k = self.slot(index)
        name = self.claim_name(index)
        if name is None:
            raise ValueError(f"pod {self.name(index)} names no claim")
        return dra_payloads.allocated_claim(
            name,
            self.nodes[node]["metadata"]["name"],
            [k],
            pod=self.name(index),
            pod_uid=pod_uid,
            namespace=NAMESPACE,
        )

    def slices(self) -> list[JSON]:
        """A ResourceSlice per DRA node, as NVIDIA's DRA driver publishes it."""
        return [dra_payloads.node_slice(n) for i, n in enumerate(self.nodes) if self.is_dra(i)]

    def slot(self, index: int) -> tuple[int, int]:
        return index % len(self.nodes), index // len(self.nodes)

    def name(self, index: int) -> str:
        node, k = self.slot(index)
        return f"w-{node:05d}-{k:03d}"

    def gpu_ids(self, index: int) -> tuple[int, ...]:
        node, k = self.slot(index)
        layout = self.layouts[node]
        return layout[k] if k < len(layout) else ()

    def pod(self, index: int) -> JSON:
        node, _ = self.slot(index)
        pod = kubeload.pod_object(
            self.name(index),
            NAMESPACE,
            node=self.nodes[node]["metadata"]["name"],
            gpu_ids=self.gpu_ids(index),
            compact=self.compact,
        )
        claim = self.claim_name(index)
        if claim is not None:  # a CPU pod's shape, its GPU from the claim it names
            pod["metadata"]["labels"][HOLDER_LABEL] = "true"
            pod["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": claim}]
            pod["spec"]["containers"][0]["resources"]["claims"] = [{"name": "gpu"}]
        return pod

    def gpu_pod_indices(self) -> Iterator[int]:
        return (i for i in range(self.pods) if self.gpu_ids(i))

    def summary(self) -> JSON:
        held = [len(self.gpu_ids(i)) for i in range(self.pods)]
        dra_nodes = sum(1 for i in range(len(self.nodes)) if self.is_dra(i))
        return {
            "nodes": len(self.nodes),
            "gpu_nodes": sum(1 for n in self.nodes if kubeload.node_gpus(n)),
            "gpus": sum(kubeload.node_gpus(n) for n in self.nodes),
            "pods": self.pods,
            "gpu_pods": sum(1 for h in held if h),
            "held_gpus": sum(held),
            "dra_nodes": dra_nodes,
            "dra_gpus": dra_nodes * dra_payloads.DRA_GPUS,
            "claims": self.claims,
        }


def fill(pool: RestPool, plan: Plan) -> JSON:
    """The plan's nodes and bound pods created (also loadtests.listformats's cluster)."""
    kubeload.create_namespace(pool, NAMESPACE)
    kubeload.create_priority_class(pool, *PRIORITY_CLASS)
    meter = kubeload.CpuMeter(kubeload.process_ids(("kube-apiserver", "etcd")))
    node_calls = (("POST", "/api/v1/nodes", n, CREATE) for n in plan.nodes)
    nodes = pool.run("nodes", node_calls, progress_s=15)
    _check(nodes)
    path = f"/api/v1/namespaces/{NAMESPACE}/pods"
    pod_calls = (("POST", path, plan.pod(i), CREATE) for i in range(plan.pods))
    meter.start()
    pods = pool.run("pods", pod_calls, progress_s=15)
    _check(pods)
    return {
        "nodes": nodes.summary(),
        "pods": pods.summary(),
        "pods_cpu_s": meter.read(),
        "concurrency": pool.concurrency,
    }


def _fill_dra(pool: RestPool, plan: Plan) -> JSON:
    """DRA's objects for the plan's claims: the DeviceClass, a slice per DRA node, and each
    claim created, then allocated and reserved for its pod through ``/status``."""
    pool.call("POST", f"{DRA}/deviceclasses", dra_payloads.gpu_device_class())
    slices = pool.run("slices", (("POST", f"{DRA}/resourceslices", piece, CREATE)
                                 for piece in plan.slices()))  # fmt: skip
    _check(slices)
    uids = _holder_uids(pool)
    path = f"{DRA}/namespaces/{NAMESPACE}/resourceclaims"
    holders = list(plan.holder_indices())
    missing = [plan.name(i) for i in holders if plan.name(i) not in uids]
    if missing:
        raise RuntimeError(f"{len(missing)} claim holders not listed, e.g. {missing[:3]}")
    claims = [plan.claim(i, uids[plan.name(i)]) for i in holders]
    created = pool.run(
        "claims",
        (("POST", path, dra_payloads.creatable_claim(c), CREATE) for c in claims),
        progress_s=15,
    )
    _check(created)
    statuses = pool.run(
        "claim statuses",
        (
            ("PATCH", f"{path}/{c['metadata']['name']}/status", dra_payloads.claim_status(c),
             MERGE_PATCH)
            for c in claims
        ),
        progress_s=15,
    )  # fmt: skip
    _check(statuses)
    return {"slices": slices.summary(), "claims": created.summary(), "statuses": statuses.summary()}


def _holder_uids(pool: RestPool) -> dict[str, str]:
    """Name -> UID of the pods that name a claim (their claims' ``reservedFor`` needs it)."""
    uids: dict[str, str] = {}
    params = {"labelSelector": f"{HOLDER_LABEL}=true", "limit": "5000"}
    while True:
        page = pool.call("GET", f"/api/v1/namespaces/{NAMESPACE}/pods", params=params)
        for pod in page["items"]:
            uids[pod["metadata"]["name"]] = pod["metadata"]["uid"]
        token = (page.get("metadata") or {}).get("continue")
        if not token:
            return uids
        params = {**params, "continue": token}


def _check(batch: kubeload.Batch) -> None:
    if batch.failed:
        raise RuntimeError(f"{batch.label}: {batch.failed} requests failed: {batch.errors[:3]}")


def _object_sizes(pool: RestPool, etcd_url: str) -> JSON:
    """Bytes per pod and per node as listed (what schedext downloads), and etcd's database."""
    sizes: JSON = {}
    for kind, path in (("pod", f"/api/v1/namespaces/{NAMESPACE}/pods"), ("node", "/api/v1/nodes")):
        response = pool.client.get(path, params={"limit": "500"})
        items = len(response.json()["items"])
        sizes[f"{kind}_bytes_listed"] = round(len(response.content) / max(items, 1))
    etcd = kubeload.Scrape(httpx.get(f"{etcd_url}/metrics", timeout=10).text)
    sizes["etcd_db_mib"] = _mib(etcd.total("etcd_mvcc_db_total_size_in_bytes") / 1024)
    sizes["etcd_db_in_use_mib"] = _mib(etcd.total("etcd_mvcc_db_total_size_in_use_in_bytes") / 1024)
    sizes["etcd_quota_mib"] = _mib(etcd.total("etcd_server_quota_backend_bytes") / 1024)
    return sizes


# ---------------------------------------------------------------------------------------------
# Cold sync
# ---------------------------------------------------------------------------------------------


def _cold_sync(
    schedext: SchedextProcess,
    plan: Plan,
    timeout: float,
    sampler: kubeload.Sampler,
    *,
    dra: bool = False,
) -> JSON:
    meter = kubeload.CpuMeter(kubeload.process_ids(("kube-apiserver", "etcd"))).start()
    schedext.start()
    meter.add_new("schedext", schedext.pid)
    with kubeload.RssSampler(schedext.pid) as rss:
        ready = schedext.wait_ready(
            timeout, on_http_up=lambda: sampler.start(schedext.pid, "cold-sync")
        )
    profile = sampler.stop()
    pid = schedext.pid
    figures: JSON = {
        "http_up_s": round(ready.http_up_s, 2),
        "ready_s": round(ready.ready_s, 2),
        "cpu_s": meter.read(),
        "rss_at_ready_mib": _mib(kubeload.status_kib(pid, "VmRSS")),
        "rss_sampled_peak_mib": _mib(rss.peak_kib),
        "vm_hwm_at_ready_mib": _mib(kubeload.status_kib(pid, "VmHWM")),
        "rss_samples": len(rss.samples),
    }
    if profile is not None:
        figures["py_spy"] = profile
    figures["inventory"] = _check_inventory(schedext, plan, dra=dra)
    return figures


def _check_inventory(schedext: SchedextProcess, plan: Plan, *, dra: bool = False) -> JSON:
    """schedext must hold every node and exactly the GPUs the pods' annotations name. With
    ``dra`` (the slices and claims exist), it must see every DRA node as DRA's, and its GPU
    counts may also include the DRA nodes' GPUs with the claims' held (a core that counts
    them in the inventory)."""
    scrape = schedext.scrape()
    expected = plan.summary()
    seen: JSON = {
        "nodes": int(scrape.total("schedext_inventory_nodes")),
        "gpus": int(scrape.total("schedext_inventory_gpus")),
        "held_gpus": int(
            scrape.total("schedext_inventory_gpus") - scrape.total("schedext_inventory_gpus_free")
        ),
    }
    readings = [expected]
    if dra:
        readings.append(
            expected
            | {
                "gpus": expected["gpus"] + expected["dra_gpus"],
                "held_gpus": expected["held_gpus"] + expected["claims"],
            }
        )
    matching = [r for r in readings if all(seen[k] == r[k] for k in ("nodes", "gpus", "held_gpus"))]
    if not matching:
        wrong = {k: (v, [r[k] for r in readings]) for k, v in seen.items()}
        raise RuntimeError(
            f"schedext inventory disagrees with the cluster (seen, expected): {wrong}"
        )
    if dra:
        seen["dra_gpus_counted"] = matching[0] is not expected
        nodes = schedext.get("/inventory").json()["nodes"]
        seen["dra_nodes"] = sum(1 for n in nodes if n.get("gpuOwner") == "dra")
        if seen["dra_nodes"] != expected["dra_nodes"]:
            raise RuntimeError(
                f"schedext sees {seen['dra_nodes']} nodes whose GPUs DRA owns, expected "
                f"{expected['dra_nodes']}"
            )
    return seen


# ---------------------------------------------------------------------------------------------
# Steady state
# ---------------------------------------------------------------------------------------------


def _steady(
    pool: RestPool,
    schedext: SchedextProcess,
    plan: Plan,
    args: argparse.Namespace,
    sampler: kubeload.Sampler,
    *,
    victim_offset: int = 0,
) -> JSON:
    """``victim_offset``: which pods the lag samples delete (each run needs pods of its own)."""
    pid = schedext.pid
    idle_began, idle_cpu = time.monotonic(), kubeload.cpu_seconds(pid)
    time.sleep(args.idle_s)
    idle_rate = (kubeload.cpu_seconds(pid) - idle_cpu) / (time.monotonic() - idle_began)
    per_run = args.lag_samples + 1
    first = victim_offset * per_run
    victims = list(itertools.islice(plan.gpu_pod_indices(), first, first + per_run))
    sampler.start(pid, "updates")
    began, cpu_before = time.monotonic(), kubeload.cpu_seconds(pid)
    deleted = set(itertools.islice(plan.gpu_pod_indices(), first))  # by earlier runs
    stream = pool.run(
        "patches",
        _patches(plan, args.updates, deleted, run=victim_offset, spread=args.updated_pods),
        rate=args.update_rate,
    )
    _check(stream)
    # The delete travels behind every PATCH event on the same watch: when schedext shows it,
    # it has processed the whole stream.
    after_stream = _lag(pool, schedext, plan, victims[0])
    cpu_s = kubeload.cpu_seconds(pid) - cpu_before
    # Events the intake found to change nothing (a tree without the metric: 0).
    skipped = schedext.scrape().total("schedext_pod_events_skipped_total")
    profile = sampler.stop()
    net_cpu_s = max(0.0, cpu_s - idle_rate * (time.monotonic() - began))
    idle_lags = []
    for victim in victims[1:]:
        time.sleep(0.5)
        idle_lags.append(_lag(pool, schedext, plan, victim))
    per_1000 = 1000 / max(stream.done, 1)
    figures: JSON = {
        "updates": stream.summary(),
        "offered_rate": args.update_rate,
        "updated_pods": min(args.updated_pods or plan.pods, plan.pods),
        "events_skipped": int(skipped),
        "idle_cpu_ms_per_s": round(idle_rate * 1000, 2),
        "stream_cpu_ms": round(cpu_s * 1000),
        "cpu_ms_per_1000_updates": round(net_cpu_s * 1000 * per_1000, 1),
        "cpu_ms_per_1000_updates_raw": round(cpu_s * 1000 * per_1000, 1),
        "lag_after_stream_ms": after_stream,
        "lag_idle_ms": idle_lags,
        "lag_idle_p50_ms": round(kubeload.percentile([s["from_delete"] for s in idle_lags], 50), 1),
        "lag_idle_max_ms": round(max((s["from_delete"] for s in idle_lags), default=math.nan), 1),
    }
    if profile is not None:
        figures["py_spy"] = profile
    return figures


def _patches(
    plan: Plan, count: int, deleted: set[int], *, run: int = 0, spread: int = 0
) -> Iterator[Call]:
    """Label PATCHes; ``run`` makes the values new (a PATCH that changes nothing is no event);
    ``spread``: over that many pods, in turn (0: every pod)."""
    # A large odd stride spreads the updates over nodes and over GPU and CPU pods alike.
    stride = 7919
    spread = min(spread or plan.pods, plan.pods)
    for tick in range(count):
        index = tick % spread * stride % plan.pods
        while index in deleted:
            index = (index + 1) % plan.pods
        name = plan.name(index)
        body = {"metadata": {"labels": {"bench-tick": f"{run}-{tick}"}}}
        yield "PATCH", f"/api/v1/namespaces/{NAMESPACE}/pods/{name}", body, MERGE_PATCH


def _free_gpus(schedext: SchedextProcess) -> float:
    return schedext.scrape().total("schedext_inventory_gpus_free")


def _lag(pool: RestPool, schedext: SchedextProcess, plan: Plan, index: int) -> JSON:
    """Delete a GPU pod; milliseconds until schedext's free GPU count includes its GPUs (from
    sending the DELETE, and from the API server's answer)."""
    wanted = _free_gpus(schedext) + len(plan.gpu_ids(index))
    sent = time.monotonic()
    pool.call("DELETE", f"/api/v1/namespaces/{NAMESPACE}/pods/{plan.name(index)}", DELETE_NOW)
    answered = time.monotonic()
    deadline = sent + 60
    while time.monotonic() < deadline:
        if _free_gpus(schedext) >= wanted:
            seen = time.monotonic()
            return {
                "from_delete": round((seen - sent) * 1000, 1),
                "from_answer": round((seen - answered) * 1000, 1),
            }
        time.sleep(0.002)
    raise RuntimeError(f"schedext did not see pod {plan.name(index)} deleted within 60 s")


# ---------------------------------------------------------------------------------------------
# Output
# ---------------------------------------------------------------------------------------------


def _mib(kib: float) -> float:
    return round(kib / 1024, 1)


def _print(report: JSON) -> None:
    m, c, fill, objects = report["machine"], report["cluster"], report["fill"], report["objects"]
    cold = report["cold_sync"]
    print(
        f"\nschedext informer sync: {c['nodes']:,} nodes ({c['gpus']:,} GPUs), "
        f"{c['pods']:,} bound pods ({c['gpu_pods']:,} holding {c['held_gpus']:,} GPUs)"
    )
    print(f"machine: {m['nproc']} CPUs ({m['cpu_model']}), {m['mem_total_gib']} GiB")
    rows = [
        ("fill: nodes", f"{fill['nodes']['done']:,} in {fill['nodes']['seconds']:.1f} s "
         f"({fill['nodes']['per_second']:,.0f}/s)", ""),
        ("fill: pods", f"{fill['pods']['done']:,} in {fill['pods']['seconds']:.1f} s "
         f"({fill['pods']['per_second']:,.0f}/s, {fill['concurrency']} in flight)", ""),
        ("CPU during pod fill", _cpu_line(fill["pods_cpu_s"]), ""),
        ("object size as listed", f"pod {objects['pod_bytes_listed']:,} B, "
         f"node {objects['node_bytes_listed']:,} B", ""),
        ("etcd db", f"{objects['etcd_db_mib']:,} MiB of {objects['etcd_quota_mib']:,} MiB quota",
         ""),
        ("start -> HTTP up", f"{cold['http_up_s']:.2f} s", ""),
        ("start -> /readyz 200", f"{cold['ready_s']:.2f} s", f"target <= {TARGET_READY_S:g} s"),
        ("CPU start -> ready", _cpu_line(cold["cpu_s"]), ""),
        ("RSS at ready", f"{cold['rss_at_ready_mib']:,} MiB", ""),
        ("peak RSS (VmHWM)", f"{cold.get('vm_hwm_end_mib', cold['vm_hwm_at_ready_mib']):,} MiB",
         f"target <= {TARGET_RSS_MIB:g} MiB"),
    ]  # fmt: skip
    steady = report.get("steady")
    if steady:
        u = steady["updates"]
        rows += [
            ("updates", f"{u['done']:,} PATCHes at {u['per_second']:.0f}/s "
             f"(offered {steady['offered_rate']:g}/s) to "
             f"{steady.get('updated_pods', 0):,} pods; "
             f"{steady.get('events_skipped', 0):,} pod events skipped", ""),
            ("schedext CPU / 1,000 updates", f"{steady['cpu_ms_per_1000_updates']:.0f} ms "
             f"(raw {steady['cpu_ms_per_1000_updates_raw']:.0f} ms; idle "
             f"{steady['idle_cpu_ms_per_s']:.1f} ms/s subtracted)", ""),
            ("watch lag after stream",
             f"{steady['lag_after_stream_ms']['from_delete']:.0f} ms", ""),
            ("watch lag idle", f"p50 {steady['lag_idle_p50_ms']:.0f} ms, max "
             f"{steady['lag_idle_max_ms']:.0f} ms (n={len(steady['lag_idle_ms'])})", ""),
        ]  # fmt: skip
    width = max(len(r[0]) for r in rows) + 2
    for label, value, target in rows:
        print(f"  {label:<{width}}{value}{'   (' + target + ')' if target else ''}")
    _print_comparison(report)
    _print_dra(report)
    print(f"  total benchmark time: {report['total_s']:.0f} s")


def _print_comparison(report: JSON) -> None:
    """Every cold sync of every tree, and each tree's steady state, side by side."""
    runs: dict[str, list[JSON]] = report.get("cold_runs") or {}
    if sum(len(r) for r in runs.values()) < 2:
        return
    steady = report.get("steady_by_tree") or {}
    print("\n  tree       ready s (each run)        median   schedext CPU s   peak RSS MiB"
          "   CPU ms / 1,000 updates")  # fmt: skip
    for name, tree_runs in runs.items():
        times = [r["ready_s"] for r in tree_runs]
        median = _median_run(tree_runs)
        figures = steady.get(name, {})
        per_update = (
            f"{figures['cpu_ms_per_1000_updates']:.0f} "
            f"(raw {figures['cpu_ms_per_1000_updates_raw']:.0f})"
            if figures
            else "-"
        )
        print(
            f"  {name:<10} {', '.join(f'{t:.1f}' for t in times):<25} "
            f"{median['ready_s']:>6.1f}   {median['cpu_s'].get('schedext', math.nan):>14.1f}"
            f"   {max(r['vm_hwm_at_ready_mib'] for r in tree_runs):>12,.0f}"
            f"   {per_update:>22}"
        )


def _print_dra(report: JSON) -> None:
    """With --claims: each tree's cold syncs before the DRA objects existed and after, side
    by side, and the medians' ratios (peak RSS: the highest of the runs)."""
    if "dra_cold_runs" not in report:
        return
    c, fill = report["cluster"], report["dra_fill"]
    print(
        f"\n  DRA: {c['dra_nodes']:,} of the nodes DRA's ({c['dra_gpus']:,} GPUs in "
        f"{fill['slices']['done']:,} ResourceSlices), {c['claims']:,} ResourceClaims "
        f"(created in {fill['claims']['seconds']:.1f} s, allocated through /status in "
        f"{fill['statuses']['seconds']:.1f} s); the same nodes and pods without and with them"
    )
    print("  tree       DRA objects    ready s (each run)        median   schedext CPU s"
          "   kube-apiserver CPU s   peak RSS MiB")  # fmt: skip
    for name in report["cold_runs"]:
        phases = [report["cold_runs"][name], report["dra_cold_runs"][name]]
        figures = [_sync_figures(runs) for runs in phases]
        for label, runs, values in zip(("without", "with"), phases, figures, strict=True):
            each = ", ".join(f"{r['ready_s']:.1f}" for r in runs)
            cells = "   ".join(f"{v:>{w}.1f}" for v, w in zip(values, _WIDTHS, strict=True))
            print(f"  {name:<10} {label:<14} {each:<25} {cells}")
        ratios = "   ".join(
            f"{_ratio(after, before):>{w}}"
            for after, before, w in zip(figures[1], figures[0], _WIDTHS, strict=True)
        )
        print(f"  {name:<10} {'with/without':<14} {'':<25} {ratios}")


_WIDTHS = (6, 14, 20, 12)  # the columns of _sync_figures


def _sync_figures(runs: list[JSON]) -> tuple[float, float, float, float]:
    """The median run's ready s, schedext and kube-apiserver CPU s; the highest peak RSS."""
    median = _median_run(runs)
    cpu = median["cpu_s"]
    return (
        median["ready_s"],
        cpu.get("schedext", math.nan),
        cpu.get("kube-apiserver", math.nan),
        max(r["vm_hwm_at_ready_mib"] for r in runs),
    )


def _ratio(after: float, before: float) -> str:
    if not after or not before or math.isnan(after) or math.isnan(before):
        return "-"
    return f"{after / before:.2f}x"


def _cpu_line(cpu: JSON) -> str:
    names = ("schedext", "kube-apiserver", "etcd", "benchmark", "others")
    parts = [f"{n} {cpu[n]:.1f}" for n in names if n in cpu]
    return f"{', '.join(parts)} s in {cpu['wall']:.1f} s wall"


def _print_py_spy(report: JSON) -> None:
    kubeload.print_stacks("the cold sync", report["cold_sync"].get("py_spy"))
    kubeload.print_stacks("the update stream", (report.get("steady") or {}).get("py_spy"))


def _print_profile(path: Path, top: int) -> None:
    if not path.exists():
        print(f"no profile written at {path}", file=sys.stderr)
        return
    stats = pstats.Stats(str(path))
    for key in ("cumulative", "tottime"):
        print(f"\n=== schedext cold sync under cProfile: top {top} by {key} ===")
        stats.sort_stats(key).print_stats(top)


if __name__ == "__main__":
    raise SystemExit(main())
