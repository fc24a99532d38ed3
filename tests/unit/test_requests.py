import re
from dataclasses import dataclass, field
from typing import Any

import pytest

from extender.config import SHARE_PRESETS, ShareResources
from extender.model import HoldingKind, WorkloadClass
from extender.names import (
    GPU_IDS,
    GPU_RESOURCE,
    GPU_SHARE_CORES,
    GPU_SHARE_MEMORY,
    SHARE_CORES_RESOURCE,
    SHARE_COUNT_RESOURCE,
    SHARE_MEMORY_RESOURCE,
)
from extender.requests import PodRequestError, gpu_ids_annotation, holding_from_pod, pod_request
from testbed.builders import container, make_pod, share_pod


@dataclass
class RequestCase:
    name: str
    pod: dict[str, Any]
    gpus: int = 0
    cpu_milli: int = 100
    memory_bytes: int = 128 * 2**20
    expect: dict[str, Any] = field(default_factory=dict)


REQUEST_CASES = [
    RequestCase("plain pod requests nothing special", make_pod()),
    RequestCase("gpus from requests", make_pod(gpus=2), gpus=2),
    RequestCase(
        "gpus given only as a limit are requested at the limit",
        {
            "metadata": {"uid": "u"},
            "spec": {"containers": [container("c", limits={"nvidia.com/gpu": "4", "cpu": "2"})]},
        },
        gpus=4,
        cpu_milli=2000,
        memory_bytes=0,
    ),
    RequestCase(
        "containers add up",
        {
            "metadata": {"uid": "u"},
            "spec": {
                "containers": [
                    container("a", requests={"cpu": "1", "nvidia.com/gpu": "1"}),
                    container(
                        "b", requests={"cpu": "500m", "nvidia.com/gpu": "2", "memory": "1Gi"}
                    ),
                ]
            },
        },
        gpus=3,
        cpu_milli=1500,
        memory_bytes=2**30,
    ),
    RequestCase(
        "a regular init container counts as the max, not the sum",
        {
            "metadata": {"uid": "u"},
            "spec": {
                "initContainers": [container("init", requests={"cpu": "4", "nvidia.com/gpu": "1"})],
                "containers": [container("main", requests={"cpu": "1", "nvidia.com/gpu": "2"})],
            },
        },
        gpus=2,
        cpu_milli=4000,
        memory_bytes=0,
    ),
    RequestCase(
        "a sidecar init container adds to the main containers and to later init containers",
        {
            "metadata": {"uid": "u"},
            "spec": {
                "initContainers": [
                    container("sidecar", requests={"cpu": "1"}, restart="Always"),
                    container("init", requests={"cpu": "2"}),
                ],
                "containers": [container("main", requests={"cpu": "1"})],
            },
        },
        cpu_milli=3000,
        memory_bytes=0,
    ),
    RequestCase(
        "pod overhead is added",
        {
            "metadata": {"uid": "u"},
            "spec": {
                "containers": [container("main", requests={"cpu": "1"})],
                "overhead": {"cpu": "250m"},
            },
        },
        cpu_milli=1250,
        memory_bytes=0,
    ),
    RequestCase(
        "pod-level resources override the container sum for cpu and memory",
        {
            "metadata": {"uid": "u"},
            "spec": {
                "containers": [container("main", requests={"cpu": "1", "nvidia.com/gpu": "1"})],
                "resources": {"requests": {"cpu": "3", "memory": "1Gi"}},
            },
        },
        gpus=1,
        cpu_milli=3000,
        memory_bytes=2**30,
    ),
    RequestCase(
        "workload class is read case-insensitively",
        make_pod(workload="cpu-intensive"),
        expect={"workload": WorkloadClass.CPU_INTENSIVE},
    ),
    RequestCase(
        "GPU model and memory hints are read from annotations",
        make_pod(gpus=1, model=" H100 ", gpu_memory_mib=40000),
        gpus=1,
        expect={"gpu_model": "H100", "gpu_memory_mib": 40000},
    ),
    RequestCase(
        "priority and preemption policy are read",
        make_pod(priority=1000, preemption_policy="Never"),
        expect={"priority": 1000, "preempt_never": True},
    ),
    RequestCase(
        "keys in any case are accepted, like Go's decoder",
        {
            "METADATA": {"Name": "p", "NameSpace": "ns", "UID": "u"},
            "Spec": {
                "Containers": [
                    {"Name": "c", "Resources": {"Requests": {"cpu": "2", "nvidia.com/gpu": "1"}}}
                ]
            },
        },
        gpus=1,
        cpu_milli=2000,
        memory_bytes=0,
        expect={"namespace": "ns", "name": "p", "uid": "u"},
    ),
]


