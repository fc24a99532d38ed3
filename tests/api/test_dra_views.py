"""DRA in the views over real HTTP, from a snapshot that holds ResourceSlices, ResourceClaims
and the pods naming them: ``/inventory``'s ``dra`` object per node, ``/explain``'s DRA lines,
``kubectl schedext nodes``' OWNER and DRA columns, and the ledger's problems reported (a
Warning event on a claim naming a device no slice has, posted once) and counted
(``schedext_dra_problems``)."""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest

from app.kube.events import DraEvent
from app.plugin import tables
from app.service.dra_problems import REASON
from testbed.builders import H100, agent_annotations, make_node, make_pod
from testbed.dra_builders import (
    dra_pod,
    gpu,
    resource_claim,
    resource_slice,
    result,
    taint_rule,
)
from tests.api.conftest import Serve
from tests.api.server import RunningServer
from tests.recorded_events import RecordedEvents

pytestmark = pytest.mark.api

GHOST_WHY = "gpu.nvidia.com/mixed/gpu-9 is in no ResourceSlice"


def cluster() -> dict[str, Any]:
    """mixed: schedext's agent and DRA both advertise 4 GPUs; claim ml/train holds GPU 1 for
    its pod, ml/infer two shares of GPU 2, ml/ghost a device no slice has; DeviceTaintRule
    xid taints GPU 3. dra-only: DRA's alone (no GPUs schedext counts), one device held.
    plain: the device plugin's."""
    annotations = agent_annotations(4, uuid_prefix="GPU-mixed")
    slices = [
        resource_slice("mixed", [gpu(i, node="mixed", shared=i == 2) for i in range(4)]),
        resource_slice("dra-only", [gpu(i, node="dra-only") for i in range(2)]),
    ]
    claims = [
        resource_claim("train", namespace="ml", results=[result("mixed", "gpu-1")],
                       node="mixed", reserved_for=["u-train"]),
        resource_claim("infer", namespace="ml", node="mixed", results=[
            result("mixed", "gpu-2", share_id="a", consumed_memory="10Gi"),
            result("mixed", "gpu-2", share_id="b", consumed_memory="20Gi"),
        ]),
        resource_claim("ghost", namespace="ml", results=[result("mixed", "gpu-9")], node="mixed"),
        resource_claim("solo", results=[result("dra-only", "gpu-0")], node="dra-only"),
    ]  # fmt: skip
    rule = taint_rule("xid", selector={"driver": "gpu.nvidia.com", "pool": "mixed",
                                       "device": "gpu-3"})  # fmt: skip
    return {
        "nodes": [
            make_node("mixed", gpus=4, model=H100, annotations=annotations),
            make_node("dra-only"),
            make_node("plain", gpus=2, model=H100),
        ],
        "pods": [
            # Pending, as between the claim's reservation and the pod's binding.
            dra_pod("u-train", namespace="ml", claims={"gpu": "train"}),
            make_pod("waits", namespace="ml", gpus=1),
        ],
        "groups": [*slices, *claims, rule],
    }


@pytest.fixture
def server(serve: Serve) -> tuple[RunningServer, RecordedEvents]:
    events = RecordedEvents()
    return serve(**cluster(), events=events), events


def inventory_nodes(server: RunningServer) -> dict[str, dict[str, Any]]:
    with server.client() as client:
        return {n["name"]: n for n in client.get("/inventory").json()["nodes"]}


def device(name: str, **fields: Any) -> dict[str, Any]:
    return {"driver": "gpu.nvidia.com", "pool": "mixed", "name": name, **fields}


