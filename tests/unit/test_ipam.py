"""Pools, allocation, exhaustion, exclusions, sticky identities and release rules."""

from __future__ import annotations

import ipaddress
import random
from dataclasses import dataclass
from typing import Any

import pytest

from extender.errors import BindRefusedError
from extender.ipam import AddressBook, IPClaimSpec, IPUse, claim_name, ip_claim_spec, ip_pool_spec
from extender.model import ClaimPolicy, Reason
from extender.policy import PolicyConfig
from extender.requests import PodRequestError, pod_request, statefulset_identity
from extender.scheduler import Scheduler
from testbed.builders import bound_ip_pod, ip_pod, make_ip_pool, make_node, name_of, uid_of


def addr(text: str) -> int:
    return int(ipaddress.ip_address(text))


@dataclass
class PoolCase:
    name: str
    pool: dict[str, Any]
    size: int
    first: str | None = None
    last: str | None = None
    problem: str | None = None


POOLS = [
    PoolCase(
        "a /29 loses its network and broadcast addresses",
        make_ip_pool("p", cidr="10.0.0.0/29"),
        6,
        "10.0.0.1",
        "10.0.0.6",
    ),
    PoolCase(
        "a /31 keeps both addresses",
        make_ip_pool("p", cidr="10.0.0.0/31"),
        2,
        "10.0.0.0",
        "10.0.0.1",
    ),
    PoolCase(
        "the gateway is excluded",
        make_ip_pool("p", cidr="10.0.0.0/29", gateway="10.0.0.1"),
        5,
        "10.0.0.2",
        "10.0.0.6",
    ),
    PoolCase(
        "single addresses and CIDRs are excluded",
        make_ip_pool("p", cidr="10.0.0.0/28", exclude=["10.0.0.1", "10.0.0.8/30"]),
        9,
        "10.0.0.2",
        "10.0.0.14",
    ),
    PoolCase(
        "ranges are merged",
        make_ip_pool("p", ranges=[("10.1.0.10", "10.1.0.12"), ("10.1.0.12", "10.1.0.14")]),
        5,
        "10.1.0.10",
        "10.1.0.14",
    ),
    PoolCase(
        "cidr and ranges combine",
        make_ip_pool("p", cidr="10.0.0.0/30", ranges=[("10.0.1.1", "10.0.1.1")]),
        3,
        "10.0.0.1",
        "10.0.1.1",
    ),
    PoolCase("ipv6", make_ip_pool("p", cidr="fd00::/126"), 4, "fd00::", "fd00::3"),
    PoolCase("no addresses at all", make_ip_pool("p"), 0, problem="needs spec.cidr or spec.ranges"),
    PoolCase("a broken cidr", make_ip_pool("p", cidr="10.0.0.0/33"), 0, problem="not a CIDR"),
    PoolCase(
        "a reversed range",
        make_ip_pool("p", ranges=[("10.0.0.9", "10.0.0.1")]),
        0,
        problem="is not a range",
    ),
    PoolCase(
        "mixed families",
        make_ip_pool("p", cidr="10.0.0.0/30", ranges=[("fd00::1", "fd00::2")]),
        0,
        problem="mixes IPv4 and IPv6",
    ),
    PoolCase("too large", make_ip_pool("p", cidr="10.0.0.0/8"), 0, problem="at most"),
]


@pytest.mark.parametrize("case", POOLS, ids=[c.name for c in POOLS])
def test_pool_addresses(case: PoolCase) -> None:
    spec = ip_pool_spec(case.pool)
    assert spec is not None
    if case.problem:
        assert spec.problem is not None
        assert case.problem in spec.problem
        return
    assert spec.problem is None
    assert spec.size == case.size == len(list(spec.addresses()))
    addresses = list(spec.addresses())
    assert (addresses[0], addresses[-1]) == (addr(case.first or ""), addr(case.last or ""))


