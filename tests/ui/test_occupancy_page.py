"""The occupancy page in headless Chromium: what its script draws from ``GET /inventory``
(node cards with GPU cells by holder and NVLink group, IP pools, gangs), checked by
structure, not by pixels."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from fastapi import FastAPI, Response

from app.service.routes import ui
from extender import names
from extender.devices.drift import Cause, Drift, InUse, StaleRecord
from testbed.builders import (
    A100,
    H100,
    T4,
    agent_annotations,
    bound_ip_pod,
    elastic_quota,
    gang_pod,
    make_ip_pool,
    make_node,
    make_pod,
    make_pod_group,
    name_of,
    uid_of,
)
from tests.api.server import RunningServer, running
from tests.ui.browser import dump_dom, read_png, screenshot
from tests.ui.conftest import ServeSnapshot, snapshot_server
from tests.ui.dom import Element, parse

RACK = "topology.kubernetes.io/rack"

NODES = [
    make_node(
        "h100-a", gpus=8, model=H100, groups=[[0, 1, 2, 3], [4, 5, 6, 7]], labels={RACK: "r1"}
    ),
    make_node("a100-b", gpus=4, model=A100, groups=[[0, 1], [2, 3]], labels={RACK: "r1"}),
    make_node("t4-c", gpus=4, model=T4, labels={RACK: "r2"}),  # no NVLink topology
    make_node("cpu-d", labels={RACK: "r2"}),
]
NVLINK_GROUPS = {"h100-a": [[0, 1, 2, 3], [4, 5, 6, 7]], "a100-b": [[0, 1], [2, 3]]}
GPU_COUNT = {"h100-a": 8, "a100-b": 4, "t4-c": 4, "cpu-d": 0}

PODS = [
    gang_pod("trainer-0", "trainer", namespace="ml", gpus=4, node="h100-a", gpu_ids=[0, 1, 2, 3]),
    gang_pod("trainer-1", "trainer", namespace="ml", gpus=2, node="h100-a", gpu_ids=[4, 5]),
    gang_pod("trainer-2", "trainer", namespace="ml", gpus=2),  # not placed yet
    bound_ip_pod(
        "inference", namespace="serving", node="a100-b", ip="10.20.1.10", pool="r1",
        gpus=2, gpu_ids=[0, 1],
    ),
    bound_ip_pod(
        "notebook", namespace="research", node="a100-b", ip="10.20.1.11", pool="r1",
        gpus=1, gpu_ids=[3],
    ),
    make_pod("legacy", gpus=1, node="t4-c"),  # bound without schedext's GPU annotation
]  # fmt: skip
GROUPS = [
    make_pod_group("trainer", namespace="ml", min_member=3),
    {"kind": "IPPool", **make_ip_pool("r1", ranges=[("10.20.1.10", "10.20.1.29")], rack="r1")},
    {"kind": "IPPool", **make_ip_pool("r2", ranges=[("10.20.2.10", "10.20.2.19")], rack="r2")},
    # ml's trainers hold 6 GPUs: 2 borrowed over its min; memory named in max alone.
    elastic_quota("ml", min={"nvidia.com/gpu": 4}, max={"nvidia.com/gpu": 8, "memory": "1Gi"}),
]


def bound_gpus(pods: list[dict[str, Any]]) -> dict[tuple[str, int], str]:
    """(node, GPU index) -> holder pod, from the pods' ``schedext.io/gpu-ids`` annotations."""
    held: dict[tuple[str, int], str] = {}
    for pod in pods:
        ids = pod["metadata"]["annotations"].get(names.GPU_IDS)
        if ids:
            key = f"{pod['metadata']['namespace']}/{name_of(pod)}"
            for index in ids.split(","):
                held[pod["spec"]["nodeName"], int(index)] = key
    return held


def render(server: RunningServer, workdir: Path) -> Element:
    return parse(dump_dom(f"{server.url}/ui", workdir))


@pytest.fixture(scope="module")
def drawn_page(tmp_path_factory: pytest.TempPathFactory) -> Callable[[], Element]:
    """The page for the snapshot above, drawn once on first use; the tests only read it.
    Drawn inside the first test, not here, so that a missing Chromium fails that test."""

    @functools.cache
    def draw() -> Element:
        workdir = tmp_path_factory.mktemp("occupancy")
        with snapshot_server(workdir, nodes=NODES, pods=PODS, groups=GROUPS) as server:
            return render(server, workdir)

    return draw


def cards_by_node(page: Element) -> dict[str, Element]:
    return {card["data-node"]: card for card in page.all("node-card")}


def cell_indices(container: Element) -> list[int]:
    return [int(cell["data-index"]) for cell in container.all("gpu-cell")]


