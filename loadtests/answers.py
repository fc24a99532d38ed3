"""Same answers? Every verb of this tree's core against another checkout's, on the same seeded
random clusters: the check that a refactoring changed no decision.

It runs ``loadtests/scenarios.py`` (this tree's copy) twice, with ``PYTHONPATH`` set to each
checkout so that each imports its own ``extender`` and test builders (``testbed/builders.py``;
``tests/builders.py`` in a checkout from before ``testbed/``). Then it compares the
two outputs scenario by scenario: filter verdicts, scores, preempt answers, bind plans and
refusals, explanations, expiries, gang events and statuses. Exit status 0 means every answer
was the same; 1 means at least one differed, and the first scenario that differs is printed
with both answers.

    python -m loadtests.answers --baseline ../schedext-before --scenarios 1500
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson

ROOT = Path(__file__).resolve().parents[1]  # this tree
SCRIPT = Path(__file__).resolve().with_name("scenarios.py")
BUILDERS = "testbed/builders.py"
OLD_BUILDERS = "tests/builders.py"  # where a checkout from before testbed/ keeps them


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m loadtests.answers", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--baseline",
        type=_checkout,
        required=True,
        metavar="DIR",
        help="another checkout of schedext (e.g. a git worktree of an earlier commit)",
    )
    parser.add_argument("--scenarios", type=int, default=1500, help="how many clusters")
    parser.add_argument("--seed", type=int, default=0, help="the first scenario's seed")
    args = parser.parse_args(argv)
    if args.scenarios < 1 or args.seed < 0:
        parser.error("need --scenarios >= 1 and --seed >= 0")
    this = _answers(ROOT, args.scenarios, args.seed)
    baseline = _answers(args.baseline, args.scenarios, args.seed)
    count = sum(len(s["answers"]) for s in this)
    for mine, theirs in zip(this, baseline, strict=True):
        if mine != theirs:
            print(f"scenario {mine['seed']} differs (of {len(this)} scenarios):")
            _print_first_difference(mine["answers"], theirs["answers"])
            return 1
    print(f"same answers: {len(this)} scenarios, {count} answers, this tree and {args.baseline}")
    return 0


def _checkout(value: str) -> Path:
    """--baseline's type: a checkout with the core and the test builders."""
    path = Path(value).resolve()
    if not (path / "extender/scheduler.py").is_file():
        raise argparse.ArgumentTypeError(
            f"{value}: not a schedext checkout (no extender/scheduler.py)"
        )
    if not ((path / BUILDERS).is_file() or (path / OLD_BUILDERS).is_file()):
        raise argparse.ArgumentTypeError(f"{value}: not a schedext checkout (no {BUILDERS})")
    return path


def _answers(root: Path, scenarios: int, seed: int) -> list[dict[str, Any]]:
    """The scenarios' answers from the core of the checkout at ``root``."""
    with tempfile.TemporaryDirectory() as shim:
        path = [str(root)]
        if not (root / BUILDERS).is_file():
            path.append(_old_builders(Path(shim)))
        result = subprocess.run(  # noqa: S603 (this tree's script, arguments built here)
            [sys.executable, str(SCRIPT), str(scenarios), str(seed)],
            cwd=root,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(path)},
            capture_output=True,
            timeout=3600,
            check=False,
        )
    if result.returncode != 0:
        tail = result.stderr.decode(errors="replace")[-2000:]
        raise SystemExit(f"the scenarios failed in {root}:\n{tail}")
    return [orjson.loads(line) for line in result.stdout.splitlines()]


def _old_builders(directory: Path) -> str:
    """A ``testbed`` package in ``directory`` whose ``builders`` are the checkout's
    ``tests.builders``, for a checkout from before ``testbed/``; ``directory``, to put on
    ``PYTHONPATH`` after the checkout."""
    package = directory / "testbed"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "builders.py").write_text("from tests.builders import *  # noqa: F403\n")
    return str(directory)


def _print_first_difference(mine: list[Any], theirs: list[Any]) -> None:
    for step, (a, b) in enumerate(zip(mine, theirs, strict=True)):
        if a != b:
            print(f"  answer {step}, this tree: {json.dumps(a)[:1000]}")
            print(f"  answer {step}, baseline:  {json.dumps(b)[:1000]}")
            return


if __name__ == "__main__":
    raise SystemExit(main())
