"""The inventory over real HTTP with GPU shares: ``GET /inventory`` per GPU (whole holders,
shares and who holds them) and the share gauges of ``GET /metrics``; per node its IP pools
and MIG devices, and the pending pods with what they ask for."""

from __future__ import annotations

from typing import Any

import httpx
import orjson
import pytest

from app.service.routes.inventory import PENDING_LISTED
from testbed.builders import (
    A100,
    H100,
    gang_pod,
    ip_pod,
    make_ip_pool,
    make_node,
    make_pod,
    make_pod_group,
    name_of,
    share_pod,
    uid_of,
)
from tests.api.conftest import Serve
from tests.api.server import RunningServer
from tests.mig_builders import mig_node, mig_pod, mig_uuid

# g: 4 GPUs of 40000 MiB. GPU 0: two shares; GPUs 1-2: one pod's share on each; GPU 3 whole.
NODES = [
    make_node("g", gpus=4, gpu_memory_mib=40000, model=A100),
    make_node("h", gpus=2, model=H100),  # nothing shared: every GPU free
    make_node("cpu"),
]
PODS = [
    share_pod("infer-a", namespace="serving", memory_mib=10000, cores=30, node="g", gpu_ids=[0]),
    share_pod("infer-b", namespace="serving", memory_mib=12000, node="g", gpu_ids=[0]),
    share_pod("pair", namespace="ml", memory_mib=5000, shares=2, node="g", gpu_ids=[1, 2]),
    make_pod("whole", namespace="ml", gpus=1, node="g", gpu_ids=[3]),
]


def gpus_of(server: RunningServer, node: str) -> list[dict[str, Any]]:
    with server.client() as client:
        nodes = {n["name"]: n for n in client.get("/inventory").json()["nodes"]}
    return list(nodes[node]["gpus"])


@pytest.fixture
def shared(serve: Serve) -> RunningServer:
    return serve(nodes=NODES, pods=PODS)


def test_a_shared_gpu_shows_what_its_shares_hold_and_who_holds_them(
    shared: RunningServer,
) -> None:
    with shared.client() as client:
        nodes = {n["name"]: n for n in client.get("/inventory").json()["nodes"]}
    gpus = nodes["g"]["gpus"]
    assert [g["share"] for g in gpus] == [
        {
            "memoryMiB": 22000,
            "cores": 30,
            "memoryFreeMiB": 18000,
            "pods": [
                {"pod": "serving/infer-a", "memoryMiB": 10000, "cores": 30, "reserved": False},
                {"pod": "serving/infer-b", "memoryMiB": 12000, "cores": 0, "reserved": False},
            ],
        },
        *[
            {
                "memoryMiB": 5000,
                "cores": 0,
                "memoryFreeMiB": 35000,
                "pods": [{"pod": "ml/pair", "memoryMiB": 5000, "cores": 0, "reserved": False}],
            }
        ]
        * 2,
        None,  # held whole: no share
    ]
    # Whole holders as before: a shared GPU has none, and is not free for a whole-GPU pod.
    assert [g["holder"] for g in gpus] == [None, None, None, "ml/whole"]
    assert (nodes["g"]["freeGpus"], nodes["g"]["sharedGpus"]) == (0, 3)
    assert [g["share"] for g in nodes["h"]["gpus"]] == [None, None]
    assert (nodes["h"]["freeGpus"], nodes["h"]["sharedGpus"]) == (2, 0)
    assert (nodes["cpu"]["gpus"], nodes["cpu"]["sharedGpus"]) == ([], 0)


