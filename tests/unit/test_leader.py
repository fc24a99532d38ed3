"""Leader election on a Lease, against a canned API server and an injected clock."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import orjson

from app.kube.leader import LeaderElector
from app.kube.role import ROLE_LABEL, PodRoleLabel
from tests.unit.kube_fakes import FakeApiServer

LEASE = "/apis/coordination.k8s.io/v1/namespaces/ops/leases/schedext"
LEASES = "/apis/coordination.k8s.io/v1/namespaces/ops/leases"


def lease(
    holder: str, renew: str = "t0", *, duration: int = 15, transitions: int = 0
) -> httpx.Response:
    spec = {
        "holderIdentity": holder,
        "leaseDurationSeconds": duration,
        "renewTime": renew,
        "leaseTransitions": transitions,
    }
    return httpx.Response(
        200, json={"metadata": {"name": "schedext", "resourceVersion": "7"}, "spec": spec}
    )


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def elector(
    answers: dict[tuple[str, str], list[httpx.Response]],
    clock: Clock,
    changes: list[tuple[bool, str]] | None = None,
) -> tuple[LeaderElector, FakeApiServer]:
    def handle(request: httpx.Request) -> httpx.Response:
        return answers[(request.method, request.url.path)].pop(0)

    server = FakeApiServer(other=handle)

    def record(leading: bool, holder: str) -> None:
        if changes is not None:
            changes.append((leading, holder))

    candidate = LeaderElector(
        server.api(), namespace="ops", name="schedext", identity="me", lease_duration_s=15,
        renew_deadline_s=5, retry_period_s=2, clock=clock, on_change=record,
    )  # fmt: skip
    return candidate, server


def body(server: FakeApiServer, index: int) -> dict[str, Any]:
    return dict(orjson.loads(server.requests[index].content))


def test_the_first_replica_creates_the_lease_and_leads() -> None:
    candidate, server = elector(
        {
            ("GET", LEASE): [httpx.Response(404, json={})],
            ("POST", LEASES): [httpx.Response(201, json={})],
        },
        Clock(),
    )
    assert asyncio.run(candidate.try_acquire_or_renew()) is True
    spec = body(server, 1)["spec"]
    assert (spec["holderIdentity"], spec["leaseDurationSeconds"], spec["leaseTransitions"]) == (
        "me",
        15,
        0,
    )


def test_a_lease_held_by_another_replica_is_respected_until_it_expires_on_our_clock() -> None:
    clock = Clock()
    candidate, server = elector(
        {
            # the same record every time: the other replica never renews
            ("GET", LEASE): [lease("other", transitions=3) for _ in range(3)],
            ("PUT", LEASE): [httpx.Response(200, json={})],
        },
        clock,
    )
    assert asyncio.run(candidate.try_acquire_or_renew()) is False
    assert candidate.holder == "other"
    clock.now += 14.9  # the record has not changed, but the lease has not expired yet either
    assert asyncio.run(candidate.try_acquire_or_renew()) is False
    clock.now += 0.2
    assert asyncio.run(candidate.try_acquire_or_renew()) is True
    taken = body(server, 3)
    assert taken["spec"]["holderIdentity"] == "me"
    assert taken["spec"]["leaseTransitions"] == 4
    assert taken["metadata"]["resourceVersion"] == "7"  # optimistic concurrency


def test_a_leader_that_keeps_renewing_keeps_the_lease() -> None:
    clock = Clock()
    renewals = [lease("other", renew=f"t{i}") for i in range(3)]
    candidate, _ = elector({("GET", LEASE): renewals}, clock)
    for _ in range(3):
        assert asyncio.run(candidate.try_acquire_or_renew()) is False
        clock.now += 10  # more than the lease duration in total, but every record was new


def test_losing_the_write_race_is_not_leading() -> None:
    clock = Clock()
    candidate, _ = elector(
        {
            ("GET", LEASE): [lease("")],
            ("PUT", LEASE): [httpx.Response(409, json={"message": "conflict"})],
        },
        clock,
    )
    assert asyncio.run(candidate.try_acquire_or_renew()) is False


def test_a_leader_that_cannot_renew_within_the_deadline_steps_down() -> None:
    clock = Clock()
    changes: list[tuple[bool, str]] = []
    answers = {
        ("GET", LEASE): [httpx.Response(404, json={})]
        + [httpx.Response(500, json={"message": "etcd down"})] * 10,
        ("POST", LEASES): [httpx.Response(201, json={})],
    }
    candidate, _ = elector(answers, clock, changes)

    async def sleep(seconds: float) -> None:
        clock.now += seconds
        if clock.now > 120:
            raise asyncio.CancelledError

    candidate._sleep = sleep  # the test seam for time
    with contextlib.suppress(asyncio.CancelledError):
        asyncio.run(candidate.run_forever())
    assert changes == [(True, "me"), (False, "me")]


def test_release_hands_the_lease_over_at_once() -> None:
    candidate, server = elector(
        {("GET", LEASE): [lease("me")], ("PUT", LEASE): [httpx.Response(200, json={})]}, Clock()
    )
    candidate.leading = True
    asyncio.run(candidate.release())
    released = body(server, 1)["spec"]
    assert (released["holderIdentity"], released["leaseDurationSeconds"]) == ("", 1)
    assert candidate.leading is False


def test_a_standby_reports_who_leads() -> None:
    clock = Clock()
    changes: list[tuple[bool, str]] = []
    candidate, _ = elector(
        {("GET", LEASE): [lease("other", renew=f"t{i}") for i in range(5)]}, clock, changes
    )

    async def sleep(seconds: float) -> None:
        clock.now += seconds
        if clock.now > 106:
            raise asyncio.CancelledError

    candidate._sleep = sleep
    with contextlib.suppress(asyncio.CancelledError):
        asyncio.run(candidate.run_forever())
    assert changes == [(False, "other")]  # reported once, for readiness; never leading


# --- the leader's pod label (app.kube.role) ------------------------------------------------

POD = "/api/v1/namespaces/ops/pods/schedext-7d9f-abcde"


def pod(*, leader: bool) -> httpx.Response:
    labels = {"app.kubernetes.io/name": "schedext"}
    if leader:
        labels[ROLE_LABEL] = "leader"
    return httpx.Response(200, json={"metadata": {"name": "schedext-7d9f-abcde", "labels": labels}})


def labeller(
    answers: dict[tuple[str, str], list[httpx.Response]],
    idle: Callable[[float], Awaitable[None]] | None = None,
) -> tuple[PodRoleLabel, FakeApiServer]:
    def handle(request: httpx.Request) -> httpx.Response:
        return answers[(request.method, request.url.path)].pop(0)

    server = FakeApiServer(other=handle)
    role = PodRoleLabel(
        server.api(), namespace="ops", pod="schedext-7d9f-abcde", resync_s=30, backoff_s=0.5,
        max_backoff_s=2, idle=idle,
    )  # fmt: skip
    return role, server


def patches(server: FakeApiServer) -> list[Any]:
    sent = [r for r in server.requests if r.method == "PATCH"]
    assert all(r.headers["content-type"] == "application/merge-patch+json" for r in sent)
    return [orjson.loads(r.content)["metadata"]["labels"][ROLE_LABEL] for r in sent]


def test_the_label_is_set_on_gaining_the_lease_and_removed_on_losing_it() -> None:
    role, server = labeller(
        {
            ("GET", POD): [pod(leader=False)],
            ("PATCH", POD): [pod(leader=True), pod(leader=False)],
        }
    )

    async def scenario() -> None:
        await role.reconcile()  # a standby, unlabelled: reads its pod, writes nothing
        assert role.actual is False
        role.set_leading(True)
        await role.reconcile()
        assert role.actual is True
        await role.reconcile()  # nothing changed: no request at all
        role.set_leading(False)
        await role.reconcile()
        assert role.actual is False

    asyncio.run(scenario())
    assert [r.method for r in server.requests] == ["GET", "PATCH", "PATCH"]
    assert patches(server) == ["leader", None]  # null removes the label


def test_a_standby_clears_a_stale_label_left_by_an_earlier_container_of_its_pod() -> None:
    role, server = labeller({("GET", POD): [pod(leader=True)], ("PATCH", POD): [pod(leader=False)]})
    asyncio.run(role.reconcile())  # not leading (the default) but labelled: remove it
    assert patches(server) == [None]
    assert role.actual is False


def test_a_failed_patch_is_retried_with_a_capped_backoff() -> None:
    waits: list[float] = []

    async def idle(seconds: float) -> None:
        waits.append(seconds)
        if seconds == 30:  # reconciled: the loop now only waits for the next resync
            raise asyncio.CancelledError

    error = httpx.Response(500, json={"message": "etcd down"})
    role, server = labeller(
        {("GET", POD): [pod(leader=False)], ("PATCH", POD): [error] * 4 + [pod(leader=True)]},
        idle,
    )
    role.set_leading(True)
    with contextlib.suppress(asyncio.CancelledError):
        asyncio.run(role.run_forever())
    assert waits == [0.5, 1, 2, 2, 30]
    assert patches(server) == ["leader"] * 5
    assert role.actual is True


def test_a_label_removed_by_hand_is_put_back_at_the_next_resync() -> None:
    waits: list[float] = []

    async def idle(seconds: float) -> None:
        waits.append(seconds)
        if len(waits) == 2:
            raise asyncio.CancelledError

    role, server = labeller(
        {
            ("GET", POD): [pod(leader=False), pod(leader=False)],  # someone removed it
            ("PATCH", POD): [pod(leader=True), pod(leader=True)],
        },
        idle,
    )
    role.set_leading(True)
    with contextlib.suppress(asyncio.CancelledError):
        asyncio.run(role.run_forever())
    assert [r.method for r in server.requests] == ["GET", "PATCH", "GET", "PATCH"]
    assert waits == [30, 30]


def test_clear_at_shutdown_unlabels_once_and_only_when_needed() -> None:
    role, server = labeller({("PATCH", POD): [httpx.Response(500, json={})]})
    role.actual = True
    asyncio.run(role.clear())  # a failure is logged, never retried: the pod is going away
    assert patches(server) == [None]
    role.actual = False
    asyncio.run(role.clear())
    assert len(server.requests) == 1


def test_the_label_loop_stops_when_cancelled_as_leadership_is_given_up() -> None:
    """At shutdown the elector releases the lease (the label loop is told: not leading) and
    the tasks are cancelled at once. Found by the fault soak: with asyncio.wait_for, Python
    3.11 swallowed that cancellation, and SIGTERM left the leader running until SIGKILL."""
    role, _ = labeller({("GET", POD): [pod(leader=True)], ("PATCH", POD): [pod(leader=False)]})
    role.set_leading(True)

    async def scenario() -> bool:
        task = asyncio.create_task(role.run_forever())
        for _ in range(100):  # until it has read its pod: labelled, as leading wants
            if role.actual is True:
                break
            await asyncio.sleep(0)
        await asyncio.sleep(0)  # now waiting for a change
        role.set_leading(False)
        task.cancel()
        done, _ = await asyncio.wait({task}, timeout=5)
        return task in done and task.cancelled()

    assert asyncio.run(scenario())