def test_lowest_free_skips_addresses_held_by_pods_and_claims() -> None:
    book = AddressBook()
    pool = ip_pool_spec(make_ip_pool("p", cidr="10.0.0.0/29"))
    assert pool is not None
    book.upsert_pool(pool)
    book.hold(IPUse(address=addr("10.0.0.1"), pool="p", uid="u1", pod="ns/a", node="n"))
    book.upsert_claim(IPClaimSpec(name="c", pool="p", address="10.0.0.2", owner="sts/ns/web/0"))
    assert book.lowest_free(pool) == addr("10.0.0.3")
    assert book.free_count(pool) == 4
    assert not book.hold(IPUse(address=addr("10.0.0.1"), pool="p", uid="u2", pod="ns/b", node="n"))
    book.release("u1")
    assert book.lowest_free(pool) == addr("10.0.0.1")
    assert book.free_count(pool) == 5


def test_a_relist_without_a_claim_gives_its_address_back() -> None:
    book = AddressBook()
    pool = ip_pool_spec(make_ip_pool("p", cidr="10.0.0.0/29"))
    assert pool is not None
    book.upsert_pool(pool)
    book.upsert_claim(IPClaimSpec(name="c", pool="p", address="10.0.0.1", owner="sts/ns/web/0"))
    assert book.free_count(pool) == 5
    book.replace_claims([])
    assert book.free_count(pool) == 6
    assert book.lowest_free(pool) == addr("10.0.0.1")


def test_free_counts_follow_every_change_of_pods_claims_and_pools() -> None:
    """The incremental free counts equal a recount from scratch after each of many random
    changes: holds and releases, claims added, removed and relisted, pools reshaped."""
    rng = random.Random(11)
    book = AddressBook()
    shapes = ["10.0.0.0/28", "10.0.0.0/29", "10.0.0.8/29"]
    owners = [f"sts/ns/web/{i}" for i in range(4)]

    def pool_named(name: str, cidr: str) -> Any:
        spec = ip_pool_spec(make_ip_pool(name, cidr=cidr))
        assert spec is not None
        return spec

    def claim(i: int) -> IPClaimSpec:
        address = f"10.0.0.{rng.randrange(1, 15)}"
        return IPClaimSpec(name=f"c{i}", pool=rng.choice(["p", "q"]), address=address,
                           owner=owners[i])  # fmt: skip

    for step in range(2000):
        action = rng.randrange(7)
        if action == 0:
            book.upsert_pool(pool_named(rng.choice(["p", "q"]), rng.choice(shapes)))
        elif action == 1:
            book.remove_pool(rng.choice(["p", "q"]))
        elif action == 2:
            address = addr(f"10.0.0.{rng.randrange(1, 15)}")
            pool = rng.choice(["p", "q", ""])
            book.hold(IPUse(address=address, pool=pool, uid=f"u{rng.randrange(8)}", pod="ns/x"))
        elif action == 3:
            book.release(f"u{rng.randrange(8)}")
        elif action == 4:
            book.upsert_claim(claim(rng.randrange(4)))
        elif action == 5:
            book.remove_claim(f"c{rng.randrange(4)}")
        else:
            book.replace_claims([claim(i) for i in range(4) if rng.random() < 0.5])
        for pool in book.pools():
            recount = pool.size - book._count_taken(pool)
            assert book.free_count(pool) == recount, step


def test_claims_are_named_after_their_address_so_the_api_server_keeps_them_unique() -> None:
    assert claim_name("rack-a", "10.20.1.15") == "rack-a.10-20-1-15"
    assert claim_name("v6", "fd00::1") == "v6.fd00--1"
    claim = ip_claim_spec(
        {
            "metadata": {"name": "x"},
            "spec": {
                "pool": "p",
                "address": "10.0.0.1",
                "owner": "sts/ns/web/0",
                "releasePolicy": "never-release",
            },
        }
    )
    assert claim is not None
    assert claim.policy is ClaimPolicy.NEVER_RELEASE
    assert ip_claim_spec({"metadata": {"name": "x"}, "spec": {"address": "nope"}}) is None


# --------------------------------------------------------------------- requests


