"""Gangs against the real kube-scheduler: all or nothing, timeouts, competing groups,
members arriving one by one, and rack affinity."""

from __future__ import annotations

import time

import httpx

from tests.e2e.conftest import GROUP_LABEL, Cluster, eventually
from tests.e2e.test_scheduling import H100, _assert_no_gpu_given_twice


def members(
    cluster: Cluster, group: str, count: int, *, gpus: int = 2, **kwargs: object
) -> list[str]:
    names = [f"{group}-{i}" for i in range(count)]
    for name in names:
        cluster.pod(name, gpus=gpus, labels={GROUP_LABEL: group}, **kwargs)  # type: ignore[arg-type]
    return names


def holders(cluster: Cluster) -> set[str]:
    """Pods holding GPUs in schedext's inventory, bound or reserved."""
    nodes = httpx.get(f"{cluster.schedext.url}/inventory", timeout=10).json()["nodes"]
    return {
        gpu["holder"].split("/", 1)[1] for node in nodes for gpu in node["gpus"] if gpu["holder"]
    }


def failed_scheduling_message(cluster: Cluster, pod: str, fragment: str) -> str:
    def find() -> str:
        events = cluster.events(pod)
        return next((e["message"] for e in events if fragment in e.get("message", "")), "")

    return str(eventually(find, timeout=60, message=f"no event of {pod} mentions {fragment!r}"))


def test_a_gang_that_fits_exactly_is_bound_whole_with_distinct_gpus(cluster: Cluster) -> None:
    cluster.node("gpu-a", gpus=4, model=H100)
    cluster.node("gpu-b", gpus=4, model=H100)
    cluster.pod_group("train", min_member=4)
    names = members(cluster, "train", 4)
    nodes = {name: cluster.wait_bound(name, timeout=90) for name in names}
    assert sorted(nodes.values()) == ["gpu-a", "gpu-a", "gpu-b", "gpu-b"]
    per_pod = _assert_no_gpu_given_twice(cluster)
    assert all(len(per_pod[name]) == 2 for name in names)

    def scheduled() -> bool:
        status = cluster.get_pod_group("train").get("status", {})
        return status.get("phase") == "Scheduled" and status.get("scheduled") == 4

    eventually(scheduled, timeout=30, message="PodGroup status not updated to Scheduled/4")
    assert cluster.get_pod_group("train")["status"]["scheduleStartTime"]
    assert cluster.metric("schedext_gang_events_total", outcome="complete") >= 1


def test_a_gang_that_fits_only_when_packed_well_is_bound_whole(cluster: Cluster) -> None:
    cluster.node("gpu-a", gpus=5, model=H100)
    cluster.node("gpu-b", gpus=4, model=H100)
    cluster.pod_group("pack", min_member=4, timeout_s=15)
    # The member of 3 first: bin packing prefers the fuller gpu-b for it, which would leave
    # 5 + 1 GPUs for 2+2+2. schedext's filter keeps it on gpu-a, the only node where the
    # rest still fits (3+2 on gpu-a, 2+2 on gpu-b).
    names = [f"pack-{i}" for i in range(4)]
    for name, gpus in zip(names, [3, 2, 2, 2], strict=True):
        cluster.pod(name, gpus=gpus, labels={GROUP_LABEL: "pack"})
    nodes = {name: cluster.wait_bound(name, timeout=90) for name in names}
    assert nodes["pack-0"] == "gpu-a"
    assert sorted(nodes.values()) == ["gpu-a", "gpu-a", "gpu-b", "gpu-b"]
    _assert_no_gpu_given_twice(cluster)
    assert cluster.metric("schedext_gang_events_total", outcome="released") == 0


def test_a_gang_with_room_for_only_three_of_four_binds_nothing(cluster: Cluster) -> None:
    cluster.node("gpu-a", gpus=4, model=H100)
    cluster.node("gpu-b", gpus=2, model=H100)
    cluster.pod_group("train", min_member=4, timeout_s=3)
    names = members(cluster, "train", 4)
    # The last member is the first judged with the quorum complete (the earlier ones were
    # rejected for the missing members, and wait for kube-scheduler to retry them).
    message = failed_scheduling_message(cluster, names[-1], "not enough free GPUs for all of group")
    assert f"group {cluster.namespace}/train" in message
    # Filter keeps every member out, so none reaches the bind barrier: nothing is reserved.
    assert cluster.bound_pods() == {}
    assert holders(cluster) == set()
    cluster.pod("solo", gpus=4)  # a cluster event: kube-scheduler retries the members too
    assert cluster.wait_bound("solo") == "gpu-a"
    assert cluster.bound_pods() == {"solo": "gpu-a"}
    assert holders(cluster) == {"solo"}
    assert cluster.metric("schedext_gang_events_total", outcome="timed_out") == 0


