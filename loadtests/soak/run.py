"""One soak run: the stream of work and the faults against the rig, the checker on every tick,
then a drain, a last strict check, and a teardown that must leave nothing behind.

Three threads, each bounded by the run's own clock:

* the main loop, every ``tick_s``: read the API server (``loadtests.soak.reading``), judge it
  (``loadtests.soak.checker``; the stable leader's ``/inventory`` too), then make and delete
  the units that are due (``loadtests.soak.workload``);
* the faults, at the seeded times (``loadtests.soak.faults``), performed by the rig;
* the watch on the replicas: which one answers the verbs, every ``LEADER_POLL_S``, and their
  memory.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from loadtests.soak.checker import Checker, Limits, Snapshot, Violation
from loadtests.soak.faults import Fault, FaultKind, schedule
from loadtests.soak.reading import read
from loadtests.soak.rig import Layout, Replica, Rig
from loadtests.soak.workload import SOAK_LABEL, Unit, UnitKind, Workload
from testbed.kubeapi import ApiError, KubeApi

__all__ = ["Options", "Outcome", "soak"]

JSON = dict[str, Any]
LEADER_POLL_S = 0.2
RSS_EVERY_S = 5.0
EVENTS_EVERY_S = 30.0
STABLE_S = 15.0  # the leader unchanged, and no fault for this long: its inventory is judged
SETTLED_S = 15.0  # the drain ends once no pod was bound for this long
TEARDOWN_S = 90.0
PODGROUPS = "/apis/scheduling.x-k8s.io/v1alpha1/namespaces/{ns}/podgroups"
STATEFULSETS = "/apis/apps/v1/namespaces/{ns}/statefulsets"
API_ERRORS = (httpx.HTTPError, ApiError)


@dataclass(frozen=True)
class Options:
    seed: int = 1
    duration_s: float = 150.0
    rate: float = 1.5  # units per second (a unit is 1.6 pods on average with the default mix)
    fault_interval_s: float = 12.0
    faults: tuple[FaultKind, ...] = tuple(FaultKind)
    workload: Workload | None = None  # None: the default mix with ``seed``
    layout: Layout = field(default_factory=Layout)
    pending_timeout_s: float = 45.0  # a unit not placed by then is deleted
    drain_s: float = 120.0
    tick_s: float = 0.5
    plant: bool = False  # replicas without the gpu-ids guard (the checker's own test)
    limits: Limits = field(default_factory=Limits)


@dataclass
class Outcome:
    """What a run saw: the figures (``loadtests.soak.figures``) are made from this."""

    options: Options
    started: float = 0.0  # monotonic
    ended: float = 0.0
    created: int = 0
    units: dict[UnitKind, int] = field(default_factory=dict)
    bound: int = 0
    deleted: int = 0  # by the stream
    preempted: int = 0  # gone without the stream deleting them: kube-scheduler's victims
    create_errors: int = 0
    api_errors: int = 0  # ticks the API server did not answer
    crashes: int = 0  # replicas or kube-scheduler found dead without a fault, started again
    binds: list[float] = field(default_factory=list)  # monotonic time each bind was seen
    faults: list[Fault] = field(default_factory=list)
    violations: list[tuple[float, Violation]] = field(default_factory=list)
    leaders: list[tuple[float, str | None]] = field(default_factory=list)  # changes
    watch_gone: float = 0.0  # watches listed again after 410 Gone, by both replicas
    rss: dict[str, list[tuple[float, int, int]]] = field(default_factory=dict)
    inventory_checks: int = 0
    phases: dict[str, float] = field(default_factory=dict)


class _Stream:
    """Makes and deletes the units of a :class:`Workload` through the API."""

    def __init__(self, api: KubeApi, outcome: Outcome, options: Options) -> None:
        self.api, self.outcome, self.options = api, outcome, options
        self.workload = options.workload or Workload(options.seed)
        self.units: dict[str, Unit] = {}
        self.doomed: dict[str, Unit] = {}  # being deleted (retried while the API is away)
        self.deleting: set[str] = set()  # pod keys the stream deleted
        self._owed = 0.0

    def arrive(self, elapsed_s: float) -> None:
        """Create the units due by ``elapsed_s`` at ``rate`` (a backlog is capped at 5, so
        an API outage does not end in a burst)."""
        self._owed = min(self._owed + elapsed_s * self.options.rate, 5.0)
        while self._owed >= 1.0:
            self._owed -= 1.0
            unit = self.workload.next_unit()
            unit.created_at = time.monotonic()
            self.units[unit.name] = unit
            self.outcome.units[unit.kind] = self.outcome.units.get(unit.kind, 0) + 1
            try:
                self._create(unit)
            except API_ERRORS:
                self.outcome.create_errors += 1
                self._doom(unit)

    def _create(self, unit: Unit) -> None:
        ns = unit.namespace
        if unit.group is not None:
            self.api.apply_raw("POST", PODGROUPS.format(ns=ns), unit.group)
        if unit.statefulset is not None:
            made = self.api.apply_raw("POST", STATEFULSETS.format(ns=ns), unit.statefulset)
            owner = {
                "apiVersion": "apps/v1",
                "kind": "StatefulSet",
                "name": unit.name,
                "uid": made["metadata"]["uid"],
                "controller": True,
            }
            for pod in unit.pods:
                pod["metadata"]["ownerReferences"] = [owner]
        for pod in unit.pods:
            self._create_pod(unit, pod)

    def _create_pod(self, unit: Unit, pod: JSON) -> None:
        made = self.api.create_pod(unit.namespace, pod)
        unit.uids[pod["metadata"]["name"]] = made["metadata"]["uid"]
        self.outcome.created += 1

    def follow(self, live: list[Mapping[str, Any]], now: float, *, act: bool = True) -> None:
        """Note which units are placed, and (``act``) delete or restart what is due."""
        bound: dict[str, set[str]] = {}
        for pod in live:
            meta = pod["metadata"]
            unit_name = (meta.get("labels") or {}).get("schedext.io/soak-unit", "")
            if pod.get("spec", {}).get("nodeName"):
                bound.setdefault(unit_name, set()).add(meta["name"])
        for unit in list(self.units.values()):
            placed = bound.get(unit.name, set()) >= set(unit.pod_names)
            if unit.bound_at is None and placed:
                unit.bound_at = now
            if not act:
                continue
            if unit.bound_at is not None:
                if now >= unit.bound_at + unit.lifetime_s:
                    self._doom(unit)
                elif unit.restart_due(now) and placed:
                    self._restart(unit)
            elif now - unit.created_at > self.options.pending_timeout_s:
                self._doom(unit)
        for unit in list(self.doomed.values()) if act else ():
            self._delete(unit)

    def _restart(self, unit: Unit) -> None:
        """Delete one sticky pod and make it again at once, as a rollout does."""
        pod = unit.pods[unit.restarted % len(unit.pods)]
        unit.restarted += 1
        name = pod["metadata"]["name"]
        try:
            self.api.delete_pod(unit.namespace, name)
            self.deleting.add(f"{unit.namespace}/{name}")
            self.outcome.deleted += 1
            self._create_pod(unit, pod)
        except API_ERRORS:
            self._doom(unit)

    def _doom(self, unit: Unit) -> None:
        self.units.pop(unit.name, None)
        self.doomed[unit.name] = unit

    def _delete(self, unit: Unit) -> None:
        ns = unit.namespace
        try:
            for name in unit.pod_names:
                self.deleting.add(f"{ns}/{name}")
                self.api.delete_pod(ns, name)
            if unit.group is not None:
                self._delete_object(f"{PODGROUPS.format(ns=ns)}/{unit.name}")
            if unit.statefulset is not None:
                self._delete_object(f"{STATEFULSETS.format(ns=ns)}/{unit.name}")
        except API_ERRORS:
            return  # tried again next tick
        self.outcome.deleted += len(unit.uids)
        del self.doomed[unit.name]

    def _delete_object(self, path: str) -> None:
        try:
            self.api.apply_raw("DELETE", path)
        except ApiError as error:
            if error.status != 404:
                raise

    def doom_all(self) -> None:
        for unit in list(self.units.values()):
            self._doom(unit)


class _Watch:
    """Which replica answers the verbs, every ``LEADER_POLL_S``, and their RSS."""

    def __init__(self, rig: Rig, outcome: Outcome) -> None:
        self.rig, self.outcome = rig, outcome
        self.current: str | None = None
        self.since = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="soak-watch", daemon=True)

    def __enter__(self) -> _Watch:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        last_rss = 0.0
        while not self._stop.is_set():
            leader = self.rig.leader()
            name = leader.name if leader is not None else None
            now = time.monotonic()
            if name != self.current:
                self.current, self.since = name, now
                self.outcome.leaders.append((now, name))
            if now - last_rss >= RSS_EVERY_S:
                self.rig.sample()
                self.outcome.crashes += self.rig.restart_dead()
                last_rss = now
            self._stop.wait(LEADER_POLL_S)

    def stable(self, now: float, quiet_since: float) -> Replica | None:
        """The leader, if it has led for ``STABLE_S`` and no fault came in that time."""
        if self.current is None or now - max(self.since, quiet_since) < STABLE_S:
            return None
        return next(r for r in self.rig.replicas if r.name == self.current)


class _Faults:
    """The seeded faults, each performed by the rig at its time, on a thread of its own."""

    def __init__(self, rig: Rig, outcome: Outcome, started: float) -> None:
        options = outcome.options
        self.plan = schedule(
            options.seed,
            options.faults,
            interval_s=options.fault_interval_s,
            duration_s=options.duration_s,
        )
        self.rig, self.outcome, self.started = rig, outcome, started
        self.busy_since: float | None = None  # a fault under way
        self.quiet_since = started  # the end of the last fault
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="soak-faults", daemon=True)

    def __enter__(self) -> _Faults:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=120)

    def _run(self) -> None:
        for at, kind in self.plan:
            if self._stop.wait(max(0.0, self.started + at - time.monotonic())):
                return
            begun = time.monotonic()
            self.busy_since = begun
            try:
                detail = self.rig.inject(kind)
            except Exception as error:  # noqa: BLE001 - a fault that failed is reported
                detail = f"failed: {type(error).__name__}: {error}"
            ended = time.monotonic()
            self.outcome.faults.append(Fault(kind, begun, ended, detail))
            self.busy_since, self.quiet_since = None, ended
            print(f"  {begun - self.started:7.1f}s fault {kind.value}: {detail}", flush=True)

    def preceding(self, at: float) -> Fault | None:
        before = [fault for fault in self.outcome.faults if fault.at <= at]
        return before[-1] if before else None


def soak(options: Options, work_dir: Path, *, log: Callable[[str], None] = print) -> Outcome:
    """Run one soak; the outcome holds every figure and violation."""
    outcome = Outcome(options)
    with Rig(work_dir, options.layout, seed=options.seed, plant=options.plant) as rig:
        assert rig.cp is not None
        api = KubeApi(rig.cp.server, rig.cp.token, rig.cp.ca_cert, timeout=15)
        try:
            _Soak(rig, api, outcome, log).run()
        finally:
            api.close()
            outcome.rss = {r.name: list(r.rss) for r in rig.replicas}
    return outcome


class _Soak:
    """The phases of one run: the stream under faults, the drain, the teardown."""

    def __init__(
        self, rig: Rig, api: KubeApi, outcome: Outcome, log: Callable[[str], None]
    ) -> None:
        self.rig, self.api, self.outcome, self.log = rig, api, outcome, log
        self.options = outcome.options
        self.stream = _Stream(api, outcome, self.options)
        self.checker = Checker(self.options.limits)
        self.seen_bound: set[str] = set()
        self.known: dict[str, str] = {}  # uid -> pod key, of every live pod last seen
        self.watch = _Watch(rig, outcome)
        self.faults = _Faults(rig, outcome, 0.0)
        self.acting = True  # the stream deletes and restarts what is due

    def run(self) -> None:
        outcome = self.outcome
        outcome.started = time.monotonic()
        self.faults = _Faults(self.rig, outcome, outcome.started)
        with self.watch, self.faults:
            self._stream_phase()
        outcome.phases["stream"] = time.monotonic() - outcome.started
        # The faults are over (their thread joined): the stream drains and settles.
        drain_start = time.monotonic()
        self.watch = _Watch(self.rig, outcome)
        with self.watch:
            self._drain_phase(drain_start)
            outcome.phases["drain"] = time.monotonic() - drain_start
            self.rig.sample()
            outcome.watch_gone = sum(r.gone for r in self.rig.replicas)
            self.log("  teardown: deleting every unit; nothing may be left behind")
            teardown = time.monotonic()
            _teardown(self.rig, self.api, self.stream, outcome, self.log)
            outcome.phases["teardown"] = time.monotonic() - teardown
        outcome.ended = time.monotonic()

    def _stream_phase(self) -> None:
        options = self.options
        started = self.outcome.started
        deadline = started + options.duration_s
        last, last_events = started, started
        while (now := time.monotonic()) < deadline:
            self.stream.arrive(now - last)
            last = now
            events = now - last_events >= EVENTS_EVERY_S
            if self.tick(events=events) and events:
                last_events = now
            time.sleep(max(0.0, options.tick_s - (time.monotonic() - now)))

    def _drain_phase(self, drain_start: float) -> None:
        """No more units, faults or deletions: wait until no pod has been bound for
        ``SETTLED_S``, give the leader time to be stable and the inventory to agree, then
        judge strictly, with the events. Units still waiting stay: each must end bound or
        pending with a reason."""
        self.log(f"  drain: {len(self.stream.units)} units live, waiting for binds to settle")
        self.faults.quiet_since, self.faults.busy_since = drain_start, None
        self.acting = False
        while time.monotonic() - drain_start < self.options.drain_s:
            self.tick()
            last_bind = self.outcome.binds[-1] if self.outcome.binds else drain_start
            if time.monotonic() - max(last_bind, drain_start) >= SETTLED_S:
                break
            time.sleep(self.options.tick_s)
        end = time.monotonic() + STABLE_S + self.options.limits.inventory_grace_s
        while time.monotonic() < end:
            self.tick()
            time.sleep(1.0)
        for _ in range(60):
            if self.tick(events=True, strict=True):
                break
            time.sleep(1.0)

    def tick(self, *, events: bool = False, strict: bool = False) -> bool:
        """One reading and judgement; False when the API server did not answer."""
        outcome = self.outcome
        try:
            snapshot, live = read(self.api, events=events)
        except API_ERRORS:
            outcome.api_errors += 1
            return False
        now = time.monotonic()
        _note_binds(snapshot, self.seen_bound, outcome, now)
        _note_departures(snapshot, self.known, self.stream.deleting, outcome)
        quiet = self.faults.quiet_since if self.faults.busy_since is None else now
        leader = self.watch.stable(now, quiet)
        body = self.rig.inventory(leader) if leader is not None else None
        outcome.inventory_checks += body is not None
        for violation in self.checker.check(snapshot, body, strict=strict):
            outcome.violations.append((now, violation))
            fault = self.faults.preceding(now)
            after = ""
            if fault is not None:
                after = f" (after {fault.kind.value} at {fault.at - outcome.started:.0f} s)"
            self.log(f"  {now - outcome.started:7.1f}s VIOLATION {violation}{after}")
        self.stream.follow(live, now, act=self.acting)
        return True


def _note_binds(snapshot: Snapshot, seen: set[str], outcome: Outcome, now: float) -> None:
    for pod in snapshot.pods:
        if pod.node and pod.uid not in seen:
            seen.add(pod.uid)
            outcome.bound += 1
            outcome.binds.append(now)


def _note_departures(
    snapshot: Snapshot, known: dict[str, str], deleting: set[str], outcome: Outcome
) -> None:
    """Pods gone that the stream did not delete: kube-scheduler's preemption victims."""
    live = {pod.uid: pod.key for pod in snapshot.pods}
    for uid, key in known.items():
        if uid not in live and key not in deleting:
            outcome.preempted += 1
    known.clear()
    known.update(live)
    deleting.clear()


