"""Explain: per node, whether a pod fits and why not, over HTTP and from the CLI."""

from __future__ import annotations

import subprocess
import sys

import orjson
import pytest

from testbed.builders import (
    bound_ip_pod,
    elastic_quota,
    gang_pod,
    ip_pod,
    make_ip_claim,
    make_ip_pool,
    make_node,
    make_pod,
    make_pod_group,
    share_pod,
)
from tests.api.conftest import Serve, fixture
from tests.api.server import RunningServer


def test_explain_gives_every_nodes_verdict_for_a_pending_pod(demo: RunningServer) -> None:
    with demo.client() as client:
        client.post("/filter", content=orjson.dumps(fixture("filter_request_nodecache_true.json")))
        answer = client.get("/explain/ml/trainer-0").json()
    assert (answer["pod"], answer["state"]) == ("ml/trainer-0", "pending")
    assert answer["request"]["gpus"] == 2
    assert answer["fits"] == ["gpu-node-a"]
    by_node = {n["node"]: n for n in answer["nodes"]}
    assert len(by_node) == 11  # the demo's nodes
    assert by_node["gpu-node-b"] == {
        "node": "gpu-node-b",
        "fits": False,
        "reason": "schedext: fewer than 2 free GPUs",
        "resolvable": True,
        "score": None,
        "drift": [],
        "dra": [],  # DRA knows nothing of it: the device plugin's GPUs
    }
    # the node it fits has the score prioritize gives it, absolute (0-10)
    assert by_node["gpu-node-a"]["reason"] is None
    assert type(by_node["gpu-node-a"]["score"]) is int
    assert 1 <= by_node["gpu-node-a"]["score"] <= 10
    assert by_node["cpu-node-1"]["reason"] == "schedext: node has no GPUs"
    assert by_node["cpu-node-1"]["resolvable"] is False


def test_explain_of_a_bound_pod_says_where_it_is(demo: RunningServer) -> None:
    with demo.client() as client:
        answer = client.get("/explain/ml/llm-train-0").json()
    assert (answer["state"], answer["node"]) == ("bound", "h100-node-1")
    assert answer["request"]["gpuIds"] == [0, 1, 2, 3]
    assert answer["group"]["phase"] == "Running"


def test_explain_and_inventory_agree_on_a_pod_bound_in_the_demo(demo: RunningServer) -> None:
    """Filtered again after its bind (as one tries the verbs by hand), the pod is bound in
    both: once, explain said "reserved" while /inventory counted no reservation."""
    request = orjson.dumps(fixture("filter_request_nodecache_true.json"))
    with demo.client() as client:
        client.post("/filter", content=request)
        bind = client.post("/bind", content=orjson.dumps(fixture("bind_request.json")))
        assert bind.json() == {"Error": ""}
        client.post("/filter", content=request)
        explained = client.get("/explain/ml/trainer-0").json()
        inventory = client.get("/inventory").json()
    held = [
        gpu
        for node in inventory["nodes"]
        for gpu in node["gpus"]
        if gpu["holder"] == "ml/trainer-0"
    ]
    assert (explained["state"], explained["node"]) == ("bound", "gpu-node-a")
    assert inventory["reservations"] == 0
    assert [gpu["reserved"] for gpu in held] == [False, False]


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


RACK = "topology.kubernetes.io/rack"
HELD_15 = "schedext: address 10.20.1.15 of pool rack-a held by default/holder"
KEPT_16 = (
    "schedext: address 10.20.1.16 of pool rack-a held by default/web-0, "
    "kept by the claim of sts/default/web/0: preemption cannot free it"
)
EXHAUSTED = "schedext: IP pool rack-a exhausted"
NOT_IN_POOL = "schedext: node not in IP pool rack-a"


