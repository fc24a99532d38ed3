"""Prometheus metrics: latency per verb, decisions by outcome, and inventory gauges read at
scrape time (so the hot path pays nothing for them)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from app.kube.readiness import Readiness
from app.service.gang_holds import HoldMetrics
from extender import names
from extender.dra import Ownership
from extender.quotas import Kind
from extender.scheduler import Scheduler

__all__ = ["CONTENT_TYPE", "Metrics"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
VERBS = ("filter", "prioritize", "preempt", "bind")
# Filter and prioritize sit on kube-scheduler's serial path: resolve sub-millisecond times.
# The top buckets reach past kube-scheduler's httpTimeout for the extender (30 s in
# manifests/scheduler-config.yaml): bind waits at a gang's barrier for up to gang.max_wait_s,
# and a quantile over that budget (the alert in manifests/monitoring/) must be resolvable.
_BUCKETS = (
    0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
    10.0, 30.0, 60.0,
)  # fmt: skip
# A verb request's way through the server (see Metrics.stages): tens of microseconds matter.
STAGES = ("body", "queue", "handler", "total")
_STAGE_BUCKETS = (
    0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005,
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.1, 1.0, 10.0,
)  # fmt: skip


class Metrics:
    def __init__(
        self, scheduler: Callable[[], Scheduler | None], readiness: Readiness | None = None
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._latency = Histogram(
            "schedext_request_duration_seconds",
            "Time to answer an extender verb, from body read to encoded answer.",
            ["verb"],
            buckets=_BUCKETS,
            registry=self.registry,
        )
        self._stages = Histogram(
            "schedext_request_stage_seconds",
            "A verb request's way through the server, from the event loop's first read of it: "
            "body (until its last byte is read), queue (from there until its handler starts: "
            "the hop to the handler and whatever else the event loop runs first), handler "
            "(until the answer is handed to the socket) and total (first read to answer).",
            ["verb", "stage"],
            buckets=_STAGE_BUCKETS,
            registry=self.registry,
        )
        self._decisions = Counter(
            "schedext_decisions_total",
            "Extender verb answers by outcome.",
            ["verb", "outcome"],
            registry=self.registry,
        )
        self._request_modes = Counter(
            "schedext_requests_by_mode_total",
            "Filter/prioritize requests by nodeCacheCapable mode: names or full node objects.",
            ["verb", "mode"],
            registry=self.registry,
        )
        self._filtered_nodes = Counter(
            "schedext_filter_nodes_total",
            "Nodes judged by filter: fits, busy (preemption may help) or unresolvable.",
            ["outcome"],
            registry=self.registry,
        )
        self._gang_events = Counter(
            "schedext_gang_events_total",
            "Gang barrier outcomes: complete, released (lost to an older group or cannot "
            "complete) and timed_out; quorum: members turned away for missing ones were sent "
            "back to kube-scheduler once the group had them.",
            ["outcome"],
            registry=self.registry,
        )
        self._choices = Counter(
            "schedext_placement_choice_total",
            "Pods bound, by how kube-scheduler's choice of node compares with schedext's "
            "rating of the nodes it offered (prioritize, or filter's shortlist): best, lower, "
            "or unscored (no rating applied, e.g. after a restart).",
            ["choice"],
            registry=self.registry,
        )
        self._rejections = Counter(
            "schedext_filter_rejections_total",
            "Nodes rejected by filter, by reason.",
            ["reason"],
            registry=self.registry,
        )
        self._watch_restarts = Counter(
            "schedext_watch_restarts_total",
            "Watches restarted: resumed after a break, or relisted after 410 Gone or an error.",
            ["resource", "cause"],
            registry=self.registry,
        )
        self._victim_waits = Counter(
            "schedext_victim_waits_total",
            "Filter calls that waited for the watch to show victims kube-scheduler had already "
            "seen go, by outcome: gone (the watch caught up) or timeout.",
            ["outcome"],
            registry=self.registry,
        )
        self._victim_waiting = Gauge(
            "schedext_victim_waits_in_progress",
            "Filter calls waiting now for the watch to show victims gone.",
            registry=self.registry,
        )
        self._requeues = Counter(
            "schedext_requeues_total",
            "Pods sent back to kube-scheduler (the schedext.io/requeued-at nudge), by what they "
            "waited for: gpu, share, mig (a resource kind's name), address or quota once "
            "schedext's watch saw it freed, "
            "gang (a gang member, once its group had its members), preemptor (once its victims "
            "were seen gone).",
            ["kind"],
            registry=self.registry,
        )
        self._dra_problems = Gauge(
            "schedext_dra_problems",
            "What DRA's claims ledger could not read, refused, or cannot count (a held device "
            "that maps to no GPU on a node whose GPUs schedext counts), by kind of object; "
            "each is logged and a Warning event on the object (docs/dra.md).",
            ["kind"],
            registry=self.registry,
        )
        self._watch_progress: dict[str, float] = {}
        # Label children resolved once: .labels() costs a lock and a dict lookup per call.
        self._verb_latency = {verb: self._latency.labels(verb) for verb in VERBS}
        self._verb_stages = {
            verb: tuple(self._stages.labels(verb, stage) for stage in STAGES) for verb in VERBS
        }
        self._node_outcomes = {
            outcome: self._filtered_nodes.labels(outcome)
            for outcome in ("fits", "busy", "unresolvable")
        }
        # The same for the other labels of the verbs' path, as they first appear (their
        # values come from closed sets: verbs, outcomes, reasons).
        self._decision_counts = _Children(self._decisions)
        self._mode_counts = _Children(self._request_modes)
        self._rejection_counts = _Children(self._rejections)
        self.holds = HoldMetrics(self.registry, scheduler)
        self.registry.register(_InventoryCollector(scheduler))
        self.registry.register(_WatchCollector(self._watch_progress))
        if readiness is not None:
            self.registry.register(_ReadinessCollector(readiness))

    def observe(self, verb: str, outcome: str, seconds: float) -> None:
        self._verb_latency[verb].observe(seconds)
        self._decision_counts.get(verb, outcome).inc()

    def stages(
        self, verb: str, *, read: float, body_read: float, handling: float, written: float
    ) -> None:
        """One request's stages (``schedext_request_stage_seconds``), from the
        ``perf_counter`` times of its first read, its last body byte read, its handler's start
        and its answer handed to the socket."""
        body, queue, handler, total = self._verb_stages[verb]
        body.observe(body_read - read)
        queue.observe(handling - body_read)
        handler.observe(written - handling)
        total.observe(written - read)

    def mode(self, verb: str, *, names_only: bool) -> None:
        self._mode_counts.get(verb, "names" if names_only else "nodes").inc()

    def filtered(self, *, fits: int, busy: int, unresolvable: int) -> None:
        if fits:
            self._node_outcomes["fits"].inc(fits)
        if busy:
            self._node_outcomes["busy"].inc(busy)
        if unresolvable:
            self._node_outcomes["unresolvable"].inc(unresolvable)

    def placed(self, choice: str) -> None:
        self._choices.labels(choice).inc()

    def rejected(self, reason: str, nodes: int) -> None:
        self._rejection_counts.get(reason).inc(nodes)

    def watch_progress(self, resource: str) -> None:
        self._watch_progress[resource] = time.monotonic()

    def watch_restart(self, resource: str, cause: str) -> None:
        self._watch_restarts.labels(resource, cause).inc()

    def gang_event(self, outcome: str) -> None:
        self._gang_events.labels(outcome).inc()

    def requeued(self, kind: str, count: int) -> None:
        """``count`` pods sent back to kube-scheduler, having waited for ``kind``."""
        self._requeues.labels(kind).inc(count)

    def dra_problems(self, by_kind: Mapping[str, int]) -> None:
        """The DRA problems found by the last pass (app.service.dra_problems), by kind."""
        for kind, count in by_kind.items():
            self._dra_problems.labels(kind).set(count)

    def victim_wait_started(self) -> None:
        self._victim_waiting.inc()

    def victim_wait_ended(self, outcome: str) -> None:
        self._victim_waiting.dec()
        self._victim_waits.labels(outcome).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _Children:
    """A counter's label children, each resolved by ``.labels()`` once, on first use."""

    def __init__(self, counter: Counter) -> None:
        self._counter = counter
        self._children: dict[tuple[str, ...], Counter] = {}

    def get(self, *labels: str) -> Counter:
        child = self._children.get(labels)
        if child is None:
            child = self._children[labels] = self._counter.labels(*labels)
        return child


