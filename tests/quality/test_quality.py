"""Linters and type checks, run as tests so that the one test command covers them."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def run(*command: str) -> subprocess.CompletedProcess[str]:
    tool = BIN / command[0]
    executable = str(tool) if tool.exists() else shutil.which(command[0])
    assert executable, f"{command[0]} is not installed (pip install -e '.[dev]')"
    return subprocess.run(
        [executable, *command[1:]],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def test_ruff_finds_nothing() -> None:
    result = run("ruff", "check", ".")
    assert result.returncode == 0, result.stdout + result.stderr


def test_code_is_ruff_formatted() -> None:
    result = run("ruff", "format", "--check", ".")
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("package", ["extender", "app", "loadtests"])
def test_mypy_strict_passes(package: str) -> None:
    result = run("mypy", "--strict", package)
    assert result.returncode == 0, result.stdout + result.stderr


def test_import_contracts_keep_the_core_pure() -> None:
    result = run("lint-imports")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout
