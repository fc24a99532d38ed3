"""GPU shares in the core: per-device accounting (a property test against a plain model, and
a restart from the bound pods), filter reasons per limit, the choice of devices, the room
preemption would make, and bind's annotations."""

from __future__ import annotations

import dataclasses
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from extender import binding, names
from extender.columns import NO_ROOM
from extender.config import PolicyConfig, SharePlacement
from extender.errors import BindRefusedError
from extender.inventory import Inventory, InventoryConflictError
from extender.model import Demand, GpuShare, Holding, HoldingKind
from extender.nodes import node_spec
from extender.packed import PackedNames
from extender.requests import holding_from_pod, pod_request
from extender.shares import pick_share_gpus, room_after, share_detail
from testbed.builders import agent_annotations, make_node, make_pod, name_of, share_pod, uid_of
from tests.unit.helpers import scheduler_with

PACK, SPREAD = SharePlacement.PACK, SharePlacement.SPREAD
XID79 = "XID 79: GPU fell off the bus"


# ------------------------------------------------------------ per-device accounting


@dataclass
class Device:
    """The model of one GPU: who holds it whole, and the shares on it (uid: MiB, cores)."""

    healthy: bool = True
    whole: str | None = None
    shares: dict[str, tuple[int, int]] = field(default_factory=dict)

    @property
    def memory(self) -> int:
        return sum(m for m, _ in self.shares.values())

    @property
    def cores(self) -> int:
        return sum(c for _, c in self.shares.values())


@dataclass
class ModelNode:
    name: str
    capacity: int  # MiB per device
    devices: list[Device]

    def free_ids(self) -> list[int]:
        return [
            i for i, d in enumerate(self.devices) if d.healthy and d.whole is None and not d.shares
        ]

    def room(self) -> list[tuple[int, int]]:
        return [
            (self.capacity - d.memory, 100 - d.cores)
            if d.healthy and d.whole is None
            else (NO_ROOM, NO_ROOM)
            for d in self.devices
        ]

    def share_fits(self, ids: Sequence[int], memory: int, cores: int) -> bool:
        if len(set(ids)) != len(ids):
            return False
        room = self.room()
        return all(0 <= i < len(room) and room[i][0] >= memory and room[i][1] >= cores for i in ids)

    def whole_fits(self, ids: Sequence[int]) -> bool:
        return len(set(ids)) == len(ids) and all(i in self.free_ids() for i in ids)


# Two nodes of different widths, so that the narrower one's row has columns past its GPUs;
# the wider one publishes UUIDs (holdings then follow them), and its GPUs fail and recover.
def node_b(unhealthy: set[int]) -> dict[str, Any]:
    bad = dict.fromkeys(sorted(unhealthy), XID79)
    return make_node(
        "b", gpus=8, gpu_memory_mib=2000, annotations=agent_annotations(8, unhealthy=bad)
    )


NODES = (
    ("a", 4, 1000, make_node("a", gpus=4, gpu_memory_mib=1000)),
    ("b", 8, 2000, node_b({5})),
)


def model_nodes() -> dict[str, ModelNode]:
    return {
        name: ModelNode(
            name, capacity, [Device(healthy=not (name == "b" and i == 5)) for i in range(gpus)]
        )
        for name, gpus, capacity, _ in NODES
    }


def fresh_inventory() -> Inventory:
    inventory = Inventory(capacity=2)
    for *_, node in NODES:
        inventory.upsert_node(node_spec(node))
    return inventory


def share_holding(
    uid: str, node: str, ids: tuple[int, ...], *, memory: int, cores: int, kind: HoldingKind
) -> Holding:
    return Holding(
        uid=uid, namespace="ns", name=uid, node=node, kind=kind, gpu_ids=ids,
        share=GpuShare(len(ids), memory, cores),
    )  # fmt: skip


def whole_holding(uid: str, node: str, ids: tuple[int, ...], kind: HoldingKind) -> Holding:
    return Holding(
        uid=uid, namespace="ns", name=uid, node=node, kind=kind, gpu_ids=ids, gpus=len(ids)
    )