def test_every_gpu_node_is_a_card_with_one_cell_per_gpu(
    drawn_page: Callable[[], Element],
) -> None:
    page = drawn_page()
    cards = cards_by_node(page)
    gpu_nodes = [node for node, count in GPU_COUNT.items() if count]
    assert sorted(cards) == sorted(gpu_nodes)
    for node in gpu_nodes:
        assert sorted(cell_indices(cards[node])) == list(range(GPU_COUNT[node])), node
    assert "NVIDIA-H100-80GB-HBM3" in cards["h100-a"].one("gpu-model").text()
    assert cards["h100-a"].one("gpu-free").text() == "2/8 GPUs free"
    assert cards["a100-b"].one("gpu-free").text() == "1/4 GPUs free"
    assert cards["h100-a"].one("node-pools").text() == "IP pools: r1"


def test_cpu_only_nodes_are_listed_apart_in_a_folded_table(
    drawn_page: Callable[[], Element],
) -> None:
    page = drawn_page()
    (row,) = page.all("cpu-node-row")
    assert row["data-node"] == "cpu-d"
    assert row.one("cpu-node-cpu").text() == "32/32 cores"  # nothing runs there
    assert row.one("cpu-node-pools").text() == "r2"
    section = page.by_id("cpu-nodes-section")
    assert section.tag == "details"
    assert section.get("open") is None  # folded until asked for
    assert page.by_id("cpu-nodes-shown").text() == "1"


def test_a_summary_per_gpu_model_counts_nodes_and_gpus(drawn_page: Callable[[], Element]) -> None:
    page = drawn_page()
    rows = {row["data-model"]: row for row in page.all("model-row")}
    counts = {
        model: tuple(row[f"data-{k}"] for k in ("nodes", "gpus", "free", "unhealthy", "shared"))
        for model, row in rows.items()
    }
    assert counts == {
        A100: ("1", "4", "1", "0", "0"),
        H100: ("1", "8", "2", "0", "0"),
        T4: ("1", "4", "3", "0", "0"),
    }
    assert rows[H100].one("model-mig").text() == "\u2013"  # no MIG: a dash, not "none"
    assert (
        page.by_id("cpu-count").text() == "CPU-only nodes: 1 (listed apart, below the GPU nodes)."
    )


def test_the_pending_pods_are_listed_each_linked_to_its_explanation(
    drawn_page: Callable[[], Element],
) -> None:
    page = drawn_page()
    (row,) = page.all("pending-row")
    assert (row["data-pod"], row["data-group"]) == ("ml/trainer-2", "ml/trainer")
    link = row.one("explain-link")
    assert (link["href"], link.text()) == ("/explain/ml/trainer-2", "ml/trainer-2")
    assert row.one("pending-asks").text() == "2 GPUs"
    assert page.by_id("no-pending").get("hidden") is not None


def test_held_cells_name_the_bound_pods_by_their_gpu_ids(drawn_page: Callable[[], Element]) -> None:
    page = drawn_page()
    drawn = {
        (card["data-node"], int(cell["data-index"])): cell["data-holder"]
        for card in page.all("node-card")
        for cell in card.all("gpu-cell")
        if cell["data-holder"]
    }
    assert drawn == bound_gpus(PODS)
    # The hover title names the holder, so the colour is never the only cue.
    for cell in page.all("gpu-cell"):
        if cell["data-holder"]:
            assert cell["title"] == f"GPU {cell['data-index']}: {cell['data-holder']}"
            assert "held" in cell.classes
        elif cell["data-anonymous"] == "false":
            assert cell["title"] == f"GPU {cell['data-index']}: free"
            assert "free" in cell.classes
    # Readable without colour: each card lists its holders with their GPU indices.
    legend = cards_by_node(page)["a100-b"].one("holder-legend")
    assert [entry.text() for entry in legend.all("holder-entry")] == [
        "research/notebook GPU 3",
        "serving/inference GPUs 0\u20131",
    ]


def test_nvlink_groups_wrap_their_cells_and_ungrouped_gpus_stand_apart(
    drawn_page: Callable[[], Element],
) -> None:
    page = drawn_page()
    cards = cards_by_node(page)
    assert len(page.all("gpu-group")) == sum(len(groups) for groups in NVLINK_GROUPS.values())
    for node, groups in NVLINK_GROUPS.items():
        assert [cell_indices(group) for group in cards[node].all("gpu-group")] == groups
        assert cards[node].all("gpu-ungrouped") == []
    assert cell_indices(cards["t4-c"].one("gpu-ungrouped")) == [0, 1, 2, 3]
    assert cards["t4-c"].all("gpu-group") == []


