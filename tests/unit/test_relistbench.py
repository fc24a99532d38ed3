"""loadtests.relistbench relists the same pages in this tree and a baseline, each with the
collector as the service sets it, and checks the inventory it built (a smoke test: its figures
are the benchmark's, never asserted)."""

from __future__ import annotations

from pathlib import Path

import pytest

from loadtests import relistbench


def test_the_relist_benchmark_prints_every_stage_and_checks_the_gpus_held(
    capsys: pytest.CaptureFixture[str],
) -> None:
    here = Path(relistbench.__file__).resolve().parent.parent
    argv = ["--nodes", "6", "--pods", "60", "--page", "25", "--reps", "1", "--baseline", str(here)]
    assert relistbench.main(argv) == 0
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines() if line.startswith(("this ", "base "))]
    assert [(row[0], row[1]) for row in rows] == [
        ("this", "service"), ("this", "paused"), ("base", "service"), ("base", "paused"),
    ]  # fmt: skip
    assert all(row[-1] == "ok" for row in rows)


def test_the_inventory_holds_what_the_pods_hold() -> None:
    data = relistbench.build_input(nodes=4, pods=40, page=15)
    assert data["held_gpus"] > 0
    for collector in relistbench.COLLECTORS:
        assert relistbench.measure(data, collector)["held_gpus"] == data["held_gpus"]


def test_an_unknown_collector_is_refused() -> None:
    with pytest.raises(SystemExit, match="--collector: one or more of service, paused"):
        relistbench.main(["--collector", "off"])