def assert_agrees(inventory: Inventory, model: dict[str, ModelNode], step: object) -> None:
    """Every per-device read of the inventory against the model."""
    a, grid = inventory.arrays, inventory.devices
    for name, node in model.items():
        view = inventory.node(name)
        assert view is not None
        slot = int(inventory.ids([name])[0])
        room = node.room()
        gpus = len(node.devices)
        assert list(view.free_gpu_ids) == node.free_ids(), step
        assert list(view.share_room) == room, step
        assert list(view.share_memory) == [d.memory for d in node.devices], step
        assert list(view.share_cores) == [d.cores for d in node.devices], step
        for i, device in enumerate(node.devices):
            # Never a whole-GPU pod on a shared device, nor a share on a whole-held one.
            assert view.holders[i] == device.whole, step
            assert not (view.holders[i] is not None and view.shared(i)), step
            assert device.memory <= node.capacity, step
            assert device.cores <= 100, step
        assert grid.memory_free[slot, :gpus].tolist() == [m for m, _ in room], step
        assert grid.cores_free[slot, :gpus].tolist() == [c for _, c in room], step
        assert grid.sharers[slot, :gpus].tolist() == [len(d.shares) for d in node.devices], step
        assert (grid.memory_free[slot, gpus:] == NO_ROOM).all(), step
        assert (grid.sharers[slot, gpus:] == 0).all(), step
        assert int(a.gpu_free[slot]) == len(node.free_ids()), step
        assert int(a.share_devices[slot]) == sum(1 for d in node.devices if d.shares), step
        assert int(a.share_memory_held[slot]) == sum(d.memory for d in node.devices), step


@dataclass
class Walk:
    """Random changes, each made on both the inventory and the model."""

    rng: random.Random
    inventory: Inventory = field(default_factory=fresh_inventory)
    model: dict[str, ModelNode] = field(default_factory=model_nodes)
    held: dict[str, Holding] = field(default_factory=dict)
    made: int = 0

    def step(self) -> str:
        """One random change; returns what it was."""
        roll = self.rng.random()
        if self.held and roll < 0.3:
            return self.release(self.rng.choice(sorted(self.held)))
        if self.held and roll < 0.4:
            return self.confirm(self.rng.choice(sorted(self.held)))
        if roll < 0.45:
            return self.flip_health(self.rng.randrange(len(self.model["b"].devices)))
        return self.hold()

    def release(self, uid: str) -> str:
        holding = self.held.pop(uid)
        assert self.inventory.remove_holding(uid) == holding
        for device in self.model[holding.node].devices:
            device.shares.pop(uid, None)
            if device.whole == uid:
                device.whole = None
        return f"release {uid}"

    def confirm(self, uid: str) -> str:
        """A reservation seen bound by the watch: the same holding, BOUND; nothing moves."""
        bound = dataclasses.replace(self.held[uid], kind=HoldingKind.BOUND, expires_at=None)
        self.inventory.upsert_holding(bound)
        self.held[uid] = bound
        return f"confirm {uid}"

    def flip_health(self, index: int) -> str:
        """The agent finds a GPU of b failed, or recovered: shares and pods stay on it."""
        devices = self.model["b"].devices
        devices[index].healthy = not devices[index].healthy
        unhealthy = {i for i, d in enumerate(devices) if not d.healthy}
        self.inventory.upsert_node(node_spec(node_b(unhealthy)))
        return f"GPU {index} of b {'recovered' if devices[index].healthy else 'failed'}"

    def hold(self) -> str:
        """A share or a whole-GPU hold on random devices (some out of range, a few naming one
        device twice): through reserve mostly (bind's path, checked against the model), else
        as a bound pod the watch brings where the model says it fits (a conflicting fact is
        counted anonymously: other tests)."""
        rng = self.rng
        self.made += 1
        uid = f"p{self.made}"
        name = rng.choice(sorted(self.model))
        node = self.model[name]
        count = rng.choice((1, 1, 1, 2))
        ids = tuple(sorted(rng.sample(range(len(node.devices) + 1), count)))
        if rng.random() < 0.05:
            ids = (ids[0],) * count
        via_reserve = rng.random() < 0.8
        kind = HoldingKind.RESERVED if via_reserve else HoldingKind.BOUND
        if rng.random() < 0.7:
            memory = rng.randrange(1, 12) * node.capacity // 10
            cores = rng.choice((0, 0, 10, 30, 50, 70, 100))
            holding = share_holding(uid, name, ids, memory=memory, cores=cores, kind=kind)
            fits = node.share_fits(ids, memory, cores)
            what = f"share {uid} {ids} {memory} MiB {cores}% on {name}"
        else:
            holding = whole_holding(uid, name, ids, kind)
            fits = node.whole_fits(ids)
            what = f"whole {uid} {ids} on {name}"
        if not fits:
            if via_reserve:
                with pytest.raises(InventoryConflictError):
                    self.inventory.reserve(holding)
            return f"{'refused' if via_reserve else 'skip'} {what}"
        if via_reserve:
            self.inventory.reserve(holding)
        else:
            self.inventory.upsert_holding(holding)
        self.held[uid] = holding
        for i in ids:
            if holding.share:
                node.devices[i].shares[uid] = (memory, cores)
            else:
                node.devices[i].whole = uid
        return what