def test_gpus_of_pods_without_the_annotation_are_shown_as_anonymous(
    drawn_page: Callable[[], Element],
) -> None:
    page = drawn_page()
    card = cards_by_node(page)["t4-c"]
    assert card.one("anonymous-badge")["data-count"] == "1"
    # Like the scheduler, the page assumes the highest free index.
    anonymous = [cell for cell in page.all("gpu-cell") if cell["data-anonymous"] == "true"]
    assert [cell["data-index"] for cell in anonymous] == ["3"]
    assert "without schedext's annotation" in anonymous[0]["title"]
    assert anonymous[0]["data-holder"] == ""
    assert card.one("gpu-free").text() == "3/4 GPUs free"


def test_pools_show_used_and_free_addresses_and_who_holds_them(
    drawn_page: Callable[[], Element],
) -> None:
    page = drawn_page()
    rows = {row["data-pool"]: row for row in page.all("pool-row")}
    assert {name: (r["data-used"], r["data-free"], r["data-size"]) for name, r in rows.items()} == {
        "r1": ("2", "18", "20"),
        "r2": ("0", "10", "10"),
    }
    r1 = rows["r1"]
    assert (r1.one("pool-used").text(), r1.one("pool-free").text()) == ("2", "18")
    assert r1.one("pool-size").text() == "20"
    assert {h["data-address"]: h["data-pod"] for h in r1.all("pool-holder")} == {
        "10.20.1.10": "serving/inference",
        "10.20.1.11": "research/notebook",
    }
    assert r1.all("bar-fill")[0]["style"] == "width: 10%;"
    assert rows["r2"].all("pool-holder") == []


def test_a_gang_shows_its_phase_and_quorum(drawn_page: Callable[[], Element]) -> None:
    page = drawn_page()
    (row,) = page.all("gang-row")
    assert row["data-group"] == "ml/trainer"
    assert row.one("phase").text() == "Scheduling"  # two of three members bound
    assert row.one("gang-placed").text() == "2 / 3"
    assert (row["data-members"], row["data-scheduled"], row["data-waiting"]) == ("3", "2", "0")
    assert row.one("gang-waiting").text() == "0"


def test_a_quota_shows_min_used_and_max_bars_per_resource(
    drawn_page: Callable[[], Element],
) -> None:
    page = drawn_page()
    rows = {row["data-resource"]: row for row in page.all("quota-row")}
    assert [r["data-quota"] for r in rows.values()] == ["ml/ml", "ml/ml"]
    gpus, memory = rows["nvidia.com/gpu"], rows["memory"]
    assert (gpus["data-used"], gpus["data-min"], gpus["data-max"]) == ("6", "4", "8")
    assert gpus["data-borrowing"] == "true"
    assert [gpus.one(c).text() for c in ("quota-used", "quota-min", "quota-max")] == ["6", "4", "8"]
    # Of the max: 4 within min, 2 borrowed over it, the min marked half way.
    assert gpus.one("quota-within")["style"] == "width: 50%;"
    assert gpus.one("quota-borrowed")["style"] == "width: 25%;"
    assert gpus.one("quota-min-mark")["style"] == "left: 50%;"
    assert gpus.one("quota-bar")["aria-label"] == (
        "ml/ml nvidia.com/gpu: 6 used; min 4, max 8; borrowing over its min"
    )
    # Two bound trainers' 128Mi each of a 1Gi ceiling: no min, so nothing borrowed or marked.
    assert [memory.one(c).text() for c in ("quota-used", "quota-min", "quota-max")] == [
        "256Mi",
        "none",
        "1Gi",
    ]
    assert memory.one("quota-within")["style"] == "width: 25%;"
    assert (memory.all("quota-borrowed"), memory.all("quota-min-mark")) == ([], [])
    assert memory["data-borrowing"] == "false"
    assert page.by_id("no-quotas").get("hidden") is not None
    assert page.all("shadowed-quota") == []


def test_the_page_says_when_it_was_last_updated_and_shows_no_error(
    drawn_page: Callable[[], Element],
) -> None:
    page = drawn_page()
    stamp = page.by_id("last-updated")
    assert stamp.text() != "never"
    assert stamp["datetime"].endswith("Z")
    assert page.by_id("error-banner").get("hidden") is not None
    assert page.by_id("summary").text().startswith("4 nodes · 6 of 16 GPUs free")


