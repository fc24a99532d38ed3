"""The node agent's allocation decisions (extender.devices.allocation): which pod a device
request is for, which GPUs it gets, and what GetPreferredAllocation suggests."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pytest

from extender.devices.allocation import (
    AllocationError,
    NodePod,
    chosen_uuids,
    grant,
    in_use,
    match_pod,
    own_pick,
    preferred,
)
from extender.devices.containers import ContainerGrant, PodContainer, Role
from extender.devices.gpus import Gpu, GpuHealth

GPU = "nvidia.com/gpu"

PAIRS = ((0, 1), (2, 3), (4, 5), (6, 7))
QUADS = ((0, 1, 2, 3), (4, 5, 6, 7))
SICK = GpuHealth(healthy=False, reason="XID 79: GPU fell off the bus")


def uuid(index: int) -> str:
    return f"GPU-{index}"


def gpus(count: int = 8, *, sick: Sequence[int] = ()) -> tuple[Gpu, ...]:
    return tuple(
        Gpu(index=i, uuid=uuid(i), health=SICK if i in sick else GpuHealth()) for i in range(count)
    )


def bound(
    name: str,
    ids: Sequence[int],
    *,
    at: float = 0.0,
    gpus: int | None = None,
    allocated: Sequence[int] = (),
    by_uuid: bool = True,
) -> NodePod:
    """A pod schedext bound to GPU ``ids`` (with UUIDs on it unless ``by_uuid`` is False)."""
    return NodePod(
        uid=f"uid-{name}",
        namespace="ml",
        name=name,
        gpus=len(ids) if gpus is None else gpus,
        gpu_ids=tuple(ids),
        gpu_uuids=tuple(uuid(i) for i in ids) if by_uuid else None,
        allocated=tuple(uuid(i) for i in allocated),
        bound_at=at,
    )


def unbound(name: str, gpus: int, *, at: float = 0.0, allocated: Sequence[int] = ()) -> NodePod:
    """A pod another scheduler (or schedext without GPU ids) put on the node."""
    return NodePod(
        uid=f"uid-{name}",
        namespace="ml",
        name=name,
        gpus=gpus,
        allocated=tuple(uuid(i) for i in allocated),
        bound_at=at,
    )


def shaped(pod: NodePod, *containers: tuple[str, int], given: dict[str, list[int]]) -> NodePod:
    """``pod`` with app containers (name, GPUs) and what the named ones were given."""
    grants = tuple(ContainerGrant(n, tuple(uuid(i) for i in ids)) for n, ids in given.items())
    return NodePod(
        **{
            **{f: getattr(pod, f) for f in pod.__dataclass_fields__},
            "containers": tuple(PodContainer(n, Role.APP, ((GPU, c),)) for n, c in containers),
            "grants": grants,
            "allocated": tuple(uuid(i) for ids in given.values() for i in ids),
        }
    )


@dataclass
class MatchCase:
    name: str
    pods: list[NodePod]
    size: int
    expected: str | None


MATCH_CASES = [
    MatchCase("nobody waits", [], 1, None),
    MatchCase("the bound pod of that size", [bound("a", [0, 1])], 2, "a"),
    MatchCase("not a bound pod of another size", [bound("a", [0, 1])], 1, None),
    MatchCase("oldest bind first", [bound("b", [2], at=2), bound("a", [0], at=1)], 1, "a"),
    MatchCase("ties by name", [bound("b", [2], at=1), bound("a", [0], at=1)], 1, "a"),
    MatchCase(
        "a fully allocated pod is done", [bound("a", [0], allocated=[0]), bound("b", [1])], 1, "b"
    ),
    MatchCase(
        "the next container of a pod part-way through",
        [shaped(bound("a", [0, 1, 2]), ("c1", 1), ("c2", 2), given={"c1": [0]})],
        2,
        "a",
    ),
    MatchCase(
        "a pod part-way through before an older one",
        [
            bound("old", [5], at=0),
            shaped(bound("a", [0, 1], at=9), ("c1", 1), ("c2", 1), given={"c1": [0]}),
        ],
        1,
        "a",
    ),
    MatchCase(
        "not a container already given its GPUs",
        [shaped(bound("a", [0, 1, 2]), ("c1", 1), ("c2", 2), given={"c1": [0]})],
        1,
        None,
    ),
    MatchCase(
        "bound pods before unbound ones, even younger",
        [unbound("old", 1, at=0), bound("young", [3], at=5)],
        1,
        "young",
    ),
    MatchCase("an unbound pod needing that many", [unbound("u", 2)], 2, "u"),
    MatchCase(
        "an unbound pod's next container",
        [shaped(unbound("u", 4), ("c1", 2), ("c2", 2), given={"c1": [0, 1]})],
        2,
        "u",
    ),
    MatchCase("unbound oldest first", [unbound("b", 1, at=3), unbound("a", 1, at=4)], 1, "b"),
]


@pytest.mark.parametrize("case", MATCH_CASES, ids=[c.name for c in MATCH_CASES])
def test_match_pod(case: MatchCase) -> None:
    match = match_pod(case.pods, case.size, resource=GPU)
    assert (match.pod.name if match else None) == case.expected


@pytest.mark.parametrize(
    ("pod", "expected"),
    [
        (bound("a", [4, 5]), (uuid(4), uuid(5))),
        (bound("a", [4, 5], allocated=[4]), (uuid(4), uuid(5))),
        (bound("a", [4, 5], by_uuid=False), (uuid(4), uuid(5))),
        (bound("a", [4, 9], by_uuid=False), None),  # index 9 is not on this node
        (unbound("u", 2), None),
    ],
    ids=["uuids", "all of them", "indices mapped", "unknown index", "unbound"],
)
def test_chosen_uuids(pod: NodePod, expected: tuple[str, ...] | None) -> None:
    by_index = {g.index: g.uuid for g in gpus()}
    assert chosen_uuids(pod, by_index) == expected


@pytest.mark.parametrize(
    ("free", "groups", "size", "expected"),
    [
        ([0, 1, 2, 3], (), 2, (0, 1)),
        ([1, 2, 3, 5], PAIRS, 2, (2, 3)),  # the free pair, not 1 and 2 across pairs
        ([3, 1, 2, 0], QUADS, 3, (0, 1, 2)),  # order of free does not matter
        ([0, 4, 5, 6], QUADS, 2, (4, 5)),
        ([0, 2, 4], PAIRS, 2, (0, 2)),  # no pair is free: as few groups as possible
        ([0], PAIRS, 2, None),
        ([0, 1], PAIRS, 0, ()),
    ],
)
def test_own_pick(
    free: list[int], groups: tuple[tuple[int, ...], ...], size: int, expected: object
) -> None:
    assert own_pick(free, groups, size) == expected


def test_in_use_is_allocated_plus_chosen_for_pending_bound_pods() -> None:
    by_index = {g.index: g.uuid for g in gpus()}
    pods = [
        bound("done", [0, 1], allocated=[0, 1]),
        bound("pending", [2, 3]),
        bound("by-index", [4], by_uuid=False),
        unbound("mine", 2, allocated=[6]),
    ]
    assert in_use(pods, by_index) == {uuid(i) for i in (0, 1, 2, 3, 4, 6)}


@dataclass
class GrantCase:
    name: str
    pods: list[NodePod]
    requested: list[int]
    expected: tuple[int, ...]
    pod: str | None
    sick: tuple[int, ...] = ()


GRANT_CASES = [
    GrantCase(
        "bound: its chosen GPUs, not those asked for", [bound("a", [4, 5])], [0, 1], (4, 5), "a"
    ),
    GrantCase(
        "bound: the second container gets the rest",
        [shaped(bound("a", [4, 5, 6, 7]), ("c1", 2), ("c2", 2), given={"c1": [4, 5]})],
        [0, 1],
        (6, 7),
        "a",
    ),
    GrantCase(
        "bound: the next container takes the chosen GPUs the kubelet named",
        [shaped(bound("a", [4, 5, 6, 7]), ("c1", 2), ("c2", 2), given={})],
        [7, 6],
        (6, 7),
        "a",
    ),
    GrantCase(
        "unbound: NVLink pick clear of allocated and pending",
        [bound("done", [0], allocated=[0]), bound("pending", [2, 3, 4]), unbound("u", 2)],
        [1, 2],
        (6, 7),
        "u",
    ),
    GrantCase(
        "unbound: skips a sick GPU's pair",
        [unbound("u", 2)],
        [0, 1],
        (2, 3),
        "u",
        sick=(0,),
    ),
    GrantCase("nobody: the requested devices", [], [6, 7], (6, 7), None),
]


@pytest.mark.parametrize("case", GRANT_CASES, ids=[c.name for c in GRANT_CASES])
def test_grant(case: GrantCase) -> None:
    result = grant(
        case.pods, gpus(sick=case.sick), PAIRS, [uuid(i) for i in case.requested], resource=GPU
    )
    assert result.uuids == tuple(uuid(i) for i in case.expected)
    assert (result.pod.name if result.pod else None) == case.pod


@pytest.mark.parametrize(
    ("pods", "requested", "sick", "message"),
    [
        ([bound("a", [4, 5])], [4, 5], (5,), "unhealthy"),
        ([bound("a", [4, 9], by_uuid=False)], [0, 1], (), "does not have"),
        ([bound("a", [0], allocated=[0]), bound("b", [0])], [1], (), "in use"),
        ([unbound("u", 2)], [0, 1], (0, 1, 2, 3, 4, 5, 6), "1 are healthy and free"),
        ([], [0], (0,), "no pod on this node awaits 1 GPUs"),
        ([bound("a", [0, 1])], [0], (), "no pod on this node awaits 1 GPUs"),  # taken
        ([], [], (), "no devices"),
    ],
    ids=[
        "chosen unhealthy",
        "unknown index",
        "chosen taken",
        "too few",
        "asked sick",
        "asked taken",
        "empty",
    ],
)
def test_grant_refuses(
    pods: list[NodePod], requested: list[int], sick: tuple[int, ...], message: str
) -> None:
    with pytest.raises(AllocationError, match=message):
        grant(pods, gpus(sick=sick), PAIRS, [uuid(i) for i in requested], resource=GPU)


def ids(*indices: int) -> list[str]:
    return [uuid(i) for i in indices]


@dataclass
class PreferredCase:
    name: str
    pods: list[NodePod]
    available: list[int]
    must: list[int]
    size: int
    expected: tuple[int, ...]
    sick: tuple[int, ...] = ()
    groups: tuple[tuple[int, ...], ...] = PAIRS


PREFERRED_CASES = [
    PreferredCase("the bound pod's choice", [bound("a", [6, 7])], [0, 1, 2, 6, 7], [], 2, (6, 7)),
    PreferredCase(
        "not when one is unavailable: an NVLink pick",
        [bound("a", [6, 7])],
        [0, 1, 2, 3, 6],
        [],
        2,
        (0, 1),
    ),
    PreferredCase(
        "an NVLink pick clear of pending pods",
        [bound("a", [0, 1, 2, 3]), unbound("u", 2)],
        list(range(8)),
        [],
        2,
        (4, 5),
    ),
    PreferredCase(
        "pending GPUs when nothing else fits", [bound("a", [0, 1])], [0, 1, 5], [], 2, (0, 1)
    ),
    PreferredCase("honours must include, in its group", [], [0, 1, 2, 3], [3], 2, (3, 2)),
    PreferredCase(
        "must include's group before a better fit elsewhere",
        [],
        [0, 1, 2, 3, 4],
        [0],
        2,
        (0, 1),
        groups=QUADS,
    ),
    PreferredCase("never a sick GPU", [], [0, 1, 2, 3], [], 2, (2, 3), sick=(1,)),
    PreferredCase("short when too few", [], [0], [], 2, (0,)),
]


@pytest.mark.parametrize("case", PREFERRED_CASES, ids=[c.name for c in PREFERRED_CASES])
def test_preferred(case: PreferredCase) -> None:
    answer = preferred(
        case.pods,
        gpus(sick=case.sick),
        case.groups,
        available=ids(*case.available),
        must_include=ids(*case.must),
        size=case.size,
        resource=GPU,
    )
    assert answer == tuple(uuid(i) for i in case.expected)