def bound_pod(holding: Holding, uuids: Sequence[str]) -> dict[str, Any]:
    """The pod object of a holding as the API server shows it once bound: bind's
    annotations (indices, UUIDs where the node publishes them, the share)."""
    ids = holding.gpu_ids or ()
    if holding.share:
        pod = share_pod(
            holding.name, uid=holding.uid, memory_mib=holding.share.memory_mib,
            cores=holding.share.cores or None, shares=holding.share.devices, node=holding.node,
            gpu_ids=ids,
        )  # fmt: skip
    else:
        pod = make_pod(
            holding.name, uid=holding.uid, gpus=holding.gpus, node=holding.node, gpu_ids=ids
        )
    if uuids:
        pod["metadata"]["annotations"][names.GPU_UUIDS] = ",".join(uuids[i] for i in ids)
    return pod


def restarted(inventory: Inventory, held: dict[str, Holding], rng: random.Random) -> Inventory:
    """A new inventory built from the bound pods alone, in a shuffled order."""
    again = Inventory()
    for name in inventory.node_names():
        view = inventory.node(name)
        assert view is not None
        again.upsert_node(view.spec)
    holdings = list(held.values())
    rng.shuffle(holdings)
    for holding in holdings:
        view = inventory.node(holding.node)
        assert view is not None
        from_pod = holding_from_pod(bound_pod(holding, view.spec.gpu_uuids))
        assert from_pod is not None
        again.upsert_holding(from_pod)
    return again


@pytest.mark.parametrize("seed", [1, 7, 20261125])
def test_per_device_accounting_agrees_with_a_plain_model(seed: int) -> None:
    walk = Walk(random.Random(seed))
    steps = []
    for _ in range(400):
        steps.append(walk.step())
        assert_agrees(walk.inventory, walk.model, steps[-3:])
    # The walk went where it matters: full devices, shares of two, failed GPUs.
    assert any(re.match(r"refused share p\d+ \(\d+,\) ", s) for s in steps)
    assert any(re.match(r"share p\d+ \(\d+, \d+\) ", s) for s in steps)
    assert any(s.endswith("failed") for s in steps)
    # A restart (every pod read back from the API server) gives the same per-device state.
    assert_agrees(restarted(walk.inventory, walk.held, walk.rng), walk.model, "restart")


def test_a_restart_mid_way_gives_the_same_state() -> None:
    walk = Walk(random.Random(3))
    for step in range(120):
        walk.step()
        if step % 30 == 29:
            again = restarted(walk.inventory, walk.held, walk.rng)
            assert_agrees(again, walk.model, f"restart at {step}")


