"""Topology-aware gangs (issue 32) against the real kube-scheduler, in the shipped shortlist
mode: a required level puts the whole group in one domain of it (a rack, an NVLink clique),
or leaves it Pending with the level named and nothing reserved; a preferred level keeps the
group in as few domains as it can and still places it across them when it must; a domain
whose address pool is short does not hold a gang that asks for addresses. Kueue's and KAI's
annotations are read as aliases, on the PodGroup or on its members; once a member is placed
the rest follow it into its domain; an annotation that cannot be followed is ignored with a
Warning event on the PodGroup, and the gang is placed without it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from tests.e2e.conftest import GROUP_LABEL, Cluster, Schedext, eventually
from tests.e2e.test_gangs import failed_scheduling_message, holders
from tests.e2e.test_scheduling import H100

RACK = "topology.kubernetes.io/rack"
CLIQUE = "nvidia.com/gpu.clique"
REQUIRED = "schedext.io/topology-required"
PREFERRED = "schedext.io/topology-preferred"
KUEUE_REQUIRED = "kueue.x-k8s.io/podset-required-topology"
KAI_REQUIRED = "kai.scheduler/topology-required-placement"
BIND_TIMEOUT_S = 90


def nodes(cluster: Cluster, layout: Mapping[str, tuple[int, Mapping[str, str]]]) -> None:
    for name, (gpus, labels) in layout.items():
        cluster.node(name, gpus=gpus, model=H100, labels=labels)


def gang(
    cluster: Cluster,
    group: str,
    count: int,
    gpus: int,
    *,
    on_members: Mapping[str, str] | None = None,
    **annotations: str,
) -> list[str]:
    """A PodGroup with ``annotations`` and its ``count`` members, each with ``on_members``."""
    cluster.pod_group(group, min_member=count, timeout_s=15, annotations=annotations)
    names = [f"{group}-{i}" for i in range(count)]
    for name in names:
        cluster.pod(name, gpus=gpus, labels={GROUP_LABEL: group}, annotations=on_members)
    return names


def bound(cluster: Cluster, names: list[str]) -> dict[str, str]:
    return {name: cluster.wait_bound(name, timeout=BIND_TIMEOUT_S) for name in names}


def podgroup_warnings(cluster: Cluster, group: str, reason: str) -> list[str]:
    """The messages of the Warning events with ``reason`` on the PodGroup ``group``."""
    selector = f"involvedObject.kind=PodGroup,involvedObject.name={group}"
    path = f"/api/v1/namespaces/{cluster.namespace}/events"
    items: list[dict[str, Any]] = cluster.api.apply_raw(
        "GET", path, params={"fieldSelector": selector}
    ).get("items", [])
    return [e.get("message", "") for e in items if (e["type"], e["reason"]) == ("Warning", reason)]


def warned(cluster: Cluster, group: str, *fragments: str) -> str:
    """The TopologyIgnored Warning on ``group`` that mentions every one of ``fragments``."""

    def find() -> str:
        messages = podgroup_warnings(cluster, group, "TopologyIgnored")
        return next((m for m in messages if all(f in m for f in fragments)), "")

    return str(eventually(find, message=f"no TopologyIgnored event on {group} says {fragments}"))


@pytest.fixture
def packing_only(cluster: Cluster) -> Cluster:
    """The cluster with a schedext whose scorers have no rack affinity (policy.rack_weight 0).
    With it, the gang_rack scorer alone keeps a gang in one rack wherever one has the free GPUs
    for it (the first member prefers such racks, the rest join it), so a gang whose required
    rack were not followed would pass these tests too; without it, bin packing alone orders
    the nodes."""
    cluster.cp.stop_scheduler()
    cluster.schedext.stop()
    cluster.schedext = Schedext(
        cluster.cp.kubeconfig,
        cluster.schedext.log_path,
        env={**cluster.schedext.env, "SCHEDEXT_POLICY__RACK_WEIGHT": "0"},
    )
    cluster.schedext.start()
    cluster.start_scheduler()
    return cluster


# Rack a: 2 nodes of 8 GPUs; rack b: 2 of 4; x1: 8 and no rack (a rack of its own).
RACKS = {
    "a1": (8, {RACK: "a"}),
    "a2": (8, {RACK: "a"}),
    "b1": (4, {RACK: "b"}),
    "b2": (4, {RACK: "b"}),
    "x1": (8, {}),
}


def test_a_required_rack_puts_the_whole_gang_in_the_one_rack_that_holds_it(
    packing_only: Cluster,
) -> None:
    # 3 x 4 GPUs: the cluster has room in several racks together (b1, b2, x1 alone fit each a
    # member exactly, and bin packing would rate them first); only rack a holds all three.
    cluster = packing_only
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
    # One rack, two cliques: nvl-1 (c1, c2: 16 + 16) holds 2 x 8; nvl-2 (d1: 8, d2: 4) does
    # not. d1 is the tightest fit for a member: bin packing alone would put the first there
    # and the second in nvl-1, across the two cliques.
    nodes(
        cluster,
        {
            "c1": (16, {CLIQUE: "nvl-1", RACK: "a"}),
            "c2": (16, {CLIQUE: "nvl-1", RACK: "a"}),
            "d1": (8, {CLIQUE: "nvl-2", RACK: "a"}),
            "d2": (4, {CLIQUE: "nvl-2", RACK: "a"}),
        },
    )
    names = gang(cluster, "nvl", 2, 8, **{REQUIRED: CLIQUE})
    placed = bound(cluster, names)
    assert set(placed.values()) <= {"c1", "c2"}, placed


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


def test_kueues_required_annotation_on_the_podgroup_is_read_as_schedexts(
    packing_only: Cluster,
) -> None:
    # As the first test, with Kueue's name for the annotation: only rack a holds 3 x 4 GPUs.
    cluster = packing_only
    nodes(cluster, RACKS)
    names = gang(cluster, "kueue", 3, 4, **{KUEUE_REQUIRED: RACK})
    placed = bound(cluster, names)
    assert set(placed.values()) <= {"a1", "a2"}, placed


def test_kais_required_annotation_on_the_members_is_read_when_the_podgroup_names_none(
    packing_only: Cluster,
) -> None:
    cluster = packing_only
    nodes(cluster, RACKS)
    names = gang(cluster, "kai", 3, 4, on_members={KAI_REQUIRED: RACK})
    placed = bound(cluster, names)
    assert set(placed.values()) <= {"a1", "a2"}, placed


def test_the_rest_of_a_required_rack_gang_follow_the_first_member_where_packing_would_not(
    packing_only: Cluster,
) -> None:
    # 2 x 4 GPUs; rack a (a1: 4, a2: 16) and rack b (b1: 8, b2: 8) each hold the gang. The
    # first member takes a1, the tightest node (it fills it); the second then packs best in b
    # (half of b1 or b2, against a quarter of a2), but must join the first in a.
    cluster = packing_only
    nodes(
        cluster,
        {
            "a1": (4, {RACK: "a"}),
            "a2": (16, {RACK: "a"}),
            "b1": (8, {RACK: "b"}),
            "b2": (8, {RACK: "b"}),
        },
    )
    names = gang(cluster, "pair", 2, 4, **{REQUIRED: RACK})
    placed = bound(cluster, names)
    assert sorted(placed.values()) == ["a1", "a2"], placed


def test_a_required_level_that_is_not_configured_is_ignored_with_a_warning(
    cluster: Cluster,
) -> None:
    # 3 x 8 GPUs: followed, the unknown key would make every node a domain of its own (none
    # has 24 GPUs) and leave the gang Pending; ignored, it spreads over the three 8-GPU nodes.
    nodes(cluster, RACKS)
    unknown = "example.com/no-such-level"
    names = gang(cluster, "typo", 3, 8, **{REQUIRED: unknown})
    warned(cluster, "typo", f"{REQUIRED}={unknown}", "is not a configured level")
    placed = bound(cluster, names)
    assert sorted(placed.values()) == ["a1", "a2", "x1"], placed
    assert len(podgroup_warnings(cluster, "typo", "TopologyIgnored")) == 1  # once, not per pass


def test_required_annotations_that_disagree_are_both_ignored_with_a_warning(
    cluster: Cluster,
) -> None:
    # 3 x 8 GPUs: neither a rack (a has 16) nor a clique (no node has one: each node its own)
    # holds the gang, so following either would leave it Pending.
    nodes(cluster, RACKS)
    names = gang(cluster, "torn", 3, 8, **{REQUIRED: RACK, KUEUE_REQUIRED: CLIQUE})
    warned(
        cluster,
        "torn",
        "the annotations disagree",
        f"{REQUIRED}={RACK}",
        f"{KUEUE_REQUIRED}={CLIQUE}",
    )
    placed = bound(cluster, names)
    assert sorted(placed.values()) == ["a1", "a2", "x1"], placed
    assert len(podgroup_warnings(cluster, "torn", "TopologyIgnored")) == 1
