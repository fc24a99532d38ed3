"""Address pools against the real kube-scheduler: specific and pool addresses, sticky
StatefulSet identities, exhaustion, GPUs and an address in one decision, restarts."""

from __future__ import annotations

from tests.e2e.conftest import Cluster, eventually
from tests.e2e.test_scheduling import H100

RACK = "topology.kubernetes.io/rack"


def racks(cluster: Cluster, *, gpus: dict[str, int] | None = None) -> None:
    """Two racks: a (a1, a2) owning 10.20.1.0/24, b (b1) owning 10.20.2.0/24."""
    for name, rack in (("a1", "a"), ("a2", "a"), ("b1", "b")):
        count = (gpus or {}).get(name, 0)
        cluster.node(name, gpus=count, model=H100 if count else None, labels={RACK: rack})
    cluster.ip_pool("rack-a", cidr="10.20.1.0/24", rack="a", gateway="10.20.1.1")
    cluster.ip_pool("rack-b", cidr="10.20.2.0/24", rack="b", gateway="10.20.2.1")


def test_a_specific_address_lands_in_the_rack_owning_it_and_is_written_into_the_pod(
    cluster: Cluster,
) -> None:
    racks(cluster)
    cluster.ip_pod("db", ip="10.20.1.15")
    assert cluster.wait_bound("db") in {"a1", "a2"}
    assert cluster.address("db") == ("10.20.1.15", "rack-a")


def sticky_set(cluster: Cluster) -> tuple[str, dict[str, str]]:
    uid = cluster.statefulset("web", replicas=3)
    for i in range(3):
        cluster.ip_pod(f"web-{i}", pool="rack-a", policy="sticky", statefulset=("web", uid))
    addresses = {}
    for i in range(3):
        assert cluster.wait_bound(f"web-{i}") in {"a1", "a2"}
        addresses[f"web-{i}"] = cluster.address(f"web-{i}")[0]
    assert len(set(addresses.values())) == 3
    return uid, addresses


def recreate(cluster: Cluster, name: str, uid: str) -> str:
    old_uid = cluster.get_pod(name)["metadata"]["uid"]
    cluster.api.delete_pod(cluster.namespace, name)
    eventually(
        lambda: (
            not any(p["metadata"]["name"] == name for p in cluster.api.list_pods(cluster.namespace))
        ),
        message=f"{name} not deleted",
    )
    cluster.ip_pod(name, pool="rack-a", policy="sticky", statefulset=("web", uid))
    assert cluster.wait_bound(name, timeout=60) in {"a1", "a2"}
    assert cluster.get_pod(name)["metadata"]["uid"] != old_uid
    return str(cluster.get_pod(name)["metadata"]["uid"])


def test_a_re_created_statefulset_pod_gets_its_sticky_address_back(cluster: Cluster) -> None:
    racks(cluster)
    uid, addresses = sticky_set(cluster)
    eventually(
        lambda: any(e.get("reason") == "IPClaimed" for e in cluster.events("web-0")),
        message="no IPClaimed event",
    )
    claims = cluster.ip_claims()
    assert {o: c["spec"]["address"] for o, c in claims.items()} == {
        f"sts/{cluster.namespace}/web/{i}": addresses[f"web-{i}"] for i in range(3)
    }
    new_uid = recreate(cluster, "web-1", uid)
    assert cluster.address("web-1") == (addresses["web-1"], "rack-a")
    eventually(
        lambda: (
            cluster.ip_claims()[f"sts/{cluster.namespace}/web/1"]["spec"]["holderUID"] == new_uid
        ),
        message="the claim does not point at the new pod",
    )


def test_a_schedext_restart_between_the_steps_changes_nothing(cluster: Cluster) -> None:
    racks(cluster)
    uid, addresses = sticky_set(cluster)
    cluster.schedext.stop(kill=True)
    cluster.schedext.start()
    recreate(cluster, "web-1", uid)
    cluster.schedext.stop()
    cluster.schedext.start()
    cluster.ip_pod("newcomer", pool="rack-a")
    cluster.wait_bound("newcomer")
    assert {f"web-{i}": cluster.address(f"web-{i}")[0] for i in range(3)} == addresses
    assert cluster.address("newcomer")[0] not in addresses.values()


def test_scaling_a_statefulset_down_releases_the_sticky_addresses_above_it(
    cluster: Cluster,
) -> None:
    racks(cluster)
    sticky_set(cluster)
    cluster.scale_statefulset("web", 2)
    owner = f"sts/{cluster.namespace}/web/2"
    assert owner in cluster.ip_claims()  # the pod still exists: nothing released yet
    cluster.api.delete_pod(cluster.namespace, "web-2")
    eventually(lambda: owner not in cluster.ip_claims(), timeout=30, message="claim of web-2 kept")
    assert set(cluster.ip_claims()) == {f"sts/{cluster.namespace}/web/{i}" for i in range(2)}


def test_a_pool_of_five_binds_five_pods_and_the_rest_wait_for_an_address(cluster: Cluster) -> None:
    racks(cluster)
    cluster.ip_pool("small", ranges=[("10.30.0.1", "10.30.0.5")])
    for i in range(8):
        cluster.ip_pod(f"p{i}", pool="small")

    def five_bound() -> dict[str, str]:
        bound = cluster.bound_pods()
        return bound if len(bound) == 5 else {}

    bound = eventually(five_bound, timeout=90, message="five pods were not bound")
    assert len({cluster.address(name)[0] for name in bound}) == 5
    pending = sorted({f"p{i}" for i in range(8)} - set(bound))

    def exhausted_event() -> bool:
        return any(
            "IP pool small exhausted" in e.get("message", "") for e in cluster.events(pending[0])
        )

    eventually(exhausted_event, timeout=60, message="no 'pool exhausted' event")
    freed = cluster.address(next(iter(bound)))[0]
    cluster.api.delete_pod(cluster.namespace, next(iter(bound)))

    def a_waiting_pod_took_it() -> str:
        bound = cluster.bound_pods()
        return next((p for p in pending if p in bound), "") if len(bound) == 5 else ""

    taker = eventually(a_waiting_pod_took_it, timeout=90, message="no waiting pod took it")
    assert cluster.address(taker)[0] == freed


def test_a_pod_needing_gpus_and_a_rack_address_goes_only_where_both_fit(cluster: Cluster) -> None:
    racks(cluster, gpus={"a2": 4, "b1": 4})  # a1 has the address but no GPU; b1 GPUs but no address
    cluster.ip_pod("trainer", pool="rack-a", gpus=2)
    assert cluster.wait_bound("trainer") == "a2"
    annotations = cluster.get_pod("trainer")["metadata"]["annotations"]
    assert annotations["schedext.io/ip-pool"] == "rack-a"
    assert annotations["schedext.io/gpu-ids"] == "0,1"
