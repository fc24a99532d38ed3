"""The gangs table of the occupancy page in headless Chromium: a gang with a hold (adopted from
its PodGroup's record by the review every second) shows how many GPUs are held, where and
until when; a gang without one shows a dash."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import pytest

from extender import names
from testbed.builders import gang_pod, make_node, make_pod, make_pod_group
from testbed.waiting import wait_for
from tests.ui.browser import dump_dom
from tests.ui.conftest import snapshot_server
from tests.ui.dom import parse

pytestmark = pytest.mark.ui

RACK = names.RACK_LABEL
EXPIRES = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 3600))
RECORD = json.dumps({
    "started": "2026-01-01T00:00:00Z", "expires": EXPIRES,
    "waitingSince": "2025-12-31T23:50:00Z", "priority": 0, "level": RACK, "domain": "a",
    "nodes": {"a1": 8, "a2": 8},
})  # fmt: skip


def test_a_gang_shows_its_hold_and_one_without_a_dash(tmp_path: Path) -> None:
    nodes = [
        make_node("a1", gpus=8, labels={RACK: "a"}),
        make_node("a2", gpus=8, labels={RACK: "a"}),
        make_node("b1", gpus=8, labels={RACK: "b"}),
    ]
    pods = [
        make_pod("small", gpus=1, node="a1", phase="Running"),
        gang_pod("m0", "big", namespace="ml", gpus=8),
        gang_pod("m1", "big", namespace="ml", gpus=8),
        gang_pod("d0", "done", namespace="ml", gpus=2, node="b1", gpu_ids=[0, 1]),
    ]
    groups = [
        make_pod_group("big", namespace="ml", min_member=2,
                       annotations={names.GANG_HOLD: RECORD}),
        make_pod_group("done", namespace="ml", min_member=1),
    ]  # fmt: skip
    with snapshot_server(tmp_path, nodes=nodes, pods=pods, groups=groups) as server:

        def adopted() -> bool:
            gangs = httpx.get(f"{server.url}/inventory", timeout=10).json()["gangs"]
            return any(g["hold"] for g in gangs)

        wait_for(adopted, timeout=10, message="the hold was not adopted")
        page = parse(dump_dom(f"{server.url}/ui", tmp_path))
    rows = {row["data-group"]: row for row in page.all("gang-row")}
    held, done = rows["ml/big"].one("gang-hold"), rows["ml/done"].one("gang-hold")
    assert (held["data-held"], held["data-gpus"], held["data-expires"]) == ("true", "16", EXPIRES)
    assert held.one("hold-gpus").text() == "16 GPUs"
    assert held.one("hold-where").text() == f"{RACK} a"
    assert held.one("hold-until").text() == f"until {EXPIRES}"
    assert held["title"].startswith("waiting since 2025-12-31T23:50:00Z; held since 2026-01-01")
    assert (done["data-held"], done.text()) == ("false", "\u2014")
