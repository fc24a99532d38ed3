"""``HEAD`` of every ``GET`` route of the main listener is answered as the ``GET``, without a
body: the same status and headers, the ``GET``'s Content-Length (once 405: FastAPI's routes
take GET only). The verbs still take POST alone."""

from __future__ import annotations

import pytest

from tests.api.server import RunningServer

# Paths whose GET body does not change from one call to the next.
STEADY = ["/healthz", "/readyz", "/readyz/synced", "/ui", "/inventory", "/openapi.json"]


@pytest.mark.parametrize("path", STEADY)
def test_head_answers_as_get_without_a_body(demo: RunningServer, path: str) -> None:
    with demo.client() as client:
        got = client.get(path)
        head = client.head(path)
    assert got.status_code == 200
    assert head.status_code == got.status_code
    assert head.content == b""
    assert head.headers["content-type"] == got.headers["content-type"]
    assert head.headers["content-length"] == str(len(got.content))


def test_head_of_metrics_gives_its_length_without_the_body(demo: RunningServer) -> None:
    with demo.client() as client:
        head = client.head("/metrics")
        got = client.get("/metrics")
    assert (head.status_code, head.content) == (200, b"")
    assert head.headers["content-type"] == got.headers["content-type"]
    # the counters move between the two calls; the length is the GET's, give or take
    assert abs(int(head.headers["content-length"]) - len(got.content)) < len(got.content) // 10


def test_head_of_an_unknown_path_is_a_404_as_get(demo: RunningServer) -> None:
    with demo.client() as client:
        assert client.head("/nothing-here").status_code == 404


@pytest.mark.parametrize("verb", ["filter", "prioritize", "preempt", "bind"])
def test_head_of_a_verb_is_still_refused(demo: RunningServer, verb: str) -> None:
    with demo.client() as client:
        head = client.head(f"/{verb}")
    assert (head.status_code, head.headers["allow"]) == (405, "POST")
