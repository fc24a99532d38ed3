"""loadtests.gangbench runs and reports both variants side by side (a smoke test: its figures
are the benchmark's, never asserted)."""

from __future__ import annotations

from loadtests import gangbench


def test_the_gang_benchmark_times_both_variants_and_says_their_ratio() -> None:
    times = gangbench.run(nodes=64, rounds=4)
    assert {name: len(samples) for name, samples in times.items()} == {
        "no topology": 4,
        "required rack": 4,
    }
    text = gangbench.report(times, 64)
    assert "required rack / no topology:" in text
