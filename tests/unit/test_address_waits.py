"""Pods turned away for an address are sent back to kube-scheduler once schedext's own books
free one in their pool: kube-scheduler's own retry, on the deletion it sees, can reach filter
before schedext's watch has given the address back (see extender.capacity_waits: addresses are
one kind of its waits)."""

from __future__ import annotations

import copy
import itertools
from collections.abc import Callable
from typing import Any

import pytest

from app.service.assembly import Service
from app.service.main import create_app
from app.service.settings import load_settings
from extender.capacity_waits import WaitKind
from extender.model import Reason
from extender.scheduler import Scheduler
from testbed.builders import bound_ip_pod, ip_pod, make_ip_claim, make_ip_pool, make_node, make_pod
from tests.recorded_events import RecordedEvents

RACK = "topology.kubernetes.io/rack"
NODES = ["a1", "b1"]
SMALL = make_ip_pool("small", ranges=[("10.30.0.1", "10.30.0.2")])  # every node
OTHER = make_ip_pool("other", ranges=[("10.40.0.1", "10.40.0.1")])
HOLDERS = [
    bound_ip_pod("h1", node="a1", ip="10.30.0.1", pool="small", uid="h1"),
    bound_ip_pod("h2", node="b1", ip="10.30.0.2", pool="small", uid="h2"),
    bound_ip_pod("o1", node="b1", ip="10.40.0.1", pool="other", uid="o1"),
]
WAITER = ip_pod("w", pool="small", uid="w")
WAITING = [("default/w", "w")]
CLAIM = make_ip_claim("small", "10.30.0.1", "sts/default/db/0")  # kept without a pod


def cluster(
    pods: list[dict[str, Any]] = HOLDERS,
    claims: list[dict[str, Any]] = (),  # type: ignore[assignment]
    scheduler: Scheduler | None = None,
) -> Scheduler:
    scheduler = scheduler or Scheduler()
    for pool in (SMALL, OTHER):
        scheduler.upsert_ip_pool(pool)
    for claim in claims:
        scheduler.upsert_ip_claim(claim)
    for name, rack in (("a1", "a"), ("b1", "b")):
        scheduler.upsert_node(make_node(name, gpus=0, labels={RACK: rack}))
    for pod in pods:
        scheduler.upsert_pod(pod)
    return scheduler


_clock = itertools.count(step=10)  # seconds apart: never within a pod's one nudge a second


def requeued(scheduler: Scheduler) -> list[tuple[str, str]]:
    """(namespace/name, uid) of the pods sent back for an address now."""
    nudges = scheduler.take_capacity_requeues(float(next(_clock)))
    assert {n.kind for n in nudges} <= {WaitKind.ADDRESS}
    return [(n.pod, n.uid) for n in nudges]


def turned_away(scheduler: Scheduler, pod: dict[str, Any] = WAITER) -> None:
    scheduler.upsert_pod(pod)  # the watch sees it pending
    assert scheduler.filter(pod, NODES).passed == []


def changed(pod: dict[str, Any], **status: str) -> dict[str, Any]:
    """The pod as a later watch event shows it: relabelled, and with ``status`` if given."""
    pod = copy.deepcopy(pod)
    pod["metadata"]["labels"]["touched"] = "yes"
    pod["status"].update(status)
    return pod