def test_a_share_without_gpu_ids_blocks_a_whole_device_anonymously() -> None:
    """Which device it is on is unknown: no device may be over-committed for it, so it takes
    one whole, assumed on the highest free index."""
    inventory = fresh_inventory()
    pod = share_pod("legacy", memory_mib=100, node="a")
    holding = holding_from_pod(pod)
    assert holding is not None
    assert holding.gpu_ids is None
    inventory.upsert_holding(holding)
    view = inventory.node("a")
    assert view is not None
    assert view.anonymous_gpus == 1
    assert view.free_gpu_ids == (0, 1, 2)
    assert view.share_room[3] == (NO_ROOM, NO_ROOM)
    assert view.share_memory == (0, 0, 0, 0)


def test_a_share_on_a_device_held_whole_counts_anonymously() -> None:
    inventory = fresh_inventory()
    inventory.upsert_holding(whole_holding("w", "a", (0,), HoldingKind.BOUND))
    inventory.upsert_holding(
        share_holding("s", "a", (0,), memory=100, cores=0, kind=HoldingKind.BOUND)
    )
    view = inventory.node("a")
    assert view is not None
    assert (view.holders[0], view.share_memory[0], view.anonymous_gpus) == ("w", 0, 1)
    assert view.free_gpu_ids == (1, 2)


def test_a_reservation_may_grow_its_own_share_in_place() -> None:
    """Reserving again for the same pod counts its own share as room (bind retried)."""
    inventory = fresh_inventory()
    inventory.reserve(share_holding("s", "a", (0,), memory=600, cores=0, kind=HoldingKind.RESERVED))
    inventory.reserve(share_holding("s", "a", (0,), memory=900, cores=0, kind=HoldingKind.RESERVED))
    view = inventory.node("a")
    assert view is not None
    assert view.share_memory[0] == 900
    with pytest.raises(InventoryConflictError, match="GPU 0 on a has no room for a 1100 MiB"):
        inventory.reserve(
            share_holding("s", "a", (0,), memory=1100, cores=0, kind=HoldingKind.RESERVED)
        )


# --------------------------------------------------------------------- filter reasons

FITS = "fits"
BUSY = "busy"  # rejected, preemption may help (FailedNodes on the wire)
UNRESOLVABLE = "unresolvable"  # rejected, preemption cannot help


@dataclass
class FilterCase:
    name: str
    pod: dict[str, Any]
    nodes: list[dict[str, Any]]
    expected: dict[str, tuple[str, str]]  # node -> (outcome, how its reason starts)
    bound: list[dict[str, Any]] = field(default_factory=list)


def small(name: str, gpus: int = 2, **kwargs: Any) -> dict[str, Any]:
    """A node of ``gpus`` GPUs of 10000 MiB each."""
    return make_node(name, gpus=gpus, gpu_memory_mib=10_000, **kwargs)


def held(name: str, node: str, ids: list[int], memory: int, cores: int | None = None) -> Any:
    return share_pod(name, memory_mib=memory, cores=cores, node=node, gpu_ids=ids)


