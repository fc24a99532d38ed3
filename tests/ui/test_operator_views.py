"""What an operator reads on the occupancy page: why each pending pod waits (the last
filter's reason, linked to its explanation), the numbers beside each usage bar, a dash where
a model has no MIG devices, and "not synced" rather than an empty page before sync."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from app.service.main import create_app
from app.service.settings import load_settings
from testbed.builders import make_pod
from tests.api.server import running
from tests.api.test_health import UnsyncedSource
from tests.ui.browser import dump_dom
from tests.ui.conftest import snapshot_server
from tests.ui.dom import parse
from tests.ui.test_occupancy_page import GROUPS, H100, NODES, PODS

pytestmark = pytest.mark.ui

WAITS_WHY = "schedext: node has fewer than 16 GPUs (3 nodes); schedext: node has no GPUs (1 node)"


def test_pending_pods_say_why_they_wait_and_bars_carry_their_numbers(tmp_path: Path) -> None:
    huge = make_pod("huge", namespace="research", gpus=16)
    with snapshot_server(tmp_path, nodes=NODES, pods=[*PODS, huge], groups=GROUPS) as server:
        names = [node["metadata"]["name"] for node in NODES]
        httpx.post(f"{server.url}/filter", json={"Pod": huge, "NodeNames": names}, timeout=10)
        pending = httpx.get(f"{server.url}/inventory", timeout=10).json()["pending"]
        page = parse(dump_dom(f"{server.url}/ui", tmp_path))
    assert {p["pod"]: p["why"] for p in pending} == {
        "ml/trainer-2": None,  # the watch saw it; no filter turned it away yet
        "research/huge": WAITS_WHY,
    }
    rows = {row["data-pod"]: row for row in page.all("pending-row")}
    why = rows["research/huge"].one("why-link")
    assert (why["href"], why.text()) == ("/explain/research/huge", WAITS_WHY)
    assert rows["ml/trainer-2"].one("why-link").text() == "not turned away by a filter yet"
    models = {row["data-model"]: row for row in page.all("model-row")}
    assert models[H100].one("bar-text").text() == "6/8 GPUs used"
    assert models[H100].one("model-mig").text() == "\u2013"
    pools = {row["data-pool"]: row for row in page.all("pool-row")}
    assert pools["r1"].one("bar-text").text() == "2/20 addresses used"
    (gang,) = page.all("gang-row")
    assert gang.one("bar-text").text() == "2/3 placed"


def test_before_sync_the_page_says_not_synced(tmp_path: Path) -> None:
    with running(create_app(load_settings(), source=UnsyncedSource())) as server:
        page = parse(dump_dom(f"{server.url}/ui", tmp_path))
    banner = page.by_id("error-banner")
    assert banner.get("hidden") is None
    assert "inventory not synced: pods not listed yet" in banner.text()
    assert page.all("node-card") == []
