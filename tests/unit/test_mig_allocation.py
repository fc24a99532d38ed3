"""The MIG device plugins' decisions (extender.devices.mig_allocation): which pod an
``Allocate`` of a profile is for, and which MIG devices it gets; and a pod as the agent sees
it."""

from __future__ import annotations

from dataclasses import dataclass, replace

import pytest

from extender.devices import Gpu, GpuHealth, MigSlice
from extender.devices.allocation import AllocationError, NodePod
from extender.devices.containers import ContainerGrant, PodContainer, Role
from extender.devices.mig_allocation import grant_mig, match_mig_pod, preferred_mig
from extender.devices.mig_slices import resource_name
from extender.node_pods import node_pod
from tests.mig_builders import mig_pod
from tests.nvml_builders import mig_uuid

P1, P2 = "1g.10gb", "2g.20gb"
M = [mig_uuid(0, i) for i in range(4)]  # 1g.10gb x3, 2g.20gb (the MIG fixture's layout)


# ----------------------------------------------------------------------------- the pods


def test_a_pod_taking_mig_devices_is_a_node_pod_with_its_record() -> None:
    pod = mig_pod("p", {P1: 2}, node="n", mig_uuids=[M[0], M[1]])
    pod["metadata"]["annotations"]["schedext.io/gpu-allocated"] = M[0]
    seen = node_pod(pod)
    assert seen is not None
    assert (seen.gpus, seen.mig, seen.mig_uuids, seen.allocated) == (
        0,
        ((P1, 2),),
        (M[0], M[1]),
        (M[0],),
    )
    assert node_pod(mig_pod("p", {P1: 0}, node="n")) is None  # asks for nothing


# ------------------------------------------------------------------------- allocation

SICK = GpuHealth(False, "XID 79")


def gpus(*, sick: bool = False, second: tuple[str, ...] = ()) -> list[Gpu]:
    """GPU 0 in MIG mode with the fixture's layout; GPU 1 whole, or in MIG mode with MIG
    devices of the ``second`` profiles (UUIDs mig_uuid(1, i))."""
    first = Gpu(
        0,
        "GPU-0",
        mig_enabled=True,
        health=SICK if sick else GpuHealth(),
        migs=(MigSlice(P1, M[0]), MigSlice(P1, M[1]), MigSlice(P1, M[2]), MigSlice(P2, M[3])),
    )
    other = Gpu(
        1,
        "GPU-1",
        mig_enabled=bool(second),
        migs=tuple(MigSlice(p, mig_uuid(1, i)) for i, p in enumerate(second)),
    )
    return [first, other]


def pod(
    name: str,
    mig: dict[str, int],
    chosen: list[str] | None = None,
    *,
    at: float = 0.0,
    allocated: tuple[str, ...] = (),
) -> NodePod:
    return NodePod(
        uid=f"uid-{name}",
        namespace="ml",
        name=name,
        gpus=0,
        allocated=allocated,
        bound_at=at,
        mig=tuple(sorted(mig.items())),
        mig_uuids=tuple(chosen) if chosen is not None else None,
    )


def two_containers(found: NodePod, *, given: str) -> NodePod:
    """``found`` as two containers of one P1 device each, the first given ``given``."""
    asks = ((resource_name(P1), 1),)
    return replace(
        found,
        containers=(PodContainer("c1", Role.APP, asks), PodContainer("c2", Role.APP, asks)),
        grants=(ContainerGrant("c1", (given,)),),
        allocated=(given,),
    )


PROFILE_OF = {M[0]: P1, M[1]: P1, M[2]: P1, M[3]: P2}


@pytest.mark.parametrize(
    ("pods", "profile", "size", "expected"),
    [
        ([], P1, 1, None),
        ([pod("a", {P1: 2}, [M[0], M[1]])], P1, 2, "a"),
        ([pod("a", {P1: 2}, [M[0], M[1]])], P1, 1, None),
        ([pod("a", {P1: 1, P2: 1}, [M[0], M[3]])], P2, 1, "a"),
        ([two_containers(pod("a", {P1: 2}, [M[0], M[1]]), given=M[0])], P1, 1, "a"),
        ([pod("a", {P1: 1}, [M[0]], allocated=(M[0],))], P1, 1, None),
        ([pod("b", {P1: 1}, [M[1]], at=2), pod("a", {P1: 1}, [M[0]], at=1)], P1, 1, "a"),
        ([pod("old", {P1: 1}, at=0), pod("young", {P1: 1}, [M[0]], at=5)], P1, 1, "young"),
        ([pod("u", {P1: 2})], P1, 2, "u"),
        ([pod("gone", {P1: 1}, ["MIG-gone"])], P1, 1, "gone"),
    ],
    ids=[
        "nobody waits",
        "the bound pod of that size",
        "not another size",
        "per profile",
        "its remainder",
        "done",
        "oldest bind first",
        "bound before unbound",
        "an unbound pod",
        "a record naming devices the node lacks: by what it still needs",
    ],
)
def test_match_mig_pod(pods: list[NodePod], profile: str, size: int, expected: str | None) -> None:
    found = match_mig_pod(pods, profile, size, PROFILE_OF)
    assert (found.name if found else None) == expected


