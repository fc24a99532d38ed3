"""Sticky claims through the API binder and the releaser, against a canned API server."""

from __future__ import annotations

import asyncio
import dataclasses
import time

import httpx
import orjson
import pytest

from app.kube.binder import ApiBinder
from app.kube.binding import BindError
from app.kube.claims import ClaimReleaser
from app.kube.readiness import Readiness
from extender.model import BindPlan, ClaimPlan, ClaimPolicy
from extender.scheduler import Scheduler
from tests.unit.kube_fakes import FakeApiServer
from tests.unit.test_api_binder import never_answering_api

CLAIMS = "/apis/schedext.io/v1alpha1/ipclaims"
CLAIM = ClaimPlan(
    name="rack-a.10-20-1-15",
    pool="rack-a",
    address="10.20.1.15",
    owner="sts/db/web/1",
    policy=ClaimPolicy.STICKY,
    holder_uid="uid-new",
    exists=False,
)
PLAN = BindPlan(
    uid="uid-new",
    namespace="db",
    name="web-1",
    node="a1",
    gpu_ids=(),
    annotations={"schedext.io/ip": "10.20.1.15", "schedext.io/ip-pool": "rack-a"},
    ip="10.20.1.15",
    ip_pool="rack-a",
    claim=CLAIM,
)
BINDING = "/api/v1/namespaces/db/pods/web-1/binding"


def status(code: int, message: str = "") -> httpx.Response:
    return httpx.Response(code, json={"kind": "Status", "code": code, "message": message})


def run(
    answers: dict[tuple[str, str], list[httpx.Response]], plan: BindPlan = PLAN
) -> FakeApiServer:
    def handle(request: httpx.Request) -> httpx.Response:
        return answers[(request.method, request.url.path)].pop(0)

    server = FakeApiServer(other=handle)

    async def no_sleep(_: float) -> None:
        return None

    asyncio.run(ApiBinder(server.api(), sleep=no_sleep).bind(plan))
    return server


def calls(server: FakeApiServer) -> list[tuple[str, str]]:
    return [(r.method, r.url.path) for r in server.requests]


def test_the_claim_is_created_before_the_binding() -> None:
    server = run(
        {
            ("POST", CLAIMS): [status(201)],
            ("PATCH", f"{CLAIMS}/{CLAIM.name}"): [],
            ("POST", BINDING): [status(201)],
        }
    )
    assert calls(server) == [("POST", CLAIMS), ("POST", BINDING)]
    body = orjson.loads(server.requests[0].content)
    assert body["metadata"]["name"] == "rack-a.10-20-1-15"
    assert body["spec"] == {
        "pool": "rack-a",
        "address": "10.20.1.15",
        "owner": "sts/db/web/1",
        "releasePolicy": "sticky",
        "holderUID": "uid-new",
    }


def test_a_claim_created_for_a_failed_bind_is_deleted_again() -> None:
    with pytest.raises(BindError, match="was deleted before it could be bound"):
        run(
            {
                ("POST", CLAIMS): [status(201)],
                ("POST", BINDING): [status(404)],
                ("DELETE", f"{CLAIMS}/{CLAIM.name}"): [status(200)],
            }
        )


def test_the_claim_counts_against_the_bind_deadline() -> None:
    requests: list[httpx.Request] = []
    binder = ApiBinder(never_answering_api(requests), deadline_s=0.2)
    started = time.monotonic()
    with pytest.raises(BindError, match=r"did not finish within 0.2s \(bind.api_deadline_s\)"):
        asyncio.run(binder.bind(PLAN))
    assert time.monotonic() - started < 0.2 + 0.5
    assert [(r.method, r.url.path) for r in requests] == [("POST", CLAIMS)]
    assert requests[0].extensions["timeout"]["read"] <= 0.2


