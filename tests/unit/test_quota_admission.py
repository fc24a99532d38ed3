"""Team quotas in filter and bind: max, borrowing within the sum of mins, weighted borrowing,
gangs counted whole; what each namespace uses and wants; explain's quota hold."""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass, field
from typing import Any

import pytest

from extender import names
from extender.errors import BindRefusedError
from extender.model import Demand, FilterVerdict, Reason
from extender.pending import PendingPods
from extender.requests import pod_request
from extender.scheduler import Scheduler
from extender.tally import ZERO, Amounts, amounts
from testbed.builders import (
    elastic_quota,
    gang_pod,
    make_node,
    make_pod,
    make_pod_group,
    name_of,
    share_pod,
    uid_of,
)

GPU = names.GPU_RESOURCE
NODES = [f"n{i}" for i in range(4)]  # 8 GPUs each: 32 in all


@dataclass
class Cluster:
    """A scheduler with four 8-GPU nodes, quotas, and pods bound GPU by GPU."""

    quotas: list[dict[str, Any]]
    scheduler: Scheduler = field(default_factory=Scheduler)
    _slots: Any = None

    def __post_init__(self) -> None:
        for node in NODES:
            self.scheduler.upsert_node(make_node(node, gpus=8, cpu="64", memory="512Gi"))
        for quota in self.quotas:
            self.scheduler.upsert_quota(quota)
        self._slots = iter([(n, i) for n in NODES for i in range(8)])
        self._names = itertools.count()

    def bind(self, namespace: str, gpus: int, **kwargs: Any) -> dict[str, Any]:
        """A pod of ``namespace`` bound with ``gpus`` GPUs (on one node)."""
        slots = [next(self._slots) for _ in range(gpus)]
        node = slots[0][0] if slots else NODES[0]
        assert all(n == node for n, _ in slots), "test layout: keep a pod on one node"
        pod = make_pod(
            f"{namespace}-{next(self._names)}", namespace=namespace, gpus=gpus, node=node,
            gpu_ids=[i for _, i in slots], **kwargs,
        )  # fmt: skip
        self.scheduler.upsert_pod(pod)
        return pod

    def use(self, namespace: str, gpus: int) -> None:
        for _ in range(gpus):
            self.bind(namespace, 1)

    def want(self, namespace: str, gpus: int) -> None:
        """A pending pod of ``namespace`` (seen by the informer, not yet placed)."""
        self.scheduler.upsert_pod(
            make_pod(f"{namespace}-waits-{next(self._names)}", namespace=namespace, gpus=gpus)
        )

    def filter(self, pod: dict[str, Any]) -> FilterVerdict:
        return self.scheduler.filter(pod, NODES)


def refused(verdict: FilterVerdict) -> tuple[Reason, str] | None:
    """The one whole-pod refusal of a quota, or None when the pod passed somewhere."""
    if verdict.passed:
        return None
    (rejection,) = verdict.rejections
    assert list(rejection.nodes) == NODES
    assert not rejection.resolvable
    return rejection.reason, rejection.message


# team-a: min 4, max 6; team-b: min 4, no max; team-c: min 8, idle. Sum of mins: 16.
QUOTAS = [
    elastic_quota("team-a", min={GPU: 4}, max={GPU: 6}),
    elastic_quota("team-b", min={GPU: 4}),
    elastic_quota("team-c", min={GPU: 8}),
]

