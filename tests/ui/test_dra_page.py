"""The occupancy page in headless Chromium with DRA: each node card says who hands out its
GPUs where the device plugin does not alone, and its DRA devices held of those advertised; a
node with DRA devices only is a card, not a CPU-only row."""

from __future__ import annotations

from pathlib import Path

from testbed.builders import H100, agent_annotations, make_node
from testbed.dra_builders import gpu, resource_claim, resource_slice, result
from tests.ui.browser import dump_dom
from tests.ui.conftest import snapshot_server
from tests.ui.dom import parse


def test_node_cards_show_the_owner_and_the_dra_devices_held_of_advertised(
    tmp_path: Path,
) -> None:
    nodes = [
        make_node("mixed", gpus=4, model=H100,
                  annotations=agent_annotations(4, uuid_prefix="GPU-mixed")),
        make_node("dra-only"),
        make_node("plain", gpus=2, model=H100),
        make_node("cpu"),
    ]  # fmt: skip
    groups = [
        resource_slice("mixed", [gpu(i, node="mixed") for i in range(4)]),
        resource_slice("dra-only", [gpu(i, node="dra-only") for i in range(8)]),
        resource_claim("train", namespace="ml", node="mixed",
                       results=[result("mixed", "gpu-0"), result("mixed", "gpu-1")]),
        resource_claim("solo", results=[result("dra-only", "gpu-3")], node="dra-only"),
    ]  # fmt: skip
    with snapshot_server(tmp_path, nodes=nodes, groups=groups) as server:
        page = parse(dump_dom(f"{server.url}/ui", tmp_path))
    cards = {card["data-node"]: card for card in page.all("node-card")}
    assert sorted(cards) == ["dra-only", "mixed", "plain"]
    assert [row["data-node"] for row in page.all("cpu-node-row")] == ["cpu"]
    assert {name: card["data-owner"] for name, card in cards.items()} == {
        "mixed": "mixed",
        "dra-only": "dra",
        "plain": "device-plugin",
    }
    assert cards["mixed"].one("gpu-owner").text() == "GPUs by device plugin and DRA (mixed)"
    assert cards["dra-only"].one("gpu-owner").text() == "GPUs by DRA"
    assert cards["plain"].all("gpu-owner") == []  # the device plugin's: nothing to say
    held = cards["mixed"].one("dra-devices")
    assert held.text() == "DRA 2/4 held"
    assert (held["data-held"], held["data-advertised"]) == ("2", "4")
    assert held["title"].splitlines() == ["gpu-0: ml/train (GPU 0)", "gpu-1: ml/train (GPU 1)"]
    assert cards["dra-only"].one("dra-devices").text() == "DRA 1/8 held"
    assert cards["dra-only"].one("gpu-model").text() == "no GPUs of schedext's"
    assert cards["plain"].all("dra-devices") == []
    # By GPU model, the nodes with DRA devices only are a row of their own, of no GPUs.
    models = {row["data-model"]: row for row in page.all("model-row")}
    assert sorted(models) == ["DRA devices only", H100]
    assert (models["DRA devices only"]["data-nodes"], models[H100]["data-nodes"]) == ("1", "2")
    # The claimed GPUs are drawn held (outside schedext), as the inventory counts them.
    cells = cards["mixed"].all("gpu-cell")
    assert [c["data-index"] for c in cells if c["data-outside"] == "true"] == ["0", "1"]
