"""The throughput benchmark's protocol floor: the Go null extender answers the protocol and
binds (the same checks as the Python one's in the api tier), and ``loadtests.throughput
--floor python,go`` runs end to end at a tiny size, a real kube-scheduler binding every pod
through each extender. A smoke test: no assertion is about how fast anything is."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from loadtests.throughput import build_go_extender
from tests.null_extenders import check_decides_nothing

ROOT = Path(__file__).resolve().parents[2]
PODS = 20


@pytest.fixture(scope="module")
def go_extender(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Built as the benchmark builds it (go is on PATH wherever the control plane is built)."""
    binary = tmp_path_factory.mktemp("goextender") / "goextender"
    build_go_extender(binary)
    return binary


def test_go_null_extender_passes_every_node_and_posts_the_binding(
    go_extender: Path, tmp_path: Path
) -> None:
    check_decides_nothing([str(go_extender)], tmp_path)


def test_throughput_benchmark_runs_every_phase_with_both_floors(tmp_path: Path) -> None:
    out = tmp_path / "throughput.json"
    result = subprocess.run(
        [sys.executable, "-m", "loadtests.throughput", "--nodes", "10", "--pods", str(PODS),
         "--reps", "1", "--floor", "python,go", "--bind-timeout", "120", "--json", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "protocol floor, a python extender" in result.stdout
    assert "protocol floor, a go extender" in result.stdout

    report = json.loads(out.read_text())
    runs = {run["phase"]: run for run in report["runs"]}
    assert list(runs) == ["A1", "B1", "P1", "G1"]
    for phase, run in runs.items():
        assert run["pods"] == PODS  # the benchmark fails a phase where one is not bound
        bind = run["kube_scheduler"]["extension_points"].get("Bind") or {"count": 0}
        if phase == "B1":
            assert bind["count"] >= PODS  # kube-scheduler bound them itself
        else:
            assert bind["count"] == 0, phase  # the extender bound every pod
            assert "schedext" in run["cpu_s"]  # the extender's process was metered

    summary = report["summary"]
    for key in ("ratio_of_medians", "P_ratio_of_medians", "G_ratio_of_medians",
                "A_to_P_median_pair_ratio", "A_to_G_median_pair_ratio"):  # fmt: skip
        assert isinstance(summary[key], float), key
        assert math.isfinite(summary[key]), key
        assert summary[key] > 0, key
    assert math.isclose(
        summary["P_ratio_of_medians"],
        summary["P_pods_per_s"] / summary["without_pods_per_s"],
        rel_tol=0.01,
    )