FILTER_CASES = [
    FilterCase(
        "a share fits a device with room, and an empty one",
        share_pod(memory_mib=3000),
        [small("half"), small("empty")],
        {"half": (FITS, ""), "empty": (FITS, "")},
        bound=[held("h0", "half", [0], 8000), held("h1", "half", [1], 5000)],
    ),
    FilterCase(
        "a share larger than the node's GPUs can never fit there",
        share_pod(memory_mib=12_000),
        [small("n"), make_node("h100", gpus=2)],
        {
            "n": (
                UNRESOLVABLE,
                "schedext: a 12000 MiB GPU share is larger than the node's GPUs "
                "(or their memory is not published)",
            ),
            "h100": (FITS, ""),
        },
    ),
    FilterCase(
        "a node whose GPU memory is unknown takes no share",
        share_pod(memory_mib=1),
        [make_node("unlabelled", gpus=2, model="")],
        {"unlabelled": (UNRESOLVABLE, "schedext: a 1 MiB GPU share is larger than")},
    ),
    FilterCase(
        "no device with the memory free: busy",
        share_pod(memory_mib=3000),
        [small("n")],
        {"n": (BUSY, "schedext: no GPU with 3000 MiB free")},
        bound=[held("h0", "n", [0], 8000), held("h1", "n", [1], 7001)],
    ),
    FilterCase(
        "a share of 2 GPUs needs 2 devices with room",
        share_pod(memory_mib=3000, shares=2),
        [small("n")],
        {"n": (BUSY, "schedext: fewer than 2 GPUs with 3000 MiB free")},
        bound=[held("h0", "n", [0], 8000)],
    ),
    FilterCase(
        "the memory fits but not the cores",
        share_pod(memory_mib=1000, cores=30),
        [small("n")],
        {"n": (BUSY, "schedext: no GPU with 1000 MiB and 30% cores free")},
        bound=[held("h0", "n", [0], 1000, cores=80), held("h1", "n", [1], 1000, cores=71)],
    ),
    FilterCase(
        "the cores fit on one device, the memory on the other: neither holds both",
        share_pod(memory_mib=5000, cores=50),
        [small("n")],
        {"n": (BUSY, "schedext: no GPU with 5000 MiB and 50% cores free")},
        bound=[held("h0", "n", [0], 6000, cores=10), held("h1", "n", [1], 1000, cores=60)],
    ),
    FilterCase(
        "a share of more GPUs than the node has",
        share_pod(memory_mib=1000, shares=5),
        [small("n", gpus=4)],
        {"n": (UNRESOLVABLE, "schedext: node has fewer than 5 GPUs")},
    ),
    FilterCase(
        "an unhealthy GPU takes no share",
        share_pod(memory_mib=1000),
        [small("n", annotations=agent_annotations(2, unhealthy={1: XID79}))],
        {"n": (BUSY, "schedext: no GPU with 1000 MiB free")},
        bound=[make_pod("whole", gpus=1, node="n", gpu_ids=[0])],
    ),
    FilterCase(
        "a node with no healthy GPU left: unresolvable, naming the GPU",
        share_pod(memory_mib=1000),
        [small("n", gpus=1, annotations=agent_annotations(1, unhealthy={0: XID79}))],
        {"n": (UNRESOLVABLE, f"schedext: GPU 0 unhealthy: {XID79} (0 healthy, pod needs 1)")},
    ),
    FilterCase(
        "a device held whole takes no share",
        share_pod(memory_mib=1000),
        [small("n", gpus=1)],
        {"n": (BUSY, "schedext: no GPU with 1000 MiB free")},
        bound=[make_pod("whole", gpus=1, node="n", gpu_ids=[0])],
    ),
    FilterCase(
        "a share bound without gpu-ids blocks a device whole",
        share_pod(memory_mib=1000),
        [small("n", gpus=1)],
        {"n": (BUSY, "schedext: no GPU with 1000 MiB free")},
        bound=[share_pod("legacy", memory_mib=100, node="n")],
    ),
    FilterCase(
        "whole-GPU pods are turned away where every device is shared",
        make_pod(gpus=1),
        [small("shared"), small("one-left")],
        {"shared": (BUSY, "schedext: fewer than 1 free GPUs"), "one-left": (FITS, "")},
        bound=[
            held("s0", "shared", [0], 100),
            held("s1", "shared", [1], 100),
            held("s2", "one-left", [0], 100),
        ],
    ),
]


@pytest.mark.parametrize("packed", [False, True], ids=["names", "packed"])
@pytest.mark.parametrize("case", FILTER_CASES, ids=[c.name for c in FILTER_CASES])
def test_filter_reasons_of_shares(case: FilterCase, packed: bool) -> None:
    """Every case twice: names as strings, and as kube-scheduler's bytes (PackedNames)."""
    scheduler = scheduler_with(case.nodes, case.bound)
    node_names: Sequence[str] = list(case.expected)
    if packed:
        node_names = PackedNames.of(node_names) or pytest.fail("test names must be plain")
    verdict = scheduler.filter(case.pod, node_names)
    for node, (outcome, reason) in case.expected.items():
        if outcome == FITS:
            assert node in verdict.passed
            continue
        assert node not in verdict.passed
        assert verdict.failed[node].startswith(reason), verdict.failed[node]
        # FailedNodes (preemption may help) or FailedAndUnresolvableNodes.
        assert (node in verdict.unresolvable) == (outcome == UNRESOLVABLE)