EVENTS: list[tuple[str, Callable[[Scheduler], object], list[tuple[str, str]]]] = [
    ("a holder of the pool is deleted", lambda s: s.delete_pod("h1"), WAITING),
    (
        "a holder of the pool finishes",
        lambda s: s.upsert_pod(changed(HOLDERS[0], phase="Succeeded")),
        WAITING,
    ),
    ("a pod relist no longer has a holder", lambda s: s.replace_pods(HOLDERS[1:]), WAITING),
    (
        "the pool grows",
        lambda s: s.upsert_ip_pool(make_ip_pool("small", ranges=[("10.30.0.1", "10.30.0.3")])),
        WAITING,
    ),
    ("a holder of another pool is deleted", lambda s: s.delete_pod("o1"), []),
    (
        "a holder's holding is rewritten: it keeps its address",
        lambda s: s.upsert_pod(changed(HOLDERS[0], phase="Pending")),
        [],
    ),
    ("a pod relist with every holder", lambda s: s.replace_pods([*HOLDERS, WAITER]), []),
    (
        "the waiting pod is deleted first",
        lambda s: (s.delete_pod("w"), s.delete_pod("h1")),
        [],
    ),
    ("the pool's spec is written again unchanged", lambda s: s.upsert_ip_pool(SMALL), []),
]


@pytest.mark.parametrize(("name", "then", "expected"), EVENTS, ids=[e[0] for e in EVENTS])
def test_a_pod_turned_away_for_a_pool_is_retried_when_schedext_sees_an_address_freed(
    name: str, then: Callable[[Scheduler], object], expected: list[tuple[str, str]]
) -> None:
    scheduler = cluster()
    turned_away(scheduler)
    assert requeued(scheduler) == []  # nothing freed yet
    then(scheduler)
    assert requeued(scheduler) == expected
    assert requeued(scheduler) == []  # sent back once


def test_a_pod_turned_away_again_waits_again() -> None:
    scheduler = cluster()
    turned_away(scheduler)
    scheduler.delete_pod("h1")
    assert requeued(scheduler) == WAITING
    taker = ip_pod("taker", pool="small", uid="taker")
    scheduler.filter(taker, NODES)
    scheduler.plan_bind(uid="taker", namespace="default", name="taker", node="a1", now=0)
    turned_away(scheduler)  # its retry came after another pod took the address
    scheduler.delete_pod("h2")
    assert requeued(scheduler) == WAITING


def test_a_bind_that_gives_its_reservation_back_frees_the_address() -> None:
    scheduler = cluster(pods=HOLDERS[1:])  # one address of small is free
    taker = ip_pod("taker", pool="small", uid="taker")
    scheduler.filter(taker, NODES)
    plan = scheduler.plan_bind(uid="taker", namespace="default", name="taker", node="a1", now=0)
    turned_away(scheduler)
    scheduler.abort_bind(plan)
    assert requeued(scheduler) == WAITING


def test_a_pod_that_waits_for_gpus_where_its_pool_has_room_is_not_retried_for_addresses() -> None:
    gpu_holder = make_pod("g", node="a1", gpus=1, gpu_ids=[0], uid="g")
    address_holder = bound_ip_pod("h", node="a1", ip="10.20.1.1", pool="rack-a", uid="h")
    scheduler = cluster(pods=[gpu_holder, address_holder])
    for name, rack in (("a1", "a"), ("b1", "b")):
        scheduler.upsert_node(make_node(name, gpus=1, labels={RACK: rack}))
    scheduler.upsert_ip_pool(make_ip_pool("rack-a", cidr="10.20.1.0/29", rack="a"))
    pod = ip_pod("w", pool="rack-a", gpus=1, uid="w")
    turned_away(scheduler, pod)
    assert {r.reason for r in scheduler.filter(pod, NODES).rejections} == {
        Reason.GPU_FREE,  # a1, in the pool, where an address is free
        Reason.IP_NOT_IN_POOL,  # b1, with a free GPU
    }
    scheduler.delete_pod("h")
    assert requeued(scheduler) == []


def test_a_pod_filter_let_through_or_bound_since_is_not_retried() -> None:
    scheduler = cluster(pods=HOLDERS[1:])
    assert scheduler.filter(WAITER, NODES).passed == NODES
    scheduler.delete_pod("h2")
    assert requeued(scheduler) == []
    scheduler = cluster()
    turned_away(scheduler)
    scheduler.upsert_pod(bound_ip_pod("w", node="a1", ip="10.30.0.9", pool="", uid="w"))
    scheduler.delete_pod("h1")
    assert requeued(scheduler) == []  # bound meanwhile: nothing to retry


