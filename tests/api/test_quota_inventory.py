"""Team quotas over real HTTP: ``GET /inventory`` lists each quota that applies with min,
used and max per resource it names, and the shadowed ones by name."""

from __future__ import annotations

from testbed.builders import elastic_quota, make_node, make_pod
from tests.api.conftest import Serve


def test_inventory_lists_each_quota_with_min_used_and_max_and_the_shadowed_ones(
    serve: Serve,
) -> None:
    server = serve(
        nodes=[make_node("g", gpus=8)],
        pods=[
            make_pod("borrower", namespace="team-a", gpus=3, node="g", gpu_ids=[0, 1, 2]),
            make_pod("small", namespace="team-b", gpus=1, memory="1Gi", node="g", gpu_ids=[3]),
            make_pod("waiting", namespace="team-a", gpus=1),  # pending: not used yet
        ],
        groups=[
            elastic_quota("team-a", min={"nvidia.com/gpu": 2, "cpu": "1"},
                          max={"nvidia.com/gpu": 4}),
            # Newer than team-a's own: shadowed, and not listed among those that apply.
            elastic_quota("team-a", name="late", max={"nvidia.com/gpu": 1},
                          created="2026-02-01T00:00:00Z"),
            elastic_quota("team-b", min={"nvidia.com/gpu": 4}, max={"memory": "64Gi"},
                          weight="3"),
        ],
    )  # fmt: skip
    with server.client() as client:
        body = client.get("/inventory").json()
    assert body["quotas"] == [
        {
            "quota": "team-a/team-a",
            "namespace": "team-a",
            "name": "team-a",
            "borrowWeight": None,
            "resources": [
                {
                    "resource": "nvidia.com/gpu",
                    "unit": "GPUs",
                    "min": 2,
                    "used": 3,  # borrowing one over its min
                    "max": 4,
                    "guarantees": True,
                    "quantities": {"min": "2", "used": "3", "max": "4"},
                },
                {
                    "resource": "cpu",
                    "unit": "milliCPU",
                    "min": 1000,
                    "used": 100,  # the bound pod's 100m
                    "max": None,  # no ceiling
                    "guarantees": True,
                    "quantities": {"min": "1", "used": "100m", "max": None},
                },
            ],
        },
        {
            "quota": "team-b/team-b",
            "namespace": "team-b",
            "name": "team-b",
            "borrowWeight": 3,
            "resources": [
                {
                    "resource": "nvidia.com/gpu",
                    "unit": "GPUs",
                    "min": 4,
                    "used": 1,
                    "max": None,
                    "guarantees": True,
                    "quantities": {"min": "4", "used": "1", "max": None},
                },
                {
                    "resource": "memory",
                    "unit": "bytes",
                    "min": 0,
                    "used": 2**30,
                    "max": 64 * 2**30,
                    "guarantees": False,  # named in max alone: a plain ceiling
                    "quantities": {"min": "0", "used": "1Gi", "max": "64Gi"},
                },
            ],
        },
    ]
    assert body["shadowedQuotas"] == [{"quota": "team-a/late", "by": "team-a/team-a"}]


def test_inventory_without_quotas_lists_none(serve: Serve) -> None:
    server = serve(nodes=[make_node("g", gpus=2)])
    with server.client() as client:
        body = client.get("/inventory").json()
    assert (body["quotas"], body["shadowedQuotas"]) == ([], [])
