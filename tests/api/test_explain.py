"""Explain: per node, whether a pod fits and why not, over HTTP and from the CLI."""

from __future__ import annotations

import subprocess
import sys

import orjson

from tests.api.conftest import Serve, fixture
from tests.api.server import RunningServer
from tests.builders import gang_pod, make_node, make_pod, make_pod_group


def test_explain_gives_every_nodes_verdict_for_a_pending_pod(demo: RunningServer) -> None:
    with demo.client() as client:
        client.post("/filter", content=orjson.dumps(fixture("filter_request_nodecache_true.json")))
        answer = client.get("/explain/ml/trainer-0").json()
    assert (answer["pod"], answer["state"]) == ("ml/trainer-0", "pending")
    assert answer["request"]["gpus"] == 2
    assert answer["fits"] == ["gpu-node-a"]
    by_node = {n["node"]: n for n in answer["nodes"]}
    assert len(by_node) == 10
    assert by_node["gpu-node-b"] == {
        "node": "gpu-node-b",
        "fits": False,
        "reason": "schedext: fewer than 2 free GPUs",
        "resolvable": True,
    }
    assert by_node["cpu-node-1"]["reason"] == "schedext: node has no GPUs"
    assert by_node["cpu-node-1"]["resolvable"] is False


def test_explain_of_a_bound_pod_says_where_it_is(demo: RunningServer) -> None:
    with demo.client() as client:
        answer = client.get("/explain/ml/llm-train-0").json()
    assert (answer["state"], answer["node"]) == ("bound", "h100-node-1")
    assert answer["request"]["gpuIds"] == [0, 1, 2, 3]
    assert answer["group"]["phase"] == "Running"


def test_explain_says_why_a_gang_member_is_held_back(serve: Serve) -> None:
    member = gang_pod("m0", "train", gpus=1)
    server = serve(
        nodes=[make_node("g", gpus=4)],
        pods=[member],
        groups=[make_pod_group("train", min_member=3)],
    )
    with server.client() as client:
        answer = client.get("/explain/default/m0").json()
    assert answer["groupReason"] == "schedext: waiting for 2 more members of group default/train"
    assert answer["fits"] == []
    assert answer["group"]["phase"] == "Pending"


def test_explain_of_an_unknown_pod_is_a_clear_404(demo: RunningServer) -> None:
    with demo.client() as client:
        response = client.get("/explain/ml/ghost")
    assert response.status_code == 404
    assert response.json() == {
        "Error": "pod ml/ghost is unknown to schedext: not pending here, not bound"
    }


def test_the_cli_prints_the_explanation(serve: Serve) -> None:
    server = serve(
        nodes=[make_node("small", gpus=1), make_node("big", gpus=4)],
        pods=[make_pod("job", namespace="team", gpus=2)],
    )
    result = subprocess.run(
        [sys.executable, "-m", "app.cli", "explain", "team/job", "--url", server.url],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "pod team/job (pending)"
    assert any(line.split()[:2] == ["big", "fits"] for line in lines)
    assert any(
        line.split()[:2] == ["small", "no"] and "fewer than 2 GPUs" in line for line in lines
    )
    assert lines[-1] == "1 of 2 nodes fit"
    missing = subprocess.run(
        [sys.executable, "-m", "app.cli", "explain", "team/none", "--url", server.url],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert missing.returncode == 1
    assert "unknown to schedext" in missing.stderr
