"""``kubectl schedext``'s tables rendered from real ``/inventory`` answers of a served
snapshot: per node the GPUs, each device's state, the shares and addresses; gangs; quotas.
(tests/e2e/test_kubectl_plugin.py runs the plugin through a real API server.)"""

from __future__ import annotations

from typing import Any

import pytest

from app.plugin import tables
from testbed.builders import (
    A100,
    H100,
    bound_ip_pod,
    elastic_quota,
    gang_pod,
    make_ip_pool,
    make_node,
    make_pod,
    make_pod_group,
    share_pod,
)
from tests.api.conftest import Serve

pytestmark = pytest.mark.api

RACK = "topology.kubernetes.io/rack"


def inventory(serve: Serve, **cluster: Any) -> dict[str, Any]:
    server = serve(**cluster)
    with server.client() as client:
        answer: dict[str, Any] = client.get("/inventory").json()
    return answer


def cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.split("   ") if cell.strip()]


def test_nodes_show_each_gpu_the_shares_addresses_and_free_cpu(serve: Serve) -> None:
    pool = make_ip_pool("rack-a", ranges=[("10.20.1.10", "10.20.1.13")], rack="a")
    answer = inventory(
        serve,
        nodes=[
            make_node("a1", gpus=4, groups=[[0, 1], [2, 3]], cpu="64", labels={RACK: "a"}),
            make_node("b1", gpus=2, model=A100),
            make_node("cpu-1"),
        ],
        pods=[
            make_pod("train", namespace="ml", gpus=2, cpu="4", node="a1", gpu_ids=[0, 1]),
            share_pod("nb", namespace="ml", memory_mib=20480, node="a1", gpu_ids=[3]),
            bound_ip_pod("web", node="a1", ip="10.20.1.10", pool="rack-a"),
        ],
        groups=[{"kind": "IPPool", **pool}],
    )
    lines = tables.nodes_table(answer).splitlines()
    assert cells(lines[0]) == ["NODE", "MODEL", "GPUS", "FREE", "DEVICES", "OWNER", "DRA",
                               "SHARED", "SHARE MEMORY", "ADDRESSES", "CPU FREE"]  # fmt: skip
    a1, b1 = cells(lines[1]), cells(lines[2])
    # train takes 4 CPUs, nb and web 100m each; no DRA: the device plugin's GPUs
    assert a1 == ["a1", H100, "4", "1", "UU|.S", "device-plugin", "-", "1", "20/79.6Gi", "1",
                  "59.8/64"]  # fmt: skip
    assert b1 == ["b1", A100, "2", "2", "..", "device-plugin", "-", "0", "-", "0", "32/32"]
    assert lines[3] == (
        "GPUs: 3 of 6 in use (50%), 1 shared, 0 unhealthy; 1 node without GPUs not listed"
    )
    assert lines[4] == tables.DEVICE_LEGEND
    pools = lines[lines.index("") + 1 :]
    assert cells(pools[0]) == ["POOL", "ALLOCATED", "FREE", "SIZE", "NODE SELECTOR", "PROBLEM"]
    assert cells(pools[1]) == ["rack-a", "1", "3", "4", f"{RACK}=a", "-"]


def test_gangs_show_members_placed_of_min_and_the_quotas_each_resource(serve: Serve) -> None:
    answer = inventory(
        serve,
        nodes=[make_node("g", gpus=8)],
        pods=[
            gang_pod("w0", "train", namespace="ml", node="g", gpu_ids=[0, 1]),
            gang_pod("w1", "train", namespace="ml"),
            gang_pod("w2", "train", namespace="ml"),
            make_pod("solo", namespace="team-a", gpus=3, node="g", gpu_ids=[2, 3, 4]),
        ],
        groups=[
            make_pod_group("train", namespace="ml", min_member=3),
            elastic_quota("team-a", min={"nvidia.com/gpu": 2}, max={"nvidia.com/gpu": 4}),
        ],
    )
    gangs = tables.gangs_table(tables.gangs_of(answer, None)).splitlines()
    assert cells(gangs[1]) == ["ml", "train", "Scheduling", "1/3", "3", "1", "0", "-", "-", "-"]
    assert tables.gangs_of(answer, "team-a") == []
    quotas = tables.quotas_table(tables.quotas_of(answer, None)).splitlines()
    assert cells(quotas[1]) == ["team-a", "team-a", "nvidia.com/gpu", "2", "3", "4", "yes"]
