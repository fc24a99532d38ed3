"""The figures a soak prints as its result, made from its :class:`~loadtests.soak.run.Outcome`.

:func:`figures` is pure (a dict, also written as JSON with ``--json``); :func:`render` turns it
into the text the command prints.
"""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import dataclass
from typing import Any

from loadtests.kubeload import percentile
from loadtests.soak.faults import FaultKind
from loadtests.soak.run import Outcome

__all__ = ["RSS_BOUND_MIB", "RSS_BOUND_RATIO", "figures", "render"]

# The bound on memory growth: a replica's RSS at its end is at most this much above its RSS
# once synced (whichever of the two is larger), over any stretch it lived. schedext's books
# are bounded; what remains is the allocator's slack and the live pods' own size.
RSS_BOUND_RATIO = 1.5
RSS_BOUND_MIB = 64


def figures(outcome: Outcome) -> dict[str, Any]:
    options = outcome.options
    started = outcome.started
    recovery: dict[str, list[float]] = {}
    for fault in outcome.faults:
        after = [t for t in outcome.binds if t >= fault.at]
        if after:
            recovery.setdefault(fault.kind.value, []).append(after[0] - fault.at)
    windows, failovers = _leadership(outcome)
    outage_by_kind: dict[str, list[float]] = {}
    for begun, length in windows:
        before = [f for f in outcome.faults if f.at <= begun + 1.0]
        kind = before[-1].kind.value if before else "start"
        outage_by_kind.setdefault(kind, []).append(length)
    rss = _rss(outcome)
    return {
        "seed": options.seed,
        "duration_s": round(options.duration_s),
        "ran_s": round(outcome.ended - started),
        "phases_s": {k: round(v, 1) for k, v in outcome.phases.items()},
        "nodes": {"gpu": options.layout.gpu_nodes, "share": options.layout.share_nodes},
        "rate_units_per_s": options.rate,
        "units": {kind.value: count for kind, count in sorted(outcome.units.items())},
        "pods": {
            "created": outcome.created,
            "bound": outcome.bound,
            "deleted": outcome.deleted,
            "preempted": outcome.preempted,
            "create_errors": outcome.create_errors,
        },
        "faults": {
            kind.value: sum(1 for f in outcome.faults if f.kind is kind)
            for kind in FaultKind
            if kind in options.faults
        },
        "faults_failed": [
            f"{f.kind.value} at {f.at - started:.0f} s: {f.detail}"
            for f in outcome.faults
            if f.detail.startswith(("failed", "no leader"))
        ],
        "violations": len(outcome.violations),
        "violation_kinds": dict(Counter(v.check for _, v in outcome.violations)),
        "violation_list": [f"{t - started:.1f} s {v}" for t, v in outcome.violations],
        "fault_to_next_bind_s": {
            kind: {
                "n": len(times),
                "median": _round(statistics.median(times)),
                "p99": _round(percentile(times, 99)),
            }
            for kind, times in sorted(recovery.items())
        },
        "failovers": failovers,
        "no_leader": {
            "windows": len(windows),
            "total_s": _round(sum(length for _, length in windows)),
            "by_fault": {
                kind: {
                    "n": len(lengths),
                    "median_s": _round(statistics.median(lengths)),
                    "max_s": _round(max(lengths)),
                }
                for kind, lengths in sorted(outage_by_kind.items())
            },
        },
        "watch_410_relists": outcome.watch_gone,
        "inventory_checks": outcome.inventory_checks,
        "api_unanswered_ticks": outcome.api_errors,
        "crashes": outcome.crashes,
        "rss_mib": rss,
    }


def _round(value: float) -> float:
    return round(value, 2)


def _leadership(outcome: Outcome) -> tuple[list[tuple[float, float]], int]:
    """The stretches in which no replica answered the verbs (start, length), and how often
    the answering replica changed (from one to the other)."""
    windows: list[tuple[float, float]] = []
    failovers = 0
    previous: str | None = None
    down_since: float | None = None
    for at, name in outcome.leaders:
        if name is None:
            down_since = at if down_since is None else down_since
            continue
        if down_since is not None:
            windows.append((down_since, at - down_since))
            down_since = None
        if previous is not None and name != previous:
            failovers += 1
        previous = name
    return windows, failovers