@pytest.mark.parametrize(
    ("pod", "asked", "expected"),
    [
        # the address a lower-priority pod without a claim holds on a1: evicting it helps there
        ("db", ("10.20.1.15", []), {"a1": (HELD_15, True), "a2": (HELD_15, False)}),
        # the address a sticky pod holds on a2 under its identity's claim: nothing helps
        ("kv", ("10.20.1.16", []), {"a1": (KEPT_16, False), "a2": (KEPT_16, False)}),
        # any address of rack-a: only the holder without a claim may make room
        ("any", (None, ["rack-a"]), {"a1": (EXHAUSTED, True), "a2": (EXHAUSTED, False)}),
    ],
)
def test_explain_of_an_ip_pod_names_the_pool_the_address_and_its_holder(
    serve: Serve,
    pod: str,
    asked: tuple[str | None, list[str]],
    expected: dict[str, tuple[str, bool]],
) -> None:
    low, high = {"priority": 10}, {"priority": 100}
    sticky = {"uid": "web-0", "policy": "sticky", "statefulset": "web", "node": "a2"}
    pool = make_ip_pool("rack-a", ranges=[("10.20.1.15", "10.20.1.16")], rack="a")
    server = serve(
        nodes=[make_node(n, labels={RACK: n[0]}) for n in ("a1", "a2", "b1")],
        pods=[
            bound_ip_pod("holder", node="a1", ip="10.20.1.15", pool="rack-a", **low),
            ip_pod("web-0", ip="10.20.1.16", pool="rack-a", **sticky, **low),
            ip_pod("db", ip="10.20.1.15", **high),
            ip_pod("kv", ip="10.20.1.16", **high),
            ip_pod("any", pool="rack-a", **high),
        ],
        groups=[
            {"kind": "IPPool", **pool},
            make_ip_claim("rack-a", "10.20.1.16", "sts/default/web/0", holder_uid="web-0"),
        ],
    )
    with server.client() as client:
        answer = client.get(f"/explain/default/{pod}").json()
    assert (answer["state"], answer["fits"]) == ("pending", [])
    assert (answer["request"]["ip"]["address"], answer["request"]["ip"]["pools"]) == asked
    by_node = {n["node"]: (n["reason"], n["resolvable"]) for n in answer["nodes"]}
    assert by_node == {**expected, "b1": (NOT_IN_POOL, False)}


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
    big = next(line.split() for line in lines if line.split()[:2] == ["big", "fits"])
    assert big[2] == "score"
    assert 0 <= int(big[3]) <= 10
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


