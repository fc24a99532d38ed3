"""The occupancy page at cluster scale, in headless Chromium driven over DevTools: a 500-node
inventory (450 GPU nodes of three models in ten racks, 50 CPU-only nodes, about 1,300 bound
pods, pending pods) drawn within a stated time, with the per-model summary, the node
filters typed and chosen as a user would, the capped card list, and a pending pod's link
followed to its explanation; and a refresh that rebuilds only the cards whose node changed."""

from __future__ import annotations

import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest

from testbed.builders import (
    A100,
    H100,
    T4,
    agent_annotations,
    gang_pod,
    make_ip_pool,
    make_node,
    make_pod,
    make_pod_group,
    uid_of,
)
from tests.api.server import RunningServer
from tests.ui.browser import read_png
from tests.ui.conftest import ServeSnapshot, snapshot_server
from tests.ui.devtools import Page, browser

pytestmark = pytest.mark.ui

NODES = 500
RACKS = 10
# Navigation to the first inventory on screen (fetching /inventory of 500 nodes, parsing it,
# the summary, the pending list and the first cards), on two shared cores. The page's own
# measure: performance.mark("schedext:drawn"), whose startTime counts from navigation.
DRAW_BOUND_MS = 3000
# What the page draws at once, and adds per "show more" (NODE_PAGE in app.js).
NODE_PAGE = 200
RACK = "topology.kubernetes.io/rack"


@dataclass(frozen=True)
class Shape:
    model: str
    gpus: int
    groups: tuple[tuple[int, ...], ...]


SHAPES = (
    Shape(H100, 8, ((0, 1, 2, 3), (4, 5, 6, 7))),
    Shape(A100, 4, ((0, 1), (2, 3))),
    Shape(T4, 4, ()),
)


def is_cpu_only(i: int) -> bool:
    return i % 10 == 9


def shape_of(i: int) -> Shape:
    return SHAPES[i % 3]


