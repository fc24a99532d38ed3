"""The API binder against a canned API server: one Binding write, outcomes by error type."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import orjson
import pytest

from app import cli
from app.kube.api import KubeApi
from app.kube.binder import ApiBinder
from app.kube.binding import BindError, BindOutcomeUnknownError
from app.kube.config import ClusterConfig
from app.service.main import create_app
from app.service.settings import SettingsError, load_settings
from app.service.snapshot import Snapshot
from app.service.sources import SnapshotSource
from extender.model import BindPlan
from testbed.builders import make_node, make_pod, uid_of
from tests.handler_transport import HandlerTransport
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


class FakeClock:
    """Time that passes only when the binder sleeps."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, delay: float) -> None:
        self.sleeps.append(delay)
        self.now += delay


def test_retries_stop_at_the_deadline_and_each_call_gets_only_what_is_left() -> None:
    clock = FakeClock()
    server = FakeApiServer(other=scripted({BINDING: [status(503)] * 10}))
    binder = ApiBinder(server.api(), attempts=10, deadline_s=1.0, sleep=clock.sleep, clock=clock)
    with pytest.raises(BindError, match="failed"):
        asyncio.run(binder.bind(PLAN))
    assert clock.sleeps == [0.1, 0.2, 0.4]  # a fourth wait (0.8) would pass the deadline
    timeouts = [r.extensions["timeout"]["read"] for r in server.requests]
    assert timeouts == pytest.approx([1.0, 0.9, 0.7, 0.3])


def never_answering_api(requests: list[httpx.Request]) -> KubeApi:
    async def hang(request: httpx.Request) -> httpx.Response:
        requests.append(request)
        await asyncio.Event().wait()  # the API server accepted the connection, and that is all
        raise AssertionError("unreachable")

    config = ClusterConfig(server="https://api.test", ssl_context=False, token="t0ken")
    return KubeApi(config, transport=HandlerTransport(hang))


def bind_twice(binder: ApiBinder) -> tuple[list[str], float, int]:
    """Bind two 2-GPU pods to one 4-GPU node in turn through the real app: (the Error each
    bind answered, the first bind's time, the reservations left)."""
    pods = [make_pod(f"trainer-{i}", gpus=2) for i in range(2)]
    snapshot = Snapshot(source="test", nodes=[make_node("gpu-1", gpus=4)], pods=pods)
    app = create_app(load_settings(), source=SnapshotSource(snapshot), binder=binder)
    core = app.state.service.scheduler

    async def run() -> tuple[list[str], float, int]:
        errors, first = [], 0.0
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://schedext") as client:
                for pod in pods:
                    body = {"PodName": pod["metadata"]["name"], "PodNamespace": "default",
                            "PodUID": uid_of(pod), "Node": "gpu-1"}  # fmt: skip
                    started = time.monotonic()
                    answer = await client.post("/bind", json=body)
                    first = first or time.monotonic() - started
                    errors.append(answer.json()["Error"])
                return errors, first, core.reservation_count

    return asyncio.run(run())


def chosen_gpus(requests: list[httpx.Request]) -> list[str]:
    """The GPU ids each Binding sent carried, in order."""
    return [orjson.loads(r.content)["metadata"]["annotations"]["schedext.io/gpu-ids"]
            for r in requests if r.url.path.endswith("/binding")]  # fmt: skip


def test_a_bind_whose_answer_never_comes_keeps_its_gpus_for_the_watch() -> None:
    """Found by the fault soak: under a slowed API a Binding was written but its answer came
    after bind.api_deadline_s; schedext gave the GPUs and the address back, and the next pod
    got them too. A Binding sent and never answered may be written: its GPUs stay reserved
    until the watch shows the pod (or the reservation's time runs out)."""
    requests: list[httpx.Request] = []
    binder = ApiBinder(never_answering_api(requests), deadline_s=0.3)
    errors, first, reservations = bind_twice(binder)
    assert "got no answer within 0.3s" in errors[0]
    assert "may have been written" in errors[0]
    assert first < 0.3 + 0.5  # kube-scheduler still gets its answer in time
    assert chosen_gpus(requests) == ["0,1", "2,3"]  # never the same GPUs twice
    assert reservations == 2
    assert all(r.extensions["timeout"]["read"] <= 0.3 for r in requests)


def test_a_bind_that_could_not_connect_gives_the_gpus_back() -> None:
    requests: list[httpx.Request] = []

    def refuse(request: httpx.Request) -> httpx.Response:
        requests.append(request)
        raise httpx.ConnectError("connection refused")

    async def no_sleep(_: float) -> None:
        return None

    config = ClusterConfig(server="https://api.test", ssl_context=False, token="t0ken")
    api = KubeApi(config, transport=HandlerTransport(refuse))
    errors, _, reservations = bind_twice(ApiBinder(api, sleep=no_sleep, deadline_s=1))
    assert "may have been written" not in errors[0]
    # Nothing was sent: the first pod's GPUs were free again for the second.
    assert set(chosen_gpus(requests)) == {"0,1"}
    assert reservations == 0


@pytest.mark.parametrize(
    ("answers", "unknown"),
    [
        ([status(500, "etcdserver: request timed out")] * 4, True),
        ([status(504, "gateway timeout")] * 4, True),
        ([status(503, "shutting down")] * 4, False),
        ([status(429, "slow down")] * 4, False),
        ([status(500, "etcdserver: request timed out"), status(503, "x"), status(503, "x"),
          status(503, "x")], True),
    ],
    ids=["500", "504", "503", "429", "500-then-503"],
)  # fmt: skip
def test_a_failed_bind_says_whether_the_binding_may_have_been_written(
    answers: list[httpx.Response], unknown: bool
) -> None:
    with pytest.raises(BindError) as caught:
        bind({BINDING: answers})
    assert isinstance(caught.value, BindOutcomeUnknownError) is unknown


def test_other_refusals_are_not_retried() -> None:
    with pytest.raises(BindError, match=r"was refused: .*403 pods/binding is forbidden"):
        bind({BINDING: [status(403, "pods/binding is forbidden")]})


def test_settings_refuse_a_bind_that_could_outlast_kube_schedulers_http_timeout(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "schedext.yaml"
    config.write_text("gang: {max_wait_s: 20}\nbind: {api_deadline_s: 9.5}\n")
    assert cli.main(["serve", "--config", str(config)]) == 2
    message = capsys.readouterr().err
    assert "invalid settings" in message
    assert (
        "gang.max_wait_s (20) + bind.api_deadline_s (9.5) + 1s to answer must not exceed "
        "bind.extender_http_timeout_s (30)"
    ) in message


@pytest.mark.parametrize(
    ("max_wait_s", "api_deadline_s", "http_timeout_s", "valid"),
    [(20, 8, 30, True), (20, 9, 30, True), (20, 9.5, 30, False), (25, 8, 30, False),
     (25, 8, 40, True)],
)  # fmt: skip
def test_the_bind_budget_check(
    max_wait_s: float, api_deadline_s: float, http_timeout_s: float, valid: bool
) -> None:
    overrides = {
        "gang": {"max_wait_s": max_wait_s, "default_timeout_s": 1},
        "bind": {"api_deadline_s": api_deadline_s, "extender_http_timeout_s": http_timeout_s},
    }
    if valid:
        load_settings(**overrides)
    else:
        with pytest.raises(SettingsError, match="to answer must not exceed"):
            load_settings(**overrides)


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