# ------------------------------------------------------------------ choice of devices

DEVICE_MIB = 1000  # the devices of the cases below


def demand(memory: int, shares: int = 1, cores: int = 0) -> Demand:
    return Demand(uid="d", namespace="ns", name="d", share=GpuShare(shares, memory, cores))


NONE = (NO_ROOM, NO_ROOM)

# (id, room per device, groups, demand, placement, expected devices)
PICK_CASES = [
    ("pack: the fullest device with room", [(1000, 100), (300, 100), (600, 100)], (),
     demand(200), PACK, (1,)),
    ("spread: the emptiest", [(1000, 100), (300, 100), (600, 100)], (), demand(200), SPREAD, (0,)),
    ("pack skips devices without the room", [(1000, 100), (300, 100), (600, 100)], (),
     demand(400), PACK, (2,)),
    ("pack: ties go to the lowest index", [(1000, 100), (500, 100), (500, 100)], (), demand(100),
     PACK, (1,)),
    ("spread: ties go to the lowest index", [(500, 100), (1000, 100), (1000, 100)], (),
     demand(100), SPREAD, (1,)),
    ("devices that take no share are skipped", [NONE, (1000, 100), NONE], (), demand(100), PACK,
     (1,)),
    ("the cores must fit too", [(200, 40), (900, 60)], (), demand(100, cores=50), PACK, (1,)),
    ("2 shares: the two fullest, by index", [(400, 100), (1000, 100), (500, 100), (900, 100)], (),
     demand(100, 2), PACK, (0, 2)),
    ("2 shares stay inside an NVLink group that has room",
     [(400, 100), (1000, 100), (500, 100), NONE], ((0, 1), (2, 3)), demand(100, 2), PACK, (0, 1)),
    ("2 shares: the group whose own best devices are best",
     [(1000, 100), (1000, 100), (600, 100), (700, 100)], ((0, 1), (2, 3)), demand(100, 2), PACK,
     (2, 3)),
    ("2 shares cross groups when no group has room for both",
     [(400, 100), NONE, (500, 100), NONE], ((0, 1), (2, 3)), demand(100, 2), PACK, (0, 2)),
    ("too few devices with room", [(400, 100), (50, 100), NONE], (), demand(100, 2), PACK, None),
    ("no device with room", [NONE, NONE], (), demand(1), SPREAD, None),
]  # fmt: skip


@pytest.mark.parametrize(
    ("room", "groups", "wanted", "placement", "expected"),
    [c[1:] for c in PICK_CASES],
    ids=[c[0] for c in PICK_CASES],
)
def test_pick_share_gpus(
    room: list[tuple[int, int]],
    groups: tuple[tuple[int, ...], ...],
    wanted: Demand,
    placement: SharePlacement,
    expected: tuple[int, ...] | None,
) -> None:
    assert pick_share_gpus(room, DEVICE_MIB, groups, wanted, placement) == expected


def holding_of(inventory: Inventory, uid: str) -> Holding:
    holding = inventory.holding(uid)
    assert holding is not None
    return holding


def room_node() -> Inventory:
    """Node n, 4 x 1000 MiB: GPU 0 holds shares s1 (300 MiB, 20%) and s2 (400 MiB); GPU 1 is
    held whole by w; GPU 2 is free; GPU 3 is taken by a pod bound without gpu-ids."""
    inventory = Inventory()
    inventory.upsert_node(node_spec(make_node("n", gpus=4, gpu_memory_mib=1000)))
    for pod in (
        share_pod("s1", uid="s1", memory_mib=300, cores=20, node="n", gpu_ids=[0]),
        share_pod("s2", uid="s2", memory_mib=400, node="n", gpu_ids=[0]),
        make_pod("w", uid="w", gpus=1, node="n", gpu_ids=[1]),
        make_pod("anon", uid="anon", gpus=1, node="n"),
    ):
        holding = holding_from_pod(pod)
        assert holding is not None
        inventory.upsert_holding(holding)
    return inventory