def test_inventory_shows_each_nodes_dra_devices_their_claims_and_owner(
    server: tuple[RunningServer, RecordedEvents],
) -> None:
    nodes = inventory_nodes(server[0])
    assert {name: n["gpuOwner"] for name, n in nodes.items()} == {
        "mixed": "mixed",
        "dra-only": "dra",
        "plain": "device-plugin",
    }
    assert nodes["plain"]["dra"] is None
    dra = nodes["mixed"]["dra"]
    assert (dra["drivers"], dra["advertised"], dra["held"], dra["unknown"]) == (
        ["gpu.nvidia.com"], 4, 3, 1,
    )  # fmt: skip
    gpu3 = dra["devices"][3]
    assert gpu3["name"] == "gpu-3"
    assert gpu3["uuid"] == "GPU-mixed-3"
    assert gpu3["pcieRoot"] == "pci0000:00"
    assert gpu3["memoryMiB"] == 80 * 1024
    assert "gpu.nvidia.com/xid=79:NoSchedule (DeviceTaintRule xid)" in gpu3["unhealthy"]
    assert gpu3["problem"] is None
    assert [d["unhealthy"] for d in dra["devices"][:3]] == [None, None, None]
    assert dra["heldDevices"] == [
        device("gpu-1", uuid="GPU-mixed-1", gpu=1, unmapped=None, claims=["ml/train"],
               pods=["ml/pod-u-train"], shareMemoryMiB=None),
        device("gpu-2", uuid="GPU-mixed-2", gpu=2, unmapped=None, claims=["ml/infer"],
               pods=[], shareMemoryMiB=30 * 1024),
        device("gpu-9", uuid=None, gpu=None, unmapped=GHOST_WHY, claims=["ml/ghost"], pods=[],
               shareMemoryMiB=None),
    ]  # fmt: skip
    assert dra["unknownDevices"] == [device("gpu-9", reason=GHOST_WHY)]
    solo = nodes["dra-only"]["dra"]
    assert (solo["advertised"], solo["held"]) == (2, 1)
    assert solo["heldDevices"][0]["unmapped"] == "the node agent publishes no GPU UUIDs"
    # The claimed GPUs are in use for schedext, as before.
    assert [g["index"] for g in nodes["mixed"]["gpus"] if g["inUse"]] == [1, 2]


def test_explain_says_who_owns_each_node_and_which_claims_hold_its_devices(
    server: tuple[RunningServer, RecordedEvents],
) -> None:
    with server[0].client() as client:
        answer = client.get("/explain/ml/waits").json()
    nodes = {n["node"]: n for n in answer["nodes"]}
    assert nodes["plain"]["dra"] == []
    assert nodes["mixed"]["dra"][:3] == [
        "owner mixed: both the device plugin and DRA advertise its GPUs",
        "gpu.nvidia.com/mixed/gpu-1 (GPU 1) held by claim ml/train for pod ml/pod-u-train",
        "gpu.nvidia.com/mixed/gpu-2 (GPU 2) held by claim ml/infer (shares of 30720 MiB)",
    ]
    assert nodes["dra-only"]["dra"][0].startswith("owner dra: ")
    text = tables.explanation_text(answer)
    assert "dra gpu.nvidia.com/mixed/gpu-1 (GPU 1) held by claim ml/train" in text


def test_the_plugins_nodes_table_has_owner_and_dra_columns(
    server: tuple[RunningServer, RecordedEvents],
) -> None:
    with server[0].client() as client:
        answer = client.get("/inventory").json()
    lines = tables.nodes_table(answer).splitlines()
    cells = [[c.strip() for c in line.split("   ") if c.strip()] for line in lines[:4]]
    assert cells[0][:7] == ["NODE", "MODEL", "GPUS", "FREE", "DEVICES", "OWNER", "DRA"]
    rows = {row[0]: row for row in cells[1:4]}
    assert rows["dra-only"][1:7] == ["-", "0", "0", "-", "dra", "1/2"]
    assert rows["mixed"][5:7] == ["mixed", "3/4"]
    assert rows["plain"][5:7] == ["device-plugin", "-"]


def scrape(server: RunningServer) -> dict[str, float]:
    text = httpx.get(f"{server.url}/metrics", timeout=10).text
    samples = (line.rsplit(" ", 1) for line in text.splitlines() if not line.startswith("#"))
    return {series: float(value) for series, value in samples}


def test_a_claim_naming_a_device_no_slice_has_gets_one_warning_event_and_is_counted(
    server: tuple[RunningServer, RecordedEvents],
) -> None:
    running, events = server
    deadline = time.monotonic() + 10
    # Other warnings (the mixed node's) are posted too, one by one: wait for DRA's own.
    while not any(isinstance(e, DraEvent) for e in events.events):
        assert time.monotonic() < deadline, f"no DRA warning within 10 s: {events.events}"
        time.sleep(0.05)
    warned = [e for e in events.events if isinstance(e, DraEvent)]
    assert warned == [DraEvent("ResourceClaim", "ml/ghost", REASON, GHOST_WHY)]
    metrics = scrape(running)
    assert metrics['schedext_dra_problems{kind="ResourceClaim"}'] == 1
    assert metrics['schedext_dra_problems{kind="ResourceSlice"}'] == 0
    time.sleep(1.5)  # more passes of the loop: the same problem is not posted again
    assert [e for e in events.events if isinstance(e, DraEvent)] == warned
