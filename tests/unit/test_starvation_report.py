"""loadtests.starvation's report: both variants side by side, a gang not placed said so, and
the ratio of the small pods' rates (its figures are the load test's, never asserted here)."""

from __future__ import annotations

from loadtests import starvation
from loadtests.starvation import Outcome


def test_the_report_puts_holds_off_and_on_side_by_side() -> None:
    args = starvation._parser().parse_args(["--window", "90"])
    outcomes = [
        Outcome("holds off", 1, None, None, 0.0, 900, 90.0, 9.5),
        Outcome("holds on (5 s)", 1, 11.0, 6.0, 80.0, 66, 11.0, 9.0, small_held=20,
                held_for_s=5.0),
    ]  # fmt: skip
    text = starvation.report(outcomes, args)
    assert "not within 90 s" in text
    assert "gang placed within 90 s: holds off 0/1, holds on 1/1" in text
    assert "6.00 / 10.00 = 0.60x" in text
    on = next(line for line in text.splitlines() if line.startswith("holds on"))
    assert "11.0 s" in on
    assert " 4.00 " in on  # during the hold