@pytest.mark.parametrize(
    ("pod", "message"),
    [
        (ip_pod("a", ip="10.0.0.300"), "is not an IP address"),
        (ip_pod("a", pool=" , "), "names no pool"),
        (ip_pod("a", pool="p", policy="forever"), "must be sticky or never-release"),
        (ip_pod("web-0", pool="p", policy="sticky"), "needs a pod of a StatefulSet"),
        (
            ip_pod("web-0", policy="sticky", statefulset="web"),
            "needs schedext.io/ip-pool or schedext.io/ip",
        ),
    ],
)
def test_bad_address_requests_are_refused_with_a_reason(pod: dict[str, Any], message: str) -> None:
    with pytest.raises(PodRequestError, match=message):
        pod_request(pod)


def test_sticky_identity_comes_from_the_statefulset_and_ordinal() -> None:
    pod = ip_pod("web-2", pool="p, q", policy="sticky", statefulset="web", namespace="db")
    request = pod_request(pod)
    assert request.ip is not None
    assert (request.ip.pools, request.ip.identity, request.ip.policy) == (
        ("p", "q"),
        "sts/db/web/2",
        ClaimPolicy.STICKY,
    )
    assert statefulset_identity(ip_pod("other-2", statefulset="web")["metadata"]) is None


# ----------------------------------------------------------------- the scheduler

RACKS = [
    make_node("a1", labels={"topology.kubernetes.io/rack": "a"}, gpus=4),
    make_node("a2", labels={"topology.kubernetes.io/rack": "a"}, gpus=4),
    make_node("b1", labels={"topology.kubernetes.io/rack": "b"}, gpus=4),
]
POOL_A = make_ip_pool("rack-a", cidr="10.20.1.0/29", rack="a")  # .1-.6
POOL_B = make_ip_pool("rack-b", cidr="10.20.2.0/29", rack="b")


def scheduler_with(
    pods: list[dict[str, Any]] = (),
    pools: list[dict[str, Any]] = (POOL_A, POOL_B),
    claims: list[dict[str, Any]] = (),
) -> Scheduler:  # type: ignore[assignment]
    scheduler = Scheduler()
    for pool in pools:
        scheduler.upsert_ip_pool(pool)
    for claim in claims:
        scheduler.upsert_ip_claim(claim)
    for node in RACKS:
        scheduler.upsert_node(node)
    for pod in pods:
        scheduler.upsert_pod(pod)
    return scheduler


def verdict_of(scheduler: Scheduler, pod: dict[str, Any]) -> dict[str, tuple[str, bool]]:
    verdict = scheduler.filter(pod, ["a1", "a2", "b1"])
    failed = verdict.failed
    return {
        n: ("fits", False) if n in verdict.passed else (failed[n], n in verdict.unresolvable)
        for n in ["a1", "a2", "b1"]
    }


def bind(scheduler: Scheduler, pod: dict[str, Any], node: str) -> Any:
    return scheduler.plan_bind(
        uid=uid_of(pod), namespace="default", name=name_of(pod), node=node, now=0
    )


def test_a_specific_address_goes_only_to_the_rack_that_owns_it() -> None:
    scheduler = scheduler_with()
    pod = ip_pod("db", ip="10.20.1.5")
    outcome = verdict_of(scheduler, pod)
    assert outcome["a1"] == outcome["a2"] == ("fits", False)
    assert outcome["b1"] == ("schedext: node not in IP pool rack-a", True)
    plan = bind(scheduler, pod, "a2")
    assert (plan.ip, plan.ip_pool) == ("10.20.1.5", "rack-a")
    assert plan.annotations == {"schedext.io/ip": "10.20.1.5", "schedext.io/ip-pool": "rack-a"}


def test_an_address_in_no_pool_and_an_unknown_pool_are_unresolvable() -> None:
    scheduler = scheduler_with()
    assert set(verdict_of(scheduler, ip_pod("x", ip="192.168.9.9")).values()) == {
        ("schedext: address 192.168.9.9 is in no IP pool", True)
    }
    assert set(verdict_of(scheduler, ip_pod("y", pool="rack-z")).values()) == {
        ("schedext: IP pool rack-z not found", True)
    }


