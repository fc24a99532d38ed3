"""Linters, type checks and the core's size rules, run as tests so that the one test command
covers them."""

from __future__ import annotations

import ast
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


@pytest.mark.parametrize("package", ["extender", "app", "loadtests", "testbed"])
def test_mypy_strict_passes(package: str) -> None:
    result = run("mypy", "--strict", package)
    assert result.returncode == 0, result.stdout + result.stderr


def test_import_contracts_keep_the_core_pure() -> None:
    result = run("lint-imports")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


# The core's size rules (docs/architecture.md): past these a module or a class is split along a
# seam, never trimmed to fit. Lines as the file has them, blank lines and docstrings included; a
# class from its ``class`` line to its last (what ``ast`` says).
MODULE_LINES = 450
CLASS_LINES = 300


def test_no_module_or_class_of_the_core_outgrows_the_size_rules() -> None:
    offenders = []
    for path in sorted((ROOT / "extender").rglob("*.py")):
        name = path.relative_to(ROOT).as_posix()
        text = path.read_text(encoding="utf-8")
        lines = len(text.splitlines())
        if lines > MODULE_LINES:
            offenders.append(f"{name}: {lines} lines (at most {MODULE_LINES})")
        for node in ast.walk(ast.parse(text, filename=name)):
            if isinstance(node, ast.ClassDef):
                size = (node.end_lineno or node.lineno) - node.lineno + 1
                if size > CLASS_LINES:
                    offenders.append(
                        f"{name}: class {node.name}, {size} lines (at most {CLASS_LINES})"
                    )
    assert not offenders, "split along a seam:\n" + "\n".join(offenders)
