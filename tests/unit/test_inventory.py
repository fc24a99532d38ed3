from dataclasses import replace

import pytest

from extender.inventory import Inventory, InventoryConflictError
from extender.model import Holding, HoldingKind
from extender.nodes import node_spec
from extender.policy import PolicyConfig, filter_nodes
from extender.requests import pod_request
from testbed.builders import make_node, make_pod


def inventory_with(*nodes: dict[str, object]) -> Inventory:
    inventory = Inventory(capacity=2)  # small, so tests also exercise growth
    for node in nodes:
        inventory.upsert_node(node_spec(node))
    return inventory


def hold(
    uid: str,
    node: str,
    gpus: int = 0,
    *,
    ids: tuple[int, ...] | None = None,
    cpu: int = 0,
    kind: HoldingKind = HoldingKind.BOUND,
    expires_at: float | None = None,
) -> Holding:
    return Holding(
        uid=uid,
        namespace="ns",
        name=uid,
        node=node,
        gpus=gpus,
        gpu_ids=ids,
        cpu_milli=cpu,
        kind=kind,
        expires_at=expires_at,
    )


def free(inventory: Inventory, node: str) -> int:
    return int(inventory.arrays.gpu_free[inventory.ids([node])][0])


def test_holdings_take_and_give_back_gpus_and_cpu() -> None:
    inventory = inventory_with(make_node("n", gpus=4, cpu="8"))
    inventory.upsert_holding(hold("a", "n", 2, ids=(0, 1), cpu=3000))
    assert free(inventory, "n") == 2
    assert int(inventory.arrays.cpu_free[inventory.ids(["n"])][0]) == 5000
    inventory.remove_holding("a")
    assert free(inventory, "n") == 4
    assert int(inventory.arrays.cpu_free[inventory.ids(["n"])][0]) == 8000


def test_upserting_the_same_pod_twice_counts_it_once() -> None:
    inventory = inventory_with(make_node("n", gpus=4))
    assert inventory.upsert_holding(hold("a", "n", 2, ids=(0, 1)))
    assert not inventory.upsert_holding(hold("a", "n", 2, ids=(0, 1)))
    assert free(inventory, "n") == 2


def test_a_pod_that_moves_is_counted_on_its_new_node_only() -> None:
    inventory = inventory_with(make_node("n1", gpus=4), make_node("n2", gpus=4))
    inventory.upsert_holding(hold("a", "n1", 2, ids=(0, 1)))
    inventory.upsert_holding(hold("a", "n2", 2, ids=(2, 3)))
    assert (free(inventory, "n1"), free(inventory, "n2")) == (4, 2)


def test_conflicting_gpu_ids_are_counted_anonymously_not_lost() -> None:
    inventory = inventory_with(make_node("n", gpus=4))
    inventory.upsert_holding(hold("a", "n", 2, ids=(0, 1)))
    inventory.upsert_holding(hold("b", "n", 1, ids=(1,)))  # index 1 already held by a
    assert free(inventory, "n") == 1
    view = inventory.node("n")
    assert view is not None
    assert view.anonymous_gpus == 1


def test_pods_listed_before_their_node_are_applied_when_it_arrives() -> None:
    inventory = inventory_with()
    inventory.upsert_holding(hold("a", "late", 3, ids=(0, 1, 2)))
    inventory.upsert_node(node_spec(make_node("late", gpus=4)))
    assert free(inventory, "late") == 1


def test_removed_node_comes_back_with_its_pods() -> None:
    inventory = inventory_with(make_node("n", gpus=4))
    inventory.upsert_holding(hold("a", "n", 2, ids=(0, 1)))
    inventory.remove_node("n")
    assert inventory.ids(["n"]).tolist() == [0]
    assert not bool(inventory.arrays.alive[0])
    inventory.upsert_node(node_spec(make_node("n", gpus=4)))
    assert free(inventory, "n") == 2


def test_node_slots_are_reused_and_arrays_grow() -> None:
    inventory = inventory_with(*[make_node(f"n{i}", gpus=1) for i in range(10)])
    assert len(inventory) == 10
    inventory.remove_node("n3")
    inventory.upsert_node(node_spec(make_node("new", gpus=2)))
    assert len(inventory.arrays.alive) == 11  # sentinel + 10 live slots, one reused
    assert free(inventory, "new") == 2


def test_shrinking_a_node_recounts_its_pods() -> None:
    inventory = inventory_with(make_node("n", gpus=8))
    inventory.upsert_holding(hold("a", "n", 2, ids=(6, 7)))
    inventory.upsert_node(node_spec(make_node("n", gpus=4)))
    view = inventory.node("n")
    assert view is not None
    assert (view.anonymous_gpus, view.free_gpu_ids) == (2, (0, 1))


def test_unchanged_node_update_is_a_no_op() -> None:
    inventory = inventory_with(make_node("n", gpus=4))
    version = inventory.version
    assert not inventory.upsert_node(node_spec(make_node("n", gpus=4)))
    assert inventory.version == version


def test_reserve_refuses_gpus_already_held() -> None:
    inventory = inventory_with(make_node("n", gpus=4))
    inventory.upsert_holding(hold("a", "n", 2, ids=(0, 1)))
    with pytest.raises(InventoryConflictError, match="already held"):
        inventory.reserve(hold("b", "n", 2, ids=(1, 2), kind=HoldingKind.RESERVED))
    assert free(inventory, "n") == 2