def _owners(owners: Mapping[str, Ownership]) -> GaugeMetricFamily:
    family = GaugeMetricFamily(
        "schedext_nodes_by_gpu_owner",
        "Nodes whose GPUs a DRA driver offers, by who owns them: dra (DRA alone) or mixed "
        "(the device plugin too: refused to schedext's GPU pods unless dra.fence is on).",
        labels=["owner"],
    )
    for owner in (Ownership.DRA, Ownership.MIXED):
        family.add_metric([owner.value], sum(1 for o in owners.values() if o is owner))
    return family


def _unreadable(problems: Mapping[str, tuple[str, ...]]) -> GaugeMetricFamily:
    unreadable = GaugeMetricFamily(
        "schedext_node_annotations_unreadable",
        "Nodes whose agent annotation was not read (malformed or a newer version), by "
        "annotation; such a node is used without it.",
        labels=["annotation"],
    )
    for annotation in (names.GPU_TOPOLOGY, names.GPU_USE, names.GPU_DRIFT):
        count = sum(
            1 for why in problems.values() if any(p.startswith(annotation + ":") for p in why)
        )
        unreadable.add_metric([annotation], count)
    return unreadable


def _intake_metrics(scheduler: Scheduler) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
    """The pending pods, and what the pod intake skips."""
    pending = GaugeMetricFamily(
        "schedext_pending_pods", "Pending pods remembered between filter and bind."
    )
    pending.add_metric([], scheduler.pending_count)
    yield pending
    skipped = CounterMetricFamily(
        "schedext_pod_events_skipped",
        "Pod watch events the intake skipped: they changed nothing schedext reads (a status "
        "update, a label it does not read).",
    )
    skipped.add_metric([], scheduler.pod_events_skipped)
    yield skipped
    marks = GaugeMetricFamily(
        "schedext_pod_marks",
        "Bound pods the intake keeps a digest of, to skip their events that change nothing "
        "(one small entry each; cleared on every relist).",
    )
    marks.add_metric([], scheduler.pod_marks)
    yield marks


