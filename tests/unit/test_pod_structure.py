"""A pending pod whose structure is not a ``v1.Pod``'s (a field of the wrong JSON type) is
refused with the field named, never read as a pod that asks for nothing: once, an integer
``schedext.io/gpu-model`` dropped the model rule and a ``spec`` that was a string sent a GPU
pod to a CPU node. A bound pod of the same shape is still counted as well as it can be."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest

from extender import names
from extender.model import Reason
from extender.requests import PodRequestError, holding_from_pod, pod_request
from testbed.builders import make_node, make_pod
from tests.unit.helpers import scheduler_with

Pod = dict[str, Any]


def gpu_pod() -> Pod:
    return make_pod("p", gpus=1, model="A100")


def changed(change: Callable[[Pod], None]) -> Pod:
    pod = gpu_pod()
    change(pod)
    return pod


def container(pod: Pod) -> dict[str, Any]:
    first: dict[str, Any] = pod["spec"]["containers"][0]
    return first


# (id, the change to a 1-GPU A100 pod, the message)
MALFORMED = [
    ("the pod's metadata is a list",
     lambda p: p.update(metadata=["p"]), "metadata must be an object, got a list"),
    ("annotations are a list",
     lambda p: p["metadata"].update(annotations=[names.GPU_MODEL]),
     "metadata.annotations must be a map of strings, got a list"),
    ("an annotation is a number: the model rule was dropped",
     lambda p: p["metadata"]["annotations"].update({names.GPU_MODEL: 100}),
     f"metadata.annotations['{names.GPU_MODEL}'] must be a string, got a number (100)"),
    ("an annotation is null",
     lambda p: p["metadata"]["annotations"].update({names.GPU_MODEL: None}),
     f"metadata.annotations['{names.GPU_MODEL}'] must be a string, got null"),
    ("labels are a string",
     lambda p: p["metadata"].update(labels="a=b"),
     "metadata.labels must be a map of strings, got a string ('a=b')"),
    ("a label is a boolean",
     lambda p: p["metadata"]["labels"].update({names.WORKLOAD_TYPE: True}),
     f"metadata.labels['{names.WORKLOAD_TYPE}'] must be a string, got a boolean (True)"),
    ("the name is a number",
     lambda p: p["metadata"].update(name=7), "metadata.name must be a string, got a number (7)"),
    ("spec is a string: the pod went to a CPU node",
     lambda p: p.update(spec="gpu"), "spec must be an object, got a string ('gpu')"),
    ("spec is a list",
     lambda p: p.update(spec=[]), "spec must be an object, got a list"),
    ("containers are an object",
     lambda p: p["spec"].update(containers={"main": container(p)}),
     "spec.containers must be a list of objects, got an object"),
    ("a container is a string",
     lambda p: p["spec"].update(containers=["main"]),
     "spec.containers[0] must be an object, got a string ('main')"),
    ("the second container is a number",
     lambda p: p["spec"]["containers"].append(3),
     "spec.containers[1] must be an object, got a number (3)"),
    ("init containers are a string",
     lambda p: p["spec"].update(initContainers="setup"),
     "spec.initContainers must be a list of objects, got a string ('setup')"),
    ("a container's resources are a list",
     lambda p: container(p).update(resources=[]),
     "container 'main': resources must be an object, got a list"),
    ("a container's limits are a string",
     lambda p: container(p)["resources"].update(limits="nvidia.com/gpu=1"),
     "container 'main': resources.limits must be an object, got a string "
     "('nvidia.com/gpu=1')"),
    ("a container's requests are a list",
     lambda p: container(p)["resources"].update(requests=[]),
     "container 'main': resources.requests must be an object, got a list"),
    ("an init container's restart policy is not a string",
     lambda p: p["spec"].update(initContainers=[{"name": "setup", "restartPolicy": 1}]),
     "container 'setup': restartPolicy must be a string, got a number (1)"),
    ("pod-level requests are a list",
     lambda p: p["spec"].update(resources={"requests": []}),
     "spec.resources.requests must be an object, got a list"),
    ("overhead is a number",
     lambda p: p["spec"].update(overhead=5), "spec.overhead must be an object, got a number (5)"),
    ("preemption policy is a boolean",
     lambda p: p["spec"].update(preemptionPolicy=False),
     "spec.preemptionPolicy must be a string, got a boolean (False)"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("change", "message"), [c[1:] for c in MALFORMED], ids=[c[0] for c in MALFORMED]
)
def test_a_malformed_pod_is_refused_with_the_field_named(
    change: Callable[[Pod], None], message: str
) -> None:
    with pytest.raises(PodRequestError, match=f"^{re.escape(message)}$"):
        pod_request(changed(change))


@pytest.mark.parametrize(
    ("change", "message"), [c[1:] for c in MALFORMED], ids=[c[0] for c in MALFORMED]
)
def test_filter_refuses_a_malformed_pod_on_every_node(
    change: Callable[[Pod], None], message: str
) -> None:
    scheduler = scheduler_with([make_node("gpu", gpus=2, model="A100"), make_node("cpu")])
    verdict = scheduler.filter(changed(change), ["gpu", "cpu"])
    assert verdict.passed == []
    [rejection] = verdict.rejections
    assert rejection.reason is Reason.INVALID_POD
    assert rejection.message == f"schedext: invalid pod: {message}"
    assert sorted(rejection.nodes) == ["cpu", "gpu"]


# What Go decodes alike: null is absent, field names match whatever their case.
WELL_FORMED = [
    ("null annotations", lambda p: p["metadata"].update(annotations=None)),
    ("null labels", lambda p: p["metadata"].update(labels=None)),
    ("null init containers", lambda p: p["spec"].update(initContainers=None)),
    ("null limits", lambda p: container(p)["resources"].update(limits=None)),
    ("a field name in another case", lambda p: p.update(Spec=p.pop("spec"))),
]


@pytest.mark.parametrize("change", [c[1] for c in WELL_FORMED], ids=[c[0] for c in WELL_FORMED])
def test_what_go_decodes_alike_is_read_alike(change: Callable[[Pod], None]) -> None:
    assert pod_request(changed(change)).gpus == 1


def test_a_bound_pod_of_a_wrong_shape_is_still_counted() -> None:
    pod = make_pod("p", gpus=1, node="n1", gpu_ids=[0])
    pod["metadata"]["labels"] = ["x"]
    pod["spec"]["containers"].append("sidecar")
    holding = holding_from_pod(pod)
    assert holding is not None
    assert (holding.node, holding.gpus, holding.gpu_ids) == ("n1", 1, (0,))
