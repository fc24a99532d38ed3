"""loadtests.intakebench runs every scenario, this tree beside a baseline, and prints each
stage (a smoke test: its figures are the benchmark's, never asserted)."""

from __future__ import annotations

from pathlib import Path

import pytest

from loadtests import intakebench


def test_the_intake_benchmark_prints_every_stage_of_both_trees(
    capsys: pytest.CaptureFixture[str],
) -> None:
    here = Path(intakebench.__file__).resolve().parent.parent
    argv = ["--nodes", "4", "--pods", "8", "--reps", "1", "--baseline", str(here)]
    assert intakebench.main(argv) == 0
    out = capsys.readouterr().out
    for scenario, stages in intakebench.STAGES.items():
        assert f"\n{scenario}\n" in out
        for stage in (*stages, "total"):
            assert f"  {stage} " in out
    assert "this/base" in out