def test_address_taken_is_resolvable_only_on_the_holders_node_and_for_lower_priority() -> None:
    holder = bound_ip_pod("old", node="a1", ip="10.20.1.5", pool="rack-a", priority=10)
    scheduler = scheduler_with([holder])
    high = verdict_of(scheduler, ip_pod("new", ip="10.20.1.5", priority=100))
    assert high["a1"] == ("schedext: address 10.20.1.5 of pool rack-a held by default/old", False)
    assert high["a2"] == ("schedext: address 10.20.1.5 of pool rack-a held by default/old", True)
    low = verdict_of(scheduler, ip_pod("low", ip="10.20.1.5", priority=1))
    assert low["a1"][1] is True


def test_pool_allocation_takes_the_lowest_free_address_and_never_one_twice() -> None:
    scheduler = scheduler_with([bound_ip_pod("first", node="a1", ip="10.20.1.1", pool="rack-a")])
    pods = [ip_pod(f"p{i}", pool="rack-a") for i in range(5)]
    addresses = []
    for pod in pods:
        scheduler.filter(pod, ["a1"])
        addresses.append(bind(scheduler, pod, "a1").ip)
    assert addresses == ["10.20.1.2", "10.20.1.3", "10.20.1.4", "10.20.1.5", "10.20.1.6"]
    seventh = ip_pod("p7", pool="rack-a")
    assert verdict_of(scheduler, seventh)["a1"] == ("schedext: IP pool rack-a exhausted", True)


def test_an_exhausted_pool_is_resolvable_where_lower_priority_holders_run() -> None:
    holders = [
        bound_ip_pod(
            f"h{i}", node="a1" if i < 3 else "a2", ip=f"10.20.1.{i + 1}", pool="rack-a", priority=5
        )
        for i in range(6)
    ]
    scheduler = scheduler_with(holders)
    outcome = verdict_of(scheduler, ip_pod("vip", pool="rack-a", priority=50))
    assert outcome["a1"] == outcome["a2"] == ("schedext: IP pool rack-a exhausted", False)
    assert verdict_of(scheduler, ip_pod("peer", pool="rack-a", priority=5))["a1"][1] is True


def test_any_of_several_pools_prefers_the_one_with_more_free_addresses() -> None:
    scheduler = scheduler_with(
        [bound_ip_pod(f"h{i}", node="a1", ip=f"10.20.1.{i + 1}", pool="rack-a") for i in range(4)]
    )
    pod = ip_pod("p", pool="rack-a,rack-b")
    assert all(v == ("fits", False) for v in verdict_of(scheduler, pod).values())
    scores = dict(zip(["a2", "b1"], scheduler.prioritize(pod, ["a2", "b1"]).tolist(), strict=True))
    assert scores["b1"] > scores["a2"]


def test_with_several_pools_only_the_pools_selecting_a_node_count_there() -> None:
    scheduler = scheduler_with(
        [
            bound_ip_pod(f"h{i}", node="b1", ip=f"10.20.2.{i + 1}", pool="rack-b", priority=5)
            for i in range(6)
        ]
    )
    outcome = verdict_of(scheduler, ip_pod("p", pool="rack-a,rack-b", priority=50))
    assert outcome["a1"] == outcome["a2"] == ("fits", False)
    # rack-a has free addresses but does not select b1; the reason names only rack-b
    assert outcome["b1"] == ("schedext: IP pool rack-b exhausted", False)


