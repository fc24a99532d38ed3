"""The views port's /inventory is built at most once a second, however often it is asked:
anyone who reaches the pod's address reaches the port, and building it walks every node on
the event loop the verbs share. (tests/api/test_cli.py serves the port for real.)"""

from __future__ import annotations

import orjson
import pytest

from app.service.views_listener import INVENTORY_REUSE_S, ViewsListener
from tests.api.conftest import fixture
from tests.api.server import RunningServer

pytestmark = pytest.mark.api


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_inventory_is_built_again_only_once_it_is_a_second_old(demo: RunningServer) -> None:
    clock = Clock()
    views = ViewsListener(demo.app.state.service, port=0, clock=clock)
    answer = views.route(b"/inventory")
    assert answer is not None

    def pending() -> int:
        status, body, _ = answer()
        assert status == 200
        count: int = orjson.loads(body)["pendingPods"]
        return count

    assert pending() == 0
    with demo.client() as client:  # a pod goes through filter: schedext now has one pending
        client.post("/filter", content=orjson.dumps(fixture("filter_request_nodecache_true.json")))
        assert client.get("/inventory").json()["pendingPods"] == 1
    clock.now += INVENTORY_REUSE_S / 2
    assert pending() == 0  # the body built a moment ago
    clock.now += INVENTORY_REUSE_S / 2
    assert pending() == 1


def test_before_sync_the_views_port_says_not_synced_as_the_main_port(
    demo: RunningServer,
) -> None:
    service = demo.app.state.service
    views = ViewsListener(service, port=0)
    answer = views.route(b"/inventory")
    assert answer is not None
    service.readiness.set_not_ready("inventory not synced: pods not listed yet")
    try:
        status, body, _ = answer()
    finally:
        service.readiness.set_ready()
    assert status == 503
    assert orjson.loads(body) == {"Error": "inventory not synced: pods not listed yet"}
