"""The gang barrier over real HTTP: member binds wait for each other, or time out together."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import orjson

from app.kube.binding import BindError, InMemoryBinder
from extender.model import BindPlan
from testbed.builders import gang_pod, make_node, make_pod_group, name_of, uid_of
from tests.api.conftest import Serve
from tests.api.server import RunningServer
from tests.recorded_events import RecordedEvents


def bind(server: RunningServer, pod: dict[str, Any], node: str) -> tuple[str, float]:
    body = {"PodName": name_of(pod), "PodNamespace": "default", "PodUID": uid_of(pod), "Node": node}
    started = time.monotonic()
    with server.client() as client:
        answer = client.post("/bind", content=orjson.dumps(body)).json()["Error"]
    return answer, time.monotonic() - started


class FailingOnce(InMemoryBinder):
    """Binds in memory, except that the first Binding of one pod fails."""

    def __init__(self, uid: str) -> None:
        super().__init__()
        self._uid = uid
        self.failed = False

    async def bind(self, plan: BindPlan) -> None:
        if plan.uid == self._uid and not self.failed:
            self.failed = True
            raise BindError(f"pod {plan.key} is being deleted")
        await super().bind(plan)


MEMBERS = [gang_pod(f"m{i}", "train", gpus=2) for i in range(3)]


def start(
    serve: Serve, *, timeout_s: int, **app_kwargs: Any
) -> tuple[RunningServer, list[dict[str, Any]]]:
    server = serve(
        nodes=[make_node("g", gpus=8)],
        pods=MEMBERS,  # pending pods in the snapshot: known to bind without a filter call
        groups=[make_pod_group("train", min_member=3, timeout_s=timeout_s)],
        **app_kwargs,
    )
    return server, MEMBERS


def holders(server: RunningServer) -> list[str]:
    with server.client() as client:
        gpus = client.get("/inventory").json()["nodes"][0]["gpus"]
    return sorted(g["holder"] for g in gpus if g["holder"])


def metric(server: RunningServer, line_start: str) -> str:
    with server.client() as client:
        text = client.get("/metrics").text
    return next((line for line in text.splitlines() if line.startswith(line_start)), "")


def test_member_binds_wait_for_the_last_member_then_all_succeed(serve: Serve) -> None:
    server, members = start(serve, timeout_s=10)
    with ThreadPoolExecutor(max_workers=3) as pool:
        early = [pool.submit(bind, server, pod, "g") for pod in members[:2]]
        time.sleep(0.5)  # the first two are parked at the barrier (bounded pause)
        assert not any(f.done() for f in early)
        assert metric(server, "schedext_gangs_waiting ") == "schedext_gangs_waiting 1.0"
        with server.client() as client:
            (gang,) = client.get("/inventory").json()["gangs"]
        assert (gang["phase"], gang["waiting"], gang["lastFailure"]) == ("Scheduling", 2, None)
        assert 0 < gang["waitLeftSeconds"] <= 10
        last = pool.submit(bind, server, members[2], "g")
        results = [f.result(timeout=10) for f in [*early, last]]
    assert [error for error, _ in results] == ["", "", ""]
    assert all(elapsed < 5 for _, elapsed in results)
    with server.client() as client:
        gpus = client.get("/inventory").json()["nodes"][0]["gpus"]
        metrics = client.get("/metrics").text
    assert (
        sorted(g["holder"] for g in gpus if g["holder"])
        == ["default/m0"] * 2 + ["default/m1"] * 2 + ["default/m2"] * 2
    )
    assert 'schedext_gang_events_total{outcome="complete"} 1.0' in metrics
    assert "schedext_gangs_waiting 0.0" in metrics


def test_a_member_whose_binding_fails_after_the_barrier_gives_its_gpus_back_and_binds_alone(
    serve: Serve,
) -> None:
    server, members = start(serve, timeout_s=10, binder=FailingOnce(uid_of(MEMBERS[1])))
    with ThreadPoolExecutor(max_workers=3) as pool:
        results = list(pool.map(lambda pod: bind(server, pod, "g"), members))
    assert [error for error, _ in results] == ["", "pod default/m1 is being deleted", ""]
    # The other two stay bound (a Binding cannot be undone); m1's GPUs are free again.
    assert holders(server) == ["default/m0"] * 2 + ["default/m2"] * 2
    with server.client() as client:
        group = client.get("/explain/default/m1").json()["group"]
    assert (group["phase"], group["scheduled"], group["waiting"]) == ("Scheduling", 2, 0)
    # kube-scheduler retries m1 alone: the group's quorum is met, so it does not wait.
    error, elapsed = bind(server, members[1], "g")
    assert (error, elapsed < 2) == ("", True)
    assert holders(server) == ["default/m0"] * 2 + ["default/m1"] * 2 + ["default/m2"] * 2
    with server.client() as client:
        group = client.get("/explain/default/m1").json()["group"]
    assert (group["phase"], group["scheduled"]) == ("Scheduled", 3)


def test_member_binds_fail_together_when_the_group_times_out(serve: Serve) -> None:
    recorded = RecordedEvents()
    server, members = start(serve, timeout_s=1, events=recorded)
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(lambda pod: bind(server, pod, "g"), members[:2]))
    for error, elapsed in results:
        assert "did not reach minMember 3 within 1s" in error
        assert 0.8 < elapsed < 5
    with server.client() as client:
        inventory = client.get("/inventory").json()
        metrics = client.get("/metrics").text
    assert inventory["reservations"] == 0
    assert all(g["holder"] is None for g in inventory["nodes"][0]["gpus"])
    (gang,) = inventory["gangs"]
    assert (gang["waiting"], gang["waitLeftSeconds"]) == (0, None)
    assert gang["lastFailure"] == {
        "outcome": "timed_out",
        "reason": "schedext: group default/train did not reach minMember 3 within 1s",
    }
    assert 'schedext_gang_events_total{outcome="timed_out"} 1.0' in metrics
    # kube-scheduler does not report this decision: schedext puts an event on each member
    assert sorted((e.pod, e.reason, e.warning) for e in recorded.events) == [
        ("default/m0", "GangTimedOut", True),
        ("default/m1", "GangTimedOut", True),
    ]
    assert all("did not reach minMember 3" in e.message for e in recorded.events)
