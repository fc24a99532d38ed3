"""A holding that changes only its tags (a bind's reservation confirmed, then seen bound by the
watch, its pod running) is recorded without writing its node's row again
(``extender.inventory._retag``): the books must end exactly as the full path leaves them, on
random histories with conflicts, shares, addresses, GPU UUIDs and node changes."""

from __future__ import annotations

import dataclasses
import random
from typing import Any

import numpy as np
import pytest

import extender.inventory
from extender.inventory import Inventory
from extender.model import GpuShare, Holding, HoldingKind
from extender.nodes import node_spec
from testbed.builders import make_node

NODES = ("n0", "n1", "n2")


def spec(name: str, *, uuids: bool, cpu: str = "64") -> Any:
    found = node_spec(make_node(name, gpus=8, cpu=cpu))
    if not uuids:
        return found
    return dataclasses.replace(found, gpu_uuids=tuple(f"GPU-{i}" for i in range(8)))


def holding(rng: random.Random, uid: str) -> Holding:
    gpus = rng.choice((0, 1, 2))
    shared = gpus == 0 and rng.random() < 0.3
    ids = tuple(sorted(rng.sample(range(8), gpus or 1))) if rng.random() < 0.9 else None
    return Holding(
        uid=uid,
        namespace=rng.choice(("a", "b")),
        name=uid,
        node=rng.choice(NODES),
        gpus=0 if shared else gpus,
        share=GpuShare(1, 1024, 0) if shared else GpuShare(0, 0, 0),
        cpu_milli=rng.choice((100, 1000)),
        memory_bytes=1 << 30,
        gpu_ids=ids if (gpus or shared) else None,
        # UUIDs that name other indices than gpu_ids, on nodes that publish them
        gpu_uuids=tuple(f"GPU-{(i + 1) % 8}" for i in ids) if ids and rng.random() < 0.3 else None,
        kind=rng.choice((HoldingKind.RESERVED, HoldingKind.BOUND)),
        expires_at=rng.choice((None, 60.0)),
        ip=f"10.0.0.{rng.randrange(1, 6)}" if rng.random() < 0.2 else None,
    )


def retagged(rng: random.Random, old: Holding) -> Holding:
    return dataclasses.replace(
        old,
        kind=rng.choice((HoldingKind.RESERVED, HoldingKind.BOUND)),
        expires_at=rng.choice((None, 60.0, 120.0)),
        running=rng.random() < 0.5,
    )


def state(inventory: Inventory) -> tuple[Any, ...]:
    """Everything the books keep, orders included."""
    nodes = []
    for name in NODES:
        slot = inventory._slots.get(name)
        if slot is None:
            continue
        s = inventory._state(slot)
        nodes.append((name, list(s.holders), s.anonymous, s.cpu_used, s.memory_used,
                      list(s.applied.items()), list(s.sharers), list(s.share_memory)))  # fmt: skip
    arrays = tuple(np.asarray(a).tolist() for a in inventory.arrays)
    devices = tuple(np.asarray(a).tolist() for a in inventory.devices)
    return (
        list(inventory._holdings.items()),
        sorted(inventory._reserved),
        {k: list(v) for k, v in inventory._holdings_by_node.items()},
        {ns: inventory.namespace_use(ns) for ns in ("a", "b")},
        sorted(inventory.addresses._pods.items()),
        sorted(inventory.addresses._by_uid.items()),
        nodes,
        arrays,
        devices,
    )


def run(seed: int, retag: bool, monkeypatch: pytest.MonkeyPatch) -> tuple[tuple[Any, ...], int]:
    with monkeypatch.context() as patch:
        calls = [0]
        real = extender.inventory._retag

        def counted(*args: Any) -> bool:
            done = retag and real(*args)
            calls[0] += done
            return done

        patch.setattr(extender.inventory, "_retag", counted)
        rng = random.Random(seed)
        inventory = Inventory()
        for name in NODES:
            inventory.upsert_node(spec(name, uuids=rng.random() < 0.5))
        uids = [f"p{i}" for i in range(12)]
        for _ in range(200):
            uid = rng.choice(uids)
            old = inventory.holding(uid)
            roll = rng.random()
            if old is not None and roll < 0.5:
                inventory.upsert_holding(retagged(rng, old))
            elif roll < 0.8:
                inventory.upsert_holding(holding(rng, uid))
            elif roll < 0.92:
                inventory.remove_holding(uid)
            else:
                name = rng.choice(NODES)
                inventory.upsert_node(
                    spec(name, uuids=rng.random() < 0.5, cpu=rng.choice(("64", "32")))
                )
        return state(inventory), calls[0]


@pytest.mark.parametrize("seed", range(40))
def test_a_retag_leaves_the_books_as_the_full_path_does(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    fast, _ = run(seed, True, monkeypatch)
    full, none = run(seed, False, monkeypatch)
    assert none == 0
    assert fast == full


def test_retags_happen(monkeypatch: pytest.MonkeyPatch) -> None:
    """The random histories do take the short path (else the test above proves nothing)."""
    assert sum(run(seed, True, monkeypatch)[1] for seed in range(10)) > 100


def relisted(seed: int, *, one_by_one: bool) -> tuple[Any, ...]:
    """A history, then a relist of random holdings: ``replace_bound`` (each node's row written
    once) or, as it did before, each holding upserted and its row written at once."""
    rng = random.Random(seed)
    inventory = Inventory()
    for name in NODES:
        inventory.upsert_node(spec(name, uuids=rng.random() < 0.5))
    for i in range(rng.randrange(0, 10)):
        inventory.upsert_holding(holding(rng, f"before{i}"))
    listed = [holding(rng, f"p{i}") for i in range(rng.randrange(1, 20))]
    listed += [holding(rng, f"before{i}") for i in range(rng.randrange(0, 4))]  # changed
    listed = [dataclasses.replace(h, kind=HoldingKind.BOUND, expires_at=None) for h in listed]
    if one_by_one:
        wanted = {h.uid: h for h in listed}
        for held in list(inventory._holdings.values()):
            if held.uid not in wanted and held.kind is HoldingKind.BOUND:
                inventory.remove_holding(held.uid)
        for h in wanted.values():
            inventory.upsert_holding(h)
    else:
        inventory.replace_bound(listed)
    return state(inventory)


@pytest.mark.parametrize("seed", range(40))
def test_a_relist_writes_each_row_once_and_ends_as_one_upsert_at_a_time(seed: int) -> None:
    assert relisted(seed, one_by_one=False) == relisted(seed, one_by_one=True)
