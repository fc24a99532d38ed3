"""What the node agent publishes, as the core reads it: the versioned topology document (old
and new versions, and what is refused), GPUs held by UUID, unhealthy GPUs never chosen, and
bind writing the UUIDs beside the indices."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest

from extender import names
from extender.devices import (
    Gpu,
    GpuHealth,
    GpuUse,
    Topology,
    UseSample,
    decode_topology,
    decode_use,
    encode_topology,
    encode_use,
)
from extender.devices.document import MAX_DOCUMENT, DocumentError
from extender.nodes import node_spec
from testbed.builders import agent_annotations, make_node, make_pod
from tests.unit.helpers import scheduler_with

XID79 = "XID 79: GPU fell off the bus"


def test_a_topology_document_reads_back_as_written() -> None:
    topology = Topology(
        groups=((0, 1),),
        gpus=(
            Gpu(0, "GPU-a", "NVIDIA H100 80GB HBM3", 81559, "00000000:00:06.0", 0),
            Gpu(1, "GPU-b", health=GpuHealth(False, XID79), numa_node=None, mig_enabled=True),
        ),
        driver="580.159.04",
    )
    assert decode_topology(encode_topology(topology), 2) == topology
    assert encode_topology(topology) == encode_topology(topology)  # change = other text


@dataclass
class DocCase:
    id: str
    raw: object
    gpus: int
    error: str | None  # a fragment of the DocumentError, or None when it reads


TOPOLOGY_DOCS = [
    DocCase("version 1: groups only", {"groups": [[0, 1]]}, 2, None),
    DocCase("version 2 without gpus", {"version": 2, "groups": []}, 2, None),
    DocCase("a future version is refused whole", {"version": 3, "groups": []}, 2, "version 3"),
    DocCase("a version that is not a number", {"version": "2", "groups": []}, 2, "integer"),
    DocCase("not JSON", "{oops", 2, "not JSON"),
    DocCase("not an object", "[1, 2]", 2, "not a JSON object"),
    DocCase(
        "a GPU index out of range",
        {"version": 2, "groups": [], "gpus": [{"index": 2, "uuid": "GPU-x"}]},
        2,
        "outside 0..1",
    ),
    DocCase(
        "a GPU listed twice",
        {"version": 2, "groups": [], "gpus": [{"index": 0}, {"index": 0}]},
        2,
        "listed twice",
    ),
    DocCase(
        "an unknown health",
        {"version": 2, "groups": [], "gpus": [{"index": 0, "health": "Meh"}]},
        2,
        "Healthy or Unhealthy",
    ),
    DocCase(
        "a UUID that is not a string",
        {"version": 2, "groups": [], "gpus": [{"index": 0, "uuid": 7}]},
        2,
        "uuid",
    ),
    DocCase("too long", "x" * (MAX_DOCUMENT + 1), 2, "longer than"),
    DocCase("nested too deep", "[" * 60_000, 2, "not JSON"),
]


@pytest.mark.parametrize("case", TOPOLOGY_DOCS, ids=lambda c: c.id)
def test_topology_documents(case: DocCase) -> None:
    raw = case.raw if isinstance(case.raw, str) else json.dumps(case.raw)
    if case.error is None:
        decode_topology(raw, case.gpus)
        return
    with pytest.raises(DocumentError, match=case.error):
        decode_topology(raw, case.gpus)


USE_DOCS = [
    DocCase("a sample", {"version": 1, "at": 5, "gpus": [[0, 10, 100]]}, 1, None),
    DocCase("another version", {"version": 2, "at": 5, "gpus": []}, 1, "not supported"),
    DocCase("no time", {"version": 1, "gpus": []}, 1, "at is not a time"),
    DocCase("a short row", {"version": 1, "at": 5, "gpus": [[0, 10]]}, 1, "entry"),
    DocCase("an index out of range", {"version": 1, "at": 5, "gpus": [[3, 1, 1]]}, 1, "outside"),
]


@pytest.mark.parametrize("case", USE_DOCS, ids=lambda c: c.id)
def test_use_documents(case: DocCase) -> None:
    raw = json.dumps(case.raw)
    if case.error is None:
        assert decode_use(raw, case.gpus) == UseSample(5.0, (GpuUse(0, 10, 100),))
        return
    with pytest.raises(DocumentError, match=case.error):
        decode_use(raw, case.gpus)


def test_use_is_clamped_to_percent_and_encodes_compactly() -> None:
    sample = decode_use(json.dumps({"version": 1, "at": 1, "gpus": [[0, 250, -5]]}), 1)
    assert sample.gpus == (GpuUse(0, 100, 0),)
    assert encode_use(sample) == '{"version":1,"at":1,"gpus":[[0,100,0]]}'


def test_node_spec_reads_the_agents_uuids_health_and_groups() -> None:
    annotations = agent_annotations(4, groups=[[0, 1], [2, 3]], unhealthy={2: XID79})
    spec = node_spec(make_node("g", gpus=4, annotations=annotations))
    assert spec.gpu_groups == ((0, 1), (2, 3))
    assert spec.gpu_uuids == ("GPU-n-0", "GPU-n-1", "GPU-n-2", "GPU-n-3")
    assert spec.gpu_unhealthy == ((2, XID79),)
    assert (spec.gpu_healthy, spec.topology_problem) == (3, None)


def test_an_unreadable_document_is_no_topology_and_is_reported() -> None:
    future = {names.GPU_TOPOLOGY: json.dumps({"version": 9, "groups": [[0, 1]]})}
    scheduler = scheduler_with([make_node("g", gpus=2, annotations=future)])
    view = scheduler.inventory.node("g")
    assert view is not None
    assert view.spec.gpu_groups == ()
    assert view.spec.gpu_unhealthy == ()
    assert view.free_gpu_ids == (0, 1)  # the node stays usable
    assert scheduler.inventory.problems == {
        "g": (f"{names.GPU_TOPOLOGY}: version 9 is not supported (this schedext reads 1 and 2)",)
    }
    scheduler.upsert_node(make_node("g", gpus=2))
    assert scheduler.inventory.problems == {}


def test_bind_never_chooses_an_unhealthy_gpu_and_writes_the_uuids() -> None:
    annotations = agent_annotations(4, groups=[[0, 1], [2, 3]], unhealthy={0: XID79})
    scheduler = scheduler_with([make_node("g", gpus=4, annotations=annotations)])
    pod = make_pod("p", gpus=2)
    scheduler.filter(pod, ["g"])
    uid = pod["metadata"]["uid"]
    plan = scheduler.plan_bind(uid=uid, namespace="default", name="p", node="g", now=0.0)
    assert plan.gpu_ids == (2, 3)  # the whole healthy group, not 1 beside the broken 0
    assert plan.annotations[names.GPU_UUIDS] == "GPU-n-2,GPU-n-3"


def test_a_gpu_turned_unhealthy_under_a_pod_stays_the_pods() -> None:
    node = make_node("g", gpus=2)
    scheduler = scheduler_with([node], [make_pod("a", gpus=1, node="g", gpu_ids=[0])])
    sick = make_node("g", gpus=2, annotations=agent_annotations(2, unhealthy={0: XID79}))
    scheduler.upsert_node(sick)
    view = scheduler.inventory.node("g")
    assert view is not None
    assert view.holders[0] is not None
    assert view.free_gpu_ids == (1,)


def test_a_pod_holds_its_gpus_by_uuid_when_the_indices_moved() -> None:
    # Bound on GPUs GPU-n-2 and GPU-n-3 (then indices 2,3); after a reboot the node numbers
    # them 0 and 1: the holding follows the UUIDs.
    moved = agent_annotations(4, uuids=["GPU-n-2", "GPU-n-3", "GPU-n-0", "GPU-n-1"])
    pod = make_pod(
        "a",
        gpus=2,
        node="g",
        gpu_ids=[2, 3],
        annotations={names.GPU_UUIDS: "GPU-n-2,GPU-n-3"},
    )
    scheduler = scheduler_with([make_node("g", gpus=4, annotations=moved)], [pod])
    view = scheduler.inventory.node("g")
    assert view is not None
    assert view.free_gpu_ids == (2, 3)
    assert view.holders[0] == view.holders[1] == pod["metadata"]["uid"]
