"""What the benchmark prints: every table through one printer, ``kubectl schedext``'s
(:func:`app.plugin.tables.table`: columns as wide as their widest cell, ``-`` for nothing),
with a title or a note where a table needs one. The figures are the rows' (``--json`` writes
them whole); this only chooses the columns and rounds them."""

from __future__ import annotations

from collections.abc import Sequence

from app.plugin.tables import table
from loadtests.bench.loaded import IDLE, LOAD_BLOCK, LOADED
from loadtests.bench.workload import BASELINE, DRA, DRA_PAIRS, THIS, WHOLE, Row

NONE = "-"


def print_rows(rows: list[Row], *, with_tree: bool, with_scenario: bool) -> None:
    """Per tree, scenario, size and verb: the round trip's percentiles, their ratios to the
    floor, and the core's p50."""
    _show(
        [*_key_headers(with_tree, with_scenario), "verb", "nodes", "feasible", "p50 ms",
         "p90 ms", "p99 ms", "p50/floor", "p99/floor", "core p50"],
        [
            [*_keys(r, with_tree, with_scenario), r["verb"], r["nodes"], r["feasible"],
             _ms(r["p50_ms"]), _ms(r["p90_ms"]), _ms(r["p99_ms"]), _times(r["p50_ratio"]),
             _times(r["p99_ratio"]), _ms(r["core_p50_ms"])]
            for r in rows
        ],
    )  # fmt: skip
    print("floor = the constant-answer endpoint of the same server, same body, same connection")


def print_comparison(rows: list[Row]) -> None:
    """Per size, scenario and verb: p50 this / p50 baseline (after / before), served and
    core."""
    baseline = {(r["nodes"], r["scenario"], r["verb"]): r for r in rows if r["tree"] == BASELINE}
    with_scenario = len({r["scenario"] for r in rows}) > 1
    lines = []
    for r in rows:
        if r["tree"] != THIS:
            continue
        before = baseline[(r["nodes"], r["scenario"], r["verb"])]
        lines.append(
            [*_keys(r, False, with_scenario), r["verb"], r["nodes"], _ms(r["p50_ms"]),
             _ms(before["p50_ms"]), _times(r["p50_vs_baseline"]), _ms(r["core_p50_ms"]),
             _ms(before["core_p50_ms"]), _times(r["core_p50_vs_baseline"])]
        )  # fmt: skip
    _show(
        [*_key_headers(False, with_scenario), "verb", "nodes", "p50 ms", "baseline p50 ms",
         "p50 ratio", "core p50 ms", "baseline core p50 ms", "core ratio"],
        lines,
        title="this / baseline (after / before), p50:",
    )  # fmt: skip
    for tree in (THIS, BASELINE):
        if not any(r["compiled"] for r in rows if r["tree"] == tree):
            print(
                f"note: {tree} tree runs without its compiled part (extender/_packed), on the "
                "pure-Python twin: build it with setup.py build_ext --inplace in that checkout"
            )


def print_scenarios(rows: list[Row]) -> None:
    """Per other scenario, tree, size and verb: it over whole, p50 and p99 served, p50 of the
    core (the constant answer's line compares the two servers' floors)."""
    whole = {(r["tree"], r["nodes"], r["verb"]): r for r in rows if r["scenario"] == WHOLE}
    with_tree = len({r["tree"] for r in rows}) > 1
    # A half-DRA scenario beside its cluster without DRA is in print_dra's table instead.
    paired = {r["scenario"] for r in rows if "p50_vs_no_dra" in r}
    others = (r["scenario"] for r in rows if r["scenario"] not in paired | {WHOLE})
    for scenario in dict.fromkeys(others):
        lines = []
        for r in (r for r in rows if r["scenario"] == scenario):
            other = whole[(r["tree"], r["nodes"], r["verb"])]
            lines.append(
                [*_keys(r, with_tree, False), r["verb"], r["nodes"], _ms(r["p50_ms"]),
                 _ms(other["p50_ms"]), _times(r["p50_vs_whole"]), _ms(r["p99_ms"]),
                 _ms(other["p99_ms"]), _times(r["p99_vs_whole"]), _ms(r["core_p50_ms"]),
                 _ms(other["core_p50_ms"]), _times(r["core_p50_vs_whole"])]
            )  # fmt: skip
        _show(
            [*_key_headers(with_tree, False), "verb", "nodes", "p50 ms", "whole p50 ms",
             "p50 ratio", "p99 ms", "whole p99 ms", "p99 ratio", "core p50 ms",
             "whole core p50 ms", "core ratio"],
            lines,
            title=f"{scenario} / whole (the same tree, verb and size; each over its own server):",
        )  # fmt: skip


def print_dra(rows: list[Row]) -> None:
    """Per pod (whole-GPU: dra over whole; claim: dra-claim over claim), tree, size and verb:
    half the nodes DRA's over none, p50 (and over its own floor) and p99 served, p50 of the
    core."""
    by_key = {(r["tree"], r["scenario"], r["nodes"], r["verb"]): r for r in rows}
    with_tree = len({r["tree"] for r in rows}) > 1
    lines = []
    for r in rows:
        if "p50_vs_no_dra" not in r or r["verb"] == "constant":
            continue
        plain = by_key[(r["tree"], DRA_PAIRS[r["scenario"]], r["nodes"], r["verb"])]
        pod = "whole-GPU" if r["scenario"] == DRA else "claim"
        lines.append(
            [*_keys(r, with_tree, False), pod, r["verb"], r["nodes"], _floored(plain),
             _floored(r), _times(r["p50_vs_no_dra"]), _ms(plain["p99_ms"]), _ms(r["p99_ms"]),
             _times(r["p99_vs_no_dra"]), _ms(plain["core_p50_ms"]), _ms(r["core_p50_ms"]),
             _times(r["core_p50_vs_no_dra"])]
        )  # fmt: skip
    _show(
        [*_key_headers(with_tree, False), "pod", "verb", "nodes", "no DRA p50 ms (/floor)",
         "half DRA p50 ms (/floor)", "p50 ratio", "no DRA p99 ms", "half DRA p99 ms",
         "p99 ratio", "no DRA core p50", "half DRA core p50", "core ratio"],
        lines,
        title="half the nodes DRA / none (the same pod, tree, verb and size; each over its own "
        "server and floor):",
    )  # fmt: skip