class _InventoryCollector(Collector):
    def __init__(self, scheduler: Callable[[], Scheduler | None]) -> None:
        self._scheduler = scheduler

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        scheduler = self._scheduler()
        if scheduler is None:
            return
        inventory = scheduler.inventory
        a = inventory.arrays
        alive = a.alive
        nodes = GaugeMetricFamily("schedext_inventory_nodes", "Nodes in the inventory.")
        nodes.add_metric([], int(alive.sum()))
        yield nodes
        total = GaugeMetricFamily(
            "schedext_inventory_gpus", "GPUs in the inventory, by model.", labels=["model"]
        )
        free = GaugeMetricFamily(
            "schedext_inventory_gpus_free", "Free GPUs, by model.", labels=["model"]
        )
        unhealthy = GaugeMetricFamily(
            "schedext_inventory_gpus_unhealthy",
            "GPUs the node agents marked unhealthy (never handed out), by model.",
            labels=["model"],
        )
        outside = GaugeMetricFamily(
            "schedext_inventory_gpus_in_use_outside",
            "GPUs the node agents report in use by containers schedext did not place (the "
            "kubelet's PodResources; held, never handed out), by model.",
            labels=["model"],
        )
        share_memory = GaugeMetricFamily(
            "schedext_gpu_share_memory_mib",
            "GPU memory (MiB) by model: held by GPU shares, and free for a share on the "
            "devices that take shares (healthy and not held whole, empty ones included).",
            labels=["model", "state"],
        )
        shared = GaugeMetricFamily(
            "schedext_gpu_shared_devices",
            "GPUs that pods hold shares of, by model.",
            labels=["model"],
        )
        # Per node, the memory a share still has on its devices: NO_ROOM (-1) where a device
        # takes none, and a device shares over-commit has none either.
        share_free = np.clip(inventory.devices.memory_free, 0, None).sum(axis=1)
        for model_id in np.unique(a.model[alive & (a.gpu_total > 0)]).tolist():
            on_model = alive & (a.model == model_id)
            label = inventory.model_name(model_id) or "unknown"
            total.add_metric([label], int(a.gpu_total[on_model].sum()))
            free.add_metric([label], int(a.gpu_free[on_model].sum()))
            bad = a.gpu_total[on_model] - a.gpu_healthy[on_model]
            unhealthy.add_metric([label], int(bad.sum()))
            outside.add_metric([label], int(a.gpu_in_use[on_model].sum()))
            share_memory.add_metric([label, "held"], int(a.share_memory_held[on_model].sum()))
            share_memory.add_metric([label, "free"], int(share_free[on_model].sum()))
            shared.add_metric([label], int(a.share_devices[on_model].sum()))
        yield total
        yield free
        yield unhealthy
        yield outside
        yield share_memory
        yield shared
        yield _unreadable(inventory.problems)
        yield _owners(scheduler.dra_owners())
        yield from _intake_metrics(scheduler)
        reserved = GaugeMetricFamily(
            "schedext_reservations", "GPU reservations of binds not yet seen bound."
        )
        reserved.add_metric([], scheduler.reservation_count)
        yield reserved
        waiting = GaugeMetricFamily(
            "schedext_gangs_waiting", "PodGroups whose members wait at the bind barrier."
        )
        waiting.add_metric([], len(scheduler.waiting_groups()))
        yield waiting
        book = inventory.addresses
        addresses = GaugeMetricFamily(
            "schedext_ip_pool_addresses", "Addresses of each IPPool.", labels=["pool"]
        )
        free_addresses = GaugeMetricFamily(
            "schedext_ip_pool_free", "Free addresses of each IPPool.", labels=["pool"]
        )
        for pool in book.pools():
            addresses.add_metric([pool.name], pool.size)
            free_addresses.add_metric([pool.name], book.free_count(pool))
        yield addresses
        yield free_addresses
        yield from _quota_gauges(scheduler)


