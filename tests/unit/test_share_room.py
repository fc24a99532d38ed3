"""The fast paths of GPU shares give the answers of the obvious ones: the count of devices
with room per node (filter, and prioritize's guard), kept until the inventory changes, and
the rating of a one-GPU share (prioritize), on random clusters of shared, whole-held,
unhealthy and free devices."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest

from extender.config import SharePlacement
from extender.model import Reason
from extender.requests import pod_request
from extender.scheduler import Scheduler
from extender.scoring import share_pack
from extender.scoring.scorer import Candidates
from extender.shares import count_per_row, room_counts, shared_devices
from testbed.builders import agent_annotations, make_node, make_pod, share_pod
from tests.unit.helpers import scheduler_with

pytestmark = pytest.mark.unit

GIB = 1024
SEEDS = range(12)


@pytest.mark.parametrize("width", [0, 1, 3, 7, 8, 9, 10, 16, 17])
def test_count_per_row_is_count_nonzero_along_rows(width: int) -> None:
    rng = np.random.default_rng(width)
    for rows in (0, 1, 5, 300):
        mask = rng.random((rows, width)) < 0.4
        expected = np.count_nonzero(mask, axis=1)
        assert count_per_row(mask).tolist() == expected.tolist()
        # views that are not rows of contiguous bools: transposed storage, every other column
        assert count_per_row(np.asfortranarray(mask)).tolist() == expected.tolist()
        assert count_per_row(mask[:, ::2]).tolist() == np.count_nonzero(mask[:, ::2], 1).tolist()


def test_count_per_row_counts_full_rows_of_many_words() -> None:
    mask = np.ones((3, 24), dtype=np.bool_)
    mask[1] = False
    assert count_per_row(mask).tolist() == [24, 0, 24]


def random_cluster(seed: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Nodes of 0-10 GPUs (10: rows wider than 8 devices) of 40 or 80 GiB, some unhealthy;
    each GPU free, held whole, or holding 1-4 shares of random memory and cores."""
    rng = random.Random(seed)
    nodes: list[dict[str, Any]] = []
    pods: list[dict[str, Any]] = []
    for n in range(rng.randint(3, 9)):
        name = f"n{n}"
        gpus = rng.choice([0, 1, 2, 4, 8, 8, 10])
        bad = {i: "XID 79" for i in range(gpus) if rng.random() < 0.1}
        memory = rng.choice([40, 80]) * GIB
        annotations = agent_annotations(gpus, unhealthy=bad) if gpus else None
        nodes.append(make_node(name, gpus=gpus, gpu_memory_mib=memory, annotations=annotations))
        for index in range(gpus):
            state = rng.choice(["free", "whole", "shared", "shared", "shared"])
            if state == "whole":
                pods.append(make_pod(f"{name}-w{index}", gpus=1, node=name, gpu_ids=[index]))
            elif state == "shared":
                for k in range(rng.randint(1, 4)):
                    pods.append(
                        share_pod(
                            f"{name}-s{index}-{k}",
                            memory_mib=rng.choice([5, 10, 20, 30]) * GIB,
                            cores=rng.choice([None, 10, 30, 50]),
                            node=name,
                            gpu_ids=[index],
                        )
                    )
    return nodes, pods


def share_pods(seed: int, shares: int = 1) -> list[dict[str, Any]]:
    rng = random.Random(1000 + seed)
    return [
        share_pod(
            f"p{k}",
            memory_mib=rng.choice([1, 10, 20, 40, 70]) * GIB,
            cores=rng.choice([None, 20, 60]),
            shares=shares,
        )
        for k in range(4)
    ]


def expected_counts(scheduler: Scheduler, name: str, memory: int, cores: int) -> tuple[int, int]:
    """The devices with room for the share's memory, and for its memory and cores, from the
    node's own view (one device at a time, in Python). A share that asks for no cores fits
    beside any (shares held past 100 % included)."""
    view = scheduler.inventory.node(name)
    assert view is not None
    room = view.share_room
    return (
        sum(1 for m, _ in room if m >= memory),
        sum(1 for m, c in room if m >= memory and (c >= cores or not cores)),
    )


