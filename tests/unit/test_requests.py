from dataclasses import dataclass, field
from typing import Any

import pytest

from extender.model import HoldingKind, WorkloadClass
from extender.requests import PodRequestError, gpu_ids_annotation, holding_from_pod, pod_request
from tests.builders import make_pod


def container(
    name: str,
    *,
    requests: dict[str, str] | None = None,
    limits: dict[str, str] | None = None,
    restart: str | None = None,
) -> dict[str, Any]:
    c: dict[str, Any] = {
        "name": name,
        "resources": {"requests": requests or {}, "limits": limits or {}},
    }
    if restart:
        c["restartPolicy"] = restart
    return c


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
]


@pytest.mark.parametrize(
    ("pod", "message"), [(p, m) for _, p, m in BAD_PODS], ids=[n for n, _, _ in BAD_PODS]
)
def test_unreadable_pod_is_rejected_with_a_specific_reason(
    pod: dict[str, Any], message: str
) -> None:
    with pytest.raises(PodRequestError, match=message.replace("(", r"\(").replace(")", r"\)")):
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
    ],
)
def test_gpu_ids_annotation(value: str | None, ids: tuple[int, ...] | None) -> None:
    assert gpu_ids_annotation(value) == ids
