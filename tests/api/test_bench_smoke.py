"""The latency benchmark (``python -m loadtests.bench``) runs end to end at tiny sizes and writes
its figures, also beside a baseline checkout: smoke tests, so no assertion is about how fast
anything is."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from extender.model import Reason
from extender.quotas import Kind
from extender.scheduler import Scheduler
from loadtests import payloads
from loadtests.bench import workload as bench_module

VERBS = ("constant", "filter", "prioritize")
SIZES = (10, 50)
ROUNDS = 100
TREES = ("this", "baseline")
REPO = Path(__file__).resolve().parents[2]  # loadtests is not installed: run from the root


def bench(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    """``python -m loadtests.bench ARGS`` from the repository root."""
    return subprocess.run(
        [sys.executable, "-m", "loadtests.bench", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=timeout,
        check=False,
    )


def test_bench_writes_percentiles_and_ratios_per_verb_and_size(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    sizes = ",".join(map(str, SIZES))
    result = bench(
        "--nodes", sizes, "--rounds", str(ROUNDS), "--warmup", "10", "--json", str(out),
        timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "p50/floor" in result.stdout

    rows = json.loads(out.read_text())
    by_key = {(row["verb"], row["nodes"]): row for row in rows}
    assert set(by_key) == {(verb, size) for verb in VERBS for size in SIZES}
    assert len(rows) == len(by_key)
    for (verb, size), row in by_key.items():
        for field in ("p50_ms", "p90_ms", "p99_ms", "p50_ratio", "p99_ratio"):
            assert isinstance(row[field], float), (verb, size, field)
            assert math.isfinite(row[field]), (verb, size, field)
            assert row[field] > 0, (verb, size, field)
        assert row["p50_ms"] <= row["p90_ms"] <= row["p99_ms"]
        assert row["count"] == ROUNDS
        assert 0 <= row["feasible"] <= size
        floor = by_key[("constant", size)]
        # ratios are to the constant-answer floor of the same size
        assert math.isclose(row["p50_ratio"], row["p50_ms"] / floor["p50_ms"])
        assert math.isclose(row["p99_ratio"], row["p99_ms"] / floor["p99_ms"])
        if verb == "constant":
            assert row["core_p50_ms"] is None
        else:
            assert isinstance(row["core_p50_ms"], float)
            assert row["core_p50_ms"] > 0


def test_bench_with_a_baseline_measures_both_trees_and_their_ratios(tmp_path: Path) -> None:
    """This very checkout as its own baseline: both servers, both cores, the after/before
    ratios on this tree's rows."""
    out = tmp_path / "out.json"
    result = bench(
        "--nodes", "10", "--rounds", str(ROUNDS), "--warmup", "10", "--baseline", str(REPO),
        "--json", str(out), timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "baseline: " in result.stdout
    assert "this / baseline (after / before)" in result.stdout

    rows = json.loads(out.read_text())
    by_key = {(row["tree"], row["verb"]): row for row in rows}
    assert set(by_key) == {(tree, verb) for tree in TREES for verb in VERBS}
    assert len(rows) == len(by_key)
    for key, row in by_key.items():
        assert row["nodes"] == 10
        assert row["count"] == ROUNDS
        for field in ("p50_ms", "p90_ms", "p99_ms", "p50_ratio", "p99_ratio"):
            assert isinstance(row[field], float), (key, field)
            assert math.isfinite(row[field]), (key, field)
            assert row[field] > 0, (key, field)
    for verb in VERBS:
        this, baseline = by_key[("this", verb)], by_key[("baseline", verb)]
        assert math.isclose(this["p50_vs_baseline"], this["p50_ms"] / baseline["p50_ms"])
        assert "p50_vs_baseline" not in baseline
        if verb == "constant":
            assert this["core_p50_vs_baseline"] is None
            continue
        for row in (this, baseline):
            assert isinstance(row["core_p50_ms"], float), (row["tree"], verb)
            assert row["core_p50_ms"] > 0, (row["tree"], verb)
        assert math.isclose(
            this["core_p50_vs_baseline"], this["core_p50_ms"] / baseline["core_p50_ms"]
        )


def test_bench_measures_the_shares_scenario_beside_the_whole_one(tmp_path: Path) -> None:
    """Both scenarios in one run, each with its own floor, and shares over whole per verb.
    The shares cluster is built so that one node in three has room for the share pod."""
    out = tmp_path / "out.json"
    size = 30
    result = bench(
        "--nodes", str(size), "--rounds", str(ROUNDS), "--warmup", "10",
        "--scenarios", "whole,shares", "--json", str(out), timeout=90,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "shares / whole" in result.stdout

    rows = json.loads(out.read_text())
    by_key = {(row["scenario"], row["verb"]): row for row in rows}
    assert set(by_key) == {(s, verb) for s in ("whole", "shares") for verb in VERBS}
    assert len(rows) == len(by_key)
    assert by_key[("shares", "filter")]["feasible"] == len(range(0, size, 3))
    for (scenario, verb), row in by_key.items():
        assert row["count"] == ROUNDS
        floor = by_key[(scenario, "constant")]
        assert math.isclose(row["p50_ratio"], row["p50_ms"] / floor["p50_ms"])
        if scenario == "whole":
            assert "p50_vs_whole" not in row
            continue
        whole = by_key[("whole", verb)]
        assert math.isclose(row["p50_vs_whole"], row["p50_ms"] / whole["p50_ms"])
        assert math.isclose(row["p99_vs_whole"], row["p99_ms"] / whole["p99_ms"])
        if verb != "constant":
            assert math.isclose(row["core_p50_vs_whole"], row["core_p50_ms"] / whole["core_p50_ms"])


def test_bench_rejects_an_unknown_scenario() -> None:
    result = bench("--nodes", "10", "--scenarios", "whole,fractional", timeout=30)
    assert result.returncode != 0
    assert "fractional" in result.stderr
    assert "Traceback" not in result.stderr
    assert result.stdout == ""


@pytest.mark.parametrize("kind", ["missing", "not a checkout"])
def test_bench_rejects_a_baseline_that_is_not_a_checkout(tmp_path: Path, kind: str) -> None:
    """Refused by the argument parser, before any server starts: a one-line error naming the
    path, no traceback."""
    baseline = tmp_path / "no-such-dir" if kind == "missing" else tmp_path
    result = bench("--nodes", "10", "--baseline", str(baseline), timeout=30)
    assert result.returncode != 0
    assert str(baseline) in result.stderr
    assert "Traceback" not in result.stderr
    assert result.stdout == ""


@pytest.mark.parametrize(
    "wire", [[], ["--tls", "--event-gap-ms", "1"]], ids=["plain-back-to-back", "tls-one-per-read"]
)
def test_api_client_bench_writes_cpu_per_operation_beside_aiohttp(
    tmp_path: Path, wire: list[str]
) -> None:
    out = tmp_path / "out.json"
    result = subprocess.run(
        [sys.executable, "-m", "loadtests.apiclient", "--requests", "50", "--events", "300",
         "--reps", "1", "--json", str(out), *wire],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert ("HTTPS, 1 ms between" if wire else "plain HTTP, 0 ms between") in result.stdout
    rows = {row["operation"]: row for row in json.loads(out.read_text())}
    assert set(rows) == {"binding POST", "watch event"}
    assert rows["watch event"]["count"] == 300  # the bench fails if one is not read as a line
    assert rows["watch event"]["bare_us"] > 0  # the floor: a protocol that counts lines
    for row in rows.values():
        assert row["kubeapi_us"] > 0
        assert row["aiohttp_us"] > 0
        assert math.isclose(row["ratio"], row["kubeapi_us"] / row["aiohttp_us"])


def test_bench_under_load_measures_each_verb_idle_and_loaded(tmp_path: Path) -> None:
    """--load: schedext against the stand-in API server, binds and watch events between the
    rounds of every other block; its stage histograms scraped per block."""
    out = tmp_path / "out.json"
    result = bench(
        "--nodes", "100", "--rounds", "100", "--warmup", "0", "--pod", "any", "--load",
        "--write-size", "4096", "--json", str(out), timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "where the round trip goes" in result.stdout

    rows = json.loads(out.read_text())
    by_key = {(row["state"], row["verb"]): row for row in rows}
    assert set(by_key) == {(state, verb) for state in ("idle", "loaded") for verb in VERBS}
    assert len(rows) == len(by_key)
    for (state, verb), row in by_key.items():
        assert row["count"] >= 100, (state, verb)
        assert 0 < row["p50_ms"] <= row["p99_ms"], (state, verb)
        assert row["bind_failures"] == 0
        # the Bindings of the loaded blocks, and two pod watch events for each
        assert row["standin"]["bindings"] >= 100
        assert row["standin"]["events"] == 2 * row["standin"]["bindings"]
        assert row["standin"]["unexpected"] == []
        if verb == "constant":
            continue  # not a verb schedext measures
        stages = [row[f"{stage}_mean_us"] for stage in ("body", "queue", "handler", "total")]
        assert all(value is not None and value >= 0 for value in stages), (state, verb)
        assert stages[2] <= stages[3]  # the handler within the total
    for verb in VERBS:
        loaded = by_key[("loaded", verb)]
        assert math.isclose(
            loaded["p50_vs_idle"], loaded["p50_ms"] / by_key[("idle", verb)]["p50_ms"]
        )


def test_bench_measures_the_quotas_scenario_beside_the_whole_one(tmp_path: Path) -> None:
    """Whole's cluster and pod with 50 ElasticQuotas beside it, in one run: the pod borrows,
    is admitted, and filter answers as without quotas; quotas over whole per verb."""
    out = tmp_path / "out.json"
    size = 30
    result = bench(
        "--nodes", str(size), "--rounds", str(ROUNDS), "--warmup", "10",
        "--scenarios", "whole,quotas", "--json", str(out), timeout=90,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "quotas / whole" in result.stdout

    rows = json.loads(out.read_text())
    by_key = {(row["scenario"], row["verb"]): row for row in rows}
    assert set(by_key) == {(s, verb) for s in ("whole", "quotas") for verb in VERBS}
    assert by_key[("quotas", "filter")]["feasible"] == by_key[("whole", "filter")]["feasible"]
    for verb in VERBS:
        row, whole = by_key[("quotas", verb)], by_key[("whole", verb)]
        assert row["count"] == ROUNDS
        assert math.isclose(row["p50_vs_whole"], row["p50_ms"] / whole["p50_ms"])


def test_the_quotas_scenario_has_50_quotas_and_its_pod_borrows_within_the_summed_min() -> None:
    workload = bench_module.Workload.build(bench_module.QUOTAS, 30, bench_module.PODS["h100"])
    items = workload.cluster["items"]
    scheduler = Scheduler()
    scheduler.replace_nodes([i for i in items if i["kind"] == "Node"])
    scheduler.replace_pods([i for i in items if i["kind"] == "Pod"])
    assert scheduler.replace_quotas([i for i in items if i["kind"] == "ElasticQuota"]) == []
    quotas = {q.namespace: q for q in scheduler.quotas()}
    assert len(quotas) == payloads.QUOTAS
    own = quotas[payloads.QUOTA_NAMESPACE].limit(Kind.GPUS)
    assert own is not None
    held = scheduler.inventory.namespace_use(payloads.QUOTA_NAMESPACE).gpus
    assert 0 < own.min < held  # already borrowing before the pod under test
    assert held + 2 <= sum(q.limits[0].min for q in quotas.values())  # room for its 2 GPUs
    answer = scheduler.filter(workload.pod, workload.orders[0])
    assert answer.passed  # admitted: its nodes answered as without quotas
    assert not {r.reason for r in answer.rejections} & {Reason.QUOTA_MAX, Reason.QUOTA_BORROW}


def test_bench_measures_half_dra_beside_no_dra_for_both_pods(tmp_path: Path) -> None:
    """The four DRA-related scenarios in one run, each server listing and watching its
    scenario's stand-in API server (resource.k8s.io/v1 included); half DRA over no DRA per
    pod (whole-GPU: dra over whole; claim: dra-claim over claim)."""
    out = tmp_path / "out.json"
    scenarios = ("whole", "claim", "dra", "dra-claim")
    result = bench(
        "--nodes", "30", "--rounds", str(ROUNDS), "--warmup", "10",
        "--scenarios", ",".join(scenarios), "--json", str(out), timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "half the nodes DRA / none" in result.stdout
    assert "not every server listed" not in result.stderr

    rows = json.loads(out.read_text())
    by_key = {(row["scenario"], row["verb"]): row for row in rows}
    assert set(by_key) == {(s, verb) for s in scenarios for verb in VERBS}
    for (scenario, verb), row in by_key.items():
        assert row["count"] == ROUNDS
        plain = {"dra": "whole", "dra-claim": "claim"}.get(scenario)
        if plain is None:
            assert "p50_vs_no_dra" not in row
            continue
        other = by_key[(plain, verb)]
        assert math.isclose(row["p50_vs_no_dra"], row["p50_ms"] / other["p50_ms"])
        assert math.isclose(row["p99_vs_no_dra"], row["p99_ms"] / other["p99_ms"])
        if verb != "constant":
            assert math.isclose(
                row["core_p50_vs_no_dra"], row["core_p50_ms"] / other["core_p50_ms"]
            )
