"""Address pools against the real kube-scheduler: specific and pool addresses, sticky
StatefulSet identities, exhaustion, GPUs and an address in one decision, restarts."""

from __future__ import annotations

import contextlib
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from testbed.controlplane import ControlPlane
from testbed.kubeapi import ApiError
from testbed.manifests import pod_manifest
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
    assert len(pending) == 3

    def told_exhausted() -> list[str]:
        """The pending pods whose FailedScheduling event says the pool is exhausted."""
        return [
            name
            for name in pending
            if any("IP pool small exhausted" in e.get("message", "") for e in cluster.events(name))
        ]

    eventually(
        lambda: told_exhausted() == pending, timeout=60, message="not every pending pod was told"
    )
    freed = cluster.address(next(iter(bound)))[0]
    cluster.api.delete_pod(cluster.namespace, next(iter(bound)))

    def a_waiting_pod_took_it() -> str:
        bound = cluster.bound_pods()
        return next((p for p in pending if p in bound), "") if len(bound) == 5 else ""

    taker = eventually(a_waiting_pod_took_it, timeout=90, message="no waiting pod took it")
    assert cluster.address(taker)[0] == freed


def test_a_waiting_pod_takes_a_freed_address_even_when_schedexts_watch_lags(
    lagging: Cluster,
) -> None:
    """kube-scheduler retries the waiting pod the moment it sees the holder deleted, and
    schedext, hearing of the deletion a second later, turns that retry away: the pool is still
    full in its books. kube-scheduler would retry it again only on another event about it, or
    after five minutes; schedext, once its own watch frees the address, sends the pod back."""
    cluster = lagging
    racks(cluster)
    cluster.ip_pool("pair", ranges=[("10.40.0.1", "10.40.0.2")])
    eventually(
        lambda: cluster.metric("schedext_ip_pool_free", pool="pair") == 2,
        message="schedext did not see the pool",
    )
    for name in ("first", "second", "waiting"):
        cluster.ip_pod(name, pool="pair")
    eventually(lambda: len(cluster.bound_pods()) == 2, timeout=60, message="two pods not bound")
    waiting = next(n for n in ("first", "second", "waiting") if n not in cluster.bound_pods())
    eventually(
        lambda: any(
            "IP pool pair exhausted" in e.get("message", "") for e in cluster.events(waiting)
        ),
        message=f"{waiting} was not told the pool is exhausted",
    )
    holder = next(iter(cluster.bound_pods()))
    freed = cluster.address(holder)[0]
    cluster.api.delete_pod(cluster.namespace, holder)
    # Well within kube-scheduler's five-minute flush, and a few times the lag.
    assert cluster.wait_bound(waiting, timeout=30)
    assert cluster.address(waiting)[0] == freed


BINDS, ADDRESSES = 300, 250


def test_hundreds_of_concurrent_binds_through_the_api_server_never_give_an_address_twice(
    cluster: Cluster,
) -> None:
    """/bind over real HTTP, the real API binder writing Bindings for pods that exist in the
    API server. The pods name another scheduler, so kube-scheduler leaves them to the test."""
    racks(cluster)
    cluster.ip_pool("tight", ranges=[("10.50.0.1", "10.50.0.250")])  # no selector: every node
    for i in range(BINDS):
        manifest = pod_manifest(
            f"b{i:03d}",
            requests={"cpu": "10m", "schedext.io/ip": "1"},
            limits={"schedext.io/ip": "1"},
            annotations={"schedext.io/ip-pool": "tight"},
            scheduler_name="test-binds",
        )
        cluster.api.create_pod(cluster.namespace, manifest)
    eventually(
        lambda: cluster.metric("schedext_pending_pods") == BINDS,
        message="schedext did not see every pod pending",
    )
    uids = {
        p["metadata"]["name"]: p["metadata"]["uid"]
        for p in cluster.api.list_pods(cluster.namespace)
    }
    nodes = ["a1", "a2", "b1"]

    def bind_some(names: list[str]) -> list[str]:
        errors = []
        with httpx.Client(base_url=cluster.schedext.url, timeout=30) as client:
            for name in names:
                body = {"PodName": name, "PodNamespace": cluster.namespace, "PodUID": uids[name],
                        "Node": nodes[int(name[1:]) % 3]}  # fmt: skip
                errors.append(client.post("/bind", json=body).json()["Error"])
        return errors

    names = sorted(uids)
    with ThreadPoolExecutor(max_workers=50) as pool:
        errors = [
            e for batch in pool.map(bind_some, [names[i::50] for i in range(50)]) for e in batch
        ]
    refused = [e for e in errors if e]
    assert len(refused) == BINDS - ADDRESSES
    assert all(e.endswith("schedext: IP pool tight exhausted") for e in refused), refused[:3]
    pods = cluster.api.list_pods(cluster.namespace)
    bound = [p for p in pods if p["spec"].get("nodeName")]
    assert len(bound) == ADDRESSES
    written = [p["metadata"]["annotations"]["schedext.io/ip"] for p in bound]
    expected = {f"10.50.0.{i}" for i in range(1, ADDRESSES + 1)}
    assert len(set(written)) == len(written)  # distinct
    assert set(written) == expected
    assert {p["metadata"]["annotations"]["schedext.io/ip-pool"] for p in bound} == {"tight"}

    def pool_status() -> dict[str, Any]:
        return cluster.api.apply_raw("GET", f"{POOLS_PATH}/tight").get("status") or {}

    eventually(
        lambda: pool_status() == {"allocated": ADDRESSES, "free": 0},
        message="the pool's status does not count the bound pods",
    )
    assert cluster.metric("schedext_ip_pool_free", pool="tight") == 0


