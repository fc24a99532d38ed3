"""The wire protocol over real HTTP, with the real-shaped kube-scheduler bodies."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import orjson
import pytest

from testbed.builders import make_node, make_pod
from tests.api.conftest import Serve, fixture
from tests.api.server import RunningServer

FILTER_KEYS = ["Nodes", "NodeNames", "FailedNodes", "FailedAndUnresolvableNodes", "Error"]


def lower_keys(value: Any) -> Any:
    """Every key lower-cased, as kube-scheduler's own compatibility test does."""
    if isinstance(value, dict):
        return {k.lower(): lower_keys(v) for k, v in value.items()}
    if isinstance(value, list):
        return [lower_keys(v) for v in value]
    return value


# Fields whose keys are map keys (case-sensitive in Go), not struct field names.
MAP_FIELDS = {
    "labels",
    "annotations",
    "capacity",
    "allocatable",
    "requests",
    "limits",
    "nodeselector",
    "nodenametometavictims",
    "nodenametovictims",
}


def mixed_keys(value: Any, *, is_map: bool = False) -> Any:
    """Every struct field name in alternating case ("nOdEnAmEs"); map keys (labels, resource
    names, node names) kept as they are, since Go matches only field names in any case."""
    if isinstance(value, dict):
        return {
            (k if is_map else _alternate(k)): mixed_keys(v, is_map=k.lower() in MAP_FIELDS)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [mixed_keys(v) for v in value]
    return value


def _alternate(key: str) -> str:
    return "".join(c.upper() if i % 2 else c.lower() for i, c in enumerate(key))


Recase = Callable[[Any], Any]
RECASINGS = pytest.mark.parametrize("recase", [lower_keys, mixed_keys], ids=["lower", "mixed"])


def post(server: RunningServer, verb: str, body: Any) -> Any:
    with server.client() as client:
        response = client.post(f"/{verb}", content=orjson.dumps(body))
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/json"
    return response.json()


def test_fixture_filter_request_against_the_demo_inventory(full_demo: RunningServer) -> None:
    result = post(full_demo, "filter", fixture("filter_request_nodecache_true.json"))
    assert list(result) == FILTER_KEYS
    assert result["Nodes"] is None
    assert result["Error"] == ""
    assert result["NodeNames"] == ["gpu-node-a"]
    # each rejected node in exactly one map: busy (preemption may help) or unresolvable
    assert result["FailedNodes"] == {"gpu-node-b": "schedext: fewer than 2 free GPUs"}
    assert result["FailedAndUnresolvableNodes"] == {"gpu-node-c": "schedext: GPU model is not A100"}


def test_full_node_mode_answers_with_the_original_node_objects(full_demo: RunningServer) -> None:
    request = fixture("filter_request_nodecache_false.json")
    result = post(full_demo, "filter", request)
    assert result["NodeNames"] is None
    assert result["Nodes"] == {"metadata": {}, "items": [request["Nodes"]["items"][0]]}
    assert set(result["FailedNodes"]) == {"gpu-node-b"}
    assert set(result["FailedAndUnresolvableNodes"]) == {"gpu-node-c"}


@RECASINGS
def test_filter_keys_in_any_case_are_accepted_and_go_spelling_is_written(
    full_demo: RunningServer, recase: Recase
) -> None:
    exact = post(full_demo, "filter", fixture("filter_request_nodecache_true.json"))
    assert post(full_demo, "filter", recase(fixture("filter_request_nodecache_true.json"))) == exact


@RECASINGS
def test_full_node_filter_in_any_case_answers_with_the_nodes_as_sent(
    full_demo: RunningServer, recase: Recase
) -> None:
    request = recase(fixture("filter_request_nodecache_false.json"))
    assert request != fixture("filter_request_nodecache_false.json")
    result = post(full_demo, "filter", request)
    assert list(result) == FILTER_KEYS
    # The very objects kube-scheduler sent, in their spelling, not rebuilt from the inventory.
    items = next(v for k, v in request.items() if k.lower() == "nodes")
    sent = next(v for k, v in items.items() if k.lower() == "items")
    assert result["Nodes"] == {"metadata": {}, "items": [sent[0]]}
    assert result["NodeNames"] is None
    assert set(result["FailedNodes"]) == {"gpu-node-b"}
    assert set(result["FailedAndUnresolvableNodes"]) == {"gpu-node-c"}


@RECASINGS
@pytest.mark.parametrize(
    "name", ["prioritize_request_nodecache_true.json", "prioritize_request_nodecache_false.json"]
)
def test_prioritize_keys_in_any_case_score_as_the_go_spelling_does(
    demo: RunningServer, recase: Recase, name: str
) -> None:
    exact = post(demo, "prioritize", fixture(name))
    recased = post(demo, "prioritize", recase(fixture(name)))
    assert sorted(exact, key=lambda e: e["Host"]) == sorted(recased, key=lambda e: e["Host"])
    assert all(list(entry) == ["Host", "Score"] for entry in recased)
    # the fixture's A100 pod: only gpu-node-a and gpu-node-b have A100s, and they score
    assert {e["Host"] for e in recased if e["Score"] > 0} <= {"gpu-node-a", "gpu-node-b"}
    assert any(e["Score"] > 0 for e in recased)


@RECASINGS
def test_bind_keys_in_any_case_bind_the_pod(demo: RunningServer, recase: Recase) -> None:
    with demo.client() as client:
        verdict = client.post(
            "/filter", content=orjson.dumps(fixture("filter_request_nodecache_true.json"))
        ).json()
        assert verdict["NodeNames"] == ["gpu-node-a"]
        response = client.post("/bind", content=orjson.dumps(recase(fixture("bind_request.json"))))
        assert response.status_code == 200
        assert response.json() == {"Error": ""}
        nodes = client.get("/inventory").json()["nodes"]
    holders = {n["name"]: [g["holder"] for g in n["gpus"]] for n in nodes}
    assert holders["gpu-node-a"] == ["ml/trainer-0", "ml/trainer-0", None, None]


def test_prioritize_answers_integer_scores_for_the_hosts_above_the_lowest(
    demo: RunningServer,
) -> None:
    for name in (
        "prioritize_request_nodecache_true.json",
        "prioritize_request_nodecache_false.json",
    ):
        request = fixture(name)
        result = post(demo, "prioritize", request)
        sent = request["NodeNames"] or [n["metadata"]["name"] for n in request["Nodes"]["items"]]
        hosts = [entry["Host"] for entry in result]
        # kube-scheduler sums scores by host: each host at most once, in any order; the hosts
        # left out are those at the lowest score, which the others are lowered by
        assert len(hosts) == len(set(hosts))
        assert set(hosts) < set(sent)
        assert all(list(entry) == ["Host", "Score"] for entry in result)
        assert all(type(entry["Score"]) is int and 1 <= entry["Score"] <= 10 for entry in result)


def test_prioritize_prefers_the_fuller_node_that_fits(serve: Serve) -> None:
    server = serve(
        nodes=[make_node("busy", gpus=8), make_node("idle", gpus=8), make_node("cpu-only")],
        pods=[make_pod("b", gpus=4, node="busy", gpu_ids=[0, 1, 2, 3])],
    )
    result = post(
        server,
        "prioritize",
        {"Pod": make_pod(gpus=2), "Nodes": None, "NodeNames": ["idle", "cpu-only", "busy"]},
    )
    scores = {entry["Host"]: entry["Score"] for entry in result}
    # cpu-only scores lowest (0): left out, and nothing else lowered; idle is below busy
    assert scores.keys() == {"busy", "idle"}
    assert scores["busy"] > scores["idle"] > 0


@pytest.mark.parametrize("setting", [False, True], ids=["compact by default", "full by default"])
def test_prioritize_full_answers_every_host_its_absolute_score_as_explain_shows_it(
    serve: Serve, setting: bool
) -> None:
    server = serve(
        nodes=[make_node("busy", gpus=8), make_node("half", gpus=8), make_node("idle", gpus=8)],
        pods=[
            make_pod("b", gpus=6, node="busy", gpu_ids=[0, 1, 2, 3, 4, 5]),
            make_pod("h", gpus=4, node="half", gpu_ids=[0, 1, 2, 3]),
        ],
        settings={"server": {"prioritize_full": setting}},
    )
    pod = make_pod("p", gpus=2)
    body = orjson.dumps({"Pod": pod, "NodeNames": ["idle", "busy", "half", "ghost"]})
    with server.client() as client:
        client.post("/filter", content=body)  # explain knows the pods filter saw
        answers = {
            query: client.post(f"/prioritize{query}", content=body).json()
            for query in ("", "?full=1", "?full=true", "?full", "?full=0", "?full=false")
        }
        explained = client.get("/explain/default/p").json()
        bad = client.post("/prioritize?full=yes", content=body)
    full = answers["?full=1"]
    # every host, in the request's order, with its own score
    assert [entry["Host"] for entry in full] == ["idle", "busy", "half", "ghost"]
    scores = {entry["Host"]: entry["Score"] for entry in full}
    assert scores["busy"] > scores["half"] > scores["idle"] > scores["ghost"] == 0
    assert answers["?full=true"] == answers["?full"] == full
    # the compact answer: the hosts above the lowest, lowered by it
    lowest = min(scores.values())
    compact = {host: score - lowest for host, score in scores.items() if score > lowest}
    for query in ("?full=0", "?full=false"):
        assert {entry["Host"]: entry["Score"] for entry in answers[query]} == compact
    assert answers[""] == (full if setting else answers["?full=0"])
    # explain shows the absolute score of each node the pod fits
    assert {n["node"]: n["score"] for n in explained["nodes"] if n["fits"]} == {
        host: score for host, score in scores.items() if host != "ghost"
    }
    assert (bad.status_code, bad.json()) == (
        400,
        {"Error": "query parameter full must be 1 or 0 (or true or false), not 'yes'"},
    )


def test_prioritize_reads_names_that_need_escaping(demo: RunningServer) -> None:
    names = ['evil"node', "back\\slash", "gpu-node-a", "tab\tname"]
    result = post(demo, "prioritize", {"Pod": make_pod(gpus=1), "NodeNames": names})
    # unknown nodes score the lowest (0), so only the demo's node is listed
    assert [entry["Host"] for entry in result] == ["gpu-node-a"]


def test_filter_escapes_unknown_names_that_need_it(full_demo: RunningServer) -> None:
    names = ['evil"node', "gpu-node-a"]
    result = post(full_demo, "filter", {"Pod": make_pod(gpus=1), "NodeNames": names})
    assert result["NodeNames"] == ["gpu-node-a"]
    assert result["FailedAndUnresolvableNodes"] == {'evil"node': "schedext: node not in inventory"}
    lowered = post(
        full_demo, "filter", {"Pod": make_pod(gpus=1, workload="bogus"), "NodeNames": names}
    )
    assert set(lowered["FailedAndUnresolvableNodes"]) == set(names)
    assert lowered["FailedNodes"] == {}


def test_unknown_node_is_rejected_with_a_reason(full_demo: RunningServer) -> None:
    request = fixture("filter_request_nodecache_true.json")
    request["NodeNames"] = ["gpu-node-a", "no-such-node"]
    result = post(full_demo, "filter", request)
    assert result["NodeNames"] == ["gpu-node-a"]
    assert "node not in inventory" in result["FailedAndUnresolvableNodes"]["no-such-node"]
    assert "no-such-node" not in result["FailedNodes"]


def preempt_cluster(serve: Serve) -> RunningServer:
    return serve(
        nodes=[make_node("g1", gpus=4), make_node("g2", gpus=4)],
        pods=[
            make_pod("v1", uid="v1", gpus=2, node="g1", gpu_ids=[0, 1], priority=1),
            make_pod("v2", uid="v2", gpus=2, node="g1", gpu_ids=[2, 3], priority=2),
            make_pod("cpu", uid="cpu", cpu="4", node="g2", priority=1),
            make_pod("v3", uid="v3", gpus=4, node="g2", gpu_ids=[0, 1, 2, 3], priority=1000),
        ],
    )


def test_preempt_with_uids_keeps_only_nodes_where_the_victims_free_enough_gpus(
    serve: Serve,
) -> None:
    server = preempt_cluster(serve)
    request = {
        "Pod": make_pod("hi", gpus=4, priority=100),
        "NodeNameToVictims": None,
        "NodeNameToMetaVictims": {
            "g1": {"Pods": [{"UID": "v2"}, {"UID": "v1"}], "NumPDBViolations": 1},
            "g2": {"Pods": [{"UID": "cpu"}], "NumPDBViolations": 0},
        },
    }
    result = post(server, "preempt", request)
    assert result == {
        "NodeNameToMetaVictims": {
            "g1": {"Pods": [{"UID": "v2"}, {"UID": "v1"}], "NumPDBViolations": 1}
        }
    }


def test_preempt_with_full_pods_answers_with_uids(serve: Serve) -> None:
    server = preempt_cluster(serve)
    victims = {
        "g1": {
            "Pods": [
                make_pod("v2", uid="v2", gpus=2, node="g1", gpu_ids=[2, 3]),
                make_pod("v1", uid="v1", gpus=2, node="g1", gpu_ids=[0, 1]),
            ],
            "NumPDBViolations": 0,
        },
        "g2": {"Pods": [make_pod("cpu", uid="cpu", cpu="4", node="g2")], "NumPDBViolations": 0},
    }
    request = {
        "Pod": make_pod("hi", gpus=4, priority=100),
        "NodeNameToVictims": victims,
        "NodeNameToMetaVictims": None,
    }
    result = post(server, "preempt", request)
    assert result == {
        "NodeNameToMetaVictims": {
            "g1": {"Pods": [{"UID": "v2"}, {"UID": "v1"}], "NumPDBViolations": 0}
        }
    }
    assert post(server, "preempt", lower_keys(copy.deepcopy(request))) == result
    assert post(server, "preempt", mixed_keys(copy.deepcopy(request))) == result


def test_preempt_fixture_bodies_are_understood(demo: RunningServer) -> None:
    # kube-scheduler proposes a victim schedext does not know on gpu-node-b; what really
    # frees an A100 there is the low-priority notebook (1 GPU, beside the 1 free): its UID.
    expected = {
        "NodeNameToMetaVictims": {
            "gpu-node-b": {"Pods": [{"UID": "demo-pod-0002"}], "NumPDBViolations": 0}
        }
    }
    assert post(demo, "preempt", fixture("preempt_request_nodecache_true.json")) == expected
    assert post(demo, "preempt", fixture("preempt_request_nodecache_false.json")) == expected


@RECASINGS
def test_preempt_with_uids_in_any_case_is_read_as_the_go_spelling(
    serve: Serve, recase: Recase
) -> None:
    server = preempt_cluster(serve)
    request = {
        "Pod": make_pod("hi", gpus=4, priority=100),
        "NodeNameToVictims": None,
        "NodeNameToMetaVictims": {
            "g1": {"Pods": [{"UID": "v2"}, {"UID": "v1"}], "NumPDBViolations": 1},
            "g2": {"Pods": [{"UID": "cpu"}], "NumPDBViolations": 0},
        },
    }
    expected = {
        "NodeNameToMetaVictims": {
            "g1": {"Pods": [{"UID": "v2"}, {"UID": "v1"}], "NumPDBViolations": 1}
        }
    }
    assert post(server, "preempt", request) == expected
    # Written in Go spelling whatever came in; the PDB count read from the recased key too.
    assert post(server, "preempt", recase(copy.deepcopy(request))) == expected


@RECASINGS
def test_preempt_fixture_with_uids_in_any_case(demo: RunningServer, recase: Recase) -> None:
    exact = post(demo, "preempt", fixture("preempt_request_nodecache_true.json"))
    assert exact["NodeNameToMetaVictims"]
    assert post(demo, "preempt", recase(fixture("preempt_request_nodecache_true.json"))) == exact
