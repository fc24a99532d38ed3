"""The informers decode only the fields schedext reads (app/kube/shapes.py). Whatever the core
derives from a pod or node must come out the same as from the fully decoded object: a field
the core starts to read and the shape drops would fail here, not silently in a cluster."""

from __future__ import annotations

import random
from typing import Any

import orjson
import pytest

from app.kube.shapes import NODE_DECODERS, POD_DECODERS
from extender.nodes import node_spec
from extender.requests import (
    PodRequestError,
    holding_from_pod,
    pod_request,
    statefulset_identity,
)
from loadtests import payloads
from testbed.builders import A100, bound_ip_pod, gang_pod, ip_pod, make_node, make_pod

pytestmark = pytest.mark.unit

SIDECAR = {
    "name": "proxy",
    "restartPolicy": "Always",
    "resources": {"requests": {"cpu": "250m", "memory": "64Mi"}},
}
INIT = {"name": "fetch", "resources": {"requests": {"cpu": "4", "nvidia.com/gpu": "1"}}}


TERM = {"labelSelector": {"matchLabels": {"app": "trainer"}}, "topologyKey": "zone"}
POD_PREF = {
    "requiredDuringSchedulingIgnoredDuringExecution": [TERM],
    "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 5, "podAffinityTerm": TERM}],
}
SELECTOR = {"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["yes"]}]}
NODE_PREF = {"preferredDuringSchedulingIgnoredDuringExecution": [
    {"weight": 10, "preference": SELECTOR}]}  # fmt: skip
REQUIRED = {
    "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [SELECTOR]}},
    "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [TERM]},
}  # fmt: skip
SPREAD = {"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule",
          "labelSelector": {"matchLabels": {"app": "trainer"}}}  # fmt: skip


def _listed(pod: dict[str, Any]) -> dict[str, Any]:
    """Add what the API server adds and schedext never reads."""
    pod = orjson.loads(orjson.dumps(pod))
    pod["metadata"]["resourceVersion"] = "42"
    pod["metadata"]["managedFields"] = [{"manager": "kubectl", "fieldsV1": {"f:spec": {}}}]
    pod["spec"]["volumes"] = [{"name": "data", "emptyDir": {}}]
    pod["spec"]["containers"][0]["env"] = [{"name": "A", "value": "1"}]
    pod.setdefault("status", {})["conditions"] = [{"type": "Ready", "status": "True"}]
    return pod


def _with_spec(pod: dict[str, Any], **spec: Any) -> dict[str, Any]:
    pod["spec"].update(spec)
    return pod


POD_CASES = {
    "pending gpu pod": make_pod("a", gpus=2, model="H100", gpu_memory_mib=40000),
    "bound with gpu ids": make_pod("b", gpus=2, node="n1", gpu_ids=[4, 5], priority=100),
    "bound without ids": make_pod("c", gpus=1, node="n1", phase="Running"),
    "finished": make_pod("d", gpus=1, node="n1", phase="Succeeded"),
    "cpu-intensive never-preempting": make_pod(
        "e", cpu="8", workload="CPU-intensive", preemption_policy="Never"
    ),
    "init and sidecar": make_pod("f", gpus=1, init_containers=[SIDECAR, INIT]),
    "overhead and pod-level resources": _with_spec(
        make_pod("g", gpus=1),
        overhead={"cpu": "100m", "memory": "10Mi"},
        resources={"requests": {"cpu": "3", "memory": "1Gi"}},
    ),
    "gang member": gang_pod("h-0", "team"),
    "sticky address of a statefulset": ip_pod(
        "web-1", pool="rack-a", policy="sticky", statefulset="web"
    ),
    "bound address": bound_ip_pod("i", node="n1", ip="10.20.1.15", pool="rack-a"),
    "unreadable quantity": make_pod("j", cpu="lots"),
    "benchmark pod": payloads.make_pod("k", gpus=2, model="A100", uid="k-uid"),
    # Of affinity and spreads only the preferences are kept: each kind, and none.
    "preferred node": _with_spec(make_pod("l", gpus=1), affinity={"nodeAffinity": NODE_PREF}),
    "preferred pod affinity": _with_spec(make_pod("m"), affinity={"podAffinity": POD_PREF}),
    "preferred anti-affinity": _with_spec(make_pod("n"), affinity={"podAntiAffinity": POD_PREF}),
    "required terms only": _with_spec(make_pod("o", gpus=1), affinity=REQUIRED),
    "a spread it may break": _with_spec(
        make_pod("p"),
        topologySpreadConstraints=[
            {**SPREAD, "whenUnsatisfiable": "DoNotSchedule"},
            {**SPREAD, "whenUnsatisfiable": "ScheduleAnyway"},
        ],
    ),
    "spreads it keeps": _with_spec(make_pod("q"), topologySpreadConstraints=[SPREAD]),
}


def _request_or_error(pod: dict[str, Any]) -> object:
    try:
        return pod_request(pod)
    except PodRequestError as error:
        return f"error: {error}"


@pytest.mark.parametrize("pod", POD_CASES.values(), ids=POD_CASES.keys())
def test_a_pod_decoded_by_its_shape_means_what_the_full_object_means(pod: dict[str, Any]) -> None:
    full = _listed(pod)
    raw = orjson.dumps(full)
    event = POD_DECODERS.event(orjson.dumps({"type": "MODIFIED", "object": full}))["object"]
    listed = POD_DECODERS.list(orjson.dumps({"metadata": {}, "items": [full]}))["items"][0]
    for shaped in (event, listed):
        assert "managedFields" not in shaped["metadata"]
        assert len(orjson.dumps(shaped)) < len(raw)
        assert holding_from_pod(shaped) == holding_from_pod(full)
        assert _request_or_error(shaped) == _request_or_error(full)
        assert statefulset_identity(shaped["metadata"]) == statefulset_identity(full["metadata"])
        assert shaped["metadata"]["resourceVersion"] == "42"


NODE_CASES = {
    "gpu node with topology": make_node("n1", gpus=8, model=A100, groups=[[0, 1, 2, 3]]),
    "cpu node": make_node("n2", cpu="4"),
    "benchmark node": payloads.make_node(7, random.Random(7)),
}


@pytest.mark.parametrize("node", NODE_CASES.values(), ids=NODE_CASES.keys())
def test_a_node_decoded_by_its_shape_means_what_the_full_object_means(
    node: dict[str, Any],
) -> None:
    shaped = NODE_DECODERS.list(orjson.dumps({"items": [node]}))["items"][0]
    assert node_spec(shaped) == node_spec(node)


def test_a_watch_error_keeps_the_status_fields_that_say_what_went_wrong() -> None:
    status = {"kind": "Status", "code": 410, "reason": "Expired", "message": "too old"}
    event = POD_DECODERS.event(orjson.dumps({"type": "ERROR", "object": status}))
    assert event == {
        "type": "ERROR",
        "object": {"code": 410, "reason": "Expired", "message": "too old"},
    }


# As kube-apiserver sends them: a 410 when a watch resumes from a compacted version, and the
# bookmark that ends the initial events (an empty object but for its resourceVersion).
GONE = {"type": "ERROR", "object": {"kind": "Status", "apiVersion": "v1", "metadata": {},
        "status": "Failure", "message": "too old resource version: 12 (340)",
        "reason": "Expired", "code": 410}}  # fmt: skip
POD_BOOKMARK = {"type": "BOOKMARK", "object": {"kind": "Pod", "apiVersion": "v1",
                "metadata": {"resourceVersion": "341"}, "spec": {"containers": None},
                "status": {}}}  # fmt: skip
NODE_BOOKMARK = {"type": "BOOKMARK", "object": {"kind": "Node", "apiVersion": "v1",
                 "metadata": {"resourceVersion": "341"}, "spec": {},
                 "status": {"daemonEndpoints": {"kubeletEndpoint": {"Port": 0}}}}}  # fmt: skip


@pytest.mark.parametrize(
    ("decoders", "event"),
    [(POD_DECODERS, GONE), (NODE_DECODERS, GONE), (POD_DECODERS, POD_BOOKMARK),
     (NODE_DECODERS, NODE_BOOKMARK)],
    ids=["pod-410", "node-410", "pod-bookmark", "node-bookmark"],
)  # fmt: skip
def test_errors_and_bookmarks_fit_the_shape_without_a_warning(
    decoders: Any, event: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    """Found by the fault soak: every 410 and every bookmark logged "unexpected shape" and
    was decoded in full, so a compaction or an idle minute filled the log with warnings."""
    decoded = decoders.event(orjson.dumps(event))
    assert not caplog.records
    assert decoded["type"] == event["type"]
    version = event["object"]["metadata"].get("resourceVersion")
    assert (decoded["object"].get("metadata") or {}).get("resourceVersion") == version
    if event["type"] == "ERROR":
        assert decoded["object"]["code"] == 410


def test_a_document_of_an_unexpected_structure_is_decoded_in_full_not_dropped() -> None:
    odd = {"type": "ADDED", "object": {"metadata": ["not", "an", "object"], "spec": {}}}
    assert POD_DECODERS.event(orjson.dumps(odd)) == odd


def test_bytes_that_are_not_json_raise_value_error() -> None:
    with pytest.raises(ValueError, match="not JSON"):
        POD_DECODERS.list(b'{"items": [')