def _rss(outcome: Outcome) -> dict[str, Any]:
    """Per replica start that lived a minute or more: RSS once synced and at its end; the
    longest-lived one; and whether each stayed within the bound."""
    starts = [
        _Start(name, round(end_at - at), kib // 1024, last // 1024)
        for name, samples in outcome.rss.items()
        for at, kib, last, end_at in _with_end(samples, outcome.ended)
    ]
    judged = [s for s in starts if s.lived_s >= 60]
    over = [vars(s) for s in judged if s.end > s.bound]
    longest = max(judged, key=lambda s: s.lived_s, default=None)
    return {
        "first_synced": starts[0].synced if starts else 0,
        "max_end": max((s.end for s in starts), default=0),
        "longest": vars(longest) if longest is not None else None,
        "starts": len(starts),
        "over_bound": over,
        "bound": f"end <= max({RSS_BOUND_RATIO} x synced, synced + {RSS_BOUND_MIB} MiB)",
    }


@dataclass
class _Start:
    replica: str
    lived_s: int
    synced: int  # MiB
    end: int

    @property
    def bound(self) -> float:
        return max(self.synced * RSS_BOUND_RATIO, self.synced + RSS_BOUND_MIB)


def _with_end(
    samples: list[tuple[float, int, int]], ended: float
) -> list[tuple[float, int, int, float]]:
    """(synced at, RSS then, RSS last, when it ended: the next start, or the run's end)."""
    return [
        (at, first, last, samples[i + 1][0] if i + 1 < len(samples) else ended)
        for i, (at, first, last) in enumerate(samples)
    ]


def render(data: dict[str, Any]) -> str:
    pods = data["pods"]
    lines = [
        f"soak: seed {data['seed']}, {data['ran_s']} s "
        f"({', '.join(f'{k} {v} s' for k, v in data['phases_s'].items())}), "
        f"{data['nodes']['gpu']} GPU nodes + {data['nodes']['share']} share nodes",
        f"  pods: {pods['created']} created, {pods['bound']} bound, {pods['deleted']} deleted, "
        f"{pods['preempted']} preempted ({pods['create_errors']} creates refused during faults)",
        f"  units: {', '.join(f'{k} {v}' for k, v in data['units'].items())}",
        f"  faults: {sum(data['faults'].values())} "
        f"({', '.join(f'{k} {v}' for k, v in data['faults'].items())})",
    ]
    lines += [f"    not done: {line}" for line in data["faults_failed"]]
    lines.append("  fault -> next bind (s):  kind                 n   median      p99")
    for kind, row in data["fault_to_next_bind_s"].items():
        lines.append(f"  {'':24}{kind:<20}{row['n']:>3} {row['median']:>8.2f} {row['p99']:>8.2f}")
    outage = data["no_leader"]
    lines.append(
        f"  failovers: {data['failovers']}; no replica answering the verbs: "
        f"{outage['windows']} times, {outage['total_s']:.1f} s in all"
    )
    for kind, row in outage["by_fault"].items():
        lines.append(
            f"    after {kind}: {row['n']} times, median {row['median_s']:.1f} s, "
            f"max {row['max_s']:.1f} s"
        )
    rss = data["rss_mib"]
    longest = rss["longest"]
    longest_text = (
        f"longest-lived start ({longest['replica']}, {longest['lived_s']} s): "
        f"{longest['synced']} -> {longest['end']} MiB"
        if longest
        else "no start lived a minute"
    )
    lines += [
        f"  RSS (MiB): first synced {rss['first_synced']}, largest at an end {rss['max_end']}; "
        f"{longest_text}; bound {rss['bound']}: "
        f"{'kept' if not rss['over_bound'] else 'EXCEEDED ' + str(rss['over_bound'])}",
        f"  watches listed again after 410 Gone: {data['watch_410_relists']:.0f}; "
        f"inventory checks: "
        f"{data['inventory_checks']}; ticks the API did not answer: "
        f"{data['api_unanswered_ticks']}; processes found dead and started again: "
        f"{data['crashes']}",
        f"  invariant violations: {data['violations']}"
        + (f" {data['violation_kinds']}" if data["violations"] else ""),
    ]
    lines += [f"    {line}" for line in data["violation_list"]]
    lines.append(f"  replay with: python -m loadtests.soak --seed {data['seed']} (and the flags)")
    return "\n".join(lines)
