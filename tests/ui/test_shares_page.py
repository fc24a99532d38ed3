"""The occupancy page with GPU shares, in headless Chromium: a shared GPU's cell, its memory
bar with one segment per pod holding a share, and the pods named in the node's list; whole
holders drawn as before. Checked by structure, on a snapshot and on the embedded demo."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from app.service.main import create_app
from app.service.settings import load_settings
from testbed.builders import A100, make_node, make_pod, share_pod
from tests.api.server import running
from tests.ui.browser import dump_dom
from tests.ui.conftest import snapshot_server
from tests.ui.dom import Element, parse

# g: 4 A100s of 40960 MiB. GPU 0: two shares; GPUs 1-2: one pod's share of each; GPU 3: whole.
NODES = [make_node("g", gpus=4, model=A100, groups=[[0, 1], [2, 3]]), make_node("w", gpus=2)]
PODS = [
    share_pod("infer-a", namespace="serving", memory_mib=10240, cores=30, node="g", gpu_ids=[0]),
    share_pod("infer-b", namespace="serving", memory_mib=20480, node="g", gpu_ids=[0]),
    share_pod("pair", namespace="ml", memory_mib=4096, shares=2, node="g", gpu_ids=[1, 2]),
    make_pod("whole", namespace="ml", gpus=1, node="g", gpu_ids=[3]),
]


@pytest.fixture(scope="module")
def drawn_page(tmp_path_factory: pytest.TempPathFactory) -> Callable[[], Element]:
    @functools.cache
    def draw() -> Element:
        workdir = tmp_path_factory.mktemp("shares")
        with snapshot_server(workdir, nodes=NODES, pods=PODS) as server:
            return parse(dump_dom(f"{server.url}/ui", workdir))

    return draw


def card(page: Element, node: str) -> Element:
    (found,) = [c for c in page.all("node-card") if c["data-node"] == node]
    return found


def width(element: Element) -> float:
    match = re.search(r"(?:^|;)\s*width:\s*([\d.]+)%", element["style"])
    assert match, f"no width in {element['style']!r}"
    return float(match.group(1))


def test_each_shared_gpu_has_a_memory_bar_with_a_segment_per_pod(
    drawn_page: Callable[[], Element],
) -> None:
    rows = {int(r["data-index"]): r for r in card(drawn_page(), "g").all("share-row")}
    assert sorted(rows) == [0, 1, 2]  # GPU 3 is held whole: no bar
    assert {i: (r["data-held"], r["data-free"], r["data-capacity"]) for i, r in rows.items()} == {
        0: ("30720", "10240", "40960"),
        1: ("4096", "36864", "40960"),
        2: ("4096", "36864", "40960"),
    }
    segments = rows[0].all("share-segment")
    assert [(s["data-pod"], s["data-memory"], s["data-cores"]) for s in segments] == [
        ("serving/infer-a", "10240", "30"),
        ("serving/infer-b", "20480", "0"),
    ]
    assert [width(s) for s in segments] == [25, 50]  # of the GPU's memory; the rest is free
    # The colour is never the only cue: each segment's title names the pod and its share.
    assert [s["title"] for s in segments] == [
        "serving/infer-a: 10,240 MiB, 30% of the cores",
        "serving/infer-b: 20,480 MiB",
    ]
    bar = rows[0].one("share-bar")
    assert bar["aria-label"] == "GPU 0: 30,720 MiB of 40,960 MiB held by 2 shares, 10,240 MiB free"
    assert rows[0].one("share-figures").text() == "30720/40960 MiB · 30% cores"
    assert [s["data-pod"] for s in rows[1].all("share-segment")] == ["ml/pair"]
    assert [width(s) for s in rows[2].all("share-segment")] == [10]


def test_shared_cells_fill_as_held_and_whole_holders_are_drawn_as_before(
    drawn_page: Callable[[], Element],
) -> None:
    cells = {int(c["data-index"]): c for c in card(drawn_page(), "g").all("gpu-cell")}
    assert [i for i, c in cells.items() if c["data-shared"] == "true"] == [0, 1, 2]
    assert all("shared" in cells[i].classes and cells[i]["data-holder"] == "" for i in (0, 1, 2))
    assert "--held: 75%" in cells[0]["style"]
    assert cells[0]["title"] == (
        "GPU 0: shared by serving/infer-a, serving/infer-b; 30,720 MiB of 40,960 MiB held, "
        "10,240 MiB free"
    )
    assert (cells[3]["data-holder"], cells[3]["data-shared"]) == ("ml/whole", "false")
    assert "held" in cells[3].classes
    assert card(drawn_page(), "g").one("gpu-free").text() == "0/4 GPUs free"


def test_the_node_list_names_the_pods_holding_shares(drawn_page: Callable[[], Element]) -> None:
    entries = {e["data-holder"]: e for e in card(drawn_page(), "g").all("holder-entry")}
    assert {pod: e.text() for pod, e in entries.items()} == {
        "ml/pair": "ml/pair GPUs 1\u20132 · share 4,096 MiB each",
        "ml/whole": "ml/whole GPU 3",
        "serving/infer-a": "serving/infer-a GPU 0 · share 10,240 MiB, 30% cores",
        "serving/infer-b": "serving/infer-b GPU 0 · share 20,480 MiB",
    }
    assert {pod for pod, e in entries.items() if "share-entry" in e.classes} == {
        "ml/pair",
        "serving/infer-a",
        "serving/infer-b",
    }
    assert card(drawn_page(), "w").all("share-row") == []
    summary = drawn_page().by_id("summary").text()
    assert summary.startswith("2 nodes · 2 of 6 GPUs free")
    assert summary.endswith("· 3 GPUs shared")


def test_the_demo_inventory_shows_a_shared_gpu(tmp_path: Path) -> None:
    with running(create_app(load_settings())) as server:
        page = parse(dump_dom(f"{server.url}/ui", tmp_path))
    (row,) = card(page, "h100-node-3").all("share-row")
    assert row["data-index"] == "0"
    assert [s["data-pod"] for s in row.all("share-segment")] == [
        "research/notebook-bob",
        "serving/embeddings-5d2a",
    ]
    assert [c["data-index"] for c in page.all("gpu-cell") if c["data-shared"] == "true"] == ["0"]