def _quota_gauges(scheduler: Scheduler) -> Iterator[GaugeMetricFamily]:
    """Per team quota that applies and resource it names: used, min and max (max only where
    there is one), in the resource's unit (CPUs, bytes, GPUs; GPU share memory in MiB)."""
    labels = ["namespace", "name", "resource"]
    used = GaugeMetricFamily(
        "schedext_quota_used", "What a team quota's namespace uses of a resource.", labels=labels
    )
    low = GaugeMetricFamily(
        "schedext_quota_min", "A team quota's guarantee (min) of a resource.", labels=labels
    )
    high = GaugeMetricFamily(
        "schedext_quota_max", "A team quota's ceiling (max) of a resource.", labels=labels
    )
    for spec in scheduler.quotas():
        use = scheduler.namespace_use(spec.namespace)
        for limit in spec.limits:
            key = [spec.namespace, spec.name, limit.resource]
            scale = 1000 if limit.kind is Kind.CPU else 1  # milli-CPU
            used.add_metric(key, use[limit.kind] / scale)
            low.add_metric(key, limit.min / scale)
            if limit.max is not None:
                high.add_metric(key, limit.max / scale)
    yield used
    yield low
    yield high


class _ReadinessCollector(Collector):
    """Whether this replica's inventory is synced, and whether it answers the verbs as the
    leader: with leader election, exactly one replica should say 1."""

    def __init__(self, readiness: Readiness) -> None:
        self._readiness = readiness

    def collect(self) -> Iterator[GaugeMetricFamily]:
        synced = GaugeMetricFamily(
            "schedext_inventory_synced",
            "1 once every informer has listed once (verbs are refused until then), else 0.",
        )
        synced.add_metric([], 1 if self._readiness.synced else 0)
        yield synced
        leader = GaugeMetricFamily(
            "schedext_leader",
            "1 where this replica may answer the verbs (the leader, or the one replica without "
            "leader election), 0 on a standby.",
        )
        leader.add_metric([], 1 if self._readiness.leading else 0)
        yield leader


class _WatchCollector(Collector):
    """Seconds since each watch last delivered an event or bookmark: the informer lag bound
    (bookmarks arrive about once a minute even on a quiet resource)."""

    def __init__(self, progress: dict[str, float]) -> None:
        self._progress = progress

    def collect(self) -> Iterator[GaugeMetricFamily]:
        age = GaugeMetricFamily(
            "schedext_watch_last_event_age_seconds",
            "Seconds since the watch of each resource last delivered an event or bookmark.",
            labels=["resource"],
        )
        now = time.monotonic()
        for resource, at in sorted(self._progress.items()):
            age.add_metric([resource], now - at)
        yield age