@pytest.mark.parametrize(
    ("ip_weight", "expected"),
    [
        (0, {"a1": 10, "b1": 10, "c1": 10}),  # addresses play no part
        (3, {"a1": 9, "b1": 10, "c1": 8}),  # the default
        (10, {"a1": 8, "b1": 10, "c1": 5}),
        (30, {"a1": 6, "b1": 10, "c1": 2}),
    ],
)
def test_ip_weight_is_the_share_of_the_score_given_to_the_pools_free_share(
    ip_weight: int, expected: dict[str, int]
) -> None:
    """A pod without GPUs scores a GPU-less node allocation_weight + topology_weight (10);
    ip_weight adds ip_weight x (free share of the best pool selecting the node), and the sum
    is scaled to 0..10: round(10 x (10 + ip_weight x share) / (10 + ip_weight)).
    a1: rack-a half free (share 0.5); b1: rack-b all free (1); c1: no pool (0)."""
    scheduler = Scheduler(PolicyConfig(ip_weight=ip_weight))
    for pool in (POOL_A, POOL_B):
        scheduler.upsert_ip_pool(pool)
    for name, rack in (("a1", "a"), ("b1", "b"), ("c1", "c")):
        scheduler.upsert_node(make_node(name, labels={"topology.kubernetes.io/rack": rack}))
    for i in range(3):
        scheduler.upsert_pod(bound_ip_pod(f"h{i}", node="a1", ip=f"10.20.1.{i + 1}", pool="rack-a"))
    pod = ip_pod("p", pool="rack-a,rack-b")
    scores = scheduler.prioritize(pod, ["a1", "b1", "c1"]).tolist()
    assert dict(zip(["a1", "b1", "c1"], scores, strict=True)) == expected


def test_an_address_held_without_a_pool_annotation_counts_against_its_pool() -> None:
    book = AddressBook()
    pool = ip_pool_spec(make_ip_pool("p", cidr="10.0.0.0/29"))
    assert pool is not None
    book.upsert_pool(pool)
    book.hold(IPUse(address=addr("10.0.0.3"), pool="", uid="u1", pod="ns/a", node="n"))
    assert book.free_count(pool) == 5
    assert [u.pod for u in book.uses_in(pool)] == ["ns/a"]
    book.release("u1")
    assert book.free_count(pool) == 6


def test_a_sticky_pod_gets_a_claim_and_its_successor_the_same_address() -> None:
    scheduler = scheduler_with()
    first = ip_pod("web-1", pool="rack-a", policy="sticky", statefulset="web", uid="web-1-v1")
    scheduler.filter(first, ["a1"])
    plan = bind(scheduler, first, "a1")
    assert plan.claim is not None
    assert (plan.claim.owner, plan.claim.address, plan.claim.exists) == (
        "sts/default/web/1",
        plan.ip,
        False,
    )
    scheduler.confirm_bind(plan)  # no watch here: the claim is recorded at once
    successor = ip_pod("web-1", pool="rack-a", policy="sticky", statefulset="web", uid="web-1-v2")
    # the old pod (old UID) still exists: the address waits for it
    outcome = verdict_of(scheduler, successor)
    busy = (f"schedext: address {plan.ip} still held by previous pod default/web-1", True)
    assert outcome["a1"] == outcome["a2"] == busy
    assert outcome["b1"] == ("schedext: node not in IP pool rack-a", True)
    scheduler.delete_pod("web-1-v1")
    outcome = verdict_of(scheduler, successor)
    assert outcome["a2"] == ("fits", False)  # another node of the same rack is fine
    again = bind(scheduler, successor, "a2")
    assert again.ip == plan.ip
    assert again.claim is not None
    assert again.claim.exists


def test_a_claimed_address_is_not_given_to_anyone_else() -> None:
    claim = {
        "metadata": {"name": "rack-a.10-20-1-1"},
        "spec": {"pool": "rack-a", "address": "10.20.1.1", "owner": "sts/default/db/0"},
    }
    scheduler = scheduler_with(claims=[claim])
    pod = ip_pod("p", pool="rack-a")
    scheduler.filter(pod, ["a1"])
    assert bind(scheduler, pod, "a1").ip == "10.20.1.2"
    assert verdict_of(scheduler, ip_pod("q", ip="10.20.1.1"))["a1"] == (
        "schedext: address 10.20.1.1 of pool rack-a held by the claim of sts/default/db/0",
        True,
    )