def _teardown(
    rig: Rig, api: KubeApi, stream: _Stream, outcome: Outcome, log: Callable[[str], None]
) -> None:
    """Delete every unit, then wait for the API server and schedext to hold nothing: no
    pod, no IPClaim, and no GPU, share, address or reservation in the leader's inventory."""
    stream.doom_all()
    deadline = time.monotonic() + TEARDOWN_S
    left: list[str] = ["not judged yet"]
    while time.monotonic() < deadline:
        with contextlib.suppress(*API_ERRORS):
            stream.follow([], time.monotonic())
            left = _leftovers(rig, api)
            if not left and not stream.doomed:
                return
        time.sleep(1.0)
    for what in left:
        violation = Violation(
            "left-behind", "-", what, f"still there {TEARDOWN_S:.0f} s after every unit was deleted"
        )
        outcome.violations.append((time.monotonic(), violation))
        log(f"  VIOLATION {violation}")


def _leftovers(rig: Rig, api: KubeApi) -> list[str]:
    left = []
    pods = api.apply_raw("GET", "/api/v1/pods", params={"labelSelector": f"{SOAK_LABEL}=1"})
    left += [f"pod {p['metadata']['namespace']}/{p['metadata']['name']}" for p in pods["items"]]
    claims = api.apply_raw("GET", "/apis/schedext.io/v1alpha1/ipclaims")["items"]
    left += [f"IPClaim {c['metadata']['name']}" for c in claims]
    leader = rig.leader()
    body = rig.inventory(leader) if leader is not None else None
    if body is None:
        return [*left, "no leader's inventory to read"]
    for node in body.get("nodes", ()):
        for gpu in node.get("gpus", ()):
            if gpu.get("holder") or gpu.get("share"):
                left.append(f"{node['name']}/gpu{gpu['index']} held in schedext's inventory")
    for pool in body.get("pools", ()):
        left += [f"address {h['address']} held in schedext's inventory" for h in pool["holders"]]
    if body.get("reservations"):
        left.append(f"{body['reservations']} reservations in schedext's inventory")
    return left
