"""The fault soak in CI: a short, seeded run of ``loadtests.soak`` (about three minutes: two
minutes of pods and faults, then the drain and the teardown) must end with no invariant
violation; and the checker must catch a double allocation when one guard is taken out.

The soak brings its own control plane (two schedext replicas under leader election behind a
real kube-scheduler; see loadtests/soak/rig.py), so these tests use no fixture of the
conftest's. ``SCHEDEXT_SOAK_SEED`` runs another seed; a failure names the seed to replay:
``python -m loadtests.soak --seed N --duration 120 --fault-interval 10``.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from loadtests.soak.faults import FaultKind
from loadtests.soak.figures import figures, render
from loadtests.soak.run import Options, soak

SEED = int(os.environ.get("SCHEDEXT_SOAK_SEED", "2026"))


@pytest.mark.timeout(900)
def test_a_short_seeded_soak_breaks_no_invariant(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    options = Options(seed=SEED, duration_s=120, fault_interval_s=10)
    outcome = soak(options, tmp_path)
    data = figures(outcome)
    report = render(data)
    request.node.add_report_section("call", "soak figures", report)  # shown with -rA
    assert data["violations"] == 0, f"seed {SEED}: replay with --seed {SEED}\n{report}"
    assert set(data["faults"]) == {kind.value for kind in FaultKind}
    assert all(count >= 1 for count in data["faults"].values()), report
    assert data["pods"]["bound"] >= 100, report
    assert not data["rss_mib"]["over_bound"], report


@pytest.mark.timeout(600)
def test_the_checker_catches_a_planted_double_allocation(tmp_path: Path) -> None:
    """Replicas that ignore schedext.io/gpu-ids (loadtests/soak/planted.py) forget which GPUs
    their bound pods hold, and give them again: the checker must see it, naming both pods."""
    options = Options(seed=SEED, duration_s=30, faults=(), plant=True)
    outcome = soak(options, tmp_path)
    twice = [v for _, v in outcome.violations if v.check == "gpu-twice"]
    assert twice, render(figures(outcome))
    assert "," in twice[0].subject  # both holders named
    assert "/gpu" in twice[0].resource
