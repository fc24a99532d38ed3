"""Topology-aware gangs (issue 32) against the real kube-scheduler, in the shipped shortlist
mode: a required level puts the whole group in one domain of it (a rack, an NVLink clique),
or leaves it Pending with the level named and nothing reserved; a preferred level keeps the
group in as few domains as it can and still places it across them when it must; a domain
whose address pool is short does not hold a gang that asks for addresses."""

from __future__ import annotations

from collections.abc import Mapping

from tests.e2e.conftest import GROUP_LABEL, Cluster, eventually
from tests.e2e.test_gangs import failed_scheduling_message, holders
from tests.e2e.test_scheduling import H100

RACK = "topology.kubernetes.io/rack"
CLIQUE = "nvidia.com/gpu.clique"
REQUIRED = "schedext.io/topology-required"
PREFERRED = "schedext.io/topology-preferred"
BIND_TIMEOUT_S = 90


def nodes(cluster: Cluster, layout: Mapping[str, tuple[int, Mapping[str, str]]]) -> None:
    for name, (gpus, labels) in layout.items():
        cluster.node(name, gpus=gpus, model=H100, labels=labels)


def gang(cluster: Cluster, group: str, count: int, gpus: int, **annotations: str) -> list[str]:
    cluster.pod_group(group, min_member=count, timeout_s=15, annotations=annotations)
    names = [f"{group}-{i}" for i in range(count)]
    for name in names:
        cluster.pod(name, gpus=gpus, labels={GROUP_LABEL: group})
    return names


def bound(cluster: Cluster, names: list[str]) -> dict[str, str]:
    return {name: cluster.wait_bound(name, timeout=BIND_TIMEOUT_S) for name in names}


# Rack a: 2 nodes of 8 GPUs; rack b: 2 of 4; x1: 8 and no rack (a rack of its own).
RACKS = {
    "a1": (8, {RACK: "a"}),
    "a2": (8, {RACK: "a"}),
    "b1": (4, {RACK: "b"}),
    "b2": (4, {RACK: "b"}),
    "x1": (8, {}),
}


def test_a_required_rack_puts_the_whole_gang_in_the_one_rack_that_holds_it(
    cluster: Cluster,
) -> None:
    # 3 x 4 GPUs: the cluster has room in several racks together (b1, b2, x1 alone fit each a
    # member exactly, and bin packing would rate them first); only rack a holds all three.
    nodes(cluster, RACKS)
    names = gang(cluster, "ring", 3, 4, **{REQUIRED: RACK})
    placed = bound(cluster, names)
    assert set(placed.values()) <= {"a1", "a2"}, placed


def test_a_gang_no_rack_can_hold_stays_pending_with_the_level_named_and_nothing_reserved(
    cluster: Cluster,
) -> None:
    # 3 x 8 GPUs = 24: rack a has 16, rack b 8, x1 8; the cluster (40) would hold it spread.
    nodes(cluster, RACKS)
    names = gang(cluster, "big", 3, 8, **{REQUIRED: RACK})
    expected = (
        f"no {RACK} can hold all of group {cluster.namespace}/big: the best, a, has 16 free GPUs "
        "of the 24 its unplaced members need"
    )
    # The last member created is the first judged with the quorum complete.
    failed_scheduling_message(cluster, names[-1], expected)
    assert cluster.bound_pods() == {}
    assert holders(cluster) == set()
    assert cluster.metric("schedext_gangs_waiting") == 0
    for name in names:
        assert not cluster.get_pod(name)["spec"].get("nodeName"), name
    # A pod outside the group still binds, and takes what a member would have needed.
    cluster.pod("solo", gpus=8, node_selector={"kubernetes.io/hostname": "x1"})
    assert cluster.wait_bound("solo") == "x1"
    assert set(cluster.bound_pods()) == {"solo"}
    assert holders(cluster) == {"solo"}


def test_a_required_clique_puts_the_whole_gang_in_one_nvlink_domain(cluster: Cluster) -> None:
    # One rack, three cliques: nvl-1 (c1, c2: 8 + 8) holds 2 x 8; nvl-2 (d1: 8, d2: 4) does
    # not, though c1 and d1 together would.
    nodes(
        cluster,
        {
            "c1": (8, {CLIQUE: "nvl-1", RACK: "a"}),
            "c2": (8, {CLIQUE: "nvl-1", RACK: "a"}),
            "d1": (8, {CLIQUE: "nvl-2", RACK: "a"}),
            "d2": (4, {CLIQUE: "nvl-2", RACK: "a"}),
        },
    )
    names = gang(cluster, "nvl", 2, 8, **{REQUIRED: CLIQUE})
    placed = bound(cluster, names)
    assert sorted(placed.values()) == ["c1", "c2"], placed


def test_a_preferred_rack_falls_back_across_racks_and_uses_as_few_as_it_can(
    cluster: Cluster,
) -> None:
    # 3 x 8 GPUs; racks p (2 x 8), q (1 x 8), r (1 x 8): no rack holds the group, so it is
    # placed across racks (a preference never refuses), two of them at best: both of p, one
    # of q or r.
    nodes(
        cluster,
        {
            "p1": (8, {RACK: "p"}),
            "p2": (8, {RACK: "p"}),
            "q1": (8, {RACK: "q"}),
            "r1": (8, {RACK: "r"}),
        },
    )
    names = gang(cluster, "spread", 3, 8, **{PREFERRED: RACK})
    placed = bound(cluster, names)
    assert len(set(placed.values())) == 3, placed  # one member per node: 8 GPUs each
    assert {"p1", "p2"} <= set(placed.values()), placed
    racks = {node.rstrip("0123456789") for node in placed.values()}
    assert len(racks) == 2, placed


def test_a_gang_asking_for_addresses_avoids_the_rack_whose_pool_is_short(
    cluster: Cluster,
) -> None:
    # Rack a (2 x 8) is the tighter fit for 3 x 4 GPUs and would be chosen first, but its
    # pool has one address for three members; rack b (3 x 8) has GPUs and addresses for all.
    nodes(
        cluster,
        {
            "a1": (8, {RACK: "a"}),
            "a2": (8, {RACK: "a"}),
            "b1": (8, {RACK: "b"}),
            "b2": (8, {RACK: "b"}),
            "b3": (8, {RACK: "b"}),
        },
    )
    cluster.ip_pool("pa", ranges=[("10.40.1.10", "10.40.1.10")], rack="a")
    cluster.ip_pool("pb", ranges=[("10.40.2.10", "10.40.2.19")], rack="b")
    cluster.pod_group("net", min_member=3, timeout_s=15, annotations={REQUIRED: RACK})
    names = [f"net-{i}" for i in range(3)]
    for name in names:
        cluster.ip_pod(name, pool="pa,pb", gpus=4, labels={GROUP_LABEL: "net"})
    placed = bound(cluster, names)
    assert set(placed.values()) <= {"b1", "b2", "b3"}, placed

    def addresses() -> dict[str, tuple[str, str]]:
        found = {name: cluster.address(name) for name in names}
        return found if all(ip for ip, _ in found.values()) else {}

    written = eventually(addresses, message="members' addresses not written")
    assert {pool for _, pool in written.values()} == {"pb"}, written
    assert len({ip for ip, _ in written.values()}) == 3, written
    assert all(ip.startswith("10.40.2.") for ip, _ in written.values()), written