def test_members_waiting_at_the_barrier_release_their_gpus_when_the_group_times_out(
    cluster: Cluster,
) -> None:
    cluster.node("gpu-a", gpus=6, model=H100)
    cluster.pod_group("trio", min_member=3, timeout_s=3)
    members(cluster, "trio", 2)  # these two fit and wait at bind for the third...
    cluster.pod("trio-2", gpus=2, labels={GROUP_LABEL: "trio"}, node_selector={"rack": "nowhere"})
    # ... which kube-scheduler itself never places (no node matches), so schedext never sees
    # it at bind. The two reserve their GPUs and wait at the barrier together:

    def waiting_at_the_barrier() -> bool:
        return holders(cluster) == {"trio-0", "trio-1"} and (
            cluster.metric("schedext_gangs_waiting") == 1
        )

    eventually(waiting_at_the_barrier, timeout=60, message="the two never waited at the barrier")
    assert cluster.bound_pods() == {}
    # The third member goes away: after this wait the group cannot even reach its quorum, so
    # its members cannot reserve again once the barrier has released them.
    cluster.api.delete_pod(cluster.namespace, "trio-2")
    eventually(
        lambda: cluster.metric("schedext_gang_events_total", outcome="timed_out") >= 1,
        timeout=30,
        message="the waiting group never timed out",
    )
    eventually(
        lambda: holders(cluster) == set(),
        timeout=30,
        message="members of the timed-out group still hold GPUs",
    )
    assert cluster.metric("schedext_gangs_waiting") == 0
    assert cluster.bound_pods() == {}
    eventually(
        lambda: any(e.get("reason") == "GangTimedOut" for e in cluster.events("trio-0")),
        timeout=30,
        message="no GangTimedOut event on a member",
    )
    failed_scheduling_message(cluster, "trio-0", "waiting for 1 more members")
    assert holders(cluster) == set()
    cluster.pod("solo", gpus=6)  # needs every GPU: only possible once the reservations are gone
    assert cluster.wait_bound("solo", timeout=60) == "gpu-a"
    assert not any(name.startswith("trio") for name in cluster.bound_pods())


def test_two_groups_that_each_need_the_whole_cluster_one_completes_the_other_waits(
    cluster: Cluster,
) -> None:
    cluster.node("gpu-a", gpus=4, model=H100)
    cluster.node("gpu-b", gpus=4, model=H100)
    cluster.pod_group("blue", min_member=4, timeout_s=10)
    cluster.pod_group("green", min_member=4, timeout_s=10)
    for i in range(4):  # interleaved, as if created at once
        cluster.pod(f"blue-{i}", gpus=2, labels={GROUP_LABEL: "blue"})
        cluster.pod(f"green-{i}", gpus=2, labels={GROUP_LABEL: "green"})

    def one_group_bound() -> str:
        bound = cluster.bound_pods()
        for group in ("blue", "green"):
            if sum(1 for name in bound if name.startswith(group)) == 4:
                return group
        return ""

    winner = eventually(one_group_bound, timeout=120, message="no group completed")
    loser = "green" if winner == "blue" else "blue"
    assert not any(name.startswith(loser) for name in cluster.bound_pods())
    eventually(
        lambda: not any(h.startswith(loser) for h in holders(cluster)),
        timeout=30,
        message=f"{loser} still holds reservations",
    )
    _assert_no_gpu_given_twice(cluster)


def test_members_created_one_by_one_are_bound_only_when_the_last_arrives(cluster: Cluster) -> None:
    cluster.node("gpu-a", gpus=8, model=H100)
    cluster.pod_group("slow", min_member=3, timeout_s=15)
    for i in range(2):
        cluster.pod(f"slow-{i}", gpus=2, labels={GROUP_LABEL: "slow"})
        missing = 2 - i
        failed_scheduling_message(cluster, f"slow-{i}", f"waiting for {missing} more members")
        assert cluster.bound_pods() == {}
        time.sleep(1.5)  # members arrive over several seconds (bounded)
    cluster.pod("slow-2", gpus=2, labels={GROUP_LABEL: "slow"})
    for i in range(3):
        assert cluster.wait_bound(f"slow-{i}", timeout=90) == "gpu-a"
    assert sorted(g for ids in _assert_no_gpu_given_twice(cluster).values() for g in ids) == list(
        range(6)
    )
    # In one round: the two turned away were sent back to kube-scheduler when the last one
    # came (an annotation on each), not after the barrier of the third had timed out.
    assert cluster.metric("schedext_gang_events_total", outcome="timed_out") == 0
    assert cluster.metric("schedext_gang_events_total", outcome="quorum") == 1
    for i in range(2):
        assert "schedext.io/requeued-at" in cluster.get_pod(f"slow-{i}")["metadata"]["annotations"]


def test_members_of_a_group_land_in_one_rack_when_one_rack_can_hold_them(cluster: Cluster) -> None:
    for rack in ("r1", "r2"):
        for i in range(2):
            cluster.node(
                f"{rack}-n{i}", gpus=4, model=H100, labels={"topology.kubernetes.io/rack": rack}
            )
    # Something already runs in rack r1, so only r2 still has room for the whole group.
    cluster.pod("resident", gpus=2, node_selector={"kubernetes.io/hostname": "r1-n0"})
    assert cluster.wait_bound("resident") == "r1-n0"
    cluster.pod_group("ring", min_member=4, timeout_s=15)
    names = members(cluster, "ring", 4)
    placed = {cluster.wait_bound(name, timeout=90) for name in names}
    assert placed <= {"r2-n0", "r2-n1"}
