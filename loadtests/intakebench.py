"""Per pod, in-process: what one pod watch event and one bind cost schedext's CPU, by stage.

No API server and no HTTP: the events are the bytes of watch event lines as kube-apiserver
sends them (bound GPU pods with schedext's annotations, defaults, ``managedFields`` and a
kubelet's status, about 6 KB each), fed to the same code the pod informer runs on them; the
bind runs the core's plan and confirm and builds the Binding's body, without posting it.

Scenarios (each pod once, ``--pods`` pods, medians over them):

- ``bind``: a pod's whole way through schedext, as kube-scheduler drives it: the watch's
  event of the new pending pod, filter of it against every node (the core's ``filter``, as
  the verb calls it; the request's JSON decode is not in it), the bind verb's work on the
  first node filter passed (``plan_bind``, the Binding's body built and encoded,
  ``confirm_bind``), then the two watch events its bind causes: the Binding's update
  (``spec.nodeName`` and the annotations bind wrote), then the kubelet's first status
  (containers creating, host IP: nothing schedext reads);
- ``status``: a running pod's status update (conditions, container statuses, a new
  ``resourceVersion``): nothing schedext reads;
- ``label``: a label schedext does not read changed (``loadtests.sync``'s updates);
- ``request``: a change schedext reads (the pod's GPU ids annotation rewritten as bind
  writes it, same GPUs in another order): the pod's holding is decoded again.

Each event is timed in three stages: ``decode`` (the pod informer's msgspec decode of the
line), ``upsert`` (``Scheduler.upsert_pod``, what the pod sink calls) and ``hooks`` (the core
calls of the service's progress hook). The per-event total is their sum; reading the line off
the socket (about 8 µs, ``loadtests.apiclient``) and the hook's own work in the shell are not
in it. Filter gets the node names packed, as the service's decoder hands them over.

    python -m loadtests.intakebench                        # 1,000 nodes, 2,000 pods
    python -m loadtests.intakebench --baseline ../schedext-before --reps 5
    python -m loadtests.intakebench --profile              # cProfile, top functions per stage

With ``--baseline DIR`` both trees run the same input in their own processes (this file run
as a script with ``PYTHONPATH`` set to each checkout, as ``loadtests.corebench`` is),
alternated rep by rep; each figure is the median over reps of each rep's median.
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import gc
import importlib.util
import io
import pstats
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import orjson

JSON = dict[str, Any]
NAMESPACE = "bench"
SCENARIOS = ("bind", "status", "label", "request")
# Stage names per scenario, in order.
STAGES = {
    "bind": (
        "pending.decode",
        "pending.upsert",
        "pending.hooks",
        "filter",
        "plan_bind",
        "binding_body",
        "confirm_bind",
        "bound.decode",
        "bound.upsert",
        "bound.hooks",
        "kubelet.decode",
        "kubelet.upsert",
        "kubelet.hooks",
    ),
    "status": ("decode", "upsert", "hooks"),
    "label": ("decode", "upsert", "hooks"),
    "request": ("decode", "upsert", "hooks"),
}

# ------------------------------------------------------------------ the input (parent side)


def _fields_v1(value: Any) -> Any:
    """``managedFields[].fieldsV1`` for ``value``, as the API server writes it: every field
    named ``f:<name>``, list items by key."""
    if isinstance(value, dict):
        return {f"f:{k}": _fields_v1(v) for k, v in value.items()}
    if isinstance(value, list):
        out: JSON = {}
        for item in value:
            if isinstance(item, dict) and "name" in item:
                out[f'k:{{"name":"{item["name"]}"}}'] = _fields_v1(item)
        return out or {}
    return {}


def _served(pod: JSON, *, uid: str, version: int) -> JSON:
    """A creatable pod as the API server serves it: its defaults, uid, resourceVersion and
    the kubectl client's managedFields."""
    meta = pod["metadata"]
    meta |= {
        "uid": uid,
        "resourceVersion": str(version),
        "creationTimestamp": "2026-11-28T10:00:00Z",
    }
    spec = pod["spec"]
    for container in spec.get("containers", []) + spec.get("initContainers", []):
        container.setdefault("imagePullPolicy", "IfNotPresent")
        container.setdefault("terminationMessagePath", "/dev/termination-log")
        container.setdefault("terminationMessagePolicy", "File")
    spec |= {
        "restartPolicy": "Always",
        "terminationGracePeriodSeconds": 30,
        "dnsPolicy": "ClusterFirst",
        "serviceAccountName": "default",
        "serviceAccount": "default",
        "securityContext": {},
        "schedulerName": "default-scheduler",
        "priority": 0,
        "enableServiceLinks": True,
        "preemptionPolicy": "PreemptLowerPriority",
    }
    meta["managedFields"] = [
        {
            "manager": "kubectl-create",
            "operation": "Update",
            "apiVersion": "v1",
            "time": "2026-11-28T10:00:00Z",
            "fieldsType": "FieldsV1",
            "fieldsV1": {"f:metadata": _fields_v1(meta), "f:spec": _fields_v1(spec)},
        }
    ]
    return pod