@pytest.mark.parametrize("case", REQUEST_CASES, ids=[c.name for c in REQUEST_CASES])
def test_pod_request_is_decoded_like_kube_scheduler(case: RequestCase) -> None:
    request = pod_request(case.pod)
    assert (request.gpus, request.cpu_milli, request.memory_bytes) == (
        case.gpus,
        case.cpu_milli,
        case.memory_bytes,
    )
    for attribute, value in case.expect.items():
        assert getattr(request, attribute) == value


def test_a_custom_gpu_resource_name_is_honoured() -> None:
    pod = make_pod(gpus=3, gpu_resource="example.com/gpu")
    assert pod_request(pod, gpu_resource="example.com/gpu").gpus == 3
    assert pod_request(pod).gpus == 0


BAD_PODS = [
    (
        "fractional gpus",
        {"spec": {"containers": [container("c", requests={"nvidia.com/gpu": "500m"})]}},
        "whole number",
    ),
    (
        "unreadable cpu",
        {"spec": {"containers": [container("c", requests={"cpu": "lots"})]}},
        "'c': cpu is not a quantity: 'lots'",
    ),
    (
        "negative memory",
        {"spec": {"containers": [container("c", requests={"memory": "-1Gi"})]}},
        "must not be negative",
    ),
    (
        "non-string quantity",
        {"spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": [1]}}}]}},
        "cpu is not a quantity",
    ),
    (
        "unknown workload class",
        make_pod(workload="memory-intensive"),
        "must be CPU-intensive or GPU-intensive",
    ),
    (
        "gpu memory is not a number",
        make_pod(gpu_memory_mib="lots"),
        "schedext.io/gpu-memory-mib='lots'",
    ),
    ("gpu memory is zero", make_pod(gpu_memory_mib=0), "positive whole number"),
    (
        "gpus of more digits than Python converts to an int",
        {"spec": {"containers": [container("c", limits={"nvidia.com/gpu": "1" * 5000})]}},
        "'c': nvidia.com/gpu is not a quantity: '1111111111111111111111111111111111111111...' "
        "(5000 characters)",
    ),
    (
        "gpus over Kubernetes's range",
        {"spec": {"containers": [container("c", limits={"nvidia.com/gpu": "1e30"})]}},
        "'c': nvidia.com/gpu is out of range (over 2^63-1): '1e30'",
    ),
    (
        "gpus in digits that are not ASCII",
        {"spec": {"containers": [container("c", limits={"nvidia.com/gpu": "\u0663"})]}},
        "nvidia.com/gpu is not a quantity",
    ),
    (
        "cpu in range per container, out of range in milli-CPU",
        {"spec": {"containers": [container("c", requests={"cpu": "9223372036854775807"})]}},
        "cpu out of range",
    ),
    (
        "memory in range per container, out of range summed",
        {
            "spec": {
                "containers": [
                    container("a", requests={"memory": "8E"}),
                    container("b", requests={"memory": "8E"}),
                ]
            }
        },
        "memory out of range",
    ),
    (
        "gpu memory of more digits than Python converts to an int",
        make_pod(gpu_memory_mib="4" * 5000),
        "schedext.io/gpu-memory-mib='4444444444444444444444444444444444444444...' "
        "(5000 characters) must be a positive whole number",
    ),
    ("gpu memory in a superscript digit", make_pod(gpu_memory_mib="\u00b2"), "positive whole"),
    *(
        (
            f"priority {name}",
            {"spec": {"priority": value}},
            f"spec.priority must be a whole number (an int32, as the priority class sets it), "
            f"got {shown}",
        )
        for name, value, shown in [
            ("in words", "high", "'high'"),
            ("as a string of digits", "1000", "'1000'"),
            ("with a fraction", 1000.0, "1000.0"),
            ("a boolean", True, "True"),
            ("over int32", 2**31, "2147483648"),
            ("an object", {"value": 1}, "{'value': 1}"),
        ]
    ),
]


@pytest.mark.parametrize(
    ("pod", "message"), [(p, m) for _, p, m in BAD_PODS], ids=[n for n, _, _ in BAD_PODS]
)
def test_unreadable_pod_is_rejected_with_a_specific_reason(
    pod: dict[str, Any], message: str
) -> None:
    with pytest.raises(PodRequestError, match=re.escape(message)):
        pod_request(pod)


