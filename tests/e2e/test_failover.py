"""High availability: two schedext replicas with leader election, each told its own pod
(POD_NAME, as the downward API gives it) among real Pod objects, behind a proxy that does
what the Service of deploy-mtls.yaml does: it sends a connection to the replica whose pod
carries schedext.io/role=leader and whose readiness check (/readyz/synced) passes.

The leader's pod is labelled and the standby's is not (a stale label from an earlier
container is cleared); the standby is Ready as a pod but refuses every verb; the leader is
killed, the standby takes over and labels its pod, the restarted replica clears its stale
label; scheduling goes on, and no GPU is ever given twice."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from app.kube.role import LEADER, ROLE_LABEL
from testbed.kubeapi import ApiError, KubeApi
from testbed.kubeapply import pod_labels, stand_in_pod
from testbed.proxy import ReadyProxy
from tests.e2e.conftest import ROOT, Cluster, Schedext, eventually, scheduler_config
from tests.e2e.test_scheduling import H100, _assert_no_gpu_given_twice

# Short leases so that the test does not wait long; the settings check that a stepping-down
# leader's last bind ends before the next leader may start (renew 1.5 + bind 2 < lease 5).
LEADER_ENV = {
    "SCHEDEXT_LEADER__ENABLED": "true",
    "SCHEDEXT_LEADER__NAMESPACE": "default",
    "SCHEDEXT_LEADER__LEASE_DURATION_S": "5",
    "SCHEDEXT_LEADER__RENEW_DEADLINE_S": "1.5",
    "SCHEDEXT_LEADER__RETRY_PERIOD_S": "0.5",
    "SCHEDEXT_BIND__API_DEADLINE_S": "2",
}
LEASE = "/apis/coordination.k8s.io/v1/namespaces/default/leases/schedext"
FIXTURES = ROOT / "tests" / "fixtures"


@dataclass
class Replica:
    schedext: Schedext
    pod: str  # its POD_NAME

    @property
    def url(self) -> str:
        return self.schedext.url


@pytest.fixture
def replicas(cluster: Cluster, tmp_path: Path) -> Iterator[tuple[Replica, Replica]]:
    """The cluster fixture's schedext is stopped; two leader-electing replicas replace it
    (:func:`leader_and_standby`)."""
    with leader_and_standby(cluster, tmp_path) as pair:
        yield pair


@contextlib.contextmanager
def leader_and_standby(
    cluster: Cluster, tmp_path: Path, env: Mapping[str, str] | None = None
) -> Iterator[tuple[Replica, Replica]]:
    """The cluster fixture's schedext is stopped; two leader-electing replicas replace it
    (with ``env`` too: more settings), each with a Pod object of its own, and kube-scheduler
    reaches them through the proxy; the first leads. The second replica's pod starts with a
    stale leader label, as if an earlier container of that pod had crashed while leading."""
    cluster.cp.stop_scheduler()
    cluster.schedext.stop()
    api = cluster.api
    cluster.api.create_pod(cluster.namespace, stand_in_pod("schedext-first"))
    stale = stand_in_pod("schedext-second", labels={ROLE_LABEL: LEADER})
    cluster.api.create_pod(cluster.namespace, stale)

    def replica(name: str) -> Replica:
        own = {"SCHEDEXT_LEADER__IDENTITY": name, "POD_NAME": f"schedext-{name}"}
        own["POD_NAMESPACE"] = cluster.namespace
        settings = {**LEADER_ENV, **(env or {}), **own}
        schedext = Schedext(cluster.cp.kubeconfig, tmp_path / f"{name}.log", env=settings)
        return Replica(schedext, f"schedext-{name}")

    first, second = replica("first"), replica("second")
    by_port = {r.schedext.port: r for r in (first, second)}
    # The proxy's own client: it runs in another thread.
    proxy_api = KubeApi(cluster.cp.server, cluster.cp.token, cluster.cp.ca_cert)

    def service_endpoint(backend: tuple[str, int]) -> bool:
        """The Service's selector (the role label) and the pod's readiness probe."""
        chosen = by_port[backend[1]]
        try:
            labelled = pod_labels(proxy_api, cluster.namespace, chosen.pod).get(ROLE_LABEL)
        except ApiError:
            return False
        return labelled == LEADER and synced(chosen)

    first.schedext.start()  # ready means synced and leading
    second.schedext.start(wait_ready=False)
    eventually(lambda: synced(second), timeout=60, message="the standby never synced")
    eventually(
        lambda: ROLE_LABEL not in pod_labels(api, cluster.namespace, second.pod),
        message="the standby did not clear the stale label of its pod",
    )
    backends = [("127.0.0.1", first.schedext.port), ("127.0.0.1", second.schedext.port)]
    with ReadyProxy(backends, endpoint=service_endpoint) as proxy:
        cluster.cp.start_scheduler(scheduler_config(f"http://127.0.0.1:{proxy.port}"))
        try:
            yield first, second
        finally:
            cluster.cp.stop_scheduler()
            first.schedext.stop()
            second.schedext.stop()
            proxy_api.close()


def synced(replica: Replica) -> bool:
    """The pod's readinessProbe in deploy-mtls.yaml: true on a standby too."""
    try:
        return httpx.get(f"{replica.url}/readyz/synced", timeout=2).status_code == 200
    except httpx.TransportError:
        return False