def test_reserve_on_unknown_node_is_refused() -> None:
    with pytest.raises(InventoryConflictError, match="not in the inventory"):
        inventory_with().reserve(hold("b", "ghost", 1, ids=(0,), kind=HoldingKind.RESERVED))


def test_reservations_expire_but_bound_pods_do_not() -> None:
    inventory = inventory_with(make_node("n", gpus=4))
    inventory.upsert_holding(hold("bound", "n", 1, ids=(0,)))
    inventory.reserve(hold("r", "n", 2, ids=(1, 2), kind=HoldingKind.RESERVED, expires_at=10.0))
    assert inventory.expire(9.9) == []
    assert [h.uid for h in inventory.expire(10.0)] == ["r"]
    assert free(inventory, "n") == 3


def test_relist_replaces_bound_pods_and_keeps_reservations() -> None:
    inventory = inventory_with(make_node("n", gpus=8))
    inventory.upsert_holding(hold("gone", "n", 2, ids=(0, 1)))
    inventory.upsert_holding(hold("kept", "n", 1, ids=(2,)))
    inventory.reserve(
        hold("inflight", "n", 1, ids=(3,), kind=HoldingKind.RESERVED, expires_at=99.0)
    )
    inventory.replace_bound([hold("kept", "n", 1, ids=(2,)), hold("new", "n", 1, ids=(4,))])
    assert {h.uid for h in inventory.holdings()} == {"kept", "inflight", "new"}
    assert free(inventory, "n") == 5


def test_relist_of_nodes_removes_the_missing_ones() -> None:
    inventory = inventory_with(make_node("a"), make_node("b"))
    inventory.replace_nodes([node_spec(make_node("b")), node_spec(make_node("c"))])
    assert sorted(inventory.node_names()) == ["b", "c"]


def test_topology_column_tracks_the_freest_group() -> None:
    inventory = inventory_with(make_node("n", gpus=8, groups=[[0, 1, 2, 3], [4, 5, 6, 7]]))
    inventory.upsert_holding(hold("a", "n", 3, ids=(4, 5, 6)))
    inventory.upsert_holding(hold("b", "n", 1, ids=(0,)))
    assert int(inventory.arrays.max_group_free[inventory.ids(["n"])][0]) == 3


def test_arrays_handed_out_are_read_only() -> None:
    inventory = inventory_with(make_node("n", gpus=4))
    with pytest.raises(ValueError, match="read-only"):
        inventory.arrays.gpu_free[1] = 99


def test_read_only_arrays_follow_every_change_and_every_new_node() -> None:
    # The views are made once per allocation and size (extender.columns): one taken before a
    # change must read what the change wrote, and a node added (the columns grow, here past
    # their first allocation) must be in the next arrays handed out, read-only like the rest.
    inventory = inventory_with(make_node("n", gpus=4))
    before = inventory.arrays
    inventory.upsert_holding(hold("a", "n", 3, ids=(0, 1, 2)))
    assert free(inventory, "n") == 1
    assert int(before.gpu_free[inventory.ids(["n"])][0]) == 1
    assert int(inventory.devices.sharers[inventory.ids(["n"])][0].sum()) == 0
    names = [f"m{i}" for i in range(40)]
    for name in names:
        inventory.upsert_node(node_spec(make_node(name, gpus=8)))
    grown = inventory.arrays
    assert len(grown.alive) == 42  # the sentinel, n, and the 40 new nodes
    assert grown.gpu_free[inventory.ids(names)].tolist() == [8] * 40
    assert free(inventory, "n") == 1
    for column in (grown.gpu_free, inventory.devices.memory_free):
        with pytest.raises(ValueError, match="read-only"):
            column[1] = 99


def test_node_view_is_a_copy() -> None:
    inventory = inventory_with(make_node("n", gpus=2))
    inventory.upsert_holding(hold("a", "n", 1, ids=(0,)))
    view = inventory.node("n")
    assert view is not None
    assert view.holders == ("a", None)
    inventory.remove_holding("a")
    assert view.holders == ("a", None)
    assert replace(view.holdings[0], gpus=1).uid == "a"


def _passing(inventory: Inventory, model_hint: str, nodes: list[str]) -> list[str]:
    request = pod_request(make_pod(gpus=1, model=model_hint))
    return filter_nodes(inventory, request, nodes, PolicyConfig()).passed


def test_an_exact_model_match_counts_only_while_a_node_has_that_model() -> None:
    # "H100" is one node's exact product name, and a part of the other's.
    inventory = inventory_with(
        make_node("exact", gpus=4, model="H100"),
        make_node("pcie", gpus=4, model="NVIDIA-H100-PCIe"),
    )
    assert _passing(inventory, "H100", ["exact", "pcie"]) == ["exact"]

    inventory.remove_node("exact")
    # No node has the product "H100" any more: the hint is matched as a part of a name.
    assert _passing(inventory, "H100", ["pcie"]) == ["pcie"]

    inventory.upsert_node(node_spec(make_node("exact", gpus=4, model="H100")))
    assert _passing(inventory, "H100", ["exact", "pcie"]) == ["exact"]


def test_a_node_relabelled_to_another_model_no_longer_makes_its_old_model_exact() -> None:
    inventory = inventory_with(
        make_node("a", gpus=4, model="H100"), make_node("b", gpus=4, model="NVIDIA-H100-SXM")
    )
    assert _passing(inventory, "H100", ["a", "b"]) == ["a"]
    inventory.upsert_node(node_spec(make_node("a", gpus=4, model="NVIDIA-H100-PCIe")))
    assert _passing(inventory, "H100", ["a", "b"]) == ["a", "b"]