STICKY = {"schedext.io/ip-policy": "sticky"}
BLOCKED: list[tuple[str, dict[str, Any], list[dict[str, Any]], Callable[[Scheduler], object]]] = [
    (
        "a specific address another pod holds",
        ip_pod("w", ip="10.30.0.1", uid="w"),
        HOLDERS,
        lambda s: s.delete_pod("h1"),
    ),
    (
        "a sticky address the identity's previous pod still holds",
        ip_pod("web-0", pool="small", policy="sticky", statefulset="web", uid="w"),
        [
            bound_ip_pod(
                "web-0", node="a1", ip="10.30.0.1", pool="small", uid="old", annotations=STICKY
            ),
            *HOLDERS[1:],
        ],
        lambda s: s.delete_pod("old"),
    ),
    (
        "an exhausted pool whose claim is released",
        WAITER,
        HOLDERS[1:],
        lambda s: s.delete_ip_claim(CLAIM),
    ),
    (
        "a pool that does not exist yet",
        ip_pod("w", pool="later", uid="w"),
        [],
        lambda s: s.upsert_ip_pool(make_ip_pool("later", cidr="10.50.0.0/29")),
    ),
    (
        "a pool that selects none of the nodes",
        ip_pod("w", pool="rack-c", uid="w"),
        [],
        lambda s: s.upsert_ip_pool(make_ip_pool("rack-c", cidr="10.60.0.0/29", rack="b")),
    ),
]


@pytest.mark.parametrize(("name", "pod", "pods", "free"), BLOCKED, ids=[b[0] for b in BLOCKED])
def test_every_wait_an_address_or_a_pool_can_end_is_remembered(
    name: str, pod: dict[str, Any], pods: list[dict[str, Any]], free: Callable[[Scheduler], object]
) -> None:
    scheduler = cluster(pods=pods, claims=[CLAIM] if "claim" in name else [])
    scheduler.upsert_ip_pool(make_ip_pool("rack-c", cidr="10.60.0.0/29", rack="c"))
    turned_away(scheduler, pod)
    free(scheduler)
    assert requeued(scheduler) == [(f"default/{pod['metadata']['name']}", "w")]


def relist_claims(scheduler: Scheduler, claims: list[dict[str, Any]]) -> None:
    relist = scheduler.ip_claim_relist()
    relist.add(claims)
    relist.commit()


@pytest.mark.parametrize(
    ("name", "then"),
    [
        ("the claim is written again", lambda s: s.upsert_ip_claim(CLAIM)),
        ("a claim relist keeps it", lambda s: relist_claims(s, [CLAIM])),
    ],
)
def test_a_claim_that_stays_frees_nothing(name: str, then: Callable[[Scheduler], object]) -> None:
    scheduler = cluster(pods=HOLDERS[1:], claims=[CLAIM])
    turned_away(scheduler)
    then(scheduler)
    assert requeued(scheduler) == []


def test_an_address_freed_before_anyone_waited_wakes_no_later_waiter() -> None:
    scheduler = cluster()
    scheduler.delete_pod("h1")
    scheduler.upsert_pod(HOLDERS[0])  # the address taken again
    turned_away(scheduler)
    assert requeued(scheduler) == []


def test_the_shell_asks_kube_scheduler_to_retry_the_waiting_pods() -> None:
    recorded = RecordedEvents()
    service: Service = create_app(load_settings(), events=recorded).state.service
    scheduler = cluster(scheduler=service.scheduler)
    turned_away(scheduler)
    scheduler.delete_pod("h1")  # a watch event: the shell calls this after each one
    service.requeue_waiters()
    assert recorded.requeued == WAITING
    assert recorded.events == []
    service.core(lambda s: s.delete_pod("h2"))  # after a core call too; nothing waits now
    assert recorded.requeued == WAITING
