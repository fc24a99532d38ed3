"""The throughput benchmark's protocol floor: the Go null extender answers the protocol and
binds (the same checks as the Python one's in the api tier), and ``loadtests.throughput
--floor python,go --variants ... --gpu-share 0.5`` runs end to end at a tiny size, a real
kube-scheduler binding every pod through each extender and each variant of schedext's
configuration, on a mix of GPU and plain pods, with the placement-quality report. A smoke
test: no assertion is about how fast anything is."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from loadtests.throughput import build_go_extender
from tests.null_extenders import check_decides_nothing, check_shortlist

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


def test_go_null_extender_shortlists_like_schedext_as_shipped(
    go_extender: Path, tmp_path: Path
) -> None:
    check_shortlist([str(go_extender)], tmp_path)


VARIANTS = "full,native,shortlist:3+native"
GPU_PODS = PODS // 2  # --gpu-share 0.5
PLAIN_PODS = PODS - GPU_PODS
# 1 and 2 GPUs alternately among the GPU pods.
GPUS = sum(1 + j % 2 for j in range(GPU_PODS))
TWO_GPU_PODS = GPU_PODS // 2
SCHEDEXT_PHASES = ("A1", "V1.1", "V2.1", "V3.1")


def test_throughput_benchmark_runs_every_phase_floors_variants_and_mix(tmp_path: Path) -> None:
    out = tmp_path / "throughput.json"
    result = subprocess.run(
        [sys.executable, "-m", "loadtests.throughput", "--nodes", "10", "--pods", str(PODS),
         "--reps", "1", "--floor", "python,go", "--variants", VARIANTS, "--gpu-share", "0.5",
         "--bind-timeout", "120", "--json", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "protocol floor, a python extender" in result.stdout
    assert "protocol floor, a go extender" in result.stdout
    assert "50% GPU pods: 10 GPU pods" in result.stdout
    assert "variant V3 = shortlist:3+native: no prioritizeVerb" in result.stdout
    assert "variant V1 (full):" in result.stdout
    assert "placement quality" in result.stdout

    report = json.loads(out.read_text())
    assert report["mix"] == {"gpu_share": 0.5, "gpu_pods": GPU_PODS, "plain_pods": PLAIN_PODS}
    assert [v["name"] for v in report["variants"].values()] == VARIANTS.split(",")
    runs = {run["phase"]: run for run in report["runs"]}
    assert list(runs) == ["A1", "B1", "P1", "G1", "V1.1", "V2.1", "V3.1"]
    for phase, run in runs.items():
        assert run["pods"] == PODS  # the benchmark fails a phase where one is not bound
        bind = run["kube_scheduler"]["extension_points"].get("Bind") or {"count": 0}
        if phase == "B1":
            assert bind["count"] >= PODS  # kube-scheduler bound them itself
        else:
            # The extender bound every GPU pod; kube-scheduler the plain ones, which the
            # shipped managedResources keeps from it.
            assert bind["count"] == PLAIN_PODS, phase
            assert "schedext" in run["cpu_s"]  # the extender's process was metered
        _check_quality(phase, run["quality"])

    # Each mode's verbs: full mode calls prioritize, the shortlist does not.
    assert runs["V1.1"]["schedext"]["prioritize"]["count"] >= GPU_PODS
    assert runs["V3.1"]["schedext"].get("prioritize", {"count": 0})["count"] == 0
    assert runs["V3.1"]["schedext"]["filter"]["count"] >= GPU_PODS

    summary = report["summary"]
    for key in ("ratio_of_medians", "P_ratio_of_medians", "G_ratio_of_medians",
                "A_to_P_median_pair_ratio", "A_to_G_median_pair_ratio",
                "V1_median_pair_ratio", "V1_to_A_median_pair_ratio",
                "V3_ratio_of_medians", "V3_to_A_median_pair_ratio"):  # fmt: skip
        assert isinstance(summary[key], float), key
        assert math.isfinite(summary[key]), key
        assert summary[key] > 0, key
    assert math.isclose(
        summary["P_ratio_of_medians"],
        summary["P_pods_per_s"] / summary["without_pods_per_s"],
        rel_tol=0.01,
    )
    assert set(summary["quality"]) == {"A", "B", "P", "G", "V1", "V2", "V3"}
    assert summary["quality"]["A"]["nodes_used"] == runs["A1"]["quality"]["nodes_used"]


def _check_quality(phase: str, figures: dict[str, Any]) -> None:
    """Every GPU pod bound and counted; packing figures that add up; NVLink fit and the
    choice counter where schedext placed the pods, n/a elsewhere."""
    assert figures["gpu_pods"] == figures["gpu_pods_bound"] == GPU_PODS, phase
    assert figures["plain_pods"] == PLAIN_PODS, phase
    assert figures["gpus_used"] == GPUS, phase
    assert 1 <= figures["nodes_used"] <= GPU_PODS, phase
    assert figures["nodes_full"] + figures["nodes_partly_used"] == figures["nodes_used"], phase
    assert figures["gpus_stranded"] == 8 * figures["nodes_used"] - GPUS, phase
    if phase in SCHEDEXT_PHASES:
        assert figures["nvlink_judged"] == TWO_GPU_PODS, phase
        assert 0.0 <= figures["nvlink_fit"] <= 1.0, phase
        assert sum(figures["choices"].values()) == GPU_PODS, phase  # one per bind
        assert 0.0 <= figures["best_choice_share"] <= 1.0, phase
    else:
        # kube-scheduler alone writes no gpu-ids, the null extenders a dummy one; no choices.
        assert figures["nvlink_judged"] == 0, phase
        assert figures["nvlink_fit"] is None, phase
        assert figures["best_choice_share"] is None, phase
