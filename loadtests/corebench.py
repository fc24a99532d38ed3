"""The core alone, for ``loadtests.bench``: filter and prioritize timed in-process, without
HTTP and JSON, on the data the benchmark sends its servers.

The benchmark runs this file as a script (not ``-m``), one process per source tree, with
``PYTHONPATH`` set to that checkout: ``extender`` is then imported from it, and both trees'
core figures come from this same code. So it imports nothing of the repository but
``extender``, and of it only API that has long been stable (``Scheduler()``,
``replace_nodes``, ``replace_pods``, ``filter``, ``prioritize``, ``PackedNames.of``, and
``replace_quotas`` and the relists of DRA's kinds where the tree has them): the baseline may be
an older or a newer tree. DeviceClasses, ResourceSlices and ResourceClaims in the cluster go
through the relists the service's list+watch commits a first list with (app/service/cluster.py).

    python loadtests/corebench.py INPUT.json

INPUT.json: ``{"cluster": {"items": [...]}, "pod": {...}, "orders": [[name, ...], ...],
"passed": [[name, ...], ...]}`` (``passed[k]``: filter's answer to ``orders[k]``). Once the
scheduler holds the cluster it prints one JSON line: where ``extender`` was imported from and
whether its compiled part was there. Then, for every line N read from stdin, it runs N rounds
(filter then prioritize, cycling through the node orders) and prints one JSON line with the
ms of every call per verb; it exits at the end of stdin. Rounds come in batches so that the
benchmark can alternate two trees' processes batch by batch, as it alternates their servers.
"""

from __future__ import annotations

import importlib.util
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import orjson

import extender
from extender.scheduler import Scheduler

Packer = Callable[[list[str]], Sequence[str]]
# DRA's kinds and the Scheduler's relist of each, in the order they are committed.
DRA_RELISTS = (
    ("DeviceClass", "device_class_relist"),
    ("ResourceSlice", "resource_slice_relist"),
    ("ResourceClaim", "resource_claim_relist"),
)


def main(argv: Sequence[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    if len(args) != 1:
        print("usage: python loadtests/corebench.py INPUT.json", file=sys.stderr)
        return 2
    data = orjson.loads(Path(args[0]).read_bytes())
    core = Core(data["cluster"], data["pod"], data["orders"], data["passed"])
    _say(
        {
            "extender": str(Path(extender.__file__).resolve().parent),
            "compiled": importlib.util.find_spec("extender._packed") is not None,
        }
    )
    for line in sys.stdin:
        _say(core.run(int(line)))
    return 0


class Core:
    """A scheduler holding the cluster, and the requests to time against it. The names are
    packed, as the service's decoder packs kube-scheduler's (extender.packed)."""

    def __init__(
        self,
        cluster: dict[str, Any],
        pod: dict[str, Any],
        orders: list[list[str]],
        passed: list[list[str]],
    ) -> None:
        pack = _packer()
        self.pod = pod
        self.orders = [pack(o) for o in orders]
        self.passed = [pack(p) for p in passed]
        self.scheduler = Scheduler()
        items = cluster["items"]
        self.scheduler.replace_nodes([i for i in items if i["kind"] == "Node"])
        self.scheduler.replace_pods([i for i in items if i["kind"] == "Pod"])
        # A tree from before team quotas has no replace_quotas: it times the cluster alone.
        replace_quotas = getattr(self.scheduler, "replace_quotas", None)
        if replace_quotas is not None:
            replace_quotas([i for i in items if i["kind"] == "ElasticQuota"])
        for kind, relist_name in DRA_RELISTS:
            objects = [i for i in items if i["kind"] == kind]
            # A tree from before DRA has no such relist: it times the cluster without them.
            relist = getattr(self.scheduler, relist_name, None)
            if objects and relist is not None:
                batch = relist()
                batch.add(objects)
                batch.commit()
        self.round = 0  # the node orders cycle on across batches

    def run(self, rounds: int) -> dict[str, list[float]]:
        """ms of every call, per verb, over ``rounds`` rounds."""
        times: dict[str, list[float]] = {"filter": [], "prioritize": []}
        for _ in range(rounds):
            k = self.round % len(self.orders)
            self.round += 1
            started = time.perf_counter_ns()
            self.scheduler.filter(self.pod, self.orders[k])
            times["filter"].append((time.perf_counter_ns() - started) / 1e6)
            started = time.perf_counter_ns()
            self.scheduler.prioritize(self.pod, self.passed[k])
            times["prioritize"].append((time.perf_counter_ns() - started) / 1e6)
        return times


def _packer() -> Packer:
    """PackedNames.of where the tree has it; plain lists in a tree from before packed names,
    which is what its own decoder handed the core."""
    try:
        from extender.packed import PackedNames  # noqa: PLC0415 (optional in old trees)
    except ImportError:
        return lambda names: names
    return lambda names: PackedNames.of(names) or names


def _say(message: object) -> None:
    sys.stdout.write(orjson.dumps(message).decode() + "\n")
    sys.stdout.flush()  # the benchmark waits for this line


if __name__ == "__main__":
    raise SystemExit(main())
