"""scripts/device-check's dry run: the accelerator machine's checks, run here with the GPU
steps skipped (and saying why) and the throughput runs at a toy size, so that the script a
lent machine runs first cannot rot unseen between the sessions that have one."""

from __future__ import annotations

import json
import os
import subprocess
import tarfile
from pathlib import Path

from tests.e2e.conftest import ROOT


def test_the_dry_run_runs_every_step_and_says_which_it_skipped(tmp_path: Path) -> None:
    out = tmp_path / "out"
    done = subprocess.run(
        [str(ROOT / "scripts" / "device-check"), "--dry-run", str(out)],
        cwd=ROOT,
        env={
            **os.environ,
            "SCHEDEXT_DEVICE_CHECK_SIZE": "--reps 1 --nodes 8 --pods 16",
            "SCHEDEXT_DEVICE_CHURN_SIZE": "--nodes 8 --pods 16 --churn-pods 8 --rate 20 "
            "--blocks 1 --block-s 1 --warmup-s 0.5",
        },
        capture_output=True,
        text=True,
        timeout=400,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    steps = {step["step"]: step for step in summary["steps"]}
    assert list(steps) == [
        "gpu-tier", "nvml-record", "throughput", "throughput-mix", "churn", "api-client"
    ]  # fmt: skip
    for name in ("gpu-tier", "nvml-record"):
        assert steps[name]["skipped"] == "NVML does not start here (no NVIDIA driver)"
    for name in ("throughput", "throughput-mix", "churn", "api-client"):
        assert (steps[name]["rc"], steps[name]["timed_out"]) == (0, False), steps[name]
    # Two files come back from the machine: the summary, and one archive of the rest.
    assert sorted(p.name for p in out.iterdir()) == ["device-check.tar.gz", "summary.json"]
    with tarfile.open(out / "device-check.tar.gz") as archive:
        figures = json.load(archive.extractfile("throughput.json"))  # type: ignore[arg-type]
        mix = json.load(archive.extractfile("throughput-mix.json"))  # type: ignore[arg-type]
        churn = json.load(archive.extractfile("churn.json"))  # type: ignore[arg-type]
        client = json.load(archive.extractfile("api-client.json"))  # type: ignore[arg-type]
    assert {run["kind"] for run in figures["runs"]} >= {"A", "B", "P", "G"}
    assert mix["mix"]["gpu_share"] == 0.2
    conditions = churn["runs"]["current"][0]["conditions"]
    assert set(conditions) == {"idle", "churn", "control"}
    assert all(c["filter"]["count"] > 0 for c in conditions.values())
    watch = {row["operation"]: row for row in client}["watch event"]
    assert watch["count"] == 100
    assert watch["bare_us"] > 0
    assert "skipped: NVML does not start here" in done.stderr
