"""High availability: two schedext replicas with leader election behind a readiness-gated
proxy (a Service's behaviour); the leader is killed, the standby takes over, scheduling goes
on, and no GPU is ever given twice."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.e2e.conftest import Cluster, Schedext, eventually, scheduler_config
from tests.e2e.proxy import ReadyProxy
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


@pytest.fixture
def replicas(cluster: Cluster, tmp_path: Path) -> Iterator[tuple[Schedext, Schedext, ReadyProxy]]:
    """The cluster fixture's schedext is stopped; two leader-electing replicas replace it,
    and kube-scheduler talks to them through the proxy."""
    cluster.cp.stop_scheduler()
    cluster.schedext.stop()
    first = Schedext(
        cluster.cp.kubeconfig,
        tmp_path / "first.log",
        env={**LEADER_ENV, "SCHEDEXT_LEADER__IDENTITY": "first"},
    )
    second = Schedext(
        cluster.cp.kubeconfig,
        tmp_path / "second.log",
        env={**LEADER_ENV, "SCHEDEXT_LEADER__IDENTITY": "second"},
    )
    first.start()  # ready means synced and leading
    second.start(wait_ready=False)
    with ReadyProxy([("127.0.0.1", first.port), ("127.0.0.1", second.port)]) as proxy:
        cluster.cp.start_scheduler(scheduler_config(f"http://127.0.0.1:{proxy.port}"))
        try:
            yield first, second, proxy
        finally:
            cluster.cp.stop_scheduler()
            first.stop()
            second.stop()


def _standby_refuses(standby: Schedext) -> bool:
    try:
        ready = httpx.get(f"{standby.url}/readyz", timeout=2)
    except httpx.TransportError:
        return False
    return ready.status_code == 503 and "not the leader (the leader is first)" in ready.text


def test_the_standby_takes_over_when_the_leader_dies(
    cluster: Cluster, replicas: tuple[Schedext, Schedext, ReadyProxy]
) -> None:
    first, second, _ = replicas
    for i in range(3):
        cluster.node(f"gpu-{i}", gpus=4, model=H100)
    eventually(
        lambda: _standby_refuses(second),
        timeout=30,
        message="the standby does not refuse as a standby",
    )
    answer = httpx.post(
        f"{second.url}/filter", json={"Pod": {}, "NodeNames": ["gpu-0"]}, timeout=5
    ).json()
    assert answer["Error"] == "not the leader (the leader is first)"
    lease = cluster.api.apply_raw(
        "GET", "/apis/coordination.k8s.io/v1/namespaces/default/leases/schedext"
    )
    assert lease["spec"]["holderIdentity"] == "first"

    for i in range(4):
        cluster.pod(f"before-{i}", gpus=2)
    for i in range(4):
        cluster.wait_bound(f"before-{i}", timeout=60)

    first.stop(kill=True)  # no lease release: the standby must wait for the lease to expire
    killed = time.monotonic()
    second.wait_ready(timeout=60)
    takeover = time.monotonic() - killed
    assert 3 < takeover < 30  # not before the lease could expire, not much after
    for i in range(2):
        cluster.pod(f"after-{i}", gpus=2)
    for i in range(2):
        cluster.wait_bound(f"after-{i}", timeout=90)
    per_pod = _assert_no_gpu_given_twice(cluster)
    assert len(per_pod) == 6
    lease = cluster.api.apply_raw(
        "GET", "/apis/coordination.k8s.io/v1/namespaces/default/leases/schedext"
    )
    assert lease["spec"]["holderIdentity"] == "second"
    assert lease["spec"]["leaseTransitions"] >= 1


def test_a_leader_that_stops_gracefully_hands_over_at_once(
    cluster: Cluster, replicas: tuple[Schedext, Schedext, ReadyProxy]
) -> None:
    first, second, _ = replicas
    eventually(lambda: _standby_refuses(second), timeout=30, message="the standby is not a standby")
    first.stop()  # SIGTERM: the lease is released on the way out
    stopped = time.monotonic()
    second.wait_ready(timeout=30)
    assert time.monotonic() - stopped < 4  # well before the 5 s lease could have expired