def test_reservations_hold_addresses_and_release_gives_them_back() -> None:
    scheduler = scheduler_with()
    first, second = ip_pod("a", ip="10.20.1.3"), ip_pod("b", ip="10.20.1.3")
    scheduler.filter(first, ["a1"])
    scheduler.filter(second, ["a1"])
    plan = bind(scheduler, first, "a1")
    with pytest.raises(BindRefusedError, match="held by default/a"):
        bind(scheduler, second, "a1")
    scheduler.abort_bind(plan)
    assert bind(scheduler, second, "a1").ip == "10.20.1.3"


# ------------------------------------------------------------------ release rules


@dataclass
class ReleaseCase:
    name: str
    owner: str
    policy: str
    replicas: int | None
    pod_exists: bool
    released: bool


RELEASES = [
    ReleaseCase("ordinal below replicas is kept", "sts/ns/web/1", "sticky", 3, False, False),
    ReleaseCase("scaled below the ordinal is released", "sts/ns/web/2", "sticky", 2, False, True),
    ReleaseCase("statefulset deleted is released", "sts/ns/web/0", "sticky", None, False, True),
    ReleaseCase(
        "a pod of the identity still exists: kept", "sts/ns/web/2", "sticky", 2, True, False
    ),
    # "\u00b2" is a digit to str.isdigit(), not to int(): not an identity schedext wrote
    ReleaseCase(
        "an ordinal int() cannot read is kept", "sts/ns/web/\u00b2", "sticky", 1, False, False
    ),
    ReleaseCase(
        "never-release is kept even when scaled down",
        "sts/ns/web/5",
        "never-release",
        1,
        False,
        False,
    ),
    ReleaseCase(
        "never-release is kept when the statefulset is gone",
        "sts/ns/web/0",
        "never-release",
        None,
        False,
        False,
    ),
]


@pytest.mark.parametrize("case", RELEASES, ids=[c.name for c in RELEASES])
def test_release_rules(case: ReleaseCase) -> None:
    claim = {
        "metadata": {"name": "c"},
        "spec": {
            "pool": "rack-a",
            "address": "10.20.1.1",
            "owner": case.owner,
            "releasePolicy": case.policy,
        },
    }
    ordinal = case.owner.rsplit("/", 1)[1]
    pods = (
        [ip_pod(f"web-{ordinal}", pool="rack-a", statefulset="web", namespace="ns")]
        if case.pod_exists
        else []
    )
    scheduler = scheduler_with(pods=pods, claims=[claim])
    scheduler.set_statefulset("ns/web", case.replicas)
    assert ([c.name for c in scheduler.claims_to_release()] == ["c"]) is case.released


def test_reasons_distinguish_taken_from_exhausted() -> None:
    assert Reason.IP_TAKEN != Reason.IP_EXHAUSTED
    assert Reason.IP_TAKEN_HERE.resolvable
    assert Reason.IP_EXHAUSTED_EVICTABLE.resolvable
    assert not Reason.IP_TAKEN.resolvable
    assert not Reason.IP_EXHAUSTED.resolvable


def test_a_node_is_in_the_pools_whose_selector_its_labels_match() -> None:
    book = AddressBook()
    specs = [
        make_ip_pool("r1", cidr="10.0.1.0/28", rack="r1"),
        make_ip_pool("r1-extra", cidr="10.0.2.0/28", rack="r1"),
        make_ip_pool("r2", cidr="10.0.3.0/28", rack="r2"),
        make_ip_pool("anywhere", cidr="10.0.4.0/28"),  # no selector: every node
    ]
    book.replace_pools(p for s in specs if (p := ip_pool_spec(s)) is not None)
    rack = "topology.kubernetes.io/rack"
    assert book.pools_selecting({rack: "r1", "zone": "a"}) == ("anywhere", "r1", "r1-extra")
    assert book.pools_selecting({rack: "r2"}) == ("anywhere", "r2")
    assert book.pools_selecting({}) == ("anywhere",)