def test_bound_pod_holds_its_annotated_gpus() -> None:
    holding = holding_from_pod(make_pod("p", gpus=2, node="n1", gpu_ids=[3, 1], priority=5))
    assert holding is not None
    assert (holding.node, holding.gpus, holding.gpu_ids, holding.kind, holding.priority) == (
        "n1",
        2,
        (1, 3),
        HoldingKind.BOUND,
        5,
    )


@pytest.mark.parametrize(
    ("pod", "expected"),
    [
        (make_pod("pending", gpus=1), None),
        (make_pod("done", gpus=1, node="n1", phase="Succeeded"), None),
        (make_pod("failed", gpus=1, node="n1", phase="Failed"), None),
    ],
    ids=["pending pod", "succeeded pod", "failed pod"],
)
def test_pods_that_hold_nothing(pod: dict[str, Any], expected: None) -> None:
    assert holding_from_pod(pod) is expected


@pytest.mark.parametrize(("priority", "expected"), [(None, 0), (-5, -5), (2**31 - 1, 2**31 - 1)])
def test_a_pending_pods_priority_is_its_int32(priority: int | None, expected: int) -> None:
    assert pod_request(make_pod(priority=priority)).priority == expected


def test_a_bound_pod_with_an_unreadable_priority_still_holds_its_gpus() -> None:
    pod = make_pod("p", gpus=1, node="n1", gpu_ids=[0])
    pod["spec"]["priority"] = "high"
    holding = holding_from_pod(pod)
    assert holding is not None
    assert (holding.gpu_ids, holding.priority) == ((0,), 0)


def test_bound_pod_without_annotation_holds_gpus_by_count() -> None:
    holding = holding_from_pod(make_pod("p", gpus=2, node="n1"))
    assert holding is not None
    assert (holding.gpus, holding.gpu_ids) == (2, None)


def test_bound_pod_with_unreadable_resources_still_counts_its_annotated_gpus() -> None:
    pod = make_pod("p", node="n1", gpu_ids=[0], cpu="lots")
    holding = holding_from_pod(pod)
    assert holding is not None
    assert (holding.gpus, holding.gpu_ids, holding.cpu_milli) == (1, (0,), 0)


@pytest.mark.parametrize(
    ("value", "ids"),
    [
        ("0,1", (0, 1)),
        (" 3, 2 ", (2, 3)),
        ("", None),
        ("a,b", None),
        ("1,1", None),
        (None, None),
        ("-1", None),
        ("\u00b2", None),  # a digit to str.isdigit, not to int
        ("1" * 5000, None),
    ],
    ids=lambda value: repr(value)[:20],
)
def test_gpu_ids_annotation(value: str | None, ids: tuple[int, ...] | None) -> None:
    assert gpu_ids_annotation(value) == ids


# ------------------------------------------------------------------------------ GPU shares

MEM, CORES, COUNT = SHARE_MEMORY_RESOURCE, SHARE_CORES_RESOURCE, SHARE_COUNT_RESOURCE
GPU = GPU_RESOURCE
GPUSHARE, HAMI = SHARE_PRESETS["gpushare"], SHARE_PRESETS["hami"]
LENIENT = ShareResources(count_required=False)


Limits = dict[str, str] | tuple[dict[str, str], ...]


def asking(limits: Limits) -> dict[str, Any]:
    """A pending pod whose container asks for ``limits`` (requested at the limit); a tuple
    gives one container each."""
    each = limits if isinstance(limits, tuple) else (limits,)
    return {
        "metadata": {"uid": "u"},
        "spec": {"containers": [container(f"c{i}", limits=c) for i, c in enumerate(each)]},
    }


