"""The periodic chores tell on the leader only (issue 33, point 20): a standby keeps its
books but posts no Warning event and keeps no gang's hold; and a stop ends the gangs' waits
at the barrier and makes the replica answer nothing new."""

from __future__ import annotations

from app.kube.events import PodGroupEvent
from app.service.assembly import Service
from app.service.main import chores, create_app
from app.service.settings import load_settings
from extender import names
from testbed.builders import gang_pod, make_node, make_pod_group
from tests.recorded_events import RecordedEvents


def service_with_a_bad_topology() -> tuple[Service, RecordedEvents]:
    recorded = RecordedEvents()
    service: Service = create_app(load_settings(), events=recorded).state.service
    service.readiness.set_ready()
    group = make_pod_group("g", min_member=1, annotations={names.TOPOLOGY_REQUIRED: "no/such"})
    service.scheduler.upsert_pod_group(group)
    return service, recorded


def test_a_standby_posts_no_warning_event_and_the_leader_does() -> None:
    service, recorded = service_with_a_bad_topology()
    tick = chores(service)
    service.readiness.set_leading(False, "replica-b")
    service.core(tick)
    assert recorded.events == []
    service.readiness.set_leading(True, "replica-a")
    service.core(tick)
    (event,) = recorded.events
    assert isinstance(event, PodGroupEvent)
    assert event.reason == "TopologyIgnored"


def test_a_stop_ends_every_wait_at_the_barrier_and_refuses_what_comes_next() -> None:
    service, _ = service_with_a_bad_topology()
    scheduler = service.scheduler
    scheduler.upsert_node(make_node("n1", gpus=2))
    scheduler.upsert_pod_group(make_pod_group("pair", min_member=2))
    member = gang_pod("p0", "pair", gpus=1)
    scheduler.upsert_pod(member)
    scheduler.upsert_pod(gang_pod("p1", "pair", gpus=1))
    assert scheduler.filter(member, ["n1"]).passed == ["n1"]
    meta = member["metadata"]
    service.core(
        lambda s: s.plan_bind(
            uid=meta["uid"], namespace="default", name="p0", node="n1", now=service.clock()
        )
    )
    assert scheduler.waiting_groups() == ["default/pair"]
    service.begin_stop()
    assert scheduler.waiting_groups() == []
    assert scheduler.inventory.holding(meta["uid"]) is None  # its reservation is gone
    failure = scheduler.gang_failure("default/pair")
    assert failure is not None
    assert "this replica is stopping" in failure.reason
    assert not service.readiness.ready
    assert service.readiness.checks()["stopping"] == "this replica is stopping"
