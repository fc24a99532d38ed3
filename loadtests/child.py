"""A benchmark's child process: this file's copy of the benchmark, run as a script with another
tree alone on ``PYTHONPATH``, so that ``app`` and ``extender`` come from that tree (a baseline
checkout) while the measurement is the same code in both (``loadtests.intakebench``,
``loadtests.relistbench``). The child prints its figures as JSON on its last line."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson


def run_child(script: str, tree: Path, args: Sequence[str]) -> dict[str, Any]:
    """``script`` with ``args`` against ``tree``; its last line of output, decoded. Its stderr
    is passed on (profiles); a failure ends the benchmark, naming the tree."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    command = [sys.executable, str(Path(script).resolve()), *args]
    # our own script and interpreter, arguments built by the benchmark
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)  # noqa: S603
    if done.returncode:
        raise SystemExit(f"{tree}: the benchmark failed:\n{done.stderr}")
    if done.stderr:
        sys.stderr.write(done.stderr)
    result: dict[str, Any] = orjson.loads(done.stdout.strip().splitlines()[-1])
    return result