# (id, limits, share resources, (gpus, shares, MiB, cores))
SHARE_REQUESTS = [
    ("memory with a count of 1", {MEM: "3000", COUNT: "1"}, ShareResources(), (0, 1, 3000, 0)),
    ("memory and cores", {MEM: "3000", CORES: "30", COUNT: "1"}, ShareResources(),
     (0, 1, 3000, 30)),
    ("a share on 2 GPUs", {MEM: "1024", CORES: "100", COUNT: "2"}, ShareResources(),
     (0, 2, 1024, 100)),
    ("the count may be left out where it is not required: 1 GPU", {MEM: "500"}, LENIENT,
     (0, 1, 500, 0)),
    ("whole GPUs alone are no share", {GPU: "2"}, ShareResources(), (2, 0, 0, 0)),
    ("gpushare counts GiB, on one GPU (it has no count)", {"aliyun.com/gpu-mem": "10"}, GPUSHARE,
     (0, 1, 10240, 0)),
    ("HAMi: nvidia.com/gpu beside memory and cores counts shares",
     {"nvidia.com/gpumem": "3000", "nvidia.com/gpucores": "30", GPU: "2"}, HAMI, (0, 2, 3000, 30)),
    ("HAMi: nvidia.com/gpu alone counts whole GPUs", {GPU: "2"}, HAMI, (2, 0, 0, 0)),
    ("HAMi: schedext's own resources are not read", {MEM: "3000", COUNT: "1"}, HAMI,
     (0, 0, 0, 0)),
    # documented (gpu-sharing.md): 0 cores is no limit, as leaving them out, as in HAMi
    ("cores of 0 set no limit, as left out", {MEM: "3000", CORES: "0", COUNT: "1"},
     ShareResources(), (0, 1, 3000, 0)),
]  # fmt: skip


@pytest.mark.parametrize(
    ("limits", "shares", "expected"),
    [c[1:] for c in SHARE_REQUESTS],
    ids=[c[0] for c in SHARE_REQUESTS],
)
def test_a_share_request_is_decoded(
    limits: dict[str, str], shares: ShareResources, expected: tuple[int, int, int, int]
) -> None:
    request = pod_request(asking(limits), shares=shares)
    got = (request.gpus, request.share.devices, request.share.memory_mib, request.share.cores)
    assert got == expected
    assert request.devices == (expected[0] or expected[1])


