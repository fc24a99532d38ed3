"""Gangs' holds in the views over real HTTP: a PodGroup carrying a hold's record (a new leader's
case) has it adopted by the review every second; then ``/inventory`` shows it per gang, explain
tells a member where its group's GPUs are held and an outsider that it is kept off them,
``kubectl schedext gangs`` has it in its HOLD column, and ``/metrics`` counts it."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import pytest

from app.plugin import command, tables
from extender import names
from testbed.builders import gang_pod, make_node, make_pod, make_pod_group
from testbed.waiting import wait_for
from tests.api.conftest import Serve
from tests.api.server import RunningServer

pytestmark = pytest.mark.api

RACK = names.RACK_LABEL


def stamp(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))


def record(expires: float) -> str:
    return json.dumps({
        "started": "2026-01-01T00:00:00Z", "expires": stamp(expires),
        "waitingSince": "2025-12-31T23:50:00Z", "priority": 0, "level": RACK, "domain": "a",
        "nodes": {"a1": 8, "a2": 8},
    })  # fmt: skip


def held(serve: Serve, expires: float) -> tuple[RunningServer, dict[str, dict[str, Any]]]:
    """Rack a (a1, a2) held for gang g (2 x 8, pending); b1 in rack b; a pod outside the gang
    pending; and gang done, placed, without a hold."""
    server = serve(
        nodes=[
            make_node("a1", gpus=8, labels={RACK: "a"}),
            make_node("a2", gpus=8, labels={RACK: "a"}),
            make_node("b1", gpus=8, labels={RACK: "b"}),
        ],
        pods=[
            *(make_pod(f"s{i}", gpus=1, node="a1", phase="Running") for i in range(3)),
            gang_pod("m0", "g", gpus=8),
            gang_pod("m1", "g", gpus=8),
            gang_pod("d0", "done", gpus=2, node="b1", gpu_ids=[0, 1], phase="Running"),
            make_pod("new", gpus=1),
        ],
        groups=[
            make_pod_group("g", min_member=2, annotations={names.GANG_HOLD: record(expires)}),
            make_pod_group("done", min_member=1),
        ],
    )

    def gangs() -> dict[str, dict[str, Any]] | None:
        with server.client() as client:
            found = {g["group"]: g for g in client.get("/inventory").json()["gangs"]}
        return found if found["default/g"]["hold"] else None

    return server, wait_for(gangs, timeout=10, message="the hold was not adopted")


def test_inventory_shows_each_gangs_hold_or_null(serve: Serve) -> None:
    expires = time.time() + 570
    _, gangs = held(serve, expires)
    hold = gangs["default/g"]["hold"]
    assert {k: v for k, v in hold.items() if k not in ("leftSeconds", "idleGpuSeconds")} == {
        "gpus": 16,
        "nodes": {"a1": 8, "a2": 8},
        "level": RACK,
        "domain": "a",
        "started": "2026-01-01T00:00:00Z",
        "expires": stamp(expires),
        "waitingSince": "2025-12-31T23:50:00Z",
    }
    assert 0 < hold["leftSeconds"] <= 570
    assert isinstance(hold["idleGpuSeconds"], float)
    assert hold["idleGpuSeconds"] >= 0
    assert gangs["default/g"]["holdWhyNot"] == ""
    assert (gangs["default/done"]["hold"], gangs["default/done"]["holdWhyNot"]) == (None, "")


def test_explain_tells_a_member_where_its_group_is_held_and_an_outsider_it_is_kept_off(
    serve: Serve,
) -> None:
    expires = time.time() + 570
    server, _ = held(serve, expires)
    with server.client() as client:
        member = client.get("/explain/default/m0").json()
        outsider = client.get("/explain/default/new").json()
        placed = client.get("/explain/default/d0").json()
    assert member["groupHold"] == (
        f"holding 16 GPUs on {RACK} a for the group since 2026-01-01T00:00:00Z, "
        f"until {stamp(expires)}"
    )
    assert outsider["groupHold"] is None
    assert placed["groupHold"] is None
    assert outsider["fits"] == ["b1"]
    for node in outsider["nodes"][:2]:
        assert node["node"] in ("a1", "a2")
        assert node["reason"].startswith(
            "schedext: this node's free GPUs are held for gang default/g, which has waited "
            "since 2025-12-31T23:50:00Z"
        )
        assert node["resolvable"] is False
    text = tables.explanation_text(member).splitlines()
    assert text[2].startswith("group: ")
    assert text[3] == member["groupHold"]


def test_the_gangs_table_has_the_hold_and_the_metrics_count_it(serve: Serve) -> None:
    server, gangs = held(serve, time.time() + 570)
    with server.client() as client:
        answer = client.get("/inventory").json()
    args = argparse.Namespace(command="gangs", output="json", namespace="default")
    passed = json.loads(command._render(args, answer))["gangs"]  # -o json: as /inventory has them
    assert passed == answer["gangs"]
    assert passed[1]["hold"]["gpus"] == 16
    lines = tables.gangs_table(sorted(gangs.values(), key=lambda g: g["group"])).splitlines()
    start = lines[0].index("HOLD")
    assert [line[start:].split("   ")[0] for line in lines[1:]] == ["-", "16 on rack a, 9m left"]
    with server.client() as client:
        metrics = client.get("/metrics").text.splitlines()
    assert "schedext_gang_holds 1.0" in metrics
    assert 'schedext_gang_hold_events_total{event="started"} 1.0' in metrics
