"""``schedext agent`` as a real process: where it cannot start, it says why and exits."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest


def agent(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "app.cli", "agent", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _driver_present() -> bool:
    import pynvml  # noqa: PLC0415 (only to know whether to skip)

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()
    return True


@pytest.mark.skipif(_driver_present(), reason="an NVIDIA driver is present: NVML starts here")
def test_nvml_failing_at_start_exits_with_a_clear_message() -> None:
    result = agent("--node-name", "n1")
    assert result.returncode == 1
    assert "NVML could not start" in result.stderr
    assert "NVIDIA driver" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_missing_node_name_is_a_settings_error() -> None:
    result = agent()
    assert result.returncode == 2
    assert "node_name" in result.stderr
    assert "Traceback" not in result.stderr


def test_an_unreadable_replay_file_exits_with_a_clear_message(tmp_path: Path) -> None:
    broken = tmp_path / "node.json"
    broken.write_text("{not json")
    result = agent("--node-name", "n1", "--nvml-replay", str(broken))
    assert result.returncode == 1
    assert str(broken) in result.stderr
    assert "Traceback" not in result.stderr


def test_shares_that_cannot_be_served_stop_the_agent_with_the_reason() -> None:
    # Memory in MiB with no count resource: one device per MiB is more than the kubelet reads.
    result = subprocess.run(
        [sys.executable, "-m", "app.cli", "agent", "--node-name", "n1"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "SCHEDEXT_AGENT_SHARE_COUNT_RESOURCE": ""},
    )
    assert result.returncode == 2
    assert "GPU shares cannot be served" in result.stderr
    assert "schedext.io/gpu-memory counts MiB and no share count resource is set" in result.stderr
    assert "shares=false" in result.stderr
    assert "Traceback" not in result.stderr