def explain_cli(server: RunningServer, pod: str) -> list[str]:
    result = subprocess.run(
        [sys.executable, "-m", "app.cli", "explain", pod, "--url", server.url],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


def test_explain_of_a_share_pod_shows_its_share_and_each_nodes_largest_free(
    serve: Serve,
) -> None:
    server = serve(
        nodes=[make_node("small", gpus=2, gpu_memory_mib=24000), make_node("big", gpus=2)],
        pods=[
            share_pod("resident", memory_mib=16000, node="small", gpu_ids=[0]),
            make_pod("whole", gpus=1, node="small", gpu_ids=[1]),
            share_pod("infer", namespace="team", memory_mib=20000, cores=30),
        ],
    )
    with server.client() as client:
        answer = client.get("/explain/team/infer").json()
        placed = client.get("/explain/default/resident").json()
    assert {k: answer["request"][k] for k in ("shares", "shareMemoryMiB", "shareCores")} == {
        "shares": 1,
        "shareMemoryMiB": 20000,
        "shareCores": 30,
    }
    assert answer["fits"] == ["big"]
    (small,) = (n for n in answer["nodes"] if n["node"] == "small")
    assert small["reason"] == (
        "schedext: no GPU with 20000 MiB and 30% of the cores free: largest free 8000 MiB on "
        "GPU 0, most cores free 100% on GPU 0"
    )
    assert small["resolvable"] is True
    assert (placed["state"], placed["node"]) == ("bound", "small")
    assert {k: placed["request"][k] for k in ("gpuIds", "shares", "shareMemoryMiB")} == {
        "gpuIds": [0],
        "shares": 1,
        "shareMemoryMiB": 16000,
    }

    lines = explain_cli(server, "team/infer")
    assert lines[0] == "pod team/infer (pending)"
    assert "shareMemoryMiB" not in lines[1]  # the share has its own line
    assert lines[2] == "share: 20000 MiB and 30% of the cores on one GPU"
    assert any(
        line.split()[:2] == ["small", "busy"] and "largest free 8000 MiB on GPU 0" in line
        for line in lines
    )
    assert explain_cli(server, "default/resident")[2] == "share: 16000 MiB on GPU 0"


def test_explain_names_the_quota_that_holds_a_pod_back_and_metrics_show_each_quota(
    serve: Serve,
) -> None:
    server = serve(
        nodes=[make_node("g", gpus=8)],
        pods=[
            make_pod("running", namespace="team-a", gpus=2, node="g", gpu_ids=[0, 1]),
            make_pod("big", namespace="team-a", gpus=3),
        ],
        groups=[elastic_quota("team-a", min={"nvidia.com/gpu": 2, "cpu": "1"},
                              max={"nvidia.com/gpu": 4})],
    )  # fmt: skip
    with server.client() as client:
        answer = client.get("/explain/team-a/big").json()
        metrics = client.get("/metrics").text
    assert answer["quota"] == {
        "quota": "team-a/team-a",
        "resource": "nvidia.com/gpu",
        "rule": "max",
        "overBy": "1",
        "message": "schedext: quota team-a: 5 of max 4 nvidia.com/gpu",
    }
    assert answer["fits"] == ["g"]  # where it would go once the quota lets it
    labels = 'name="team-a",namespace="team-a",resource="nvidia.com/gpu"'
    assert f"schedext_quota_used{{{labels}}} 2.0" in metrics
    assert f"schedext_quota_min{{{labels}}} 2.0" in metrics
    assert f"schedext_quota_max{{{labels}}} 4.0" in metrics
    cpu = 'name="team-a",namespace="team-a",resource="cpu"'
    assert f"schedext_quota_used{{{cpu}}} 0.1" in metrics  # the running pod's 100m
    assert f"schedext_quota_min{{{cpu}}} 1.0" in metrics
    assert f"schedext_quota_max{{{cpu}}}" not in metrics  # no ceiling
    assert "held back by quota team-a/team-a (max): over by 1 nvidia.com/gpu" in explain_cli(
        server, "team-a/big"
    )


def test_a_bound_pod_filtered_again_is_bound_in_every_view(demo: RunningServer) -> None:
    """filter, bind, filter again: /inventory and explain agree that the pod is bound."""
    filter_body = orjson.dumps(fixture("filter_request_nodecache_true.json"))
    with demo.client() as client:
        client.post("/filter", content=filter_body)
        bound = client.post("/bind", content=orjson.dumps(fixture("bind_request.json"))).json()
        assert bound == {"Error": ""}
        client.post("/filter", content=filter_body)
        inventory = client.get("/inventory").json()
        answer = client.get("/explain/ml/trainer-0").json()
    assert (answer["state"], answer["node"]) == ("bound", "gpu-node-a")
    assert "ml/trainer-0" not in [p["pod"] for p in inventory["pending"]]
    assert inventory["pendingPods"] == len(inventory["pending"])


def explain_run(server: RunningServer, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "app.cli", "explain", *args, "--url", server.url],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def test_the_cli_says_what_a_pod_asks_in_words_never_a_repr(serve: Serve) -> None:
    server = serve(
        nodes=[make_node("g", gpus=2, gpu_memory_mib=24000)],
        pods=[
            share_pod("resident", namespace="team", memory_mib=16000, node="g", gpu_ids=[0]),
            make_pod("job", namespace="team", gpus=1, node="g", gpu_ids=[1]),
            make_pod("next", namespace="team", gpus=2),
        ],
    )
    share, whole, pending = (explain_cli(server, f"team/{p}") for p in ("resident", "job", "next"))
    assert share[1:3] == ["needs a share of one GPU", "share: 16000 MiB on GPU 0"]
    assert whole[1] == "needs 1 GPU (GPU 1)"
    assert pending[1].startswith("needs 2 GPUs")
    for line in (*share, *whole, *pending):
        assert "None" not in line
        assert "=" not in line
    # -n NAMESPACE with a name alone asks for the same pod
    assert explain_run(server, "job", "-n", "team").stdout.splitlines()[1] == whole[1]


def test_a_path_or_argument_that_is_not_a_pod_gets_a_clear_error(demo: RunningServer) -> None:
    with demo.client() as client:
        for path in ("/explain/ml/trainer-0/x", "/explain/ml", "/explain/ML/x"):
            response = client.get(path)
            assert response.status_code == 400, path
            assert response.json() == {
                "Error": "not a pod: give /explain/NAMESPACE/NAME, Kubernetes names"
            }
        elsewhere = client.get("/no-such-page")
    assert elsewhere.status_code == 404
    assert elsewhere.json() == {"Error": "no such path: GET /no-such-page"}
    extra = explain_run(demo, "ml/trainer-0/x")
    assert (extra.returncode, extra.stdout) == (2, "")
    assert extra.stderr == (
        "schedext explain: 'ml/trainer-0' is not a namespace name (give NAMESPACE/NAME)\n"
    )
    bare = explain_run(demo, "trainer-0")
    assert bare.returncode == 2
    assert "NAME with -n NAMESPACE" in bare.stderr
    assert "detail" not in bare.stderr + extra.stderr
