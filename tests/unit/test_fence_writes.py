"""The fence's writes against a canned API server (app.kube.fence): a bind publishes its
rules before the Binding and is refused when it cannot; a pass creates, rewrites and deletes
until the published rules are the wanted ones, and never deletes the rule of a GPU a bind took
since it planned; at start, a cluster that cannot take the fence is named in one line, and
without a cluster the fence is inert."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from app.kube.api import Deadline
from app.kube.binder import ApiBinder
from app.kube.binding import BindError, InMemoryBinder
from app.kube.fence import DEVICE_TAINT_RULES, Fences, fence_problem, rule_body
from app.kube.readiness import Readiness
from app.service.main import create_app
from app.service.settings import load_settings
from extender.config import DraConfig, PolicyConfig
from extender.dra import FENCE_KEY, DeviceRef, FenceRule, fence_name
from extender.fencing import FencePlan
from extender.model import BindPlan
from extender.scheduler import Scheduler
from testbed.builders import agent_annotations, make_node, make_pod
from testbed.dra_builders import DRIVER, gpu, resource_claim, resource_slice, result, taint_rule
from tests.unit.kube_fakes import FakeApiServer

Handler = Callable[[httpx.Request], httpx.Response]


def fence_rule(device: str, value: str = "uid-1") -> FenceRule:
    ref = DeviceRef(DRIVER, "n1", device)
    return FenceRule(fence_name("n1", ref), "n1", ref, value)


RULES = (fence_rule("gpu-0"), fence_rule("gpu-1"))
PLAN = BindPlan(
    uid="uid-1",
    namespace="ml",
    name="trainer-0",
    node="n1",
    gpu_ids=(0, 1),
    annotations={"schedext.io/gpu-ids": "0,1"},
    fence=RULES,
)
BINDING = "/api/v1/namespaces/ml/pods/trainer-0/binding"


def status(code: int, message: str = "") -> httpx.Response:
    return httpx.Response(code, json={"kind": "Status", "code": code, "message": message})


def by_method(answers: dict[str, list[httpx.Response]]) -> Handler:
    """Answers by "METHOD path" (a path under DEVICE_TAINT_RULES by "METHOD rules")."""

    def handle(request: httpx.Request) -> httpx.Response:
        path = request.url.path
        where = "rules" if path.startswith(DEVICE_TAINT_RULES) else path
        queue = answers.get(f"{request.method} {where}")
        assert queue, f"unexpected {request.method} {path}"
        return queue.pop(0)

    return handle


def calls(server: FakeApiServer) -> list[str]:
    return [f"{r.method} {r.url.path}" for r in server.requests]


def body(request: httpx.Request) -> Any:
    return orjson.loads(request.content)


# -------------------------------------------------------------------------- the bind


def test_a_bind_publishes_its_rules_before_its_binding() -> None:
    server = FakeApiServer(
        other=by_method(
            {"POST rules": [status(201), status(201)], f"POST {BINDING}": [status(201)]}
        )
    )
    api = server.api()
    asyncio.run(ApiBinder(api, fences=Fences(api)).bind(PLAN))
    assert calls(server) == [
        f"POST {DEVICE_TAINT_RULES}",
        f"POST {DEVICE_TAINT_RULES}",
        f"POST {BINDING}",
    ]
    first = body(server.requests[0])
    assert first == rule_body(RULES[0])
    assert first["metadata"]["labels"] == {"app.kubernetes.io/managed-by": "schedext"}
    assert first["spec"] == {
        "deviceSelector": {"driver": DRIVER, "pool": "n1", "device": "gpu-0"},
        "taint": {"key": FENCE_KEY, "value": "uid-1", "effect": "NoSchedule"},
    }


def test_a_rule_already_there_is_made_the_bind_s_own() -> None:
    server = FakeApiServer(
        other=by_method(
            {
                "POST rules": [status(409), status(201)],
                "PATCH rules": [status(200)],
                f"POST {BINDING}": [status(201)],
            }
        )
    )
    api = server.api()
    asyncio.run(ApiBinder(api, fences=Fences(api)).bind(PLAN))
    assert calls(server) == [
        f"POST {DEVICE_TAINT_RULES}",
        f"PATCH {DEVICE_TAINT_RULES}/{RULES[0].name}",
        f"POST {DEVICE_TAINT_RULES}",
        f"POST {BINDING}",
    ]
    assert body(server.requests[1])["spec"]["taint"]["value"] == "uid-1"


def test_a_rule_that_cannot_be_published_refuses_the_bind_before_any_binding() -> None:
    server = FakeApiServer(other=by_method({"POST rules": [status(403, "forbidden")]}))
    api = server.api()
    with pytest.raises(BindError) as refused:
        asyncio.run(ApiBinder(api, fences=Fences(api)).bind(PLAN))
    assert type(refused.value) is BindError  # certainly not bound: the reservation goes back
    message = str(refused.value)
    assert "cannot fence GPU device gpu.nvidia.com/n1/gpu-0 on node n1" in message
    assert "not binding" in message
    assert calls(server) == [f"POST {DEVICE_TAINT_RULES}"]


def test_a_bind_s_rules_share_its_deadline() -> None:
    server = FakeApiServer(other=by_method({}))
    fences = Fences(server.api())
    with pytest.raises(TimeoutError):
        asyncio.run(fences.before_bind(RULES, Deadline(at=0.0)))
    assert server.requests == []


def test_a_claim_allocated_while_the_fence_went_up_refuses_the_bind() -> None:
    """Bind reserved GPUs 0 and 1; while its rules are published, the watch brings in a claim
    DRA allocated on GPU 1 before the fence was up: no Binding goes out."""
    scheduler = mixed()
    pod = make_pod("p", uid="uid-p", gpus=2)
    assert scheduler.filter(pod, ["n1"]).passed == ["n1"]
    plan = scheduler.plan_bind(uid="uid-p", namespace="default", name="p", node="n1", now=1.0)
    claim = resource_claim("late", results=[result("n1", f"gpu-{plan.gpu_ids[1]}")], node="n1")

    def handle(request: httpx.Request) -> httpx.Response:
        assert request.url.path.startswith(DEVICE_TAINT_RULES), request.url.path
        scheduler.upsert_resource_claim(claim)  # the watch, while the write is awaited
        return status(201)

    server = FakeApiServer(other=handle)
    api = server.api()
    fences = Fences(api)

    async def bind() -> None:
        passes = asyncio.create_task(fences.run_forever(scheduler, Readiness()))
        await asyncio.sleep(0)  # the pass loop starts: binds now check their GPUs
        try:
            await ApiBinder(api, fences=fences).bind(plan)
        finally:
            passes.cancel()

    with pytest.raises(BindError) as refused:
        asyncio.run(bind())
    assert type(refused.value) is BindError  # never sent: the reservation goes back
    assert "allocated by DRA to claim default/late" in str(refused.value)
    assert all(r.url.path.startswith(DEVICE_TAINT_RULES) for r in server.requests)


# ------------------------------------------------------------------------- the passes


def mixed(*pods: dict[str, Any]) -> Scheduler:
    scheduler = Scheduler(PolicyConfig(dra=DraConfig(fence=True)))
    scheduler.upsert_node(
        make_node("n1", gpus=4, annotations=agent_annotations(4, uuid_prefix="GPU-n1"))
    )
    scheduler.upsert_resource_slice(resource_slice("n1", [gpu(i) for i in range(4)]))
    for pod in pods:
        scheduler.upsert_pod(pod)
    return scheduler


def seen(scheduler: Scheduler, rule: FenceRule) -> None:
    """The watch brings ``rule`` back, as published."""
    driver, pool, device = rule.ref
    obj = taint_rule(
        rule.name,
        selector={"driver": driver, "pool": pool, "device": device},
        key=FENCE_KEY,
        value=rule.value,
    )
    scheduler.upsert_device_taint_rule(obj)


def run_pass(scheduler: Scheduler, handle: Handler) -> FakeApiServer:
    server = FakeApiServer(other=handle)
    asyncio.run(Fences(server.api()).pass_once(scheduler))
    return server


def test_a_pass_publishes_missing_rules_and_deletes_those_no_pod_needs() -> None:
    scheduler = mixed(make_pod("a", uid="uid-1", gpus=1, node="n1", gpu_ids=[0]))
    stale = fence_rule("gpu-3", "uid-gone")
    seen(scheduler, stale)
    server = run_pass(
        scheduler, by_method({"POST rules": [status(201)], "DELETE rules": [status(404)]})
    )
    assert calls(server) == [
        f"POST {DEVICE_TAINT_RULES}",
        f"DELETE {DEVICE_TAINT_RULES}/{stale.name}",  # already gone: fine
    ]
    assert body(server.requests[0]) == rule_body(fence_rule("gpu-0"))


def test_a_pass_rewrites_a_rule_whose_holder_changed_and_leaves_a_right_one_alone() -> None:
    scheduler = mixed(
        make_pod("a", uid="uid-1", gpus=1, node="n1", gpu_ids=[0]),
        make_pod("b", uid="uid-2", gpus=1, node="n1", gpu_ids=[1]),
    )
    seen(scheduler, fence_rule("gpu-0"))
    seen(scheduler, fence_rule("gpu-1", "uid-old"))
    server = run_pass(scheduler, by_method({"PATCH rules": [status(200)]}))
    assert calls(server) == [f"PATCH {DEVICE_TAINT_RULES}/{fence_rule('gpu-1').name}"]
    assert body(server.requests[0])["spec"]["taint"]["value"] == "uid-2"


def test_a_pass_never_deletes_the_rule_of_a_gpu_taken_since_it_planned() -> None:
    """The pass plans a delete of gpu-1's rule (no pod holds it); while it writes another
    rule, a pod is bound to gpu-1: the delete is dropped."""
    scheduler = mixed(make_pod("a", uid="uid-1", gpus=1, node="n1", gpu_ids=[0]))
    seen(scheduler, fence_rule("gpu-1", "uid-gone"))

    def handle(request: httpx.Request) -> httpx.Response:
        assert request.method == "POST", f"unexpected {request.method} {request.url.path}"
        scheduler.upsert_pod(make_pod("b", uid="uid-2", gpus=1, node="n1", gpu_ids=[1]))
        return status(201)

    server = run_pass(scheduler, handle)
    assert calls(server) == [f"POST {DEVICE_TAINT_RULES}"]


def test_a_pass_writes_at_most_its_bound() -> None:
    pods = [make_pod(f"p{i}", uid=f"uid-{i}", gpus=1, node="n1", gpu_ids=[i]) for i in range(4)]
    scheduler = mixed(*pods)
    server = FakeApiServer(other=lambda _: status(201))
    plan = asyncio.run(Fences(server.api(), max_writes=3).pass_once(scheduler))
    assert len(plan.diff.create) == 4
    assert len(server.requests) == 3


def test_a_pass_that_fails_to_write_carries_on() -> None:
    pods = [make_pod(f"p{i}", uid=f"uid-{i}", gpus=1, node="n1", gpu_ids=[i]) for i in range(2)]
    server = run_pass(mixed(*pods), by_method({"POST rules": [status(500, "boom"), status(201)]}))
    assert len(server.requests) == 2


def test_a_kick_passes_at_once_and_only_a_ready_replica_writes() -> None:
    """Passes follow a kick (a pod or a slice changed), not the next second; a replica that
    is not synced, or not the leader, writes nothing."""
    scheduler = mixed(make_pod("a", uid="uid-1", gpus=1, node="n1", gpu_ids=[0]))
    server = FakeApiServer(other=lambda _: status(201))
    fences = Fences(server.api())
    readiness = Readiness()
    plans: list[FencePlan] = []

    async def scenario() -> None:
        passes = fences.run_forever(
            scheduler, readiness, interval_s=60, min_gap_s=0, report=plans.append
        )
        task = asyncio.create_task(passes)
        try:
            fences.kick()
            await asyncio.sleep(0.05)
            assert (plans, server.requests) == ([], [])  # not synced yet
            readiness.set_ready()
            fences.kick()
            async with asyncio.timeout(5):
                while not plans:
                    await asyncio.sleep(0.01)
        finally:
            task.cancel()

    asyncio.run(scenario())
    assert calls(server) == [f"POST {DEVICE_TAINT_RULES}"]


# ------------------------------------------------------------------------ at start

DISCOVERY = "/apis/resource.k8s.io/v1beta2"
REVIEWS = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"
SERVED = httpx.Response(200, json={"resources": [{"name": "devicetaintrules"}]})


def review(allowed: bool) -> httpx.Response:
    return httpx.Response(201, json={"status": {"allowed": allowed}})


@pytest.mark.parametrize(
    ("answers", "says"),
    [
        pytest.param(
            {f"GET {DISCOVERY}": [status(404)]},
            ["does not serve devicetaintrules", "DRADeviceTaintRules", "runtime-config"],
            id="v1beta2 not served",
        ),
        pytest.param(
            {f"GET {DISCOVERY}": [httpx.Response(200, json={"resources": []})]},
            ["does not serve devicetaintrules", "DRADeviceTaintRules"],
            id="v1beta2 served, but not the gate's resource",
        ),
        pytest.param(
            {f"GET {DISCOVERY}": [SERVED], f"POST {REVIEWS}": [review(False)]},
            ["may not create devicetaintrules", "manifests/rbac-dra-fence.yaml"],
            id="no right to create them",
        ),
        pytest.param(
            {
                f"GET {DISCOVERY}": [SERVED],
                f"POST {REVIEWS}": [review(True), review(True), review(True)],
            },
            [],
            id="served and allowed: no problem",
        ),
    ],
)
def test_a_cluster_that_cannot_take_the_fence_is_named_in_one_line(
    answers: dict[str, list[httpx.Response]], says: list[str]
) -> None:
    server = FakeApiServer(other=by_method(answers))
    problem = asyncio.run(fence_problem(server.api()))
    assert "\n" not in problem
    if not says:
        assert problem == ""
    for words in says:
        assert words in problem


def test_without_a_cluster_the_fence_is_accepted_and_inert(tmp_path: Path) -> None:
    """A snapshot (or the demo) has no API server to ask nor to publish to: the setting is
    accepted, and binds write nothing."""
    snapshot = tmp_path / "snapshot.json"
    node = {"kind": "Node", **make_node("n1", gpus=4)}
    snapshot.write_text(orjson.dumps({"kind": "List", "items": [node]}).decode())
    app = create_app(load_settings(snapshot=snapshot, dra={"fence": True}))
    assert app.state.service.settings.dra.fence
    assert isinstance(app.state.service.binder, InMemoryBinder)