def labelled(cluster: Cluster, replica: Replica) -> bool:
    return pod_labels(cluster.api, cluster.namespace, replica.pod).get(ROLE_LABEL) == LEADER


def _standby_refuses(standby: Replica, leader: str) -> bool:
    try:
        ready = httpx.get(f"{standby.url}/readyz", timeout=2)
    except httpx.TransportError:
        return False
    return ready.status_code == 503 and f"not the leader (the leader is {leader})" in ready.text


def _assert_every_verb_is_refused(standby: Replica, leader: str) -> None:
    """filter and bind answer the error in the protocol's Error field, prioritize and preempt
    (whose results have none) with 503; kube-scheduler retries either way."""
    refusal = f"not the leader (the leader is {leader})"
    for verb, fixture, status in (
        ("filter", "filter_request_nodecache_true.json", 200),
        ("prioritize", "prioritize_request_nodecache_true.json", 503),
        ("preempt", "preempt_request_nodecache_true.json", 503),
        ("bind", "bind_request.json", 200),
    ):
        answer = httpx.post(
            f"{standby.url}/{verb}", content=(FIXTURES / fixture).read_bytes(), timeout=5
        )
        assert (answer.status_code, answer.json()["Error"]) == (status, refusal), verb


def test_the_standby_takes_over_when_the_leader_dies(
    cluster: Cluster, replicas: tuple[Replica, Replica]
) -> None:
    first, second = replicas
    for i in range(3):
        cluster.node(f"gpu-{i}", gpus=4, model=H100)
    eventually(
        lambda: _standby_refuses(second, "first"),
        timeout=30,
        message="the standby does not refuse as a standby",
    )
    # The Service's view: only the leader's pod is selected, while both are Ready as pods
    # (which is what lets a rolling update of the Deployment complete).
    eventually(lambda: labelled(cluster, first), message="the leader did not label its pod")
    assert not labelled(cluster, second)
    assert synced(first)
    assert synced(second)
    _assert_every_verb_is_refused(second, "first")
    assert cluster.api.apply_raw("GET", LEASE)["spec"]["holderIdentity"] == "first"

    for i in range(4):
        cluster.pod(f"before-{i}", gpus=2)
    for i in range(4):
        cluster.wait_bound(f"before-{i}", timeout=60)

    first.schedext.stop(kill=True)  # no lease release: the standby waits for it to expire
    killed = time.monotonic()
    second.schedext.wait_ready(timeout=60)
    takeover = time.monotonic() - killed
    assert 3 < takeover < 30  # not before the lease could expire, not much after
    eventually(lambda: labelled(cluster, second), message="the new leader did not label its pod")
    # A killed process cannot unlabel its pod; its readiness fails, so the Service skips it,
    # and the next container of that pod clears the label as a standby.
    assert labelled(cluster, first)
    first.schedext.start(wait_ready=False)
    eventually(
        lambda: _standby_refuses(first, "second"), timeout=60, message="no restarted standby"
    )
    eventually(
        lambda: not labelled(cluster, first),
        message="the restarted standby did not clear the stale label of its pod",
    )
    assert labelled(cluster, second)
    _assert_every_verb_is_refused(first, "second")

    for i in range(2):
        cluster.pod(f"after-{i}", gpus=2)
    for i in range(2):
        cluster.wait_bound(f"after-{i}", timeout=90)
    per_pod = _assert_no_gpu_given_twice(cluster)
    assert len(per_pod) == 6
    lease = cluster.api.apply_raw("GET", LEASE)
    assert lease["spec"]["holderIdentity"] == "second"
    assert lease["spec"]["leaseTransitions"] >= 1


def test_a_leader_that_stops_gracefully_hands_over_at_once(
    cluster: Cluster, replicas: tuple[Replica, Replica]
) -> None:
    first, second = replicas
    eventually(
        lambda: _standby_refuses(second, "first"), timeout=30, message="the standby is not one"
    )
    eventually(lambda: labelled(cluster, first), message="the leader did not label its pod")
    first.schedext.stop()  # SIGTERM: the lease is released, then the label removed
    stopped = time.monotonic()
    second.schedext.wait_ready(timeout=30)
    assert time.monotonic() - stopped < 4  # well before the 5 s lease could have expired
    assert not labelled(cluster, first)  # removed on the way out
    eventually(lambda: labelled(cluster, second), message="the new leader did not label its pod")
