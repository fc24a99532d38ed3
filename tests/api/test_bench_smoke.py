"""The latency benchmark (``schedext bench``, loadtests/bench.py) runs end to end at tiny sizes
and writes its figures: a smoke test, so no assertion is about how fast anything is."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

VERBS = ("constant", "filter", "prioritize")
SIZES = (10, 50)
ROUNDS = 100


def test_bench_writes_percentiles_and_ratios_per_verb_and_size(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    sizes = ",".join(map(str, SIZES))
    result = subprocess.run(
        [sys.executable, "-m", "app.cli", "bench", "--", "--nodes", sizes,
         "--rounds", str(ROUNDS), "--warmup", "10", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
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


def test_api_client_bench_writes_cpu_per_operation_beside_aiohttp(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    result = subprocess.run(
        [sys.executable, "-m", "loadtests.apiclient", "--requests", "50", "--events", "300",
         "--reps", "1", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    rows = {row["operation"]: row for row in json.loads(out.read_text())}
    assert set(rows) == {"binding POST", "watch event"}
    assert rows["watch event"]["count"] == 300  # the bench fails if one is not read as a line
    for row in rows.values():
        assert row["kubeapi_us"] > 0
        assert row["aiohttp_us"] > 0
        assert math.isclose(row["ratio"], row["kubeapi_us"] / row["aiohttp_us"])