def _pending_status() -> JSON:
    return {"phase": "Pending", "qosClass": "Burstable"}


def _bound_conditions(ts: str) -> list[JSON]:
    return [{"type": "PodScheduled", "status": "True", "lastProbeTime": None,
             "lastTransitionTime": ts}]  # fmt: skip


def _kubelet_status(pod: JSON, *, running: bool, ts: str, restarts: int = 0) -> JSON:
    """What the kubelet writes: containers creating (``running`` False) or running."""
    node = pod["spec"]["nodeName"]
    index = int(node.rsplit("-", 1)[1])
    host = f"10.{index // 250}.{index % 250}.1"
    state: JSON = (
        {"running": {"startedAt": ts}} if running else {"waiting": {"reason": "ContainerCreating"}}
    )

    def status(container: JSON) -> JSON:
        return {
            "name": container["name"],
            "state": state,
            "lastState": {},
            "ready": running,
            "restartCount": restarts,
            "image": container["image"],
            "imageID": f"{container['image']}@sha256:{'ab' * 32}" if running else "",
            "containerID": f"containerd://{'cd' * 32}" if running else "",
            "started": running,
        }

    kinds = ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady")
    flag = "True" if running else "False"
    conditions = [
        {"type": t, "status": flag, "lastProbeTime": None, "lastTransitionTime": ts} for t in kinds
    ]
    return {
        "phase": "Running" if running else "Pending",
        "conditions": conditions + _bound_conditions(ts),
        "hostIP": host,
        "hostIPs": [{"ip": host}],
        "podIP": f"10.244.{index % 250}.{restarts % 250 + 2}" if running else None,
        "podIPs": [{"ip": f"10.244.{index % 250}.2"}] if running else [],
        "startTime": ts,
        "initContainerStatuses": [status(c) for c in pod["spec"].get("initContainers", [])],
        "containerStatuses": [status(c) for c in pod["spec"]["containers"]],
        "qosClass": "Burstable",
    }


def build_input(nodes: int, pods: int, seed: int = 7) -> JSON:
    """Nodes (8 GPUs each), and for each pod: its pending object (as watched before bind) and
    a running, bound one (for the update scenarios), both as the API server serves them."""
    from loadtests import kubeload  # noqa: PLC0415 (the child process imports no loadtests)

    rng = random.Random(seed)
    node_objs = [kubeload.gpu_node(i, rng, eight_gpus=True) for i in range(nodes)]
    for i, node in enumerate(node_objs):
        node["metadata"] |= {"uid": f"node-uid-{i:05d}", "resourceVersion": "1"}
    pending, running = [], []
    for i in range(pods):
        name = f"p-{i:06d}"
        node = node_objs[i % nodes]["metadata"]["name"]
        uid = f"00000000-0000-4000-8000-{i:012d}"
        waiting = _served(
            kubeload.pod_object(name, NAMESPACE, node=None, gpu_ids=(0,)), uid=uid, version=10
        )
        waiting["spec"].pop("nodeName", None)
        waiting["metadata"]["annotations"].pop("schedext.io/gpu-ids", None)
        waiting["status"] = _pending_status()
        pending.append(waiting)
        # A running pod on another pass over the nodes: GPUs 1 and 2 of its node (bind's
        # pods take GPU 0 first).
        bound_uid = f"00000000-0000-4000-9000-{i:012d}"
        held = kubeload.pod_object(f"r-{i:06d}", NAMESPACE, node=node, gpu_ids=(1 + i % 7,))
        held = _served(held, uid=bound_uid, version=20)
        held["status"] = _kubelet_status(held, running=True, ts="2026-11-28T10:00:05Z")
        running.append(held)
    return {"nodes": node_objs, "pending": pending, "running": running}


# ------------------------------------------------------------------ the measurement (child)


def _line(kind: str, obj: JSON) -> bytes:
    return orjson.dumps({"type": kind, "object": obj})


