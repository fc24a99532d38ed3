from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from extender.model import Reason
from extender.packed import PackedNames
from extender.policy import PolicyConfig
from testbed.builders import A100, H100, T4, agent_annotations, make_node, make_pod
from tests.unit.helpers import scheduler_with

FITS = "fits"
BUSY = "busy"  # rejected, preemption may help (FailedNodes on the wire)
UNRESOLVABLE = "unresolvable"  # rejected, preemption cannot help (FailedAndUnresolvableNodes)


@dataclass
class FilterCase:
    name: str
    pod: dict[str, Any]
    nodes: list[dict[str, Any]]
    expected: dict[str, tuple[str, str]]  # node -> (outcome, reason fragment)
    bound: list[dict[str, Any]] = field(default_factory=list)
    config: PolicyConfig = field(default_factory=PolicyConfig)


XID79 = "XID 79: GPU fell off the bus"

CASES = [
    FilterCase(
        "a GPU the node agent marked unhealthy is never free; the healthy rest still fit",
        make_pod(gpus=2),
        [make_node("g1", gpus=4, annotations=agent_annotations(4, unhealthy={3: XID79}))],
        {"g1": (FITS, "")},
        bound=[make_pod("holder", gpus=1, node="g1", gpu_ids=[0])],
    ),
    FilterCase(
        "too few healthy GPUs is unresolvable, naming the GPU and why",
        make_pod(gpus=4),
        [make_node("g1", gpus=4, annotations=agent_annotations(4, unhealthy={3: XID79}))],
        {"g1": (UNRESOLVABLE, f"GPU 3 unhealthy: {XID79} (3 healthy, pod needs 4)")},
    ),
    FilterCase(
        "enough healthy GPUs but pods hold them: busy (evicting helps)",
        make_pod(gpus=2),
        [make_node("g1", gpus=4, annotations=agent_annotations(4, unhealthy={3: XID79}))],
        {"g1": (BUSY, "fewer than 2 free GPUs")},
        bound=[make_pod("holder", gpus=2, node="g1", gpu_ids=[0, 1])],
    ),
    FilterCase(
        "gpu pod fits a node with enough free gpus",
        make_pod(gpus=2),
        [make_node("g1", gpus=4)],
        {"g1": (FITS, "")},
    ),
    FilterCase(
        "node without gpu hardware is unresolvable for a gpu pod",
        make_pod(gpus=1),
        [make_node("cpu1")],
        {"cpu1": (UNRESOLVABLE, "node has no GPUs")},
    ),
    FilterCase(
        "node without free gpu is busy, not unresolvable",
        make_pod(gpus=2),
        [make_node("g1", gpus=4)],
        {"g1": (BUSY, "fewer than 2 free GPUs")},
        bound=[make_pod("holder", gpus=3, node="g1", gpu_ids=[0, 1, 2])],
    ),
    FilterCase(
        "pods bound without gpu ids still consume gpus by count",
        make_pod(gpus=2),
        [make_node("g1", gpus=4)],
        {"g1": (BUSY, "fewer than 2 free")},
        bound=[make_pod("legacy", gpus=3, node="g1")],
    ),
    FilterCase(
        "node with fewer gpus in total than requested is unresolvable",
        make_pod(gpus=8),
        [make_node("g1", gpus=4)],
        {"g1": (UNRESOLVABLE, "node has fewer than 8 GPUs")},
    ),
    FilterCase(
        "gpu model hint matches a part of the product name, ignoring case",
        make_pod(gpus=1, model="h100"),
        [make_node("h", gpus=8, model=H100), make_node("a", gpus=8, model=A100)],
        {"h": (FITS, ""), "a": (UNRESOLVABLE, "GPU model is not h100")},
    ),
    FilterCase(
        "an exact product name matches only that product",
        make_pod(gpus=1, model="NVIDIA-A100-SXM4-40GB"),
        [
            make_node("a40", gpus=8, model="NVIDIA-A100-SXM4-40GB"),
            make_node("a80", gpus=8, model="NVIDIA-A100-SXM4-40GB-PLUS"),
        ],
        {"a40": (FITS, ""), "a80": (UNRESOLVABLE, "GPU model")},
    ),
    FilterCase(
        "gpu model hint rejects gpu nodes without a product label",
        make_pod(gpus=1, model="T4"),
        [make_node("unlabelled", gpus=2, model=""), make_node("t4", gpus=2, model=T4)],
        {"unlabelled": (UNRESOLVABLE, "GPU model"), "t4": (FITS, "")},
    ),
    FilterCase(
        "minimum gpu memory",
        make_pod(gpus=1, gpu_memory_mib=40000),
        [make_node("h", gpus=8, model=H100), make_node("t4", gpus=4, model=T4)],
        {"h": (FITS, ""), "t4": (UNRESOLVABLE, "GPU memory under 40000 MiB")},
    ),
    FilterCase(
        "cpu-intensive pod avoids nodes under the cpu threshold",
        make_pod(cpu="500m", workload="CPU-intensive"),
        [make_node("small", cpu="1500m"), make_node("big", cpu="4")],
        {"small": (UNRESOLVABLE, "CPU-intensive needs 2+ CPU nodes"), "big": (FITS, "")},
    ),
    FilterCase(
        "cpu threshold is configurable",
        make_pod(cpu="500m", workload="CPU-intensive"),
        [make_node("small", cpu="1500m")],
        {"small": (FITS, "")},
        config=PolicyConfig(cpu_intensive_min_cpu_milli=1000),
    ),
    FilterCase(
        "cpu-intensive pod needs free cpu for its request (busy)",
        make_pod(cpu="3", workload="CPU-intensive"),
        [make_node("n", cpu="4")],
        {"n": (BUSY, "under 3 CPU free")},
        bound=[make_pod("other", cpu="2", node="n")],
    ),
    FilterCase(
        "cpu-intensive pod bigger than the node is unresolvable",
        make_pod(cpu="8", workload="CPU-intensive"),
        [make_node("n", cpu="4")],
        {"n": (UNRESOLVABLE, "node has under 8 CPU")},
    ),
    FilterCase(
        "gpu-intensive pod needs gpu hardware even when it requests none",
        make_pod(workload="GPU-intensive"),
        [make_node("cpu1"), make_node("g1", gpus=1)],
        {"cpu1": (UNRESOLVABLE, "node has no GPUs"), "g1": (FITS, "")},
    ),
    FilterCase(
        "pod without gpu needs fits anywhere",
        make_pod(),
        [make_node("cpu1"), make_node("g1", gpus=1)],
        {"cpu1": (FITS, ""), "g1": (FITS, "")},
    ),
    FilterCase(
        "a node unknown to the inventory is rejected with a clear reason",
        make_pod(gpus=1),
        [make_node("g1", gpus=1)],
        {"g1": (FITS, ""), "ghost": (UNRESOLVABLE, "node not in inventory")},
    ),
    FilterCase(
        "terminated pods free their gpus",
        make_pod(gpus=4),
        [make_node("g1", gpus=4)],
        {"g1": (FITS, "")},
        bound=[make_pod("done", gpus=4, node="g1", gpu_ids=[0, 1, 2, 3], phase="Succeeded")],
    ),
    FilterCase(
        "an invalid pod is unresolvable everywhere with the reason",
        make_pod(gpus=1, gpu_memory_mib="lots"),
        [make_node("g1", gpus=1), make_node("g2", gpus=1)],
        {
            "g1": (UNRESOLVABLE, "invalid pod: annotation schedext.io/gpu-memory-mib"),
            "g2": (UNRESOLVABLE, "invalid pod"),
        },
    ),
    FilterCase(
        "the most fundamental reason wins",
        make_pod(gpus=8, model="T4"),
        [make_node("h", gpus=4, model=H100)],
        {"h": (UNRESOLVABLE, "GPU model")},
        bound=[make_pod("holder", gpus=4, node="h", gpu_ids=[0, 1, 2, 3])],
    ),
]