def test_an_address_claimed_by_another_identity_refuses_the_bind() -> None:
    other = httpx.Response(
        200, json={"metadata": {"name": CLAIM.name}, "spec": {"owner": "sts/db/other/0"}}
    )
    with pytest.raises(BindError, match=r"address 10.20.1.15 is claimed by sts/db/other/0"):
        run({("POST", CLAIMS): [status(409, "exists")], ("GET", f"{CLAIMS}/{CLAIM.name}"): [other]})


def test_an_existing_claim_of_the_identity_is_pointed_at_the_new_pod_and_kept_on_failure() -> None:
    plan = dataclasses.replace(PLAN, claim=dataclasses.replace(CLAIM, exists=True))
    answers = {
        ("PATCH", f"{CLAIMS}/{CLAIM.name}"): [status(200)],
        ("POST", BINDING): [status(403, "forbidden")],
    }
    recorded: list[tuple[str, str]] = []

    def handle(request: httpx.Request) -> httpx.Response:
        recorded.append((request.method, request.url.path))
        return answers[(request.method, request.url.path)].pop(0)

    server = FakeApiServer(other=handle)
    with pytest.raises(BindError, match="was refused"):
        asyncio.run(ApiBinder(server.api()).bind(plan))
    assert recorded == [("PATCH", f"{CLAIMS}/{CLAIM.name}"), ("POST", BINDING)]  # no DELETE
    assert orjson.loads(server.requests[0].content) == {"spec": {"holderUID": "uid-new"}}


# ----------------------------------------------------------------------- releaser


def releaser(
    answers: dict[tuple[str, str], list[httpx.Response]], scheduler: Scheduler
) -> tuple[list[str], FakeApiServer]:
    def handle(request: httpx.Request) -> httpx.Response:
        return answers[(request.method, request.url.path)].pop(0)

    server = FakeApiServer(other=handle)
    ready = Readiness()
    ready.set_ready()
    released = asyncio.run(ClaimReleaser(server.api(), scheduler, ready).release_once())
    return released, server


def scaled_down() -> Scheduler:
    scheduler = Scheduler()
    scheduler.upsert_ip_claim(
        {
            "metadata": {"name": "c2", "uid": "claim-uid"},
            "spec": {"pool": "p", "address": "10.0.0.2", "owner": "sts/db/web/2"},
        }
    )
    scheduler.set_statefulset("db/web", 2)
    return scheduler


def test_the_releaser_rechecks_and_deletes_with_the_claims_uid_as_precondition() -> None:
    released, server = releaser(
        {
            ("GET", "/api/v1/namespaces/db/pods/web-2"): [status(404)],
            ("GET", "/apis/apps/v1/namespaces/db/statefulsets/web"): [
                httpx.Response(200, json={"spec": {"replicas": 2}})
            ],
            ("DELETE", f"{CLAIMS}/c2"): [status(200)],
        },
        scaled_down(),
    )
    assert released == ["c2"]
    assert orjson.loads(server.requests[-1].content)["preconditions"] == {"uid": "claim-uid"}


@pytest.mark.parametrize(
    ("answers", "why"),
    [
        (
            {
                ("GET", "/api/v1/namespaces/db/pods/web-2"): [
                    httpx.Response(200, json={"metadata": {}})
                ]
            },
            "the pod exists after all",
        ),
        (
            {
                ("GET", "/api/v1/namespaces/db/pods/web-2"): [status(404)],
                ("GET", "/apis/apps/v1/namespaces/db/statefulsets/web"): [
                    httpx.Response(200, json={"spec": {"replicas": 3}})
                ],
            },
            "scaled back up meanwhile",
        ),
    ],
    ids=["pod exists", "scaled back up"],
)
def test_the_releaser_keeps_a_claim_when_the_api_says_the_identity_lives(
    answers: dict[tuple[str, str], list[httpx.Response]], why: str
) -> None:
    released, server = releaser(answers, scaled_down())
    assert released == [], why
    assert all(r.method == "GET" for r in server.requests)
