"""The share capacity writer against a canned API server: the Node's status patched only
when it differs, capacity and allocatable together, and read again after a failed write. The
real API server keeps what it writes (tests/e2e/test_node_agent.py)."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import orjson
import pytest

from app.agent.node_capacity import NodeCapacity
from app.kube.errors import ApiError
from tests.unit.kube_fakes import FakeApiServer

NODE = "/api/v1/nodes/gpu-1"
MEMORY, CORES = "schedext.io/gpu-memory", "schedext.io/gpu-cores"


class Node:
    """One Node's status, served for GET and changed by merge patches of .../status."""

    def __init__(self, capacity: dict[str, str]) -> None:
        self.status: dict[str, Any] = {"capacity": dict(capacity), "allocatable": dict(capacity)}
        self.patches: list[dict[str, Any]] = []
        self.fail_next = False

    def handle(self, request: httpx.Request) -> httpx.Response:
        if request.method == "GET" and request.url.path == NODE:
            return httpx.Response(200, json={"metadata": {"name": "gpu-1"}, "status": self.status})
        assert (request.method, request.url.path) == ("PATCH", f"{NODE}/status")
        assert request.headers["content-type"] == "application/merge-patch+json"
        if self.fail_next:
            self.fail_next = False
            return httpx.Response(500, json={"kind": "Status", "code": 500, "message": "etcd"})
        body = orjson.loads(request.content)
        self.patches.append(body)
        for field, values in body["status"].items():
            self.status[field].update(values)
        return httpx.Response(200, json={"status": self.status})


def writer(node: Node) -> NodeCapacity:
    return NodeCapacity(FakeApiServer(other=node.handle).api(), "gpu-1")


def test_writes_capacity_and_allocatable_once_and_only_on_change() -> None:
    node = Node({"cpu": "32", "nvidia.com/gpu": "8"})
    capacity = writer(node)

    async def scenario() -> list[bool]:
        await capacity.start()
        return [
            await capacity.write({MEMORY: "652472", CORES: "800"}),
            await capacity.write({MEMORY: "652472", CORES: "800"}),
            await capacity.write({MEMORY: "570913", CORES: "700"}),  # a GPU turned unhealthy
        ]

    assert asyncio.run(scenario()) == [True, False, True]
    assert node.patches[0] == {
        "status": {
            "capacity": {MEMORY: "652472", CORES: "800"},
            "allocatable": {MEMORY: "652472", CORES: "800"},
        }
    }
    assert node.status["capacity"] == {
        "cpu": "32",
        "nvidia.com/gpu": "8",
        MEMORY: "570913",
        CORES: "700",
    }
    assert capacity.writes == 2


def test_a_restarted_agent_with_nothing_new_writes_nothing() -> None:
    node = Node({MEMORY: "652472", CORES: "800"})
    capacity = writer(node)
    assert not asyncio.run(capacity.write({MEMORY: "652472", CORES: "800"}))  # reads first
    assert node.patches == []


def test_after_a_failed_write_the_node_is_read_again() -> None:
    node = Node({})
    node.fail_next = True
    capacity = writer(node)

    async def scenario() -> bool:
        await capacity.start()
        with pytest.raises(ApiError):
            await capacity.write({MEMORY: "1"})
        node.status["capacity"][MEMORY] = node.status["allocatable"][MEMORY] = "1"  # it landed
        return await capacity.write({MEMORY: "1"})

    assert asyncio.run(scenario()) is False
    assert node.patches == []
