"""The core alone, for ``loadtests.bench``: filter and prioritize timed in-process, without
HTTP and JSON, on the data the benchmark sends its servers.

The benchmark runs this file as a script (not ``-m``), once per source tree, with
``PYTHONPATH`` set to that checkout: ``extender`` is then imported from it, and both trees'
core figures come from this same code. So it imports nothing of the repository but
``extender``, and of it only API that has long been stable (``Scheduler()``,
``replace_nodes``, ``replace_pods``, ``filter``, ``prioritize``, ``PackedNames.of``): the
baseline may be an older or a newer tree.

    python loadtests/corebench.py INPUT.json

INPUT.json: ``{"cluster": {"items": [...]}, "pod": {...}, "orders": [[name, ...], ...],
"passed": [[name, ...], ...], "rounds": N}`` (``passed[k]``: filter's answer to
``orders[k]``). Prints one JSON object: the p50 of each verb in ms, where ``extender`` was
imported from and whether its compiled part was there.
"""

from __future__ import annotations

import importlib.util
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import orjson

import extender
from extender.scheduler import Scheduler

Packer = Callable[[list[str]], Sequence[str]]


def main(argv: Sequence[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    if len(args) != 1:
        print("usage: python loadtests/corebench.py INPUT.json", file=sys.stderr)
        return 2
    data = orjson.loads(Path(args[0]).read_bytes())
    times = core_times(
        data["cluster"], data["pod"], data["orders"], data["passed"], rounds=data["rounds"]
    )
    result = {
        **times,
        "extender": str(Path(extender.__file__).resolve().parent),
        "compiled": importlib.util.find_spec("extender._packed") is not None,
    }
    sys.stdout.write(orjson.dumps(result).decode() + "\n")
    return 0


def core_times(
    cluster: dict[str, Any],
    pod: dict[str, Any],
    orders: list[list[str]],
    passed: list[list[str]],
    *,
    rounds: int,
) -> dict[str, float]:
    """p50 ms of each verb over ``rounds`` calls, cycling through the node orders. The names
    are packed, as the service's decoder packs kube-scheduler's (extender.packed)."""
    pack = _packer()
    packed_orders = [pack(o) for o in orders]
    packed_passed = [pack(p) for p in passed]
    scheduler = Scheduler()
    items = cluster["items"]
    scheduler.replace_nodes([i for i in items if i["kind"] == "Node"])
    scheduler.replace_pods([i for i in items if i["kind"] == "Pod"])
    times: dict[str, list[float]] = {"filter": [], "prioritize": []}
    for round_ in range(rounds):
        k = round_ % len(orders)
        started = time.perf_counter_ns()
        scheduler.filter(pod, packed_orders[k])
        times["filter"].append((time.perf_counter_ns() - started) / 1e6)
        started = time.perf_counter_ns()
        scheduler.prioritize(pod, packed_passed[k])
        times["prioritize"].append((time.perf_counter_ns() - started) / 1e6)
    return {verb: float(np.percentile(values, 50)) for verb, values in times.items()}


def _packer() -> Packer:
    """PackedNames.of where the tree has it; plain lists in a tree from before packed names,
    which is what its own decoder handed the core."""
    try:
        from extender.packed import PackedNames  # noqa: PLC0415 (optional in old trees)
    except ImportError:
        return lambda names: names
    return lambda names: PackedNames.of(names) or names


if __name__ == "__main__":
    raise SystemExit(main())