def _floored(row: Row) -> str:
    return f"{row['p50_ms']:.3f} ({row['p50_ratio']:.2f}x)"


def print_loaded(rows: list[Row], *, with_tree: bool, with_scenario: bool) -> None:
    """``--load``: each verb's round trip idle and loaded; where it went, by schedext's timing
    headers and by its stage histograms; this tree over the baseline; what the stand-ins
    served."""
    keys = _key_headers(with_tree, with_scenario)
    _show(
        [*keys, "verb", "nodes", "state", "p50 ms", "p90 ms", "p99 ms", "mean ms", "p50/idle",
         "p99/idle"],
        [
            [*_keys(r, with_tree, with_scenario), r["verb"], r["nodes"], r["state"],
             _ms(r["p50_ms"]), _ms(r["p90_ms"]), _ms(r["p99_ms"]), _ms(r["mean_ms"]),
             _times(r.get("p50_vs_idle")), _times(r.get("p99_vs_idle"))]
            for r in rows
        ],
    )  # fmt: skip
    print(
        f"blocks of {LOAD_BLOCK} rounds, {IDLE} and {LOADED} alternating; {LOADED}: the pod "
        "before is bound meanwhile (Binding POST, two pod watch events)"
    )
    split = [r for r in rows if r["server_p50_us"] is not None]
    if split:
        _show(
            [*keys, "verb", "nodes", "state", "before", "schedext", "after", "round trip"],
            [
                [*_keys(r, with_tree, with_scenario), r["verb"], r["nodes"], r["state"],
                 f"{r['before_p50_us']:.0f}", f"{r['server_p50_us']:.0f}",
                 f"{r['after_p50_us']:.0f}", f"{r['p50_ms'] * 1000:.0f}"]
                for r in split
            ],
            title="where the round trip goes, medians in µs, from schedext's timing headers: "
            "before its event loop read the request (sending, the kernel, and waiting for the "
            "loop to finish what it was doing), in schedext (first read to answer handed to the "
            "socket), after (the kernel, this client reading the answer)",
        )  # fmt: skip
    staged = [r for r in rows if r["verb"] != "constant" and r["total_mean_us"] is not None]
    if staged:
        _show(
            [*keys, "verb", "nodes", "state", "body", "queue", "handler", "total"],
            [
                [*_keys(r, with_tree, with_scenario), r["verb"], r["nodes"], r["state"],
                 f"{r['body_mean_us']:.1f}", f"{r['queue_mean_us']:.1f}",
                 f"{r['handler_mean_us']:.1f}", f"{r['total_mean_us']:.1f}"]
                for r in staged
            ],
            title="in schedext, means in µs, from its schedext_request_stage_seconds: the body "
            "(first read to last byte read), queue (to the handler's start), handler (to the "
            "answer handed to the socket), total",
        )  # fmt: skip
    if with_tree:
        _print_loaded_comparison(rows, with_scenario=with_scenario)
    for (tree, scenario), r in {(r["tree"], r["scenario"]): r for r in rows}.items():
        stats = r["standin"]
        line = (
            f"{tree}/{scenario}: {stats['bindings']} Bindings, {stats['events']} pod watch "
            f"events, {r['bind_failures']} binds refused"
        )
        if stats["unexpected"]:
            line += f"; the stand-in was asked what it does not serve: {stats['unexpected'][:5]}"
        print(line)


def _print_loaded_comparison(rows: list[Row], *, with_scenario: bool) -> None:
    key = ("nodes", "scenario", "state", "verb")
    baseline = {tuple(r[k] for k in key): r for r in rows if r["tree"] == BASELINE}
    lines = []
    for r in rows:
        if r["tree"] != THIS:
            continue
        before = baseline[tuple(r[k] for k in key)]
        lines.append(
            [*_keys(r, False, with_scenario), r["verb"], r["nodes"], r["state"],
             _ms(r["p50_ms"]), _ms(before["p50_ms"]), _times(r["p50_ms"] / before["p50_ms"]),
             _ms(r["p99_ms"]), _ms(before["p99_ms"]), _times(r["p99_ms"] / before["p99_ms"])]
        )  # fmt: skip
    _show(
        [*_key_headers(False, with_scenario), "verb", "nodes", "state", "p50 ms",
         "baseline p50 ms", "p50 ratio", "p99 ms", "baseline p99 ms", "p99 ratio"],
        lines,
        title="this / baseline (after / before), p50 and p99:",
    )  # fmt: skip


def _show(headers: Sequence[str], rows: Sequence[Sequence[object]], title: str = "") -> None:
    """One table, after a blank line and its title where it has one."""
    if title:
        print(f"\n{title}")
    print(table(headers, rows))


def _key_headers(with_tree: bool, with_scenario: bool) -> list[str]:
    return ["tree"] * with_tree + ["scenario"] * with_scenario


def _keys(row: Row, with_tree: bool, with_scenario: bool) -> list[object]:
    return [row["tree"]] * with_tree + [row["scenario"]] * with_scenario


def _ms(value: float | None) -> str:
    return NONE if value is None else f"{value:.3f}"


def _times(value: float | None) -> str:
    return NONE if value is None else f"{value:.2f}x"
