"""Bind over real HTTP: GPU indices are chosen, re-validated and never given twice."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import orjson

from app.kube.binding import BindError
from extender.model import BindPlan
from testbed.builders import make_node, make_pod, name_of, uid_of
from tests.api.conftest import Serve, fixture
from tests.api.server import RunningServer


def filter_then_bind(client: httpx.Client, pod: dict[str, Any], node: str) -> str:
    verdict = client.post("/filter", content=orjson.dumps({"Pod": pod, "NodeNames": [node]})).json()
    assert verdict["Error"] == ""
    return bind(client, pod, node)


def bind(client: httpx.Client, pod: dict[str, Any], node: str) -> str:
    body = {"PodName": name_of(pod), "PodNamespace": "default", "PodUID": uid_of(pod), "Node": node}
    response = client.post("/bind", content=orjson.dumps(body))
    assert response.status_code == 200
    assert list(response.json()) == ["Error"]
    return str(response.json()["Error"])


def gpu_holders(client: httpx.Client) -> dict[str, list[str | None]]:
    nodes = client.get("/inventory").json()["nodes"]
    return {n["name"]: [g["holder"] for g in n["gpus"]] for n in nodes}


def test_fixture_bind_after_filter_binds_on_the_demo_inventory(demo: RunningServer) -> None:
    with demo.client() as client:
        assert client.post(
            "/filter", content=orjson.dumps(fixture("filter_request_nodecache_true.json"))
        ).json()["NodeNames"] == ["gpu-node-a"]
        response = client.post("/bind", content=orjson.dumps(fixture("bind_request.json")))
        assert response.json() == {"Error": ""}
        assert gpu_holders(client)["gpu-node-a"] == ["ml/trainer-0", "ml/trainer-0", None, None]


def test_bound_pods_get_distinct_gpus_and_the_node_fills_up(serve: Serve) -> None:
    server = serve(nodes=[make_node("g", gpus=4, groups=[[0, 1], [2, 3]])])
    pods = [make_pod(f"p{i}", gpus=2) for i in range(3)]
    with server.client() as client:
        assert filter_then_bind(client, pods[0], "g") == ""
        assert filter_then_bind(client, pods[1], "g") == ""
        assert gpu_holders(client)["g"] == ["default/p0", "default/p0", "default/p1", "default/p1"]
        verdict = client.post(
            "/filter", content=orjson.dumps({"Pod": pods[2], "NodeNames": ["g"]})
        ).json()
        assert verdict["FailedNodes"] == {"g": "schedext: fewer than 2 free GPUs"}


def test_bind_rechecks_what_filter_said(serve: Serve) -> None:
    server = serve(nodes=[make_node("g", gpus=2)])
    first, second = make_pod("a", gpus=2), make_pod("b", gpus=2)
    with server.client() as client:
        for pod in (first, second):  # both pass filter while the node is empty
            assert client.post(
                "/filter", content=orjson.dumps({"Pod": pod, "NodeNames": ["g"]})
            ).json()["NodeNames"] == ["g"]
        assert bind(client, first, "g") == ""
        assert (
            bind(client, second, "g")
            == "pod default/b no longer fits node g: schedext: fewer than 2 free GPUs"
        )


def test_bind_of_a_pod_never_filtered_is_refused(demo: RunningServer) -> None:
    with demo.client() as client:
        error = bind(client, make_pod("stranger", gpus=1), "gpu-node-a")
    assert "is unknown to schedext" in error


def test_binding_the_same_pod_twice_is_refused_with_its_node(serve: Serve) -> None:
    server = serve(nodes=[make_node("g", gpus=2)])
    pod = make_pod("p", gpus=1)
    with server.client() as client:
        assert filter_then_bind(client, pod, "g") == ""
        assert bind(client, pod, "g") == "pod default/p is already bound to node g"


class ExplodingBinder:
    """A binder whose API call fails, to check that the reservation is given back."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    async def bind(self, plan: BindPlan) -> None:  # noqa: ARG002 (fails whatever the plan)
        raise self.error


def test_failed_bind_gives_the_gpus_back(serve: Serve) -> None:
    server = serve(
        nodes=[make_node("g", gpus=2)], binder=ExplodingBinder(BindError("pod was deleted"))
    )
    with server.client() as client:
        assert filter_then_bind(client, make_pod("p", gpus=2), "g") == "pod was deleted"
        assert gpu_holders(client)["g"] == [None, None]
        assert client.get("/inventory").json()["reservations"] == 0


def test_crashing_binder_answers_an_error_and_releases(serve: Serve) -> None:
    server = serve(nodes=[make_node("g", gpus=2)], binder=ExplodingBinder(RuntimeError("boom")))
    with server.client() as client:
        error = filter_then_bind(client, make_pod("p", gpus=2), "g")
        assert error == "schedext internal error in bind (RuntimeError); see its logs"
        assert gpu_holders(client)["g"] == [None, None]
        assert client.get("/healthz").status_code == 200


def test_concurrent_binds_never_give_a_gpu_twice(serve: Serve) -> None:
    nodes = [make_node(f"g{i}", gpus=8, groups=[[0, 1, 2, 3], [4, 5, 6, 7]]) for i in range(4)]
    server = serve(nodes=nodes)
    pods = [make_pod(f"p{i}", gpus=1 + i % 3) for i in range(40)]  # 80 GPUs asked, 32 exist
    names = [f"g{i}" for i in range(4)]
    with server.client() as client:
        for pod in pods:
            client.post("/filter", content=orjson.dumps({"Pod": pod, "NodeNames": names}))

    def attempt(index: int) -> str:
        with server.client() as client:
            return bind(client, pods[index], names[index % 4])

    with ThreadPoolExecutor(max_workers=16) as pool:
        errors = list(pool.map(attempt, range(len(pods))))
    with server.client() as client:
        holders = gpu_holders(client)
    held = [h for node in holders.values() for h in node if h is not None]
    bound = {f"default/{name_of(p)}": p for p, e in zip(pods, errors, strict=True) if e == ""}
    # every GPU index has at most one holder by construction; check the counts match exactly
    for key, pod in bound.items():
        wanted = int(pod["spec"]["containers"][0]["resources"]["requests"]["nvidia.com/gpu"])
        assert held.count(key) == wanted
    assert len(held) == sum(held.count(k) for k in bound)
    assert all(e == "" or "no longer fits" in e for e in errors)
    assert 0 < len(bound) < len(pods)
    assert sum(1 for node in holders.values() for h in node if h is None) < 3  # nodes filled up