@pytest.mark.parametrize("packed", [False, True], ids=["names", "packed"])
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_filter(case: FilterCase, packed: bool) -> None:
    """Every case twice: names as strings, and as kube-scheduler's bytes (PackedNames)."""
    scheduler = scheduler_with(case.nodes, case.bound, case.config)
    names: Sequence[str] = list(case.expected)
    if packed:
        names = PackedNames.of(names) or pytest.fail("test names must be plain")
    verdict = scheduler.filter(case.pod, names)
    for node, (outcome, fragment) in case.expected.items():
        if outcome == FITS:
            assert node in verdict.passed
            assert node not in verdict.failed
        else:
            assert node not in verdict.passed
            assert fragment in verdict.failed[node]
            assert (node in verdict.unresolvable) == (outcome == UNRESOLVABLE)
            if outcome == UNRESOLVABLE:
                assert verdict.unresolvable[node] == verdict.failed[node]


def test_filter_keeps_the_order_of_the_input() -> None:
    scheduler = scheduler_with([make_node(f"g{i}", gpus=2) for i in range(6)])
    names = ["g3", "g0", "g5", "g1", "g4", "g2"]
    assert scheduler.filter(make_pod(gpus=1), names).passed == names


def test_reasons_do_not_name_the_node_so_kube_scheduler_can_aggregate_them() -> None:
    scheduler = scheduler_with([make_node("cpu-a"), make_node("cpu-b")])
    verdict = scheduler.filter(make_pod(gpus=1), ["cpu-a", "cpu-b"])
    assert verdict.failed["cpu-a"] == verdict.failed["cpu-b"]


