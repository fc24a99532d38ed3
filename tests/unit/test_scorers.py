"""Each scorer alone: whether it applies to a pod, and its 0..1 rating of each node. Then the
registry: weights from the config, by name."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from extender import names
from extender.addressing import ip_context
from extender.gang.preference import preference
from extender.model import PodRequest
from extender.policy import GpuScoring, PolicyConfig
from extender.requests import pod_request
from extender.scheduler import Scheduler
from extender.scoring import (
    NAMES,
    SCORERS,
    GroupAffinity,
    Scorer,
    binpack,
    cpu_only,
    gang_rack,
    gang_topology,
    ip_headroom,
    live_use,
    mig_pack,
    score_nodes,
    share_pack,
    share_spread,
    spread,
    topology,
    weights,
)
from extender.scoring.scorer import Candidates
from testbed.builders import (
    agent_annotations,
    bound_ip_pod,
    gang_pod,
    ip_pod,
    make_ip_pool,
    make_node,
    make_pod,
    share_pod,
)
from tests.mig_builders import mig_node, mig_pod, mig_uuid
from tests.unit.helpers import scheduler_with

NVLINK_2X4 = [[0, 1, 2, 3], [4, 5, 6, 7]]


def rack(name: str, zone: str = "z1") -> dict[str, str]:
    return {"topology.kubernetes.io/rack": name, "topology.kubernetes.io/zone": zone}


@dataclass
class Case:
    id: str
    nodes: list[dict[str, Any]]
    pod: dict[str, Any]
    expected: dict[str, float]  # node -> rating
    bound: list[dict[str, Any]] = field(default_factory=list)
    pools: list[dict[str, Any]] = field(default_factory=list)
    affinity: GroupAffinity | None = None
    # Racks named instead of interned ids (resolved against the inventory).
    placed_racks: tuple[str, ...] = ()
    placed_zones: tuple[str, ...] = ()
    # The affinity, from the scheduler once it holds the nodes (a rating per node slot).
    affinity_of: Callable[[Scheduler], GroupAffinity] | None = None


def ratings(scorer: Scorer, case: Case) -> dict[str, float]:
    scheduler = scheduler_with(case.nodes, case.bound)
    for pool in case.pools:
        scheduler.upsert_ip_pool(pool)
    nodes = candidates(scheduler, pod_request(case.pod), case)
    assert scorer.applies(nodes)
    names = [n["metadata"]["name"] for n in case.nodes]
    return dict(zip(names, scorer.score(nodes).tolist(), strict=True))


def candidates(scheduler: Scheduler, request: PodRequest, case: Case) -> Candidates:
    inventory = scheduler.inventory
    names = [n["metadata"]["name"] for n in case.nodes]
    affinity = case.affinity_of(scheduler) if case.affinity_of is not None else case.affinity
    if case.placed_racks:
        racks = tuple(_interned(scheduler, "rack", value) for value in case.placed_racks)
        zones = tuple(_interned(scheduler, "zone", value) for value in case.placed_zones)
        affinity = GroupAffinity(racks=racks, zones=zones)
    return Candidates(
        inventory,
        request,
        inventory.ids(names),
        affinity=affinity,
        ip=ip_context(inventory, request),
    )


def _interned(scheduler: Scheduler, column: str, value: str) -> int:
    """The id the inventory gave a rack or zone label value (a node with it must exist)."""
    label = f"topology.kubernetes.io/{column}"
    node = next(n for n in scheduler.inventory.node_names() if _label(scheduler, n, label) == value)
    return int(getattr(scheduler.inventory.arrays, column)[scheduler.inventory.ids([node])][0])


def _label(scheduler: Scheduler, node: str, label: str) -> str | None:
    view = scheduler.inventory.node(node)
    return view.spec.labels.get(label) if view is not None else None


HALF_USED = [make_pod("b", gpus=4, node="half", gpu_ids=[0, 1, 2, 3])]
ALLOCATION_NODES = [
    make_node("half", gpus=8),
    make_node("empty", gpus=8),
    make_node("cpu"),
    make_node("tight", gpus=4),
]
TIGHT_USED = [make_pod("t", gpus=3, node="tight", gpu_ids=[0, 1, 2])]

BINPACK_CASES = [
    Case(
        "the share of GPUs used once the pod has its own; GPU-less nodes 0; capped at 1",
        ALLOCATION_NODES,
        make_pod(gpus=2),
        {"half": 0.75, "empty": 0.25, "cpu": 0.0, "tight": 1.0},
        bound=HALF_USED + TIGHT_USED,
    ),
    Case(
        "a pod of one GPU on empty nodes",
        [make_node("eight", gpus=8), make_node("two", gpus=2)],
        make_pod(gpus=1),
        {"eight": 0.125, "two": 0.5},
    ),
]

SPREAD_CASES = [
    Case(
        "the share left free once the pod has its own; GPU-less nodes 0",
        ALLOCATION_NODES,
        make_pod(gpus=2),
        {"half": 0.25, "empty": 0.75, "cpu": 0.0, "tight": 0.0},
        bound=HALF_USED + TIGHT_USED,
    ),
]

TOPOLOGY_CASES = [
    Case(
        "all the pod's GPUs inside one free NVLink group",
        [
            make_node("whole", gpus=8, groups=NVLINK_2X4),
            make_node("split", gpus=8, groups=NVLINK_2X4),
            make_node("flat", gpus=8),
        ],
        make_pod(gpus=4),
        {"whole": 1.0, "split": 0.0, "flat": 0.0},
        bound=[
            make_pod("a", gpus=4, node="whole", gpu_ids=[0, 1, 2, 3]),
            make_pod("b", gpus=4, node="split", gpu_ids=[0, 1, 4, 5]),
        ],
    ),
    Case(
        "a smaller pod fits a group partly used",
        [make_node("g", gpus=8, groups=NVLINK_2X4)],
        make_pod(gpus=2),
        {"g": 1.0},
        bound=[make_pod("a", gpus=5, node="g", gpu_ids=[0, 1, 2, 4, 5])],
    ),
]

CPU_ONLY_CASES = [
    Case(
        "nodes without GPUs are preferred, whatever their GPUs' use",
        [make_node("cpu"), make_node("gpu", gpus=4), make_node("busy", gpus=1)],
        make_pod(),
        {"cpu": 1.0, "gpu": 0.0, "busy": 0.0},
        bound=[make_pod("b", gpus=1, node="busy", gpu_ids=[0])],
    ),
]

GANG_RACK_CASES = [
    Case(
        "the group's rack 1, its zone 0.5, elsewhere and unlabelled 0",
        [
            make_node("here", gpus=8, labels=rack("r1", "z1")),
            make_node("zone", gpus=8, labels=rack("r2", "z1")),
            make_node("away", gpus=8, labels=rack("r3", "z2")),
            make_node("bare", gpus=8),
        ],
        gang_pod("m", "train"),
        {"here": 1.0, "zone": 0.5, "away": 0.0, "bare": 0.0},
        placed_racks=("r1",),
        placed_zones=("z1",),
    ),
    Case(
        "a group not placed yet: racks whose free GPUs hold all of it",
        [
            make_node("a1", gpus=8, labels=rack("r1")),
            make_node("a2", gpus=4, labels=rack("r1")),
            make_node("b1", gpus=8, labels=rack("r2")),
            make_node("bare", gpus=8),
        ],
        gang_pod("m", "train"),
        {"a1": 1.0, "a2": 1.0, "b1": 0.0, "bare": 0.0},
        bound=[make_pod("b", gpus=4, node="b1", gpu_ids=[0, 1, 2, 3])],
        affinity=GroupAffinity(gpus_needed=10),
    ),
    Case(
        "a group that needs nothing more prefers no rack",
        [make_node("a1", gpus=8, labels=rack("r1"))],
        gang_pod("m", "train"),
        {"a1": 0.0},
        affinity=GroupAffinity(),
    ),
]


def _preferred(placed: Sequence[str], gpus: int) -> Callable[[Scheduler], GroupAffinity]:
    """The affinity of a group preferring a rack, as the gang coordinator rates it."""
    levels = (names.CLIQUE_LABEL, names.RACK_LABEL, names.ZONE_LABEL)

    def of(scheduler: Scheduler) -> GroupAffinity:
        rating = preference(
            scheduler.inventory, levels, names.RACK_LABEL, placed=placed, gpus_needed=gpus
        )
        return GroupAffinity(gpus_needed=gpus, topology=rating)

    return of


def _clique(value: str, rack_value: str) -> dict[str, str]:
    return {names.CLIQUE_LABEL: value, names.RACK_LABEL: rack_value}


GANG_TOPOLOGY_CASES = [
    Case(
        "placed in clique c1 of rack r1: that clique 1, the rest of the rack 0.5, away 0",
        [
            make_node("mate", gpus=8, labels=_clique("c1", "r1")),
            make_node("rack", gpus=8, labels=_clique("c2", "r1")),
            make_node("away", gpus=8, labels=_clique("c3", "r2")),
        ],
        gang_pod("m", "train"),
        {"mate": 1.0, "rack": 0.5, "away": 0.0},
        bound=[gang_pod("p", "train", gpus=2, node="mate", gpu_ids=[0, 1])],
        affinity_of=_preferred(["mate"], 0),
    ),
    Case(
        "none placed: a clique that holds all of it 1, a rack that does 0.5, neither 0",
        [
            make_node("c1a", gpus=8, labels=_clique("c1", "r1")),
            make_node("c1b", gpus=8, labels=_clique("c1", "r1")),
            make_node("c2a", gpus=8, labels=_clique("c2", "r2")),
            make_node("c3a", gpus=8, labels=_clique("c3", "r2")),
            make_node("c4a", gpus=8, labels=_clique("c4", "r3")),
        ],
        gang_pod("m", "train"),
        {"c1a": 1.0, "c1b": 1.0, "c2a": 0.5, "c3a": 0.5, "c4a": 0.0},
        affinity_of=_preferred([], 16),
    ),
]

IP_HEADROOM_CASES = [
    Case(
        "the free share of the best pool selecting the node; no pool 0",
        [
            make_node("r0", labels=rack("r0")),
            make_node("r1", labels=rack("r1")),
            make_node("nopool", labels=rack("r9")),
        ],
        ip_pod("p", pool="p0,p1"),
        {"r0": 0.75, "r1": 1.0, "nopool": 0.0},
        bound=[bound_ip_pod("held", node="r0", ip="10.0.0.1", pool="p0")],
        pools=[
            make_ip_pool("p0", ranges=[("10.0.0.1", "10.0.0.4")], rack="r0"),
            make_ip_pool("p1", ranges=[("10.0.1.1", "10.0.1.8")], rack="r1"),
        ],
    ),
]

LIVE_USE_CASES = [
    Case(
        "idle free GPUs 1, busy and full ones 0, half 0.5; no sample 0.5",
        [
            make_node("idle", gpus=2, annotations=agent_annotations(2, use={0: (0, 0), 1: (0, 0)})),
            make_node("busy", gpus=1, annotations=agent_annotations(1, use={0: (100, 81559)})),
            make_node("half", gpus=1, annotations=agent_annotations(1, use={0: (50, 40780)})),
            make_node("silent", gpus=1),
        ],
        make_pod(gpus=1),
        {"idle": 1.0, "busy": 0.0, "half": 0.5, "silent": 0.5},
    ),
    Case(
        "only the free GPUs count: a busy GPU a pod holds is not the new pod's",
        [make_node("n", gpus=2, annotations=agent_annotations(2, use={0: (100, 0), 1: (20, 0)}))],
        make_pod(gpus=1),
        {"n": 0.9},
        bound=[make_pod("b", gpus=1, node="n", gpu_ids=[0])],
    ),
]

# Two 4 x 80 GiB nodes: "shared" has 40 GiB of GPU 0 held by a share, "empty" holds nothing.
GIB = 1024
SHARE_NODES = [
    make_node("shared", gpus=4, gpu_memory_mib=80 * GIB),
    make_node("empty", gpus=4, gpu_memory_mib=80 * GIB),
]
SHARE_BOUND = [share_pod("held", memory_mib=40 * GIB, node="shared", gpu_ids=[0])]

SHARE_PACK_CASES = [
    Case(
        "a shared GPU with room rates 0.5 to 1 by how full it gets; opening one at most 0.45",
        SHARE_NODES,
        share_pod(memory_mib=20 * GIB),
        {"shared": 0.5 + 0.5 * 0.75, "empty": 0.45 * 1 / 4},
        bound=SHARE_BOUND,
    ),
    Case(
        "opening a device: the node with fewer whole devices free once it is opened",
        SHARE_NODES,
        share_pod(memory_mib=60 * GIB),
        {"shared": 0.45 * 2 / 4, "empty": 0.45 * 1 / 4},
        bound=SHARE_BOUND,
    ),
    Case(
        "two shares: the mean of the two devices bind would pick",
        SHARE_NODES,
        share_pod(memory_mib=20 * GIB, shares=2),
        {"shared": (0.875 + 0.45 * 2 / 4) / 2, "empty": 0.45 * 1 / 4},
        bound=SHARE_BOUND,
    ),
    Case(
        "no device with the cores free: 0",
        [make_node("n", gpus=1, gpu_memory_mib=80 * GIB)],
        share_pod(memory_mib=GIB, cores=50),
        {"n": 0.0},
        bound=[share_pod("busy", memory_mib=GIB, cores=60, node="n", gpu_ids=[0])],
    ),
]

SHARE_SPREAD_CASES = [
    Case(
        "the emptiest device with room: an empty GPU anywhere rates the same",
        SHARE_NODES,
        share_pod(memory_mib=20 * GIB),
        {"shared": 0.75, "empty": 0.75},
        bound=SHARE_BOUND,
    ),
    Case(
        "a node whose only GPU is half taken rates below an empty one",
        [
            make_node("half", gpus=1, gpu_memory_mib=80 * GIB),
            make_node("free", gpus=1, gpu_memory_mib=80 * GIB),
        ],
        share_pod(memory_mib=20 * GIB),
        {"half": 0.25, "free": 0.75},
        bound=[share_pod("held", memory_mib=40 * GIB, node="half", gpu_ids=[0])],
    ),
]

MIG_NODES = [
    mig_node("busy", migs={0: ["1g.10gb", "1g.10gb"], 1: ["1g.10gb", "2g.20gb", "2g.20gb"]}),
    mig_node("idle", migs={0: ["1g.10gb", "1g.10gb"]}),
]
MIG_BOUND = [mig_pod("b", {"2g.20gb": 1}, node="busy", mig_uuids=[mig_uuid("busy", 1, 1)])]

MIG_PACK_CASES = [
    Case(
        "a MIG device beside one in use rates 1; on an idle GPU 0",
        MIG_NODES,
        mig_pod("p", {"1g.10gb": 1}),
        {"busy": 1.0, "idle": 0.0},
        bound=MIG_BOUND,
    ),
    Case(
        "the share of the pod's MIG devices that can go beside one in use",
        MIG_NODES,
        mig_pod("p", {"1g.10gb": 2}),
        {"busy": 0.5, "idle": 0.0},
        bound=MIG_BOUND,
    ),
    Case(
        "several profiles, counted together",
        MIG_NODES,
        mig_pod("p", {"1g.10gb": 1, "2g.20gb": 1}),
        {"busy": 1.0, "idle": 0.0},
        bound=MIG_BOUND,
    ),
]

TABLES = [
    (binpack.SCORER, BINPACK_CASES),
    (spread.SCORER, SPREAD_CASES),
    (topology.SCORER, TOPOLOGY_CASES),
    (cpu_only.SCORER, CPU_ONLY_CASES),
    (gang_rack.SCORER, GANG_RACK_CASES),
    (gang_topology.SCORER, GANG_TOPOLOGY_CASES),
    (ip_headroom.SCORER, IP_HEADROOM_CASES),
    (live_use.SCORER, LIVE_USE_CASES),
    (share_pack.SCORER, SHARE_PACK_CASES),
    (share_spread.SCORER, SHARE_SPREAD_CASES),
    (mig_pack.SCORER, MIG_PACK_CASES),
]


@pytest.mark.parametrize("case", MIG_PACK_CASES, ids=lambda c: c.id)
def test_mig_pack_rates_mig_devices_beside_busy_ones(case: Case) -> None:
    assert ratings(mig_pack.SCORER, case) == pytest.approx(case.expected)


@pytest.mark.parametrize("case", SHARE_PACK_CASES, ids=lambda c: c.id)
def test_share_pack_rates_how_full_the_chosen_devices_get(case: Case) -> None:
    assert ratings(share_pack.SCORER, case) == pytest.approx(case.expected)


@pytest.mark.parametrize("case", SHARE_SPREAD_CASES, ids=lambda c: c.id)
def test_share_spread_rates_how_empty_the_chosen_devices_stay(case: Case) -> None:
    assert ratings(share_spread.SCORER, case) == pytest.approx(case.expected)


@pytest.mark.parametrize("case", BINPACK_CASES, ids=lambda c: c.id)
def test_binpack_rates_how_full_the_node_gets(case: Case) -> None:
    assert ratings(binpack.SCORER, case) == pytest.approx(case.expected)


@pytest.mark.parametrize("case", SPREAD_CASES, ids=lambda c: c.id)
def test_spread_rates_how_much_stays_free(case: Case) -> None:
    assert ratings(spread.SCORER, case) == pytest.approx(case.expected)


@pytest.mark.parametrize("case", TOPOLOGY_CASES, ids=lambda c: c.id)
def test_topology_rates_one_nvlink_group_for_all_the_gpus(case: Case) -> None:
    assert ratings(topology.SCORER, case) == pytest.approx(case.expected)


@pytest.mark.parametrize("case", CPU_ONLY_CASES, ids=lambda c: c.id)
def test_cpu_only_rates_nodes_without_gpus(case: Case) -> None:
    assert ratings(cpu_only.SCORER, case) == pytest.approx(case.expected)


@pytest.mark.parametrize("case", GANG_RACK_CASES, ids=lambda c: c.id)
def test_gang_rack_rates_the_rack_of_the_group(case: Case) -> None:
    assert ratings(gang_rack.SCORER, case) == pytest.approx(case.expected)


@pytest.mark.parametrize("case", GANG_TOPOLOGY_CASES, ids=lambda c: c.id)
def test_gang_topology_rates_the_narrowest_domain_the_group_can_share(case: Case) -> None:
    assert ratings(gang_topology.SCORER, case) == pytest.approx(case.expected)


@pytest.mark.parametrize("case", IP_HEADROOM_CASES, ids=lambda c: c.id)
def test_ip_headroom_rates_the_free_share_of_the_pool(case: Case) -> None:
    assert ratings(ip_headroom.SCORER, case) == pytest.approx(case.expected)


@pytest.mark.parametrize("case", LIVE_USE_CASES, ids=lambda c: c.id)
def test_live_use_rates_how_idle_the_free_gpus_were(case: Case) -> None:
    assert ratings(live_use.SCORER, case) == pytest.approx(case.expected)


def test_a_stale_live_use_sample_is_ignored_and_a_fresh_one_counts_again() -> None:
    busy = agent_annotations(1, use={0: (100, 81559)}, use_at=1000.0)
    scheduler = scheduler_with([make_node("n", gpus=1, annotations=busy)])
    request = pod_request(make_pod(gpus=1))

    def rating() -> float:
        nodes = Candidates(scheduler.inventory, request, scheduler.inventory.ids(["n"]))
        return float(live_use.SCORER.score(nodes)[0])

    assert rating() == 0.0
    scheduler.age_live_use(1000.0 + 301)  # past the default live_use_stale_s of 300
    assert rating() == live_use.UNKNOWN
    fresh = agent_annotations(1, use={0: (100, 81559)}, use_at=1000.0 + 310)
    scheduler.upsert_node(make_node("n", gpus=1, annotations=fresh))
    assert rating() == 0.0


def test_a_new_live_use_sample_keeps_the_nodes_spec_caches() -> None:
    scheduler = scheduler_with(
        [make_node("n", gpus=1, annotations=agent_annotations(1, use={0: (0, 0)}))]
    )
    version = scheduler.inventory.nodes_version
    again = agent_annotations(1, use={0: (90, 10)}, use_at=2_000_000.0)
    assert scheduler.upsert_node(make_node("n", gpus=1, annotations=again))
    assert scheduler.inventory.nodes_version == version
    assert int(scheduler.inventory.arrays.use_util[scheduler.inventory.ids(["n"])][0]) == 90


APPLIES = [
    # (scorer, pod, applies)
    (binpack.SCORER, make_pod(gpus=1), True),
    (binpack.SCORER, make_pod(), False),
    (spread.SCORER, make_pod(gpus=1), True),
    (spread.SCORER, make_pod(), False),
    (topology.SCORER, make_pod(gpus=2), True),
    (topology.SCORER, make_pod(workload="GPU-intensive"), False),
    (cpu_only.SCORER, make_pod(), True),
    (cpu_only.SCORER, make_pod(gpus=1), False),
    (ip_headroom.SCORER, ip_pod("p", pool="p0"), True),
    (ip_headroom.SCORER, make_pod(gpus=1), False),
    (live_use.SCORER, make_pod(gpus=1), True),
    (live_use.SCORER, make_pod(), False),
    (mig_pack.SCORER, mig_pod("p"), True),
    (mig_pack.SCORER, make_pod(gpus=1), False),
    (cpu_only.SCORER, mig_pod("p"), False),
]


@pytest.mark.parametrize(
    ("scorer", "pod", "applies"),
    APPLIES,
    ids=[f"{s.name}-{'applies' if a else 'does not'}-{i}" for i, (s, _, a) in enumerate(APPLIES)],
)
def test_each_scorer_says_which_pods_it_weighs_in_on(
    scorer: Scorer, pod: dict[str, Any], applies: bool
) -> None:
    scheduler = scheduler_with([make_node("n", gpus=4)])
    scheduler.upsert_ip_pool(make_ip_pool("p0", cidr="10.0.0.0/29"))
    request = pod_request(pod)
    nodes = Candidates(
        scheduler.inventory,
        request,
        scheduler.inventory.ids(["n"]),
        ip=ip_context(scheduler.inventory, request),
    )
    assert scorer.applies(nodes) is applies


def test_a_gang_member_is_rated_by_gang_rack_and_others_are_not() -> None:
    scheduler = scheduler_with([make_node("n", gpus=4)])
    request = pod_request(gang_pod("m", "train"))
    ids = scheduler.inventory.ids(["n"])
    member = Candidates(scheduler.inventory, request, ids, affinity=GroupAffinity())
    assert gang_rack.SCORER.applies(member)
    assert not gang_rack.SCORER.applies(Candidates(scheduler.inventory, request, ids))


def test_every_scorer_has_a_table_and_a_unique_name() -> None:
    assert {scorer.name for scorer, _ in TABLES} == NAMES
    assert len(NAMES) == len(SCORERS)


# ------------------------------------------------------------------ weights by name


def scores(config: PolicyConfig, pod: dict[str, Any]) -> dict[str, int]:
    nodes = [
        make_node("whole", gpus=8, groups=NVLINK_2X4),
        make_node("split", gpus=8, groups=NVLINK_2X4),
    ]
    bound = [
        make_pod("a", gpus=4, node="whole", gpu_ids=[0, 1, 2, 3]),
        make_pod("b", gpus=4, node="split", gpu_ids=[0, 1, 4, 5]),
    ]
    scheduler = scheduler_with(nodes, bound, config)
    ids = scheduler.inventory.ids(["whole", "split"])
    got = score_nodes(scheduler.inventory, pod_request(pod), ids, weights(config))
    return dict(zip(["whole", "split"], got.tolist(), strict=True))


def test_a_weight_named_in_the_config_overrides_the_scorers_default() -> None:
    pod = make_pod(gpus=4)
    assert scores(PolicyConfig(), pod) == {"whole": 10, "split": 7}
    # Only the NVLink bonus tells the nodes apart: without it they tie.
    assert scores(PolicyConfig(weights=(("topology", 0),)), pod) == {"whole": 10, "split": 10}
    # The bonus alone: all or nothing.
    assert scores(PolicyConfig(weights=(("binpack", 0),)), pod) == {"whole": 10, "split": 0}


def test_spread_takes_the_allocation_weight_when_chosen() -> None:
    pod = make_pod(gpus=1)  # 5 of 8 GPUs used after: binpack 0.625, spread 0.375
    binpacked = scores(PolicyConfig(weights=(("topology", 0),)), pod)
    spread_out = scores(
        PolicyConfig(gpu_scoring=GpuScoring.SPREAD, weights=(("topology", 0),)), pod
    )
    assert binpacked == {"whole": 6, "split": 6}
    assert spread_out == {"whole": 4, "split": 4}


def test_when_every_scorer_that_applies_weighs_nothing_no_node_is_preferred() -> None:
    config = PolicyConfig(weights=(("binpack", 0), ("topology", 0)))
    assert scores(config, make_pod(gpus=4)) == {"whole": 0, "split": 0}


@pytest.mark.parametrize(
    ("weights", "message"),
    [
        ((("bin-pack", 1),), "no scorer is named bin-pack: scorers must be binpack, cpu_only"),
        ((("topology", -1),), "score weights must be >= 0"),
    ],
    ids=["an unknown name", "a negative weight"],
)
def test_weights_by_name_are_validated(weights: tuple[tuple[str, int], ...], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Scheduler(PolicyConfig(weights=weights))