class _Timer:
    def __init__(self, profile: cProfile.Profile | None) -> None:
        self.ns: dict[str, list[int]] = {}
        self._profile = profile
        self.profiles: dict[str, pstats.Stats] = {}
        self._per_stage: dict[str, cProfile.Profile] = {}

    def run(self, stage: str, call: Callable[[], Any]) -> Any:
        profile = self._per_stage.get(stage) if self._profile is not None else None
        if self._profile is not None and profile is None:
            profile = self._per_stage[stage] = cProfile.Profile()
        if profile is not None:
            profile.enable()
        start = time.perf_counter_ns()
        result = call()
        elapsed = time.perf_counter_ns() - start
        if profile is not None:
            profile.disable()
        self.ns.setdefault(stage, []).append(elapsed)
        return result

    def report(self, top: int) -> str:
        out = io.StringIO()
        for stage, profile in self._per_stage.items():
            out.write(f"\n===== {stage}\n")
            stats = pstats.Stats(profile, stream=out)
            stats.sort_stats("cumulative").print_stats(top)
        return out.getvalue()


class _Run:
    """One scenario in the child: a fresh core holding the nodes, and the timer."""

    def __init__(self, data: JSON, profile: bool) -> None:
        # From the tree PYTHONPATH names: this file runs against either checkout.
        from app.kube.binder import _binding  # noqa: PLC0415
        from app.service.cluster import PODS  # noqa: PLC0415
        from extender.packed import PackedNames  # noqa: PLC0415
        from extender.scheduler import Scheduler  # noqa: PLC0415

        self.packed = PackedNames
        self.data, self.decoders, self.binding = data, PODS, _binding
        self.core = Scheduler()
        self.core.replace_nodes(data["nodes"])
        self.timer = _Timer(cProfile.Profile() if profile else None)

    def seen(self, pods: list[JSON]) -> None:
        """The watch has seen ``pods`` (untimed)."""
        for pod in pods:
            self.core.upsert_pod(self.decoders.decode_event(_line("ADDED", pod))["object"])

    def event(self, prefix: str, obj: JSON, kind: str = "MODIFIED") -> None:
        """One watch event of ``obj``, timed by stage."""
        line, run = _line(kind, obj), self.timer.run
        pod = run(f"{prefix}decode", lambda: self.decoders.decode_event(line))["object"]
        run(f"{prefix}upsert", lambda: self.core.upsert_pod(pod))
        run(f"{prefix}hooks", self.hooks)

    def hooks(self) -> None:
        """What the service's progress hook asks the core after every pod event
        (``Service.requeue_waiters``)."""
        self.core.take_capacity_requeues(2.0)
        self.core.take_preemptor_requeues()
        self.core.next_requeue_at()

    def body(self, plan: Any) -> bytes:
        """The Binding's body, as the API binder builds and encodes it."""
        return orjson.dumps(self.binding(plan))

    def bind(self) -> None:
        nodes, core, run = self.data["nodes"], self.core, self.timer.run
        names = [node["metadata"]["name"] for node in nodes]
        # As the filter request's body carries them: the service keeps them packed.
        plain = b",".join(orjson.dumps(name) for name in names)
        ts = "2026-11-28T10:00:01Z"
        for i, pod in enumerate(self.data["pending"]):
            meta = pod["metadata"]
            self.event("pending.", pod, kind="ADDED")
            # kube-scheduler's copy of the pod: what the filter request's body decodes to.
            asked = orjson.loads(orjson.dumps(pod))
            packed = self.packed.parse(plain, 0, len(plain)) or names
            verdict = run("filter", functools.partial(core.filter, asked, packed))
            node = verdict.passed[0] if verdict.passed else names[i % len(names)]
            plan = run(
                "plan_bind",
                functools.partial(
                    core.plan_bind,
                    uid=meta["uid"],
                    namespace=meta["namespace"],
                    name=meta["name"],
                    node=node,
                    now=1.0,
                ),
            )
            run("binding_body", functools.partial(self.body, plan))
            run("confirm_bind", functools.partial(core.confirm_bind, plan, awaiting_watch=True))
            bound = orjson.loads(orjson.dumps(pod))
            bound["metadata"]["resourceVersion"] = str(10_000 + 2 * i)
            bound["metadata"]["annotations"] |= dict(plan.annotations)
            bound["spec"]["nodeName"] = plan.node
            bound["status"]["conditions"] = _bound_conditions(ts)
            self.event("bound.", bound)
            bound["metadata"]["resourceVersion"] = str(10_001 + 2 * i)
            bound["status"] = _kubelet_status(bound, running=False, ts=ts)
            self.event("kubelet.", bound)

    def update(self, scenario: str) -> None:
        self.seen(self.data["running"])
        for i, pod in enumerate(self.data["running"]):
            changed = orjson.loads(orjson.dumps(pod))
            changed["metadata"]["resourceVersion"] = str(50_000 + i)
            if scenario == "status":
                changed["status"] = _kubelet_status(
                    changed, running=True, ts="2026-11-28T10:05:00Z", restarts=1
                )
            elif scenario == "label":
                changed["metadata"]["labels"]["bench-tick"] = f"0-{i}"
            else:  # request: the same GPUs, the annotation written anew ("1," for "1")
                annotations = changed["metadata"]["annotations"]
                annotations["schedext.io/gpu-ids"] = annotations["schedext.io/gpu-ids"] + ","
            self.event("", changed)