def test_a_share_bound_over_http_appears_on_the_device_it_was_given(
    shared: RunningServer,
) -> None:
    pod = share_pod("new", memory_mib=8000, cores=20)
    with shared.client() as client:
        verdict = client.post("/filter", content=orjson.dumps({"Pod": pod, "NodeNames": ["g"]}))
        assert verdict.json()["NodeNames"] == ["g"]
        body = {"PodName": name_of(pod), "PodNamespace": "default", "PodUID": uid_of(pod)}
        bound = client.post("/bind", content=orjson.dumps({**body, "Node": "g"}))
        assert bound.json() == {"Error": ""}
    holding = [
        (g["index"], p)
        for g in gpus_of(shared, "g")
        for p in (g["share"] or {}).get("pods", [])
        if p["pod"] == "default/new"
    ]
    assert len(holding) == 1
    index, entry = holding[0]
    assert (entry["memoryMiB"], entry["cores"]) == (8000, 20)
    share = gpus_of(shared, "g")[index]["share"]
    assert share["memoryMiB"] + share["memoryFreeMiB"] == 40000


def scrape(server: RunningServer) -> dict[str, float]:
    """Every sample of ``/metrics`` by its name and labels, as exposed."""
    text = httpx.get(f"{server.url}/metrics", timeout=10).text
    samples = (line.rsplit(" ", 1) for line in text.splitlines() if not line.startswith("#"))
    return {series: float(value) for series, value in samples}


def test_share_gauges_count_memory_held_and_free_and_the_shared_devices(
    shared: RunningServer,
) -> None:
    metrics = scrape(shared)
    found = {
        series: value
        for series, value in metrics.items()
        if series.startswith(("schedext_gpu_share_memory_mib", "schedext_gpu_shared_devices"))
    }
    assert found == {
        # A100 (g): 22000 + 5000 + 5000 MiB held; free for a share on GPUs 0-2 (GPU 3 is held
        # whole): 18000 + 35000 + 35000.
        f'schedext_gpu_share_memory_mib{{model="{A100}",state="held"}}': 32000,
        f'schedext_gpu_share_memory_mib{{model="{A100}",state="free"}}': 88000,
        f'schedext_gpu_shared_devices{{model="{A100}"}}': 3,
        # H100 (h): nothing shared; both empty devices take shares.
        f'schedext_gpu_share_memory_mib{{model="{H100}",state="held"}}': 0,
        f'schedext_gpu_share_memory_mib{{model="{H100}",state="free"}}': 2 * 81559,
        f'schedext_gpu_shared_devices{{model="{H100}"}}': 0,
    }


def test_share_gauges_agree_with_the_inventory_node_by_node(serve: Serve) -> None:
    """Many nodes of two models and different widths, shares and whole pods mixed: the
    gauges (from the columns and the device grid) equal the sums over /inventory's GPUs."""
    nodes, pods = [], []
    for n in range(60):
        model, width = (H100, 8) if n % 3 else (A100, 4)
        nodes.append(make_node(f"n{n}", gpus=width, model=model))
        for index in range(n % width):
            if (n + index) % 4 == 0:
                pods.append(make_pod(f"w{n}-{index}", gpus=1, node=f"n{n}", gpu_ids=[index]))
            else:
                for k in range(1 + (n + index) % 3):
                    pods.append(
                        share_pod(
                            f"s{n}-{index}-{k}",
                            memory_mib=1000 * (1 + (n * 7 + index + k) % 9),
                            cores=(n + k) % 2 * 10 or None,
                            node=f"n{n}",
                            gpu_ids=[index],
                        )
                    )
    server = serve(nodes=nodes, pods=pods)
    with server.client() as client:
        listed = client.get("/inventory").json()["nodes"]
    metrics = scrape(server)
    for model in (A100, H100):
        gpus = [g for n in listed if n["gpuModel"] == model for g in n["gpus"]]
        shares = [g["share"] for g in gpus if g["share"]]
        held = sum(s["memoryMiB"] for s in shares)
        memory = next(n["gpuMemoryMiB"] for n in listed if n["gpuModel"] == model)
        # Free for a share: what shared devices have left, and every empty device whole.
        empty = sum(1 for g in gpus if g["holder"] is None and g["share"] is None)
        free = sum(s["memoryFreeMiB"] for s in shares) + empty * memory
        assert held > 0
        assert len(shares) > 0
        assert metrics[f'schedext_gpu_share_memory_mib{{model="{model}",state="held"}}'] == held
        assert metrics[f'schedext_gpu_share_memory_mib{{model="{model}",state="free"}}'] == free
        assert metrics[f'schedext_gpu_shared_devices{{model="{model}"}}'] == len(shares)