def test_a_pod_needing_gpus_and_a_rack_address_goes_only_where_both_fit(cluster: Cluster) -> None:
    racks(cluster, gpus={"a2": 4, "b1": 4})  # a1 has the address but no GPU; b1 GPUs but no address
    cluster.ip_pod("trainer", pool="rack-a", gpus=2)
    assert cluster.wait_bound("trainer") == "a2"
    annotations = cluster.get_pod("trainer")["metadata"]["annotations"]
    assert annotations["schedext.io/ip-pool"] == "rack-a"
    assert annotations["schedext.io/gpu-ids"] == "0,1"


# ------------------------------------------------------------------ validation

POOLS_PATH = "/apis/schedext.io/v1alpha1/ippools"
CLAIMS_PATH = "/apis/schedext.io/v1alpha1/ipclaims"


def pool_object(name: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "schedext.io/v1alpha1", "kind": "IPPool",
            "metadata": {"name": name}, "spec": spec}  # fmt: skip


def claim_object(name: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "schedext.io/v1alpha1", "kind": "IPClaim",
            "metadata": {"name": name}, "spec": spec}  # fmt: skip


OWNER = "sts/db/web/0"
ADDRESS = {"pool": "p", "address": "10.20.1.15"}
INVALID = [
    pytest.param(pool_object("p", cidr="10.20.1.0/33"), "spec.cidr must be a CIDR", id="bad-cidr"),
    pytest.param(pool_object("p", cidr="10.0.0.0/8"),
                 "spec.cidr may hold at most 1048576 addresses", id="cidr-too-large"),
    pytest.param(pool_object("p", ranges=[{"start": "10.20.1.100", "end": "10.20.1.20"}]),
                 "end must not come before start", id="range-end-before-start"),
    pytest.param(pool_object("p", ranges=[{"start": "10.20.1.10", "end": "fd00::1"}]),
                 "start and end must be IP addresses of one family", id="range-of-two-families"),
    pytest.param(pool_object("p", nodeSelector={"rack": "a"}),
                 "an IPPool needs spec.cidr or spec.ranges", id="no-addresses"),
    pytest.param(pool_object("p", cidr="10.20.1.0/24", gateway="10.20.1"),
                 "spec.gateway must be an IP address", id="bad-gateway"),
    pytest.param(pool_object("p", cidr="10.20.1.0/24", exclude=["nope"]),
                 "each exclude must be an address or a CIDR", id="bad-exclude"),
    pytest.param(claim_object("p.10-20-1-15", **ADDRESS, owner=OWNER, releasePolicy="forever"),
                 'spec.releasePolicy: Unsupported value: "forever"', id="unknown-release-policy"),
    pytest.param(claim_object("p.10-20-1-300", pool="p", address="10.20.1.300", owner=OWNER),
                 "spec.address must be an IP address", id="bad-address"),
    pytest.param(claim_object("p.fd00--1", pool="p", address="FD00:0::1", owner=OWNER),
                 "spec.address must be in canonical form", id="address-not-canonical"),
    pytest.param(claim_object("p.10-20-1-15", **ADDRESS, owner="deploy/db/web"),
                 "spec.owner: Invalid value", id="owner-not-a-statefulset-identity"),
    pytest.param(claim_object("p.10-20-1-15", **ADDRESS),
                 "spec.owner: Required value", id="no-owner"),
    pytest.param(claim_object("another-name", **ADDRESS, owner=OWNER),
                 "an IPClaim is named <pool>.<address with dashes>", id="name-not-the-address"),
]  # fmt: skip


@pytest.mark.parametrize(("obj", "message"), INVALID)
def test_the_api_server_refuses_an_invalid_pool_or_claim(
    control_plane: ControlPlane, obj: dict[str, Any], message: str
) -> None:
    path = POOLS_PATH if obj["kind"] == "IPPool" else CLAIMS_PATH
    with pytest.raises(ApiError) as refused:  # (one accepted by mistake goes at the next reset)
        control_plane.api.apply_raw("POST", path, obj)
    assert refused.value.status == 422, refused.value
    assert message in refused.value.json()["message"]


def test_the_api_server_accepts_valid_pools_and_claims(control_plane: ControlPlane) -> None:
    objects = [
        (POOLS_PATH, pool_object("ok-v4", cidr="10.64.0.0/12", gateway="10.64.0.1",
                                 exclude=["10.64.0.2", "10.64.0.8/29"],
                                 ranges=[{"start": "10.70.0.9", "end": "10.70.1.0"}])),
        (POOLS_PATH, pool_object("ok-v6", cidr="fd00::/108",
                                 ranges=[{"start": "fd01::1", "end": "fd01::9"}])),
        (CLAIMS_PATH, claim_object("ok-v4.10-64-0-15", pool="ok-v4", address="10.64.0.15",
                                   owner=OWNER, releasePolicy="never-release")),
        (CLAIMS_PATH, claim_object("ok-v6.fd00--f", pool="ok-v6", address="fd00::f",
                                   owner=OWNER)),
    ]  # fmt: skip
    try:
        for path, obj in objects:
            control_plane.api.apply_raw("POST", path, obj)
        claim = control_plane.api.apply_raw("GET", f"{CLAIMS_PATH}/ok-v6.fd00--f")
        assert claim["spec"]["releasePolicy"] == "sticky"  # the default
    finally:
        for path, obj in objects:
            with contextlib.suppress(ApiError):
                control_plane.api.apply_raw("DELETE", f"{path}/{obj['metadata']['name']}")