FULL = (1000, 100)

# (id, victims, room per device once they are gone)
ROOM_AFTER_CASES = [
    ("no victims: the room there is now", [], [(300, 80), NONE, FULL, NONE]),
    ("a share's victim leaves its device", ["s1"], [(600, 100), NONE, FULL, NONE]),
    ("every share gone: the device is empty", ["s1", "s2"], [FULL, NONE, FULL, NONE]),
    ("a whole victim frees its device", ["w"], [(300, 80), FULL, FULL, NONE]),
    ("the pod without gpu-ids frees the highest unshared index", ["anon"],
     [(300, 80), NONE, FULL, FULL]),
]  # fmt: skip


@pytest.mark.parametrize(
    ("victims", "expected"),
    [c[1:] for c in ROOM_AFTER_CASES],
    ids=[c[0] for c in ROOM_AFTER_CASES],
)
def test_room_after_victims(victims: list[str], expected: list[tuple[int, int]]) -> None:
    inventory = room_node()
    view = inventory.node("n")
    assert view is not None
    assert room_after(view, [holding_of(inventory, uid) for uid in victims]) == expected


def test_room_after_keeps_anonymous_gpus_blocked_when_a_whole_victim_goes() -> None:
    """With w gone, three devices are unshared (1, 2, 3): the anonymous pod is still assumed
    on the highest of them."""
    inventory = room_node()
    view = inventory.node("n")
    assert view is not None
    assert room_after(view, [holding_of(inventory, "w")])[3] == NONE
    assert view.anonymous_gpus == 1


def test_room_after_never_opens_an_unhealthy_gpu() -> None:
    inventory = Inventory()
    annotations = agent_annotations(2, unhealthy={1: XID79})
    inventory.upsert_node(
        node_spec(make_node("n", gpus=2, gpu_memory_mib=1000, annotations=annotations))
    )
    holding = holding_from_pod(make_pod("w", uid="w", gpus=1, node="n", gpu_ids=[1]))
    assert holding is not None
    inventory.upsert_holding(holding)
    view = inventory.node("n")
    assert view is not None
    assert room_after(view, [holding]) == [FULL, NONE]