CASES = [
    # (id, GPUs in use per namespace, pod's namespace, its GPUs, refusal)
    ("under min", {"team-a": 2}, "team-a", 1, None),
    ("up to min exactly", {"team-a": 3}, "team-a", 1, None),
    ("over min, borrowing within the sum of mins", {"team-a": 4, "team-b": 4}, "team-a", 2, None),
    ("up to max exactly", {"team-a": 5}, "team-a", 1, None),
    ("over max", {"team-a": 6}, "team-a", 1,
     (Reason.QUOTA_MAX, "schedext: quota team-a: 7 of max 6 nvidia.com/gpu")),
    ("one pod alone over max", {}, "team-a", 8,
     (Reason.QUOTA_MAX, "schedext: quota team-a: 8 of max 6 nvidia.com/gpu")),
    ("borrowing up to the sum of mins exactly", {"team-b": 4, "team-c": 8, "team-a": 2},
     "team-b", 2, None),
    ("borrowing beyond the sum of mins", {"team-b": 6, "team-c": 8, "team-a": 2}, "team-b", 1,
     (Reason.QUOTA_BORROW, "schedext: quota team-b: over min 4 nvidia.com/gpu, and borrowing "
      "would bring the quotas' use to 17 of their summed min 16")),
    ("within min while others borrow everything", {"team-b": 12, "team-c": 2, "team-a": 2},
     "team-a", 2, None),
    ("a namespace without a quota", {"team-b": 16}, "free", 8, None),
    ("a pod that asks for nothing the quota names", {"team-a": 6}, "team-a", 0, None),
]  # fmt: skip