# (id, limits, share resources, a fragment of the reason)
SHARE_REJECTIONS = [
    ("whole GPUs and a share in one pod", {GPU: "1", MEM: "1000", COUNT: "1"}, ShareResources(),
     f"whole GPUs ({GPU}) or shares of GPUs ({MEM}), not both"),
    ("whole GPUs and a share in two containers",
     ({GPU: "1"}, {MEM: "1000", COUNT: "1"}), ShareResources(), "split it into two pods"),
    ("cores without memory", {CORES: "30", COUNT: "1"}, ShareResources(),
     f"a GPU share needs {MEM} (the memory it may use)"),
    ("a count without memory", {COUNT: "1"}, ShareResources(), f"a GPU share needs {MEM}"),
    ("cores above 100", {MEM: "1000", CORES: "101", COUNT: "1"}, ShareResources(),
     f"{CORES} must be 1 to 100 (percent of a GPU's SMs; 0, as left out, sets no limit), "
     "got 101"),
    # once "a GPU share must name schedext.io/gpu-shares": it did, as 0
    ("a count of 0", {MEM: "1000", COUNT: "0"}, ShareResources(),
     f"{COUNT} must be at least 1 (on how many GPUs the share is), got 0"),
    ("a count of 0 where the count may be left out", {MEM: "1000", COUNT: "0"}, LENIENT,
     f"{COUNT} must be at least 1 (on how many GPUs the share is), got 0"),
    ("HAMi: nvidia.com/gpu of 0 beside memory", {"nvidia.com/gpumem": "3000", GPU: "0"}, HAMI,
     f"{GPU} must be at least 1 (on how many GPUs the share is), got 0"),
    ("negative cores", {MEM: "1000", CORES: "-5", COUNT: "1"}, ShareResources(),
     f"{CORES} must not be negative"),
    ("half a MiB", {MEM: "0.5", COUNT: "1"}, ShareResources(),
     f"{MEM} must be a whole number of MiB, got 0.5"),
    ("1500m MiB", {MEM: "1500m", COUNT: "1"}, ShareResources(),
     f"{MEM} must be a whole number of MiB, got 1.5"),
    ("fractional cores", {MEM: "1000", CORES: "500m", COUNT: "1"}, ShareResources(),
     f"{CORES} must be a whole number percent, got 0.5"),
    ("a fractional count", {MEM: "1000", COUNT: "1500m"}, ShareResources(),
     f"{COUNT} must be a whole number, got 1.5"),
    ("fractional GiB of gpushare", {"aliyun.com/gpu-mem": "0.5"}, GPUSHARE,
     "aliyun.com/gpu-mem must be a whole number of GiB, got 0.5"),
    ("the count is missing where it is required", {MEM: "1000"}, ShareResources(),
     f"a GPU share must name {COUNT} in its limits (1 for a share of one GPU)"),
    ("HAMi: memory without nvidia.com/gpu", {"nvidia.com/gpumem": "3000"}, HAMI,
     f"a GPU share must name {GPU} in its limits"),
    ("a count above 64", {MEM: "1000", COUNT: "65"}, ShareResources(),
     f"{COUNT} must be at most 64, got 65"),
    ("10Gi read as MiB", {MEM: "10Gi", COUNT: "1"}, ShareResources(),
     f"{MEM} counts MiB: 10737418240 MiB is more than any GPU has "
     f"(for 10 GiB of {MEM}, write 10240, not 10Gi)"),
    ("10Gi read as GiB (gpushare)", {"aliyun.com/gpu-mem": "10Gi"}, GPUSHARE,
     "(for 10 GiB of aliyun.com/gpu-mem, write 10, not 10Gi)"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("limits", "shares", "message"),
    [c[1:] for c in SHARE_REJECTIONS],
    ids=[c[0] for c in SHARE_REJECTIONS],
)
def test_a_share_request_that_cannot_be_understood_is_rejected_with_why(
    limits: Limits, shares: ShareResources, message: str
) -> None:
    with pytest.raises(PodRequestError) as raised:
        pod_request(asking(limits), shares=shares)
    assert message in str(raised.value)


def bound_share(annotations: dict[str, str], **resources: str) -> dict[str, Any]:
    """A pod bound to n1 asking for ``resources`` (schedext's share names by keyword:
    memory, cores, count, cpu), with ``annotations`` as bind wrote them."""
    pod = make_pod("p", node="n1", cpu=resources.pop("cpu", "100m"), annotations=annotations)
    names = {"memory": MEM, "cores": CORES, "count": COUNT}
    limits = {names[k]: v for k, v in resources.items()}
    pod["spec"]["containers"][0]["resources"]["limits"].update(limits)
    return pod


# (id, the bound pod, (shares, MiB, cores, gpu_ids))
HELD_SHARES = [
    ("the share bind wrote beside its GPU",
     share_pod("p", memory_mib=3000, cores=30, node="n1", gpu_ids=[2]), (1, 3000, 30, (2,))),
    ("the annotations win over the resources",
     bound_share({GPU_IDS: "1", GPU_SHARE_MEMORY: "2000", GPU_SHARE_CORES: "40"},
                 memory="1000", cores="10", count="1"),
     (1, 2000, 40, (1,))),
    ("unreadable resources: the annotations still count",
     bound_share({GPU_IDS: "0,3", GPU_SHARE_MEMORY: "2000"}, cpu="lots", memory="1000"),
     (2, 2000, 0, (0, 3))),
    ("a bound share without its count resource still counts (read leniently)",
     bound_share({}, memory="1000"), (1, 1000, 0, None)),
    ("the GPU indices give the count", bound_share(
        {GPU_IDS: "0,1,2", GPU_SHARE_MEMORY: "500"}, memory="500", count="1"),
     (3, 500, 0, (0, 1, 2))),
    ("cores over 100 in the annotation are capped",
     bound_share({GPU_IDS: "0", GPU_SHARE_MEMORY: "500", GPU_SHARE_CORES: "150"}),
     (1, 500, 100, (0,))),
    ("a share without gpu-ids: indices unknown",
     share_pod("p", memory_mib=4000, node="n1"), (1, 4000, 0, None)),
    # digits to str.isdigit() that int() refuses: unreadable, so the resources count
    ("annotations in digits int() cannot read: the resources count",
     bound_share({GPU_IDS: "0", GPU_SHARE_MEMORY: "\u00b2", GPU_SHARE_CORES: "1" * 5000},
                 memory="1000", cores="10", count="1"),
     (1, 1000, 10, (0,))),
]  # fmt: skip


@pytest.mark.parametrize(
    ("pod", "expected"), [c[1:] for c in HELD_SHARES], ids=[c[0] for c in HELD_SHARES]
)
def test_a_bound_share_pod_holds_its_share(
    pod: dict[str, Any], expected: tuple[int, int, int, tuple[int, ...] | None]
) -> None:
    holding = holding_from_pod(pod)
    assert holding is not None
    assert holding.gpus == 0
    got = (holding.share.devices, holding.share.memory_mib, holding.share.cores, holding.gpu_ids)
    assert got == expected
