"""The throughput benchmark's figures and printout (``loadtests.throughput``): kube-scheduler's
and schedext's metrics over a phase's window, the summary over the phases of each kind (medians,
ratios to kube-scheduler alone and to schedext as shipped), and the tables printed at the end,
the placement-quality report among them (:mod:`loadtests.quality`).

Phase kinds: A (schedext as shipped), B (kube-scheduler alone), C (a baseline tree's
schedext), P and G (the null extenders of ``--floor``), V1, V2 ... (the ``--variants`` of A,
in the order given). Every run records its ``kind`` and ``rep``.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from loadtests import kubeload, quality
from loadtests.kubeload import Scrape

JSON = dict[str, Any]
TARGET_RATIO = 0.85
# The extenders that decide nothing (--floor), by phase letter.
FLOORS = {"python": "P", "go": "G"}
PHASES = ("A", "B", "C", *FLOORS.values())
VARIANT = "V"
# kube-scheduler histograms worth a mean per phase (sum / count over the timed window).
SCHEDULER_HISTOGRAMS = (
    "scheduler_scheduling_attempt_duration_seconds",
    "scheduler_scheduling_algorithm_duration_seconds",
    "scheduler_pod_scheduling_sli_duration_seconds",
)
EXTENSION_POINTS = "scheduler_framework_extension_point_duration_seconds"


def variant_kind(index: int) -> str:
    """The phase kind of the variant at ``index`` of ``--variants``: V1, V2 ..."""
    return f"{VARIANT}{index + 1}"


def is_variant(kind: str) -> bool:
    return kind.startswith(VARIANT) and kind[len(VARIANT) :].isdigit()


# ---------------------------------------------------------------------------------------------
# Metrics
# ---------------------------------------------------------------------------------------------


@dataclass
class Histogram:
    """count, total seconds and mean milliseconds of a histogram over a window."""

    count: float = 0.0
    total_s: float = 0.0
    labels: JSON = field(default_factory=dict)

    def as_json(self) -> JSON:
        mean = self.total_s / self.count * 1000 if self.count else None
        return {
            "count": int(self.count),
            "total_s": round(self.total_s, 3),
            "mean_ms": None if mean is None else round(mean, 3),
            **self.labels,
        }


def _window(before: Scrape, after: Scrape, name: str, **labels: str) -> Histogram:
    count = after.total(f"{name}_count", **labels) - before.total(f"{name}_count", **labels)
    total = after.total(f"{name}_sum", **labels) - before.total(f"{name}_sum", **labels)
    return Histogram(count, total)


def scheduler_figures(before: Scrape, after: Scrape) -> JSON:
    attempts = {
        result: int(value - before.by_label("scheduler_schedule_attempts_total", "result").get(
            result, 0.0
        ))
        for result, value in after.by_label("scheduler_schedule_attempts_total", "result").items()
    }  # fmt: skip
    figures: JSON = {"attempts": attempts}
    for name in SCHEDULER_HISTOGRAMS:
        if after.names(name):
            figures[name] = _window(before, after, name).as_json()
    points = after.by_label(f"{EXTENSION_POINTS}_count", "extension_point")
    figures["extension_points"] = {
        point: _window(before, after, EXTENSION_POINTS, extension_point=point).as_json()
        for point in sorted(points)
    }
    figures["extender_metric_names"] = after.names("extender")
    return figures


def schedext_figures(before: Scrape, after: Scrape) -> JSON:
    verbs = after.by_label("schedext_request_duration_seconds_count", "verb")
    return {
        verb: _window(before, after, "schedext_request_duration_seconds", verb=verb).as_json()
        for verb in sorted(verbs)
    }


STAGES = ("body", "queue", "handler", "total")


def schedext_stages(before: Scrape, after: Scrape) -> JSON:
    """Mean ms per stage of each verb, from the event loop's first read of the request
    (``schedext_request_stage_seconds``): its body read, the wait for its handler, the
    handler, and all of it. Empty for a schedext that has no such metric."""
    name = "schedext_request_stage_seconds"
    verbs = after.by_label(f"{name}_count", "verb")
    return {
        verb: {
            stage: _window(before, after, name, verb=verb, stage=stage).as_json().get("mean_ms")
            for stage in STAGES
        }
        for verb in sorted(verbs)
    }


# ---------------------------------------------------------------------------------------------
# Summary and output
# ---------------------------------------------------------------------------------------------


def _median(values: Sequence[float]) -> float:
    return round(statistics.median(values), 2) if values else float("nan")


def kinds(runs: Sequence[JSON]) -> list[str]:
    """The phase kinds present, in the order of the tables: A B C P G, then the variants."""
    present = {r["kind"] for r in runs}
    variants = sorted((k for k in present if is_variant(k)), key=lambda k: int(k[len(VARIANT) :]))
    return [k for k in PHASES if k in present] + variants


def summarize(runs: list[JSON]) -> JSON:
    """Medians and ratios over the phases of each kind (``<kind>_...`` keys), and the
    placement-quality medians per kind under ``quality``."""
    by_phase = {p: [r for r in runs if r["kind"] == p] for p in (*PHASES, *kinds(runs))}
    rates = {p: [r["pods_per_s"] for r in phase_runs] for p, phase_runs in by_phase.items()}
    a, b = rates["A"], rates["B"]
    summary: JSON = {
        "with_schedext_pods_per_s": _median(a),
        "without_pods_per_s": _median(b),
        "ratio_of_medians": _ratio(a, b),
        "median_pair_ratio": _pair_ratio(a, b),
        "target_ratio": TARGET_RATIO,
    }
    c = rates["C"]
    if c:
        summary["baseline_pods_per_s"] = _median(c)
        summary["baseline_ratio_of_medians"] = _ratio(c, b)
    for phase in FLOORS.values():
        floor = rates[phase]
        if floor:
            # The floor to kube-scheduler alone, and schedext to the floor, run by run.
            summary[f"{phase}_pods_per_s"] = _median(floor)
            summary[f"{phase}_ratio_of_medians"] = _ratio(floor, b)
            summary[f"{phase}_median_pair_ratio"] = _pair_ratio(floor, b)
            summary[f"A_to_{phase}_median_pair_ratio"] = _pair_ratio(a, floor)
    for kind in kinds(runs):
        if is_variant(kind):
            # Each variant to kube-scheduler alone and to schedext as shipped, run by run.
            rate = rates[kind]
            summary[f"{kind}_pods_per_s"] = _median(rate)
            summary[f"{kind}_ratio_of_medians"] = _ratio(rate, b)
            summary[f"{kind}_median_pair_ratio"] = _pair_ratio(rate, b)
            summary[f"{kind}_to_A_median_pair_ratio"] = _pair_ratio(rate, a)
    summary["quality"] = {
        kind: quality.medians([r["quality"] for r in by_phase[kind] if r.get("quality")])
        for kind in kinds(runs)
    }
    for phase, phase_runs in by_phase.items():
        if not phase_runs:
            continue
        summary[f"{phase}_create_per_s"] = _median([r["create"]["per_second"] for r in phase_runs])
        for key, process in (("machine", "machine"), ("extender", "schedext")):
            if process in phase_runs[0]["cpu_s"]:
                per_pod = [r["cpu_s"][process] * 1000 / r["pods"] for r in phase_runs]
                summary[f"{phase}_{key}_cpu_ms_per_pod"] = _median(per_pod)
        for key, histogram in (
            ("algorithm", "scheduler_scheduling_algorithm_duration_seconds"),
            ("attempt", "scheduler_scheduling_attempt_duration_seconds"),
        ):
            summary[f"{phase}_{key}_mean_ms"] = _median([_mean(r, histogram) for r in phase_runs])
    return summary


def _ratio(values: Sequence[float], to: Sequence[float]) -> float | None:
    return round(_median(values) / _median(to), 3) if values and to else None


def _pair_ratio(values: Sequence[float], to: Sequence[float]) -> float | None:
    """The median of the ratios of the phases run side by side (rep i with rep i)."""
    pairs = [x / y for x, y in zip(values, to, strict=False) if y]
    return round(statistics.median(pairs), 3) if pairs else None


def _mean(run: JSON, histogram: str) -> float:
    mean = (run["kube_scheduler"].get(histogram) or {}).get("mean_ms")
    return float(mean) if mean is not None else float("nan")


def print_run(run: JSON) -> None:
    """One line as each phase ends."""
    cpu = run["cpu_s"]
    parts = ", ".join(
        f"{k} {cpu[k]:.1f}"
        for k in ("kube-scheduler", "schedext", "kube-apiserver", "etcd", "benchmark", "others")
        if k in cpu
    )
    print(
        f"{run['phase']}: {run['pods']} pods bound in {run['seconds']:.2f} s = "
        f"{run['pods_per_s']:.0f} pods/s (creates {run['create']['per_second']:.0f}/s; "
        f"create->bound p50 {run['create_to_bound_p50_ms']:.0f} ms, p99 "
        f"{run['create_to_bound_p99_ms']:.0f} ms); CPU s: {parts} in {cpu['wall']:.1f} s",
        flush=True,
    )


def print_report(report: JSON) -> None:
    """Everything at the end of a run: the phases, the ratios, CPU, attribution, quality."""
    s, m = report["summary"], report["machine"]
    print(f"\nkube-scheduler throughput, {report['nodes']['done']:,} 8-GPU nodes")
    print(f"machine: {m['nproc']} CPUs ({m['cpu_model']}), {m['mem_total_gib']} GiB")
    mix = report["mix"]
    print(f"pods per phase: {mix['gpu_pods'] + mix['plain_pods']}, {_mix_words(mix)}")
    for kind, variant in report["variants"].items():
        print(f"variant {kind} = {variant['name']}: {variant['changes']}")
    print(
        f"{'phase':<7}{'pods/s':>8}{'create/s':>10}{'algorithm ms':>14}{'attempt ms':>12}"
        f"{'p50 ms':>9}{'p99 ms':>9}"
    )
    for run in report["runs"]:
        print(
            f"{run['phase']:<7}{run['pods_per_s']:>8.0f}{run['create']['per_second']:>10.0f}"
            f"{_mean(run, 'scheduler_scheduling_algorithm_duration_seconds'):>14.3f}"
            f"{_mean(run, 'scheduler_scheduling_attempt_duration_seconds'):>12.2f}"
            f"{run['create_to_bound_p50_ms']:>9.0f}{run['create_to_bound_p99_ms']:>9.0f}"
        )
    print(
        "algorithm = kube-scheduler's serial filter+score time per pod, extender calls "
        "included;\nattempt = algorithm + bind (bind runs off the serial path); "
        "p50/p99 = create answered -> seen bound"
    )
    print(
        f"median pods/s: with schedext {s['with_schedext_pods_per_s']:.0f}, without "
        f"{s['without_pods_per_s']:.0f}; ratio {s['ratio_of_medians']:.2f} "
        f"(median of pair ratios {s['median_pair_ratio']:.2f}; target >= {TARGET_RATIO})"
    )
    if "baseline_pods_per_s" in s:
        print(
            f"baseline tree (phase C): {s['baseline_pods_per_s']:.0f} pods/s, ratio "
            f"{s['baseline_ratio_of_medians']:.2f} to kube-scheduler alone"
        )
    for name, phase in FLOORS.items():
        if f"{phase}_pods_per_s" in s:
            print(
                f"protocol floor, a {name} extender that decides nothing (phase {phase}): "
                f"{s[f'{phase}_pods_per_s']:.0f} pods/s, ratio "
                f"{s[f'{phase}_ratio_of_medians']:.2f} to kube-scheduler alone (pair median "
                f"{s[f'{phase}_median_pair_ratio']:.2f}); schedext to it, pair median "
                f"{s[f'A_to_{phase}_median_pair_ratio']:.2f}"
            )
    for kind, variant in report["variants"].items():
        if f"{kind}_pods_per_s" in s:
            to_b, to_a = s[f"{kind}_median_pair_ratio"], s[f"{kind}_to_A_median_pair_ratio"]
            print(
                f"variant {kind} ({variant['name']}): {s[f'{kind}_pods_per_s']:.0f} pods/s, "
                f"ratio {s[f'{kind}_ratio_of_medians']:.2f} to kube-scheduler alone (pair "
                f"median {_two(to_b)}); to schedext as shipped (A), pair median {_two(to_a)}"
            )
    cpu = [
        f"{phase} {s[f'{phase}_machine_cpu_ms_per_pod']:.1f}"
        + (f" ({s[f'{phase}_extender_cpu_ms_per_pod']:.2f} extender)"
           if f"{phase}_extender_cpu_ms_per_pod" in s else "")
        for phase in kinds(report["runs"])
        if f"{phase}_machine_cpu_ms_per_pod" in s
    ]  # fmt: skip
    print(f"median CPU ms per pod, whole machine: {', '.join(cpu)}")
    _print_attribution(report["runs"])
    _print_quality(report)
    for run in report["runs"]:
        kubeload.print_stacks(f"timed phase {run['phase']}", run.get("schedext_py_spy"), 20)
    print(f"total benchmark time: {report['total_s']:.0f} s")


def _mix_words(mix: JSON) -> str:
    if not mix["plain_pods"]:
        return "all GPU pods (1 or 2 GPUs, alternately)"
    return (
        f"{mix['gpu_share']:.0%} GPU pods: {mix['gpu_pods']} GPU pods (1 or 2 GPUs, "
        f"alternately), {mix['plain_pods']} plain pods (1 CPU, 2 GiB; not sent to schedext);"
        "\n  pods/s and the ratios cover the whole mix"
    )


def _two(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def _print_quality(report: JSON) -> None:
    """The placement-quality table: every phase, then the medians of each kind."""
    print(
        "\nplacement quality, read before each phase's pods were deleted: nodes used (>= 1 GPU "
        "pod), full (8 of 8 GPUs);\nstranded = free GPUs on partly used nodes (sum, and mean "
        "per partly used node); NVLink fit = 2-GPU pods\nwhose gpu-ids lie in one NVLink "
        "group; best node = binds on the node schedext scored best (its\n"
        f"{quality.CHOICE_METRIC})"
    )
    print(quality.TABLE_HEADER)
    for run in report["runs"]:
        if run.get("quality"):
            print(quality.table_row(run["phase"], run["quality"]))
    print("medians per phase kind:")
    for kind, figures in report["summary"].get("quality", {}).items():
        print(quality.table_row(kind, figures))


def _print_attribution(runs: list[JSON]) -> None:
    """Per-phase mean time at each kube-scheduler extension point and per schedext verb."""
    print("\nmean ms per call over the timed window (kube-scheduler extension points; schedext):")
    # Only the extension points that take measurable time, to keep the table narrow.
    points = sorted(
        {
            point
            for r in runs
            for point, h in r["kube_scheduler"]["extension_points"].items()
            if (h.get("mean_ms") or 0) >= 0.01
        }
    )
    verbs = sorted({v for r in runs for v in (r["schedext"] or {})})
    header = f"{'phase':<7}" + "".join(f"{p[:10]:>11}" for p in points)
    header += "".join(f"{'x:' + v:>13}" for v in verbs)
    print(header)
    for run in runs:
        row = f"{run['phase']:<7}"
        for point in points:
            mean = run["kube_scheduler"]["extension_points"].get(point, {}).get("mean_ms")
            row += f"{mean:>11.3f}" if mean is not None else f"{'-':>11}"
        for verb in verbs:
            mean = (run["schedext"] or {}).get(verb, {}).get("mean_ms")
            row += f"{mean:>13.3f}" if mean is not None else f"{'-':>13}"
        print(row)
    _print_stages(runs)
    names = sorted({n for r in runs for n in r["kube_scheduler"]["extender_metric_names"]})
    print(f"kube-scheduler metrics about extenders: {', '.join(names) or 'none'}")


def _print_stages(runs: list[JSON]) -> None:
    """schedext's filter and bind, stage by stage, from the loop's first read: how long a
    request waited for the loop (queue) beside what its handler took."""
    staged = [r for r in runs if r.get("schedext_stages")]
    if not staged:
        return
    print("schedext stages, mean ms from the loop's first read (body, queue, handler, total):")
    for run in staged:
        cells = []
        for verb, stages in run["schedext_stages"].items():
            if stages.get("total") is None:  # not called in this phase
                continue
            values = "/".join("-" if stages.get(s) is None else f"{stages[s]:.3f}" for s in STAGES)
            cells.append(f"{verb} {values}")
        print(f"{run['phase']:<7}" + "   ".join(cells))
