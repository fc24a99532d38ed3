"""Test tiers follow the directory: tests/unit -> unit, tests/api -> api, tests/e2e -> e2e,
tests/quality -> quality, tests/ui -> ui (headless Chromium), tests/gpu -> gpu (real NVML;
skipped without an NVIDIA driver). Run one tier with ``pytest -m unit``."""

from __future__ import annotations

from pathlib import Path

import pytest

_TIERS = ("unit", "api", "e2e", "quality", "ui", "gpu")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        tier = Path(str(item.path)).parent.name
        if tier in _TIERS:
            item.add_marker(getattr(pytest.mark, tier))
