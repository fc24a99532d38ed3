"""Which GPUs belong together: NVLink components, else NUMA nodes
(extender.devices.links)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from extender.devices.gpus import Gpu
from extender.devices.links import nvlink_groups, pci_key

pytestmark = pytest.mark.unit


def bus(index: int) -> str:
    return f"00000000:{0x18 + index:02X}:00.0"


def gpus(
    count: int, links: Sequence[tuple[int, int]] = (), numa: Sequence[int | None] = ()
) -> list[Gpu]:
    """``count`` GPUs, linked in ``links`` (each pair named on one side only, as a GPU whose
    peer was lost would be), on NUMA nodes ``numa`` (unknown when not given)."""
    peers: dict[int, list[str]] = {i: [] for i in range(count)}
    for a, b in links:
        peers[a].append(bus(b))
    return [
        Gpu(
            index=i,
            uuid=f"GPU-{i}",
            pci_bus_id=bus(i),
            numa_node=numa[i] if numa else None,
            nvlink_peers=tuple(peers[i]),
        )
        for i in range(count)
    ]


CASES = [
    ("no GPUs", [], ()),
    ("one GPU", gpus(1), ()),
    ("no links, NUMA unknown", gpus(4), ()),
    (
        "two quads",
        gpus(8, [(0, 1), (1, 2), (2, 3), (4, 5), (5, 6), (6, 7)]),
        ((0, 1, 2, 3), (4, 5, 6, 7)),
    ),
    ("a chain folds into one group", gpus(4, [(0, 1), (1, 2), (2, 3)]), ((0, 1, 2, 3),)),
    ("unlinked GPUs are in no group", gpus(4, [(2, 3)]), ((2, 3),)),
    ("groups sorted by first index", gpus(4, [(3, 2), (1, 0)]), ((0, 1), (2, 3))),
    ("a self link is no link", gpus(2, [(0, 0)]), ()),
    ("NVLink wins over NUMA", gpus(4, [(0, 3)], numa=[0, 0, 1, 1]), ((0, 3),)),
    ("no NVLink: by NUMA node", gpus(4, numa=[1, 0, 1, 0]), ((0, 2), (1, 3))),
    ("one NUMA node says nothing", gpus(4, numa=[0, 0, 0, 0]), ()),
    ("a lone GPU on a NUMA node is no group", gpus(3, numa=[0, 0, 1]), ((0, 1),)),
    ("an unknown NUMA node voids the NUMA groups", gpus(4, numa=[0, 0, 1, None]), ()),
]


@pytest.mark.parametrize(("gpu_list", "groups"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_nvlink_groups(gpu_list: list[Gpu], groups: tuple[tuple[int, ...], ...]) -> None:
    assert nvlink_groups(gpu_list) == groups


def test_a_peer_named_in_another_spelling_still_links() -> None:
    a = Gpu(0, "GPU-a", pci_bus_id="00000000:1A:00.0", nvlink_peers=("0000:1b:00.0",))
    b = Gpu(1, "GPU-b", pci_bus_id="00000000:1B:00.0")
    assert nvlink_groups([a, b]) == ((0, 1),)


def test_a_peer_that_is_no_gpu_of_the_node_is_ignored() -> None:
    switch = Gpu(0, "GPU-a", pci_bus_id=bus(0), nvlink_peers=("00000000:C0:00.0",))
    assert nvlink_groups([switch, Gpu(1, "GPU-b", pci_bus_id=bus(1))]) == ()


@pytest.mark.parametrize(
    ("spelling", "key"),
    [
        ("00000000:1A:00.0", "00000000:1a:00.0"),
        ("0000:1a:00.0", "00000000:1a:00.0"),
        (" 00000000:1a:00.0 ", "00000000:1a:00.0"),
        ("not a bus id", "not a bus id"),
        ("zz:1a:00.0", "zz:1a:00.0"),
    ],
)
def test_pci_key(spelling: str, key: str) -> None:
    assert pci_key(spelling) == key
