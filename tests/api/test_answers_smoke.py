"""``python -m loadtests.answers``: the same-answers check between two checkouts' cores. It
must say "same" for the same code and catch one changed decision."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]  # loadtests is not installed: run from the root


def answers(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "loadtests.answers", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
        check=False,
    )


def core_copy(into: Path) -> Path:
    """What the check needs of a checkout: the core and the test builders."""
    shutil.copytree(REPO / "extender", into / "extender", ignore=shutil.ignore_patterns("*.pyc"))
    (into / "testbed").mkdir()
    for name in ("__init__.py", "builders.py"):
        shutil.copy(REPO / "testbed" / name, into / "testbed" / name)
    return into


def test_the_same_core_gives_the_same_answers(tmp_path: Path) -> None:
    result = answers("--baseline", str(core_copy(tmp_path)), "--scenarios", "20")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "same answers: 20 scenarios" in result.stdout


def test_one_changed_decision_is_caught_and_shown(tmp_path: Path) -> None:
    baseline = core_copy(tmp_path)
    policy = baseline / "extender" / "kinds" / "whole_gpu.py"
    text = policy.read_text()
    free_gpus = "col(a.gpu_free) < request.gpus"
    assert free_gpus in text  # the mutation below must change something
    policy.write_text(text.replace(free_gpus, "col(a.gpu_free) <= request.gpus"))
    result = answers("--baseline", str(baseline), "--scenarios", "20")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "differs" in result.stdout
    assert "this tree:" in result.stdout
    assert "baseline:" in result.stdout


def test_a_directory_that_is_not_a_checkout_is_refused(tmp_path: Path) -> None:
    result = answers("--baseline", str(tmp_path))
    assert result.returncode == 2
    assert "not a schedext checkout" in result.stderr
    assert "Traceback" not in result.stderr
