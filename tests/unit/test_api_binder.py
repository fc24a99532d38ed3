"""The API binder against a canned API server: one Binding write, outcomes by error type."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import httpx
import orjson
import pytest

from app.binder import BindError
from app.kube.binder import ApiBinder
from extender.model import BindPlan
from tests.unit.kube_fakes import FakeApiServer

PLAN = BindPlan(
    uid="uid-1",
    namespace="ml",
    name="trainer-0",
    node="gpu-1",
    gpu_ids=(0, 1),
    annotations={"schedext.io/gpu-ids": "0,1"},
)
BINDING = "/api/v1/namespaces/ml/pods/trainer-0/binding"
POD = "/api/v1/namespaces/ml/pods/trainer-0"


def pod(
    *, uid: str = "uid-1", node: str = "", gpu_ids: str | None = None, deleting: bool = False
) -> httpx.Response:
    metadata: dict[str, object] = {"name": "trainer-0", "namespace": "ml", "uid": uid}
    if gpu_ids is not None:
        metadata["annotations"] = {"schedext.io/gpu-ids": gpu_ids}
    if deleting:
        metadata["deletionTimestamp"] = "2026-11-22T00:00:00Z"
    return httpx.Response(
        200, json={"metadata": metadata, "spec": {"nodeName": node} if node else {}}
    )


def status(code: int, message: str = "") -> httpx.Response:
    return httpx.Response(code, json={"kind": "Status", "code": code, "message": message})


def scripted(answers: dict[str, list[httpx.Response]]) -> Callable[[httpx.Request], httpx.Response]:
    def handle(request: httpx.Request) -> httpx.Response:
        return answers[request.url.path].pop(0)

    return handle


def bind(
    answers: dict[str, list[httpx.Response]], **kwargs: object
) -> tuple[FakeApiServer, list[float]]:
    server = FakeApiServer(other=scripted(answers))
    delays: list[float] = []

    async def sleep(delay: float) -> None:
        delays.append(delay)

    binder = ApiBinder(server.api(), sleep=sleep, **kwargs)  # type: ignore[arg-type]
    asyncio.run(binder.bind(PLAN))
    return server, delays


def test_bind_posts_one_binding_with_uid_precondition_and_gpu_annotations() -> None:
    server, delays = bind({BINDING: [status(201)]})
    (request,) = server.requests
    assert (request.method, request.url.path) == ("POST", BINDING)
    assert orjson.loads(request.content) == {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {
            "name": "trainer-0",
            "namespace": "ml",
            "uid": "uid-1",
            "annotations": {"schedext.io/gpu-ids": "0,1"},
        },
        "target": {"apiVersion": "v1", "kind": "Node", "name": "gpu-1"},
    }
    assert delays == []


def test_deleted_pod_is_reported_clearly() -> None:
    with pytest.raises(BindError, match="pod ml/trainer-0 was deleted before it could be bound"):
        bind({BINDING: [status(404, "pods not found")]})


@pytest.mark.parametrize(
    ("pod_answer", "message"),
    [
        (pod(node="gpu-7", gpu_ids="3"), "already bound to node gpu-7"),
        (pod(uid="uid-2"), r"was re-created \(uid uid-2\)"),
        (pod(deleting=True), "is being deleted"),
        (status(404), "was deleted before it could be bound"),
    ],
    ids=["bound elsewhere", "re-created", "being deleted", "deleted meanwhile"],
)
def test_conflict_is_explained_by_the_pods_state(pod_answer: httpx.Response, message: str) -> None:
    with pytest.raises(BindError, match=message):
        bind({BINDING: [status(409, "conflict")], POD: [pod_answer]})


def test_conflict_because_our_earlier_attempt_went_through_is_success() -> None:
    server, _ = bind(
        {BINDING: [status(409, "already assigned")], POD: [pod(node="gpu-1", gpu_ids="0,1")]}
    )
    assert [r.method for r in server.requests] == ["POST", "GET"]


def test_passing_conflicts_and_transient_errors_are_retried_with_growing_delays() -> None:
    server, delays = bind(
        {
            BINDING: [
                status(409, "write conflict"),
                status(503, "etcd leader changed"),
                status(429),
                status(201),
            ],
            POD: [pod()],
        }
    )
    assert [r.method for r in server.requests] == ["POST", "GET", "POST", "POST", "POST"]
    assert delays == [0.1, 0.2, 0.4]


def test_retries_are_bounded_and_the_last_error_is_reported() -> None:
    with pytest.raises(BindError, match=r"failed: POST .*: 503 apiserver down"):
        bind({BINDING: [status(503, "apiserver down")] * 3}, attempts=3)


def test_retries_stop_at_the_deadline() -> None:
    clock = iter([0.0, 0.05, 0.5, 0.9, 5.0, 9.0]).__next__
    with pytest.raises(BindError, match="failed"):
        bind({BINDING: [status(503)] * 10}, attempts=10, deadline_s=1.0, clock=clock)


def test_other_refusals_are_not_retried() -> None:
    with pytest.raises(BindError, match=r"was refused: .*403 pods/binding is forbidden"):
        bind({BINDING: [status(403, "pods/binding is forbidden")]})


def test_connection_failures_count_as_transient() -> None:
    calls: list[int] = []

    def flaky(request: httpx.Request) -> httpx.Response:
        calls.append(1)
        if len(calls) == 1:
            raise httpx.ConnectError("connection refused")
        return status(201)

    server = FakeApiServer(other=flaky)

    async def no_sleep(_: float) -> None:
        return None

    asyncio.run(ApiBinder(server.api(), sleep=no_sleep).bind(PLAN))
    assert len(calls) == 2
