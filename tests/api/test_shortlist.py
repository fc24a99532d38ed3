"""Shortlist mode over real HTTP: filter answers the best few nodes and no rejected one, a pod
that fits nowhere still gets every reason, and bind counts whether the node kube-scheduler
chose was schedext's best."""

from __future__ import annotations

from typing import Any

import httpx
import orjson
import pytest

from testbed.builders import make_node, make_pod, name_of, uid_of
from tests.api.conftest import Serve
from tests.api.server import RunningServer

FILTER_KEYS = ["Nodes", "NodeNames", "FailedNodes", "FailedAndUnresolvableNodes", "Error"]


@pytest.fixture
def server(serve: Serve) -> RunningServer:
    """busy (6 of 8 GPUs held), half (4 of 8), idle, and full (8 of 8)."""
    held = {"busy": 6, "half": 4, "idle": 0, "full": 8}
    return serve(
        nodes=[make_node(name, gpus=8) for name in held],
        pods=[
            make_pod(f"{name}-tenant", gpus=count, node=name, gpu_ids=list(range(count)))
            for name, count in held.items()
            if count
        ],
        settings={"policy": {"shortlist": 2}},
    )


def post(client: httpx.Client, verb: str, body: Any) -> Any:
    response = client.post(f"/{verb}", content=orjson.dumps(body))
    assert response.status_code == 200, response.text
    return response.json()


def test_filter_answers_the_best_nodes_and_no_rejected_one(server: RunningServer) -> None:
    # kube-scheduler's own layout (NodeNames last), the path that keeps names as bytes
    body = {
        "Pod": make_pod("p", gpus=1),
        "Nodes": None,
        "NodeNames": ["idle", "full", "half", "busy"],
    }
    with server.client() as client:
        result = post(client, "filter", body)
    assert list(result) == FILTER_KEYS
    assert result == {
        "Nodes": None,
        "NodeNames": ["busy", "half"],
        "FailedNodes": {},
        "FailedAndUnresolvableNodes": {},
        "Error": "",
    }


def test_filter_with_whole_nodes_answers_the_shortlisted_objects(server: RunningServer) -> None:
    nodes = [make_node(name, gpus=8) for name in ("idle", "half", "busy")]
    body = {"Pod": make_pod("p", gpus=1), "Nodes": {"items": nodes}, "NodeNames": None}
    with server.client() as client:
        result = post(client, "filter", body)
    assert [n["metadata"]["name"] for n in result["Nodes"]["items"]] == ["half", "busy"]
    assert result["FailedNodes"] == {}
    assert result["NodeNames"] is None


def test_a_pod_that_fits_nowhere_gets_every_reason(server: RunningServer) -> None:
    body = {"Pod": make_pod("p", gpus=3), "NodeNames": ["busy", "full"]}
    with server.client() as client:
        result = post(client, "filter", body)
    assert result["NodeNames"] == []
    assert result["FailedNodes"] == {
        "busy": "schedext: fewer than 3 free GPUs",
        "full": "schedext: fewer than 3 free GPUs",
    }


def choices(client: httpx.Client) -> dict[str, float]:
    text = client.get("/metrics").text
    prefix = "schedext_placement_choice_total{choice="
    return {
        line[len(prefix) + 1 : line.index('"}')]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(prefix)
    }


def test_bind_counts_whether_the_chosen_node_was_the_best(server: RunningServer) -> None:
    first, second = make_pod("first", gpus=1), make_pod("second", gpus=1)
    with server.client() as client:
        for pod, node in ((first, "busy"), (second, "idle")):
            assert post(client, "filter", {"Pod": pod, "NodeNames": ["idle", "half", "busy"]})
            bind = {"PodName": name_of(pod), "PodNamespace": "default", "PodUID": uid_of(pod),
                    "Node": node}  # fmt: skip
            assert post(client, "bind", bind) == {"Error": ""}
        assert choices(client) == {"best": 1.0, "lower": 1.0}


def test_the_demo_serves_in_shortlist_mode_by_default(demo: RunningServer) -> None:
    body = {"Pod": make_pod("p", gpus=1), "NodeNames": [f"gpu-node-{x}" for x in "abcdef"]}
    with demo.client() as client:
        result = post(client, "filter", body)
        scored = client.post("/prioritize", content=orjson.dumps(body)).json()
    assert len(result["NodeNames"]) == 1
    assert result["FailedNodes"] == result["FailedAndUnresolvableNodes"] == {}
    # schedext's pick is one of its best-rated nodes: prioritize (still served) rates none above
    scores = {entry["Host"]: entry["Score"] for entry in scored}
    assert scores[result["NodeNames"][0]] == max(scores.values())