def _scenario(data: JSON, scenario: str, profile: bool, top: int) -> tuple[JSON, str]:
    run = _Run(data, profile)
    if scenario == "bind":
        run.bind()
    else:
        run.update(scenario)
    ns = run.timer.ns
    medians = {stage: statistics.median(each) / 1000 for stage, each in ns.items()}
    return medians, run.timer.report(top) if profile else ""


def child(path: str, scenarios: Sequence[str], profile: bool, top: int) -> None:
    import extender  # noqa: PLC0415 (from the tree PYTHONPATH names)

    data = orjson.loads(Path(path).read_bytes())
    result: JSON = {
        "extender": str(Path(extender.__file__).resolve().parent),
        "compiled": importlib.util.find_spec("extender._packed") is not None,
        "scenarios": {},
    }
    reports = []
    for scenario in scenarios:
        gc.collect()
        medians, report = _scenario(data, scenario, profile, top)
        result["scenarios"][scenario] = medians
        if report:
            reports.append(f"\n######## {scenario}{report}")
    if reports:
        sys.stderr.write("".join(reports))
    sys.stdout.write(orjson.dumps(result).decode() + "\n")


# ------------------------------------------------------------------ the parent


def _run(tree: Path, path: str, scenarios: Sequence[str], profile: bool, top: int) -> JSON:
    from loadtests.child import run_child  # noqa: PLC0415 (the parent's: the child has no loadtests)

    args = ["--child", path, "--scenarios", ",".join(scenarios), "--top", str(top)]
    return run_child(__file__, tree, [*args, "--profile"] if profile else args)


def _medians(runs: list[JSON], scenario: str) -> dict[str, float]:
    stages = runs[0]["scenarios"][scenario]
    return {s: statistics.median(r["scenarios"][scenario][s] for r in runs) for s in stages}


def _rows(scenario: str, stages: dict[str, float]) -> Iterator[tuple[str, float]]:
    total = 0.0
    for stage in STAGES[scenario]:
        value = stages.get(stage)
        if value is None:
            continue
        total += value
        yield stage, value
    yield "total", total


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--pods", type=int, default=2000)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    parser.add_argument("--baseline", type=Path, help="another checkout, measured beside")
    parser.add_argument("--profile", action="store_true", help="cProfile each stage (stderr)")
    parser.add_argument("--top", type=int, default=15, help="functions per profiled stage")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    scenarios = [s for s in args.scenarios.split(",") if s]
    unknown = set(scenarios) - set(SCENARIOS)
    if unknown:
        parser.error(f"unknown scenarios: {', '.join(sorted(unknown))}")
    if args.child:
        child(args.child, scenarios, args.profile, args.top)
        return 0
    here = Path(__file__).resolve().parent.parent
    trees = [("this", here)] + ([("baseline", args.baseline.resolve())] if args.baseline else [])
    with tempfile.TemporaryDirectory() as scratch:
        path = str(Path(scratch) / "input.json")
        Path(path).write_bytes(orjson.dumps(build_input(args.nodes, args.pods)))
        runs: dict[str, list[JSON]] = {label: [] for label, _ in trees}
        reps = 1 if args.profile else args.reps
        for rep in range(reps):
            for label, tree in trees if rep % 2 == 0 else trees[::-1]:
                runs[label].append(_run(tree, path, scenarios, args.profile, args.top))
    print(f"{args.nodes} nodes, {args.pods} pods per scenario, {reps} reps; µs per event "
          "or bind, median over pods, then over reps")  # fmt: skip
    for label, tree in trees:
        first = runs[label][0]
        print(f"  {label}: {tree} (compiled core: {first['compiled']})")
    for scenario in scenarios:
        print(f"\n{scenario}")
        this = dict(_rows(scenario, _medians(runs["this"], scenario)))
        base = dict(_rows(scenario, _medians(runs["baseline"], scenario))) if args.baseline else {}
        header = f"  {'stage':<16}{'this':>10}{'share':>8}"
        if base:
            header += f"{'baseline':>10}{'share':>8}{'this/base':>11}"
        print(header)
        for stage, value in this.items():
            row = f"  {stage:<16}{value:>10.1f}{value / this['total']:>8.0%}"
            if base and stage in base:
                b = base[stage]
                ratio = f"{value / b:.2f}" if b else "-"
                row += f"{b:>10.1f}{b / base['total']:>8.0%}{ratio:>11}"
            print(row)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
