"""Every endpoint, fuzzed from the service's own OpenAPI schema: whatever the input, never a
5xx and never a traceback, and the service keeps serving."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import schemathesis
from hypothesis import HealthCheck, settings

from app.service.main import create_app
from app.service.settings import load_settings
from tests.api.server import RunningServer, running


@pytest.fixture(scope="module")
def fuzzed_server() -> Iterator[RunningServer]:
    with running(create_app(load_settings())) as server:
        yield server


# The schema is the service's own (as served at /openapi.json); the requests go over real
# HTTP to a server started for this module.
schema = schemathesis.openapi.from_dict(create_app(load_settings()).openapi())


@schema.parametrize()
@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
def test_no_request_makes_schedext_fail(
    case: schemathesis.Case, fuzzed_server: RunningServer
) -> None:
    response = case.call(base_url=fuzzed_server.url)
    assert response.status_code < 500, (
        f"{case.method} {case.path}: {response.status_code} {response.text[:300]}"
    )
    assert "Traceback" not in response.text


def test_the_fuzzing_reached_every_verb(fuzzed_server: RunningServer) -> None:
    """Runs after the fuzz cases (same module server): they really exercised the verbs."""
    with fuzzed_server.client() as client:
        served = client.get("/openapi.json").json()
        metrics = client.get("/metrics").text
    verbs = ("filter", "prioritize", "preempt", "bind")
    assert {f"/{v}" for v in verbs} | {"/explain/{namespace}/{name}", "/inventory"} <= set(
        served["paths"]
    )
    assert all("requestBody" in served["paths"][f"/{verb}"]["post"] for verb in verbs)
    assert served == schema.raw_schema  # what was fuzzed is what is served
    for verb in verbs:
        line = next(
            x
            for x in metrics.splitlines()
            if x.startswith(f'schedext_request_duration_seconds_count{{verb="{verb}"}}')
        )
        assert float(line.split()[-1]) >= 20, line