def test_each_node_names_its_pools_and_mig_devices_and_pending_pods_say_what_they_ask(
    serve: Serve,
) -> None:
    rack = "topology.kubernetes.io/rack"
    server = serve(
        nodes=[
            make_node("a", gpus=2, labels={rack: "r1"}),
            mig_node("m", migs={0: ["1g.10gb", "1g.10gb", "2g.20gb"]}, labels={rack: "r2"}),
            make_node("cpu"),
        ],
        pods=[
            mig_pod("slice", {"1g.10gb": 1}, node="m", mig_uuids=[mig_uuid("m", 0, 0)]),
            make_pod("trainer", namespace="ml", gpus=2, model="H100"),
            ip_pod("web", namespace="serving", pool="r1"),
            share_pod("infer", namespace="serving", memory_mib=8000),
            mig_pod("tiny", {"2g.20gb": 1}, namespace="ml"),
            gang_pod("g-0", "pair", namespace="ml", gpus=1),
        ],
        groups=[
            {"kind": "IPPool", **make_ip_pool("r1", cidr="10.0.1.0/28", rack="r1")},
            {"kind": "IPPool", **make_ip_pool("any", cidr="10.0.9.0/28")},
            make_pod_group("pair", namespace="ml", min_member=2),
        ],
    )
    with server.client() as client:
        body = client.get("/inventory").json()
    nodes = {n["name"]: n for n in body["nodes"]}
    assert {name: n["pools"] for name, n in nodes.items()} == {
        "a": ["any", "r1"],
        "m": ["any"],
        "cpu": ["any"],
    }
    assert nodes["m"]["mig"] == {
        "1g.10gb": {"devices": 2, "free": 1},
        "2g.20gb": {"devices": 1, "free": 1},
    }
    assert nodes["a"]["mig"] == {}
    assert body["pendingPods"] == 5
    pending = {p["pod"]: p for p in body["pending"]}
    assert list(pending) == ["ml/g-0", "ml/tiny", "ml/trainer", "serving/infer", "serving/web"]
    asks = {
        key: (p["gpus"], p["shares"], p["shareMemoryMiB"], p["mig"], p["gpuModel"], p["group"])
        for key, p in pending.items()
    }
    assert asks == {
        "ml/g-0": (1, 0, 0, {}, None, "ml/pair"),
        "ml/tiny": (0, 0, 0, {"2g.20gb": 1}, None, None),
        "ml/trainer": (2, 0, 0, {}, "H100", None),
        "serving/infer": (0, 1, 8000, {}, None, None),
        "serving/web": (0, 0, 0, {}, None, None),
    }
    assert (pending["serving/web"]["pools"], pending["serving/web"]["address"]) == (["r1"], None)
    assert (pending["ml/trainer"]["namespace"], pending["ml/trainer"]["name"]) == ("ml", "trainer")


def test_the_pending_list_is_bounded_and_the_count_is_not(serve: Serve) -> None:
    waiting = PENDING_LISTED + 7
    server = serve(
        nodes=[make_node("a", gpus=1)],
        pods=[make_pod(f"p{i:04d}", gpus=1) for i in range(waiting)],
    )
    with server.client() as client:
        body = client.get("/inventory").json()
    assert body["pendingPods"] == waiting
    assert [p["pod"] for p in body["pending"]] == [
        f"default/p{i:04d}" for i in range(PENDING_LISTED)
    ]