# (id, demand, expected message)
DETAIL_CASES = [
    ("memory", demand(800), "no GPU with 800 MiB free: largest free 1000 MiB on GPU 2"),
    ("memory and cores", demand(800, cores=90),
     "no GPU with 800 MiB and 90% of the cores free: largest free 1000 MiB on GPU 2, "
     "most cores free 100% on GPU 2"),
    ("two shares", demand(800, shares=2),
     "fewer than 2 GPUs with 800 MiB free: largest free 1000 MiB on GPU 2"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("wanted", "expected"), [c[1:] for c in DETAIL_CASES], ids=[c[0] for c in DETAIL_CASES]
)
def test_share_detail_names_the_best_device(wanted: Demand, expected: str) -> None:
    view = room_node().node("n")
    assert view is not None
    assert share_detail(view, wanted) == expected


def test_share_detail_when_no_device_takes_a_share() -> None:
    inventory = Inventory()
    inventory.upsert_node(node_spec(make_node("n", gpus=1, gpu_memory_mib=1000)))
    holding = holding_from_pod(make_pod("w", uid="w", gpus=1, node="n", gpu_ids=[0]))
    assert holding is not None
    inventory.upsert_holding(holding)
    view = inventory.node("n")
    assert view is not None
    assert share_detail(view, demand(100)) == (
        "no GPU with 100 MiB free: every GPU is held whole or unhealthy"
    )


# ------------------------------------------------------------------------------- bind


def bind(scheduler: Any, pod: dict[str, Any], node: str) -> Any:
    assert node in scheduler.filter(pod, [node]).passed
    return scheduler.plan_bind(
        uid=uid_of(pod), namespace="default", name=name_of(pod), node=node, now=0.0
    )


def test_bind_writes_the_devices_their_uuids_and_the_share() -> None:
    scheduler = scheduler_with(
        [small("n", gpus=4, annotations=agent_annotations(4))],
        [held("first", "n", [2], 4000)],
    )
    plan = bind(scheduler, share_pod("p", memory_mib=3000, cores=30), "n")
    assert plan.gpu_ids == (2,)  # pack: onto the device that already holds a share
    assert plan.annotations == {
        names.GPU_IDS: "2",
        names.GPU_UUIDS: "GPU-n-2",
        names.GPU_SHARE_MEMORY: "3000",
        names.GPU_SHARE_CORES: "30",
    }


def test_bind_without_cores_or_uuids_writes_only_what_there_is() -> None:
    config = PolicyConfig(share_placement=SPREAD)
    scheduler = scheduler_with([small("n", gpus=4)], [held("first", "n", [2], 4000)], config)
    plan = bind(scheduler, share_pod("p", memory_mib=3000), "n")
    assert plan.annotations == {names.GPU_IDS: "0", names.GPU_SHARE_MEMORY: "3000"}


def test_bind_keeps_a_share_of_two_gpus_inside_an_nvlink_group() -> None:
    scheduler = scheduler_with(
        [small("n", gpus=4, groups=[[0, 1], [2, 3]])],
        [
            held("a", "n", [0], 6000),
            held("b", "n", [2], 5000),
            make_pod("w", gpus=1, node="n", gpu_ids=[3]),
        ],
    )
    plan = bind(scheduler, share_pod("p", memory_mib=1000, shares=2), "n")
    assert plan.gpu_ids == (0, 1)  # not (0, 2), the two fullest: they span both groups


def test_bind_then_the_watch_then_a_restart_give_the_same_devices() -> None:
    scheduler = scheduler_with([small("n", gpus=2, annotations=agent_annotations(2))])
    pod = share_pod("p", memory_mib=3000, cores=40)
    plan = bind(scheduler, pod, "n")
    reserved = scheduler.inventory.node("n")
    pod["spec"]["nodeName"] = "n"
    pod["metadata"]["annotations"].update(plan.annotations)
    scheduler.upsert_pod(pod)  # the watch sees it bound, with bind's annotations
    seen = scheduler.inventory.node("n")
    again = scheduler_with([small("n", gpus=2, annotations=agent_annotations(2))], [pod])
    after_restart = again.inventory.node("n")
    assert reserved is not None
    assert seen is not None
    assert after_restart is not None
    for view in (seen, after_restart):
        assert (view.share_memory, view.share_cores, view.share_room) == (
            reserved.share_memory,
            reserved.share_cores,
            reserved.share_room,
        )
    assert seen.share_memory == (3000, 0)


def test_a_reservation_planned_on_a_stale_view_is_refused() -> None:
    scheduler = scheduler_with([small("n", gpus=1)])
    pod = share_pod("p", memory_mib=6000)
    assert scheduler.filter(pod, ["n"]).passed == ["n"]
    request = pod_request(pod)
    stale = binding.reservation(scheduler.inventory, request, "n", expires_at=60.0)
    scheduler.upsert_pod(held("other", "n", [0], 5000))  # the device lost its room since
    with pytest.raises(InventoryConflictError, match="GPU 0 on n has no room for a 6000 MiB"):
        scheduler.inventory.reserve(stale)
    with pytest.raises(BindRefusedError, match="no longer fits node n: schedext: no GPU with"):
        scheduler.plan_bind(
            uid=uid_of(pod), namespace="default", name=name_of(pod), node="n", now=0
        )


def test_a_share_reserved_twice_on_one_device_is_refused() -> None:
    inventory = fresh_inventory()
    twice = share_holding("s", "a", (0, 0), memory=600, cores=0, kind=HoldingKind.RESERVED)
    with pytest.raises(InventoryConflictError):
        inventory.reserve(twice)
    assert inventory.holding("s") is None