@dataclass
class GrantCase:
    id: str
    pods: list[NodePod]
    profile: str
    requested: list[str]
    pod: str | None
    uuids: tuple[str, ...]
    second: tuple[str, ...] = ()


GRANT_CASES = [
    GrantCase(
        "schedext's choice, whatever the kubelet named",
        [pod("a", {P1: 1}, [M[2]])],
        P1,
        [M[0]],
        "a",
        (M[2],),
    ),
    GrantCase(
        "an unbound pod gets a packed pick: beside the devices in use",
        [pod("u", {P1: 1}), pod("a", {P1: 1}, [mig_uuid(1, 0)], allocated=(mig_uuid(1, 0),))],
        P1,
        [M[0]],
        "u",
        (mig_uuid(1, 1),),
        (P1, P1),
    ),
    GrantCase(
        "a bound pod before an older unbound one",
        [pod("u", {P1: 1}, at=0), pod("a", {P1: 1}, [M[0]], at=9)],
        P1,
        [M[0]],
        "a",
        (M[0],),
    ),
    GrantCase(
        "no pod seen: the kubelet's own free choice",
        [],
        P2,
        [M[3]],
        None,
        (M[3],),
    ),
]


@pytest.mark.parametrize("case", GRANT_CASES, ids=lambda c: c.id)
def test_grant_mig(case: GrantCase) -> None:
    granted = grant_mig(case.pods, gpus(second=case.second), case.profile, case.requested)
    assert (granted.pod.name if granted.pod else None) == case.pod
    assert granted.uuids == case.uuids


def test_an_unbound_pod_never_takes_a_device_a_bound_pod_awaits() -> None:
    waiting = pod("a", {P1: 2}, [M[0], M[1]], at=9)
    granted = grant_mig([pod("u", {P1: 1}, at=0), waiting], gpus(), P1, [M[0]])
    assert granted.pod is not None
    assert granted.pod.name == "u"
    assert granted.uuids == (M[2],)


@pytest.mark.parametrize(
    ("pods", "profile", "requested", "sick", "error"),
    [
        ([pod("a", {P1: 1}, ["MIG-gone"])], P1, [M[0]], False, "does not have: ['MIG-gone']"),
        ([pod("a", {P1: 1}, [M[0]])], P1, [M[0]], True, "unhealthy"),
        (
            [pod("a", {P1: 1}, [M[0]], at=1), pod("b", {P1: 1}, [M[1]], allocated=(M[0],))],
            P1,
            [M[0]],
            False,
            "in use",
        ),
        ([pod("u", {P2: 2})], P2, [M[3], M[3]], False, "needs 2 MIG 2g.20gb"),
        ([], P1, [M[0]], True, "not all healthy and free"),
        ([], P1, [], False, "no devices"),
    ],
    ids=["unknown device", "unhealthy GPU", "taken", "too few free", "unseen pod, sick", "none"],
)
def test_grant_mig_refuses(
    pods: list[NodePod], profile: str, requested: list[str], sick: bool, error: str
) -> None:
    with pytest.raises(AllocationError, match=error.replace("[", r"\[").replace("]", r"\]")):
        grant_mig(pods, gpus(sick=sick), profile, requested)


def test_preferred_mig_names_the_chosen_devices_or_packs() -> None:
    chosen = pod("a", {P1: 2}, [M[1], M[2]])
    assert preferred_mig(
        [chosen], gpus(), P1, available=[M[0], M[1], M[2]], must_include=[], size=2
    ) == (M[1], M[2])
    second = (P1, P1)
    busy = pod("b", {P1: 1}, [mig_uuid(1, 0)], allocated=(mig_uuid(1, 0),))
    available = [M[0], M[1], M[2], mig_uuid(1, 1)]
    assert preferred_mig(
        [busy], gpus(second=second), P1, available=available, must_include=[], size=1
    ) == (mig_uuid(1, 1),)
    assert preferred_mig([], gpus(), P1, available=[M[0], M[1]], must_include=[M[1]], size=2) == (
        M[1],
        M[0],
    )
