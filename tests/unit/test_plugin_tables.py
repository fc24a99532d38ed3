"""``kubectl schedext``'s tables from schedext's view values: the column layout, each GPU's
mark, and what the gang and quota rows say. (tests/api/test_plugin_views.py renders them from
real /inventory answers.)"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from app.plugin import tables

pytestmark = pytest.mark.unit


def test_columns_are_as_wide_as_their_widest_cell_three_spaces_apart() -> None:
    text = tables.table(("NAME", "GPUS", "NOTE"), [("a", 8, "x"), ("long-name", 10, "")])
    assert text.splitlines() == [
        "NAME        GPUS   NOTE",
        "a           8      x",
        "long-name   10",  # an empty last cell leaves no trailing space
    ]


def gpu(group: int | None = None, **state: Any) -> dict[str, Any]:
    return {"group": group, "holder": None, "reserved": False, "unhealthy": None,
            "share": None, **state}  # fmt: skip


@dataclass
class MapCase:
    name: str
    gpus: list[dict[str, Any]]
    marks: str


MAP_CASES = [
    MapCase("no GPUs", [], "-"),
    MapCase("free, no groups", [gpu(), gpu()], ".."),
    MapCase(
        "held whole, reserved, shared, unhealthy",
        [gpu(holder="a/p"), gpu(holder="a/q", reserved=True),
         gpu(share={"memoryMiB": 1024}), gpu(unhealthy="XID 79")],
        "URSX",
    ),
    MapCase("an unhealthy GPU still held shows unhealthy", [gpu(holder="a/p", unhealthy="x")], "X"),
    MapCase(
        "in use by a container schedext did not place; held where schedext pinned it",
        [gpu(inUse="GPU 0 in use by ..."), gpu(holder="a/p", inUse="GPU 1 in use by a/p")],
        "KU",
    ),
    MapCase(
        "NVLink groups apart",
        [gpu(0, holder="a/p"), gpu(0), gpu(1), gpu(1, share={"memoryMiB": 1})],
        "U.|.S",
    ),
]  # fmt: skip


@pytest.mark.parametrize("case", MAP_CASES, ids=lambda c: c.name)
def test_each_gpu_has_one_mark_by_index(case: MapCase) -> None:
    assert tables.device_map(case.gpus) == case.marks


def gang(group: str, **fields: Any) -> dict[str, Any]:
    return {"group": group, "minMember": 3, "members": 3, "scheduled": 0, "running": 0,
            "waiting": 0, "phase": "Pending", "waitLeftSeconds": None, "lastFailure": None,
            **fields}  # fmt: skip


def test_a_gang_row_counts_placed_members_of_min_and_says_how_its_wait_ended() -> None:
    waiting = gang("ml/train", scheduled=1, waiting=1, phase="Scheduling", waitLeftSeconds=12.5)
    failed = gang(
        "ml/sweep",
        lastFailure={
            "outcome": "timed_out",
            "reason": "schedext: group ml/sweep did not reach minMember 3 within 20s",
        },
    )
    lines = tables.gangs_table([waiting, failed]).splitlines()
    assert lines[0].split() == ["NAMESPACE", "GROUP", "PHASE", "PLACED/MIN", "MEMBERS",
                                "BOUND", "WAITING", "WAIT", "LEFT", "HOLD", "LAST",
                                "FAILURE"]  # fmt: skip
    assert lines[1].split() == ["ml", "train", "Scheduling", "2/3", "3", "1", "1", "12.5s", "-",
                                "-"]  # fmt: skip
    assert lines[2].split()[:9] == ["ml", "sweep", "Pending", "0/3", "3", "0", "0", "-", "-"]
    assert lines[2].endswith(
        "timed out: schedext: group ml/sweep did not reach minMember 3 within 20s"
    )
    assert tables.gangs_table([]) == "no gangs"


def hold(gpus: int, nodes: dict[str, int], left: float, **where: str) -> dict[str, Any]:
    return {"gpus": gpus, "nodes": nodes, "level": "", "domain": "", "leftSeconds": left,
            "started": "2026-01-01T00:00:00Z", "expires": "2026-01-01T00:15:00Z",
            "waitingSince": "2025-12-31T23:58:00Z", "idleGpuSeconds": 0.0, **where}  # fmt: skip


HOLD_CASES = [
    ("none", None, "-"),
    ("a domain of a level: the level's last part", hold(16, {"a1": 8, "a2": 8}, 272.4,
     level="topology.kubernetes.io/rack", domain="a"), "16 on rack a, 4m left"),
    ("nodes: the first two, the rest counted", hold(24, {"n3": 8, "n1": 8, "n2": 8}, 3900),
     "24 on n1, n2 +1, 1h5m left"),
    ("seconds", hold(8, {"n1": 8}, 45.9), "8 on n1, 45s left"),
    ("whole hours", hold(8, {"n1": 8}, 7200), "8 on n1, 2h left"),
]  # fmt: skip


@pytest.mark.parametrize(("gang_hold", "shown"), [c[1:] for c in HOLD_CASES],
                         ids=[c[0] for c in HOLD_CASES])  # fmt: skip
def test_a_gang_row_says_how_many_gpus_are_held_for_it_where_and_how_long_still(
    gang_hold: dict[str, Any] | None, shown: str
) -> None:
    failure = {"outcome": "released", "reason": "a member was deleted"}
    header, row = tables.gangs_table(
        [gang("ml/train", hold=gang_hold, lastFailure=failure)]
    ).splitlines()
    start = header.index("HOLD")
    assert header[start:].split("   ")[0] == "HOLD"
    assert row[start:].split("   ")[0] == shown
    assert row.endswith("released: a member was deleted")


def test_gangs_and_quotas_of_one_namespace_or_all() -> None:
    inventory = {
        "gangs": [gang("a/g1"), gang("b/g2")],
        "quotas": [{"quota": "a/q"}, {"quota": "b/q"}],
        "shadowedQuotas": [{"quota": "a/q2", "by": "a/q"}],
    }
    assert [g["group"] for g in tables.gangs_of(inventory, "b")] == ["b/g2"]
    assert [g["group"] for g in tables.gangs_of(inventory, None)] == ["a/g1", "b/g2"]
    assert tables.quotas_of(inventory, "b") == {"quotas": [{"quota": "b/q"}], "shadowedQuotas": []}
    assert len(tables.quotas_of(inventory, None)["quotas"]) == 2


def resource(name: str, used: int, minimum: int, *, guarantees: bool = True) -> dict[str, Any]:
    return {"resource": name, "min": minimum, "used": used, "max": None, "guarantees": guarantees,
            "quantities": {"min": str(minimum), "used": str(used), "max": None}}  # fmt: skip


def test_a_quota_row_per_resource_says_whether_the_team_borrows() -> None:
    quotas = {
        "quotas": [
            {"quota": "team-a/q", "namespace": "team-a", "name": "q",
             "resources": [resource("nvidia.com/gpu", 6, 4),
                           resource("cpu", 2, 0, guarantees=False)]},
        ],
        "shadowedQuotas": [{"quota": "team-a/late", "by": "team-a/q"}],
    }  # fmt: skip
    lines = tables.quotas_table(quotas).splitlines()
    assert lines[0].split() == ["NAMESPACE", "QUOTA", "RESOURCE", "MIN", "USED", "MAX", "BORROWING"]
    assert lines[1].split() == ["team-a", "q", "nvidia.com/gpu", "4", "6", "none", "yes"]
    # No stated min: nothing guaranteed, so nothing borrowed either.
    assert lines[2].split() == ["team-a", "q", "cpu", "0", "2", "none", "no"]
    assert lines[3] == "not applied: team-a/late (team-a/q applies instead)"
    assert tables.quotas_table({"quotas": [], "shadowedQuotas": []}) == "no team quotas"


DRIFT = "GPU 1 in use by a container schedext did not place (kubelet: ml/ghost/main)"


def test_the_nodes_table_counts_and_lists_the_drift() -> None:
    node = {
        "name": "g", "gpuModel": "H100", "freeGpus": 1, "sharedGpus": 0, "gpuMemoryMiB": None,
        "cpuMilli": {"free": 1000, "allocatable": 2000},
        "gpus": [gpu(), gpu(inUse=DRIFT)],
        "drift": [DRIFT], "driftProblem": None,
    }  # fmt: skip
    odd = {**node, "name": "h", "gpus": [gpu()], "drift": [],
           "driftProblem": "schedext.io/gpu-drift: version 2 is not supported"}  # fmt: skip
    lines = tables.nodes_table({"nodes": [node, odd], "pools": []}).splitlines()
    assert lines[1].split()[4] == ".K"
    assert lines[3].endswith(", 1 in use by containers schedext did not place (kubelet)")
    assert lines[-3:] == [
        "where the kubelet and schedext disagree (the node agents' drift):",
        f"  g: {DRIFT}",
        "  h: not read: schedext.io/gpu-drift: version 2 is not supported",
    ]


def test_an_explanation_shows_each_nodes_drift_under_its_verdict() -> None:
    answer = {
        "pod": "ml/p", "state": "pending", "node": None, "request": {"gpus": 2},
        "group": None, "groupReason": None, "fits": [],
        "nodes": [{"node": "g", "fits": False, "reason": f"schedext: {DRIFT} (1 free, pod needs 2)",
                   "resolvable": True, "score": None, "drift": [DRIFT]}],
    }  # fmt: skip
    lines = tables.explanation_text(answer).splitlines()
    assert lines[2] == f"  g  busy  schedext: {DRIFT} (1 free, pod needs 2)"
    assert lines[3] == f"     drift {DRIFT}"


def dra(held: int, advertised: int) -> dict[str, Any]:
    return {"held": held, "advertised": advertised, "unknown": 0}


@dataclass
class OwnerCase:
    name: str
    node: dict[str, Any]
    cells: list[str]  # OWNER, DRA


OWNER_CASES = [
    OwnerCase("the device plugin's, DRA knows nothing", {"gpuOwner": "device-plugin", "dra": None},
              ["device-plugin", "-"]),
    OwnerCase("mixed: held of advertised", {"gpuOwner": "mixed", "dra": dra(1, 4)},
              ["mixed", "1/4"]),
    OwnerCase("DRA's alone, no GPUs schedext counts: listed still",
              {"gpuOwner": "dra", "dra": dra(0, 8), "gpus": [], "freeGpus": 0}, ["dra", "0/8"]),
    OwnerCase("an older schedext without either field", {}, ["-", "-"]),
]  # fmt: skip


@pytest.mark.parametrize("case", OWNER_CASES, ids=lambda c: c.name)
def test_the_nodes_table_says_who_owns_the_gpus_and_dra_held_of_advertised(
    case: OwnerCase,
) -> None:
    node = {
        "name": "g", "gpuModel": "H100", "freeGpus": 1, "sharedGpus": 0, "gpuMemoryMiB": None,
        "cpuMilli": {"free": 1000, "allocatable": 2000}, "gpus": [gpu()], **case.node,
    }  # fmt: skip
    lines = tables.nodes_table({"nodes": [node], "pools": []}).splitlines()
    header = [cell.strip() for cell in lines[0].split("   ") if cell.strip()]
    assert header[4:7] == ["DEVICES", "OWNER", "DRA"]
    assert lines[1].split()[5:7] == case.cells


def test_the_totals_count_the_dra_devices_claims_hold() -> None:
    node = {
        "name": "g", "gpuModel": None, "freeGpus": 0, "sharedGpus": 0, "gpuMemoryMiB": None,
        "cpuMilli": {"free": 1000, "allocatable": 2000}, "gpus": [], "gpuOwner": "dra",
        "dra": dra(3, 8),
    }  # fmt: skip
    lines = tables.nodes_table({"nodes": [node], "pools": []}).splitlines()
    assert lines[2] == "GPUs: 0 of 0 in use, 0 shared, 0 unhealthy, 3 DRA devices held by claims"


def test_an_explanation_shows_what_dra_says_of_each_node_under_its_verdict() -> None:
    held = "gpu.nvidia.com/g/gpu-1 (GPU 1) held by claim ml/train"
    answer = {
        "pod": "ml/p", "state": "pending", "node": None, "request": {"gpus": 2},
        "group": None, "groupReason": None, "fits": [],
        "nodes": [{"node": "g", "fits": False, "reason": "schedext: ...", "resolvable": True,
                   "score": None, "drift": [], "dra": ["owner mixed: both ...", held]}],
    }  # fmt: skip
    lines = tables.explanation_text(answer).splitlines()
    assert lines[3:5] == ["     dra owner mixed: both ...", f"     dra {held}"]


EXPLAINED_GROUP = {"phase": "Pending", "scheduled": 0, "waiting": 0, "members": 2}


@pytest.mark.parametrize(
    "group_hold",
    [
        "holding 16 GPUs on topology.kubernetes.io/rack a for the group since "
        "2026-01-01T00:00:00Z, until 2026-01-01T00:15:00Z",
        "no hold: the cluster could hold it even if the pods of no higher priority outside "
        "gangs finished",
    ],
)
def test_an_explanation_says_under_the_group_whether_it_has_a_hold(group_hold: str) -> None:
    answer = {
        "pod": "ml/m0", "state": "pending", "node": None, "request": {"gpus": 8},
        "group": EXPLAINED_GROUP, "groupReason": None, "groupHold": group_hold, "fits": [],
        "nodes": [],
    }  # fmt: skip
    lines = tables.explanation_text(answer).splitlines()
    assert lines[2].startswith("group: Pending")
    assert lines[3] == group_hold
    assert "hold" not in tables.explanation_text({**answer, "groupHold": None})


def explained(request: dict[str, Any], state: str = "pending") -> list[str]:
    answer = {
        "pod": "ml/p", "state": state, "node": "g" if state == "bound" else None,
        "request": request, "group": None, "groupReason": None, "fits": [], "nodes": [],
    }  # fmt: skip
    return tables.explanation_text(answer).splitlines()


@pytest.mark.parametrize(
    ("request_", "state", "needs"),
    [
        pytest.param({"gpus": 0, "shares": 1, "shareMemoryMiB": 16384, "shareCores": 0,
                      "gpuIds": [0], "ip": None}, "bound", "needs a share of one GPU",
                     id="a bound share pod: no gpus=0, no ip=None"),
        pytest.param({"gpus": 4, "gpuIds": [0, 1, 2, 3], "ip": "10.20.2.4"}, "bound",
                     "needs 4 GPUs (GPUs 0, 1, 2, 3), address 10.20.2.4", id="bound whole GPUs"),
        pytest.param({"gpus": 2, "cpuMilli": 2000, "memoryBytes": 8 << 30, "priority": 100000,
                      "gpuModel": "A100"}, "pending",
                     "needs 2 A100 GPUs, 2 CPUs, 8 GiB of memory, priority 100000",
                     id="pending whole GPUs"),
        pytest.param({"gpus": 0, "mig": {"1g.10gb": 2}, "cpuMilli": 500, "memoryBytes": 0,
                      "priority": 0}, "pending", "needs 2 MIG 1g.10gb devices, 500m CPU",
                     id="MIG devices, nothing else that is 0"),
        pytest.param({"gpus": 0, "cpuMilli": 0, "memoryBytes": 0, "priority": 0,
                      "ip": {"address": None, "pools": ["p"], "policy": "sticky",
                             "identity": "sts/ml/web/0"}}, "pending",
                     "needs an address from pool p (policy sticky, identity sts/ml/web/0)",
                     id="an address only"),
        pytest.param({"gpus": 0, "cpuMilli": 0}, "pending", "needs nothing schedext counts",
                     id="nothing"),
    ],
)  # fmt: skip
def test_an_explanation_says_what_the_pod_asks_in_words(
    request_: dict[str, Any], state: str, needs: str
) -> None:
    assert explained(request_, state)[1] == needs