@pytest.mark.parametrize(
    ("use", "namespace", "gpus", "refusal"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_admission_by_min_max_and_the_sum_of_mins(
    use: dict[str, int], namespace: str, gpus: int, refusal: tuple[Reason, str] | None
) -> None:
    cluster = Cluster(QUOTAS)
    for ns, count in use.items():
        cluster.use(ns, count)
    verdict = cluster.filter(make_pod("p", namespace=namespace, gpus=gpus))
    assert refused(verdict) == refusal


def test_cpu_and_memory_count_only_where_a_quota_names_them() -> None:
    cluster = Cluster([elastic_quota("team-a", max={"cpu": "4", "memory": "8Gi"})])
    cluster.bind("team-a", 0, cpu="3", memory="4Gi")
    over_cpu = cluster.filter(make_pod("p", namespace="team-a", cpu="1500m", memory="1Gi"))
    assert refused(over_cpu) == (
        Reason.QUOTA_MAX, "schedext: quota team-a: 4500m of max 4 cpu"
    )  # fmt: skip
    over_memory = cluster.filter(make_pod("q", namespace="team-a", cpu="1", memory="5Gi"))
    assert refused(over_memory) == (
        Reason.QUOTA_MAX, "schedext: quota team-a: 9Gi of max 8Gi memory"
    )  # fmt: skip
    gpus_only = Cluster([elastic_quota("team-a", max={GPU: 8})])
    assert refused(gpus_only.filter(make_pod("r", namespace="team-a", cpu="60"))) is None


def test_gpu_shares_count_their_memory_on_every_device() -> None:
    cluster = Cluster([elastic_quota("team-a", max={names.SHARE_MEMORY_RESOURCE: "40000"})])
    two = share_pod("s", namespace="team-a", memory_mib=20000, shares=2)
    assert refused(cluster.filter(two)) is None
    three = share_pod("t", namespace="team-a", memory_mib=20000, shares=3)
    assert refused(cluster.filter(three)) == (
        Reason.QUOTA_MAX, "schedext: quota team-a: 60000 of max 40000 schedext.io/gpu-memory"
    )  # fmt: skip


# -------------------------------------------------------------- weighted borrowing


def test_borrowing_is_shared_by_min_between_the_namespaces_that_want_it() -> None:
    # Both at their min of 4; team-c's 8 idle: each of the two wanting gets 4 of them.
    cluster = Cluster([*QUOTAS[1:], elastic_quota("team-a", min={GPU: 4})])
    cluster.use("team-a", 8)
    cluster.use("team-b", 4)
    pod = make_pod("p", namespace="team-a", gpus=1)
    assert refused(cluster.filter(pod)) is None  # team-b wants nothing more: first come
    cluster.want("team-b", 2)
    assert refused(cluster.filter(pod)) == (
        Reason.QUOTA_BORROW,
        "schedext: quota team-a: over min 4 nvidia.com/gpu, borrowing 5 is over its weighted "
        "share 4 of 8 idle while team-b borrows less than its share",
    )
    # team-b's own borrowing, within its share, goes ahead.
    assert refused(cluster.filter(make_pod("q", namespace="team-b", gpus=4))) is None


def test_a_borrow_weight_overrides_the_min() -> None:
    quotas = [
        elastic_quota("team-a", min={GPU: 4}, weight="3"),
        elastic_quota("team-b", min={GPU: 4}, weight="1"),
        elastic_quota("team-c", min={GPU: 8}),
    ]
    cluster = Cluster(quotas)
    cluster.use("team-b", 4)
    cluster.want("team-b", 1)
    cluster.use("team-a", 9)  # borrows 5 of the 8 idle; its share is 6
    assert refused(cluster.filter(make_pod("p", namespace="team-a", gpus=1))) is None
    two = refused(cluster.filter(make_pod("q", namespace="team-a", gpus=2)))
    assert two is not None
    assert two[0] is Reason.QUOTA_BORROW
    assert "borrowing 7 is over its weighted share 6 of 8 idle" in two[1]


def test_once_every_other_wanting_namespace_has_its_share_the_rest_is_first_come() -> None:
    cluster = Cluster([*QUOTAS[1:], elastic_quota("team-a", min={GPU: 4})])
    cluster.use("team-a", 6)
    cluster.use("team-b", 8)  # borrows its share (4 of 8 idle) already
    cluster.want("team-b", 1)
    assert refused(cluster.filter(make_pod("p", namespace="team-a", gpus=2))) is None


# ---------------------------------------------------------------------------- gangs


def gang_cluster(max_gpus: int, members: int = 4) -> tuple[Cluster, list[dict[str, Any]]]:
    cluster = Cluster([elastic_quota("team-a", min={GPU: max_gpus}, max={GPU: max_gpus})])
    group = make_pod_group("train", min_member=members, namespace="team-a")
    cluster.scheduler.upsert_pod_group(group)
    pods = [gang_pod(f"m{i}", "train", gpus=2, namespace="team-a") for i in range(members)]
    for pod in pods:
        cluster.scheduler.upsert_pod(pod)
    return cluster, pods


def test_a_gang_counts_whole_against_its_quota_at_its_first_member() -> None:
    cluster, pods = gang_cluster(max_gpus=6)
    assert refused(cluster.filter(pods[0])) == (
        Reason.QUOTA_MAX, "schedext: quota team-a: 8 of max 6 nvidia.com/gpu"
    )  # fmt: skip
    cluster, pods = gang_cluster(max_gpus=8)
    assert refused(cluster.filter(pods[0])) is None


def test_a_gangs_later_members_count_the_placed_ones_as_used() -> None:
    cluster, pods = gang_cluster(max_gpus=8)
    cluster.scheduler.plan_bind(
        uid=uid_of(pods[0]), namespace="team-a", name=name_of(pods[0]), node="n0", now=0.0
    )
    assert cluster.scheduler.inventory.namespace_use("team-a").gpus == 2
    assert refused(cluster.filter(pods[1])) is None  # 2 held + 3 members x 2 = 8
    cluster.use("team-a", 1)
    verdict = refused(cluster.filter(pods[1]))
    assert verdict == (Reason.QUOTA_MAX, "schedext: quota team-a: 9 of max 8 nvidia.com/gpu")


# ----------------------------------------------------------------------------- bind


def test_bind_refuses_what_another_pod_took_since_filter() -> None:
    cluster = Cluster([elastic_quota("team-a", max={GPU: 4})])
    cluster.use("team-a", 2)
    pod = make_pod("p", namespace="team-a", gpus=2)
    assert refused(cluster.filter(pod)) is None
    cluster.use("team-a", 1)  # bound by another path between filter and bind
    with pytest.raises(BindRefusedError, match=r"quota team-a: 5 of max 4 nvidia\.com/gpu"):
        cluster.scheduler.plan_bind(
            uid=uid_of(pod), namespace="team-a", name="p", node="n1", now=0.0
        )
    assert cluster.scheduler.reservation_count == 0


# ---------------------------------------------------------------------------- explain


def test_explain_says_which_quota_holds_a_pod_back_and_by_how_much() -> None:
    cluster = Cluster([elastic_quota("team-a", name="gpus", max={GPU: 6})])
    cluster.use("team-a", 5)
    cluster.filter(make_pod("p", namespace="team-a", gpus=3))
    explanation = cluster.scheduler.explain("team-a", "p")
    assert explanation is not None
    assert explanation.quota is not None
    hold = explanation.quota
    assert (hold.quota, hold.resource, hold.reason, hold.over_by) == (
        "team-a/gpus", GPU, Reason.QUOTA_MAX, "2"
    )  # fmt: skip
    assert any(node.fits for node in explanation.nodes)  # where it goes once the quota lets it
    cluster.filter(make_pod("q", namespace="team-a", gpus=1))
    fine = cluster.scheduler.explain("team-a", "q")
    assert fine is not None
    assert fine.quota is None


# ----------------------------------------------------------- use and wants, as tallied


def test_use_counts_reservations_and_bound_pods_until_they_are_gone() -> None:
    cluster = Cluster([elastic_quota("team-a", max={GPU: 8})])
    scheduler = cluster.scheduler
    pod = make_pod("p", namespace="team-a", gpus=2)
    scheduler.filter(pod, NODES)
    scheduler.plan_bind(uid=uid_of(pod), namespace="team-a", name="p", node="n3", now=0.0)
    assert scheduler.inventory.namespace_use("team-a") == Amounts(2, 0, 0, 100, 128 * 2**20)
    scheduler.expire(1000.0)  # the reservation lapsed
    assert scheduler.inventory.namespace_use("team-a") == ZERO
    bound = cluster.bind("team-a", 3)
    scheduler.delete_node("n0")  # a pod on a node gone still counts until it is gone
    assert scheduler.inventory.namespace_use("team-a").gpus == 3
    scheduler.delete_pod(uid_of(bound))
    assert scheduler.inventory.namespace_use("team-a") == ZERO


def test_the_tallies_match_a_recount_after_any_sequence_of_changes() -> None:
    rng = random.Random(20)
    cluster = Cluster([])
    scheduler = cluster.scheduler
    pending = PendingPods(capacity=5)
    live: dict[str, dict[str, Any]] = {}
    for step in range(300):
        ns = rng.choice(["a", "b", "c"])
        action = rng.random()
        if action < 0.35:
            node = rng.choice(NODES)
            pod = make_pod(f"p{step}", namespace=ns, gpus=0, node=node, cpu=f"{rng.randint(1, 9)}")
            scheduler.upsert_pod(pod)
            live[uid_of(pod)] = pod
        elif action < 0.5 and live:
            uid = rng.choice(sorted(live))
            scheduler.delete_pod(uid)
            del live[uid]
        elif action < 0.6:
            scheduler.replace_pods(rng.sample(list(live.values()), k=len(live) // 2))
            live = {u: p for u, p in live.items() if scheduler.inventory.holding(u)}
        elif action < 0.85:
            pending.remember(pod_request(make_pod(f"w{step % 7}", namespace=ns, gpus=1)))
        else:
            pending.forget(rng.choice([uid_of(p) for p in live.values()] or ["none"]))
        for ns_ in ("a", "b", "c"):
            assert scheduler.inventory.namespace_use(ns_) == _recount(
                h for h in scheduler.inventory.holdings() if h.namespace == ns_
            )
    assert len(pending) <= 5


def _recount(demands: Any) -> Amounts:
    total = ZERO
    for demand in demands:
        assert isinstance(demand, Demand)
        total = total.plus(amounts(demand))
    return total


def test_pending_wants_follow_remember_forget_and_the_capacity() -> None:
    pending = PendingPods(capacity=2)
    first = pod_request(make_pod("a", namespace="t", gpus=1))
    pending.remember(first)
    pending.remember(pod_request(make_pod("b", namespace="t", gpus=2)))
    assert pending.wanted("t").gpus == 3
    pending.remember(pod_request(make_pod("c", namespace="t", gpus=4)))  # "a" falls out
    assert pending.wanted("t").gpus == 6
    pending.forget(first.uid)  # already gone: nothing changes
    assert pending.wanted("t").gpus == 6
    again = pod_request(make_pod("c2", namespace="u", uid="same", gpus=1))
    pending.remember(again)
    pending.remember(pod_request(make_pod("c2", namespace="u", uid="same", gpus=3)))
    assert pending.wanted("u").gpus == 3  # a newer version replaces the older