def held_on(i: int) -> int:
    """GPUs a bound pod holds on GPU node ``i`` (the lowest indices): none up to all, varied
    within each rack and model."""
    return (i // RACKS) % (shape_of(i).gpus + 1)


def unhealthy_on(i: int) -> bool:
    """Every 25th node's last GPU is marked unhealthy (build_cluster checks it is not held)."""
    return i % 25 == 0


def node_name(i: int) -> str:
    return f"{'cpu' if is_cpu_only(i) else 'gpu'}-{i:03d}"


def build_cluster() -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    nodes: list[dict[str, Any]] = []
    pods: list[dict[str, Any]] = []
    for i in range(NODES):
        labels = {RACK: f"r{i % RACKS}"}
        if is_cpu_only(i):
            nodes.append(make_node(node_name(i), labels=labels))
            continue
        shape = shape_of(i)
        if unhealthy_on(i):
            assert held_on(i) < shape.gpus, "an unhealthy GPU must not be held here"
            annotations = agent_annotations(
                shape.gpus,
                groups=shape.groups,
                unhealthy={shape.gpus - 1: "XID 79"},
                uuid_prefix=f"GPU-{i}",
            )
            node = make_node(node_name(i), gpus=shape.gpus, model=shape.model, labels=labels,
                             annotations=annotations)  # fmt: skip
        else:
            topology = [list(g) for g in shape.groups] if shape.groups else None
            node = make_node(node_name(i), gpus=shape.gpus, model=shape.model, groups=topology,
                             labels=labels)  # fmt: skip
        nodes.append(node)
        if held_on(i):
            pods.append(
                make_pod(
                    f"job-{i:03d}",
                    namespace=f"team-{i % 7}",
                    gpus=held_on(i),
                    node=node_name(i),
                    gpu_ids=list(range(held_on(i))),
                )
            )
    pods += [make_pod(f"waiting-{k:02d}", namespace="ml", gpus=1 + k % 4) for k in range(30)]
    pods += [gang_pod(f"trainer-{k}", "trainer", namespace="ml", gpus=8) for k in range(4)]
    groups = [make_pod_group("trainer", namespace="ml", min_member=4)]
    groups += [
        {"kind": "IPPool", **make_ip_pool(f"r{r}", cidr=f"10.30.{r}.0/26", rack=f"r{r}")}
        for r in range(RACKS)
    ]
    return nodes, pods, groups


def expected_models() -> dict[str, dict[str, int]]:
    """Per model, what the summary row must say, counted from the cluster built above."""
    found: dict[str, dict[str, int]] = {}
    for i in range(NODES):
        if is_cpu_only(i):
            continue
        shape = shape_of(i)
        row = found.setdefault(shape.model, {"nodes": 0, "gpus": 0, "free": 0, "unhealthy": 0})
        bad = 1 if unhealthy_on(i) else 0
        row["nodes"] += 1
        row["gpus"] += shape.gpus
        row["free"] += shape.gpus - held_on(i) - bad
        row["unhealthy"] += bad
    return found


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    nodes, pods, groups = build_cluster()
    workdir = tmp_path_factory.mktemp("many-nodes")
    with snapshot_server(workdir, nodes=nodes, pods=pods, groups=groups) as running:
        yield running


@pytest.fixture
def page(tmp_path: Path) -> Iterator[Page]:
    with browser(tmp_path) as tab:
        yield tab


def open_page(page: Page, server: RunningServer, query: str = "") -> float:
    """Load /ui and wait for the first inventory on screen; the page's own measure of it
    (milliseconds from navigation)."""
    page.goto(f"{server.url}/ui{query}")
    return float(
        page.wait_for(
            "performance.getEntriesByName('schedext:drawn').map((m) => m.startTime)[0]",
            within_s=30,
        )
    )


def shown(page: Page) -> dict[str, int]:
    data = page.evaluate("({...document.getElementById('nodes-shown').dataset})")
    return {key: int(data[key]) for key in ("total", "matching", "drawn")}


def card_names(page: Page) -> list[str]:
    return list(
        page.evaluate(
            "[...document.querySelectorAll('#nodes .node-card')].map((c) => c.dataset.node)"
        )
    )


def test_a_500_node_inventory_is_drawn_within_3_s_with_a_summary_per_model(
    server: RunningServer, page: Page, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """From navigation to the first inventory drawn (performance.mark "schedext:drawn", in
    real time): under 3 s, on two shared cores. The screenshot's path is in the test's
    report ("screenshot" section; pytest -rA shows it)."""
    drawn_ms = open_page(page, server)
    path = tmp_path / "ui-500-nodes.png"
    png = read_png(page.screenshot(path, width=1400, height=2400))
    request.node.add_report_section("call", "screenshot", f"{path} (drawn in {drawn_ms:.0f} ms)")
    assert drawn_ms < DRAW_BOUND_MS, f"first draw took {drawn_ms:.0f} ms"
    assert (png.width, png.height) == (1400, 2400)
    assert len(set(png.scanlines)) > 64  # not a blank page

    rows = page.evaluate(
        "[...document.querySelectorAll('.model-row')].map((r) => ({...r.dataset}))"
    )
    drawn = {
        row["model"]: {key: int(row[key]) for key in ("nodes", "gpus", "free", "unhealthy")}
        for row in rows
    }
    assert drawn == expected_models()
    gpu_nodes = sum(1 for i in range(NODES) if not is_cpu_only(i))
    # The first NODE_PAGE cards only, and a button for the rest; the CPU-only nodes apart.
    assert shown(page) == {"total": gpu_nodes, "matching": gpu_nodes, "drawn": NODE_PAGE}
    assert (
        card_names(page) == [node_name(i) for i in range(NODES) if not is_cpu_only(i)][:NODE_PAGE]
    )
    assert page.evaluate("document.getElementById('show-more').hidden") is False
    assert page.evaluate("document.querySelectorAll('.cpu-node-row').length") == NODES - gpu_nodes
    assert page.evaluate("document.getElementById('cpu-nodes-section').open") is False
    assert page.evaluate("document.querySelectorAll('.pending-row').length") == 34
    assert page.evaluate("document.getElementById('summary').textContent").startswith(
        f"{NODES} nodes · "
    )


def test_show_more_draws_the_next_page_of_cards_until_none_is_left(
    server: RunningServer, page: Page
) -> None:
    open_page(page, server)
    gpu_nodes = sum(1 for i in range(NODES) if not is_cpu_only(i))
    page.click("#show-more")
    assert page.wait_for("document.querySelectorAll('#nodes .node-card').length") == 2 * NODE_PAGE
    page.click("#show-more")
    page.wait_for(f"document.querySelectorAll('#nodes .node-card').length === {gpu_nodes}")
    assert shown(page)["drawn"] == gpu_nodes
    assert page.evaluate("document.getElementById('show-more').hidden") is True


def test_typing_a_node_name_narrows_the_cards_and_the_cpu_nodes_and_lands_in_the_url(
    server: RunningServer, page: Page
) -> None:
    open_page(page, server)
    page.type("#filter-node", "-04")  # gpu-040 … gpu-048 and cpu-049
    page.wait_for("document.getElementById('nodes-shown').dataset.matching === '9'")
    assert card_names(page) == [f"gpu-04{d}" for d in range(9)]
    assert page.evaluate(
        "[...document.querySelectorAll('.cpu-node-row')].map((r) => r.dataset.node)"
    ) == ["cpu-049"]
    assert page.evaluate("document.getElementById('show-more').hidden") is True
    assert page.evaluate("location.search") == "?node=-04"
    page.click("#filter-clear")
    page.wait_for("document.getElementById('nodes-shown').dataset.matching === '450'")
    assert page.evaluate("location.search") == ""


def test_choosing_a_model_and_a_pool_keeps_the_nodes_with_both(
    server: RunningServer, page: Page
) -> None:
    open_page(page, server)
    page.choose("#filter-model", A100)
    page.choose("#filter-pool", "r4")
    # Model A100: i % 3 == 1; pool r4: i % 10 == 4; GPU nodes only.
    indices = [i for i in range(NODES) if i % 3 == 1 and i % 10 == 4]
    page.wait_for(f"document.getElementById('nodes-shown').dataset.matching === '{len(indices)}'")
    assert card_names(page) == [node_name(i) for i in indices]
    # A model filter leaves no CPU-only node.
    assert page.evaluate("document.querySelectorAll('.cpu-node-row').length") == 0
    query = urllib.parse.parse_qs(page.evaluate("location.search")[1:])
    assert query == {"model": [A100], "pool": ["r4"]}
    page.click("#filter-free")
    free = [i for i in indices if shape_of(i).gpus - held_on(i) - unhealthy_on(i) > 0]
    assert 0 < len(free) < len(indices)
    page.wait_for(f"document.getElementById('nodes-shown').dataset.matching === '{len(free)}'")
    assert card_names(page) == [node_name(i) for i in free]


def test_a_shared_filtered_url_opens_with_its_filters_applied(
    server: RunningServer, page: Page
) -> None:
    query = urllib.parse.urlencode({"model": T4, "node": "gpu-1"})
    open_page(page, server, f"?{query}")
    wanted = [node_name(i) for i in range(100, 200) if not is_cpu_only(i) and i % 3 == 2]
    assert card_names(page) == wanted
    assert page.evaluate("document.getElementById('filter-model').value") == T4
    assert page.evaluate("document.getElementById('filter-node').value") == "gpu-1"


def test_a_models_name_filters_the_nodes_to_it(server: RunningServer, page: Page) -> None:
    open_page(page, server)
    page.click(f".model-row[data-model='{H100}'] .model-pick")
    page.wait_for(f"document.getElementById('filter-model').value === '{H100}'")
    wanted = [
        node_name(i) for i in range(NODES) if not is_cpu_only(i) and shape_of(i).model == H100
    ]
    page.wait_for(f"document.getElementById('nodes-shown').dataset.matching === '{len(wanted)}'")
    assert card_names(page) == wanted


def test_a_pending_pods_link_opens_its_explanation(server: RunningServer, page: Page) -> None:
    open_page(page, server)
    first = page.evaluate("document.querySelector('.pending-row').dataset.pod")
    assert first == "ml/trainer-0"
    href = page.evaluate(
        "document.querySelector('.pending-row .explain-link').getAttribute('href')"
    )
    assert href == "/explain/ml/trainer-0"
    page.click(".pending-row .explain-link")
    page.wait_for(f"location.pathname === {orjson.dumps(href).decode()}")
    page.wait_for("document.readyState === 'complete' && document.body.innerText.length > 0")
    explanation = orjson.loads(page.evaluate("document.body.innerText"))
    assert (explanation["pod"], explanation["state"]) == ("ml/trainer-0", "pending")
    assert len(explanation["nodes"]) == NODES


def test_a_refresh_rebuilds_only_the_cards_of_nodes_that_changed(
    serve_snapshot: ServeSnapshot, page: Page
) -> None:
    pod = make_pod("late", namespace="ml", gpus=2)
    server = serve_snapshot(nodes=[make_node(f"g{k}", gpus=4) for k in range(3)], pods=[pod])
    open_page(page, server)
    # An expando on each card element survives only if the element is kept.
    page.evaluate("document.querySelectorAll('.node-card').forEach((c) => { c.kept = true; })")
    body = {"PodName": "late", "PodNamespace": "ml", "PodUID": uid_of(pod), "Node": "g1"}
    with server.client() as client:
        assert client.post("/bind", content=orjson.dumps(body)).json()["Error"] == ""
    # The next refresh (every 2 s) draws the holder on g1.
    page.wait_for("document.querySelector('[data-node=\"g1\"]').dataset.free === '2'", within_s=10)
    kept = page.evaluate(
        "Object.fromEntries([...document.querySelectorAll('.node-card')]"
        ".map((c) => [c.dataset.node, c.kept === true]))"
    )
    assert kept == {"g0": True, "g1": False, "g2": True}