@pytest.mark.parametrize("seed", SEEDS)
def test_room_counts_are_the_nodes_own_room(seed: int) -> None:
    nodes, pods = random_cluster(seed)
    scheduler = scheduler_with(nodes, pods)
    names = [n["metadata"]["name"] for n in nodes]
    for pod in share_pods(seed):
        request = pod_request(pod)
        counts = room_counts(scheduler.inventory, request)
        ids = scheduler.inventory.ids(names)
        got = list(zip(counts.memory[ids].tolist(), counts.both[ids].tolist(), strict=True))
        expected = [
            expected_counts(scheduler, n, request.share.memory_mib, request.share.cores)
            for n in names
        ]
        assert got == expected


@pytest.mark.parametrize("seed", SEEDS)
def test_filter_turns_away_the_nodes_without_room_for_the_share(seed: int) -> None:
    nodes, pods = random_cluster(seed)
    scheduler = scheduler_with(nodes, pods)
    names = [n["metadata"]["name"] for n in nodes]
    for pod in share_pods(seed, shares=random.Random(seed).choice([1, 2])):
        request = pod_request(pod)
        verdict = scheduler.filter(pod, names)
        reasons = {n: r.reason for r in verdict.rejections for n in r.nodes}
        for name in names:
            memory, both = expected_counts(
                scheduler, name, request.share.memory_mib, request.share.cores
            )
            reason = reasons.get(name)
            if reason in (None, Reason.GPU_SHARE_MEMORY, Reason.GPU_SHARE_CORES):
                # nothing the specs decide stood in the way: the room alone decides
                expected = (
                    Reason.GPU_SHARE_MEMORY
                    if memory < request.share.devices
                    else Reason.GPU_SHARE_CORES
                    if both < request.share.devices
                    else None
                )
                assert reason is expected, (name, memory, both)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("placement", list(SharePlacement))
def test_one_device_rating_is_every_devices_rating(seed: int, placement: SharePlacement) -> None:
    """_one_device's shortcut (only the best device rated) is the same number as rating
    every device and sorting, on nodes with and without room, unhealthy and unknown ones."""
    nodes, pods = random_cluster(seed)
    scheduler = scheduler_with(nodes, pods)
    names = [n["metadata"]["name"] for n in nodes] + ["ghost"]
    rng = random.Random(seed)
    for pod in share_pods(seed):
        order = rng.sample(names, len(names))
        rated = Candidates(scheduler.inventory, pod_request(pod), scheduler.inventory.ids(order))
        fast = share_pack._one_device(rated, placement)
        full = share_pack._every_device(rated, placement)
        assert fast.tolist() == full.tolist()


def test_room_counts_and_shared_devices_are_computed_again_once_the_inventory_changes() -> None:
    scheduler = scheduler_with([make_node("n", gpus=1, gpu_memory_mib=80 * GIB)])
    request = pod_request(share_pod(memory_mib=50 * GIB))
    slot = scheduler.inventory.ids(["n"])
    assert room_counts(scheduler.inventory, request).memory[slot].tolist() == [1]
    assert room_counts(scheduler.inventory, request) is room_counts(scheduler.inventory, request)

    assert shared_devices(scheduler.inventory)[slot].tolist() == [[False]]

    held = share_pod("held", memory_mib=40 * GIB, node="n", gpu_ids=[0])
    scheduler.upsert_pod(held)
    assert room_counts(scheduler.inventory, request).memory[slot].tolist() == [0]
    assert shared_devices(scheduler.inventory)[slot].tolist() == [[True]]
    scheduler.delete_pod(held["metadata"]["uid"])
    assert room_counts(scheduler.inventory, request).memory[slot].tolist() == [1]
    assert shared_devices(scheduler.inventory)[slot].tolist() == [[False]]