@dataclass
class Step:
    change: str  # what happens to node "g" before the pod is filtered again
    node: dict[str, Any] | None  # its new object, None: deleted
    reason: str  # "" when the pod fits, else a fragment of the reason


# filter keeps what the nodes' specs alone decide per pod shape until a node changes: every
# change of spec below must be seen by the very next call.
NODE_CHANGES = [
    Step("the node as first seen", make_node("g", gpus=4, model=H100), ""),
    Step("its GPUs are replaced by A100s", make_node("g", gpus=4, model=A100), "not H100"),
    Step("it is deleted", None, "not in inventory"),
    Step("it comes back with H100s", make_node("g", gpus=4, model=H100), ""),
    Step("it shrinks to one GPU", make_node("g", gpus=1, model=H100), "fewer than 2 GPUs"),
    Step("its GPU plugin is gone", make_node("g", model=H100), "no GPUs"),
    Step("it is whole again", make_node("g", gpus=8, model=H100), ""),
]


@pytest.mark.parametrize("packed", [False, True], ids=["names", "packed"])
def test_filter_sees_every_change_of_a_nodes_spec(packed: bool) -> None:
    scheduler = scheduler_with([make_node(f"other-{i}", gpus=8, model=H100) for i in range(3)])
    names: Sequence[str] = ["g", "other-0", "other-1", "other-2"]
    if packed:
        names = PackedNames.of(names) or pytest.fail("test names must be plain")
    pod = make_pod(gpus=2, model="H100")
    for step in NODE_CHANGES:
        if step.node is None:
            scheduler.delete_node("g")
        else:
            scheduler.upsert_node(step.node)
        verdict = scheduler.filter(pod, names)
        reason = verdict.failed.get("g", "")
        assert (step.reason in reason) if step.reason else reason == "", (step.change, reason)
        assert ("g" in verdict.passed) == (not step.reason), step.change
        assert {"other-0", "other-1", "other-2"} <= set(verdict.passed)


def test_filter_stays_right_for_more_pod_shapes_than_it_keeps() -> None:
    scheduler = scheduler_with(
        [make_node(f"g{i}", gpus=8, model=H100, gpu_memory_mib=81920) for i in range(4)]
    )
    names = ["g0", "g1", "g2", "g3"]
    for round_ in range(2):  # the second round finds some shapes evicted, some kept
        for memory in range(0, 100 * 1024, 1024):  # 100 shapes
            verdict = scheduler.filter(make_pod(gpus=1, gpu_memory_mib=memory or None), names)
            fits = memory <= 81920
            assert (verdict.passed == names) is fits, (round_, memory)


def test_filter_stays_right_for_more_model_hints_than_it_keeps() -> None:
    """Pods write their model hints: what filter keeps per hint is bounded, never wrong."""
    scheduler = scheduler_with([make_node(f"g{i}", gpus=8, model=H100) for i in range(2)])
    names = ["g0", "g1"]
    hints = [f"no-such-gpu-{i}" for i in range(600)] + ["h100", "H100", "NVIDIA"]
    for round_ in range(2):
        for hint in hints:
            verdict = scheduler.filter(make_pod(gpus=1, model=hint), names)
            assert (verdict.passed == names) is (not hint.startswith("no-such")), (round_, hint)
    assert len(scheduler.inventory._models._masks) <= 256  # the bound itself


def test_reasons_are_numbered_from_0_without_gaps() -> None:
    """Filter looks a reason up by its number in a tuple (faster than Reason(code))."""
    assert sorted(r.value for r in Reason) == list(range(len(Reason)))