def test_a_gpu_reserved_at_the_gang_barrier_is_drawn_reserved(
    serve_snapshot: ServeSnapshot, tmp_path: Path
) -> None:
    members = [gang_pod(f"m{i}", "pair", gpus=2) for i in range(2)]
    server = serve_snapshot(
        nodes=[make_node("g", gpus=8, groups=[[0, 1, 2, 3], [4, 5, 6, 7]])],
        pods=members,
        groups=[make_pod_group("pair", min_member=2, timeout_s=20)],
    )

    def bind(pod: dict[str, Any]) -> str:
        body = {"PodName": name_of(pod), "PodNamespace": "default", "PodUID": uid_of(pod)}
        with server.client() as client:
            answer = client.post("/bind", content=orjson.dumps({**body, "Node": "g"}))
        return str(answer.json()["Error"])

    with ThreadPoolExecutor(max_workers=2) as pool:
        first = pool.submit(bind, members[0])  # parks at the barrier, holding a reservation
        try:
            wait_for_reservations(server, 1)
            page = render(server, tmp_path)
        finally:
            # Completes the gang, so both binds go ahead even when drawing failed.
            second = pool.submit(bind, members[1])
        assert [first.result(timeout=30), second.result(timeout=30)] == ["", ""]

    reserved = [cell for cell in page.all("gpu-cell") if cell["data-reserved"] == "true"]
    assert len(reserved) == 2
    assert {cell["data-holder"] for cell in reserved} == {"default/m0"}
    assert all("reserved" in cell.classes and "reserved" in cell["title"] for cell in reserved)
    (row,) = page.all("gang-row")
    assert (row["data-phase"], row["data-waiting"], row["data-placed"]) == ("Scheduling", "1", "1")


def test_an_inventory_that_cannot_be_loaded_shows_an_error_banner(tmp_path: Path) -> None:
    app = FastAPI()
    app.include_router(ui.router)

    @app.get("/inventory")
    async def broken() -> Response:
        return Response(b'{"Error": "down"}', status_code=503, media_type="application/json")

    with running(app) as server:
        page = render(server, tmp_path)
    banner = page.by_id("error-banner")
    assert banner.get("hidden") is None
    # The answer's Error says why (as "inventory not synced: ..." does before sync).
    assert banner.text() == (
        "Could not load /inventory: HTTP 503 Service Unavailable: down. No data yet."
    )
    assert page.all("node-card") == []


def test_the_page_renders_as_a_full_size_screenshot_that_is_not_blank(
    serve_snapshot: ServeSnapshot, tmp_path: Path
) -> None:
    server = serve_snapshot(nodes=NODES, pods=PODS, groups=GROUPS)
    png = read_png(screenshot(f"{server.url}/ui", tmp_path / "ui.png", width=1280, height=1600))
    assert (png.width, png.height) == (1280, 1600)
    # A single-colour image filters down to a handful of byte values whatever the PNG filter;
    # text, cells and bars give far more.
    assert len(set(png.scanlines)) > 64


def test_the_page_and_its_assets_are_served_under_a_strict_content_policy(
    serve_snapshot: ServeSnapshot,
) -> None:
    server = serve_snapshot(nodes=NODES)
    with server.client() as client:
        answers = {path: client.get(path) for path in ("/ui", "/ui/app.js", "/ui/style.css")}
    kinds = {path: answer.headers["content-type"].split(";")[0] for path, answer in answers.items()}
    assert kinds == {
        "/ui": "text/html",
        "/ui/app.js": "text/javascript",
        "/ui/style.css": "text/css",
    }
    for answer in answers.values():
        assert answer.status_code == 200
        assert answer.headers["content-security-policy"] == "default-src 'self'"
        assert answer.headers["x-content-type-options"] == "nosniff"


def wait_for_reservations(server: RunningServer, count: int, *, within_s: float = 10) -> None:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if httpx.get(f"{server.url}/inventory", timeout=5).json()["reservations"] == count:
            return
        time.sleep(0.02)
    raise AssertionError(f"the inventory never showed {count} reservation(s) within {within_s} s")


def test_a_gpu_the_kubelet_says_is_in_use_outside_schedext_is_drawn_held_with_the_drift(
    tmp_path: Path,
) -> None:
    used = InUse("GPU-n-3", "ml/ghost", "main", names.GPU_RESOURCE, Cause.UNKNOWN_POD)
    stale = StaleRecord("ml/gone", "u", ("GPU-n-1",), 1_000_000.0, released=False)
    annotations = agent_annotations(4, drift=Drift(in_use=(used,), stale=(stale,)))
    node = make_node("g", gpus=4, model=H100, annotations=annotations)
    with snapshot_server(tmp_path, nodes=[node]) as server:
        page = render(server, tmp_path)
    card = cards_by_node(page)["g"]
    (outside,) = [cell for cell in card.all("gpu-cell") if cell["data-outside"] == "true"]
    assert outside["data-index"] == "3"
    assert outside["title"] == (
        "GPU 3 in use by a container schedext did not place (kubelet: ml/ghost/main)"
    )
    assert card.one("gpu-free").text() == "3/4 GPUs free"
    assert [line.text() for line in card.all("drift-line")] == [
        "GPU 3 in use by a container schedext did not place (kubelet: ml/ghost/main)",
        "stale record: ml/gone holds GPU 1 but the kubelet no longer lists it (not yet released)",
    ]
