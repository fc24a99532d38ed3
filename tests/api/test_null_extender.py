"""The Python null extender of the throughput benchmark's floor (phase P) answers the protocol
and binds, over real HTTP (the Go one is checked in the e2e tier, where Go is installed)."""

from __future__ import annotations

import sys
from pathlib import Path

from tests.null_extenders import check_decides_nothing, check_shortlist


def test_python_null_extender_passes_every_node_and_posts_the_binding(tmp_path: Path) -> None:
    check_decides_nothing([sys.executable, "-m", "loadtests.nullextender"], tmp_path)


def test_python_null_extender_shortlists_like_schedext_as_shipped(tmp_path: Path) -> None:
    check_shortlist([sys.executable, "-m", "loadtests.nullextender"], tmp_path)
