"""Hand-built NVML recordings for multi-GPU nodes, on the shapes a real H100 answered.

A node that could not be recorded (an NVLink node, a node behind NVSwitches) is built from
the recorded H100's own calls, repeated per GPU with a ``"device"`` key, changing only what
differs between GPUs: identity, PCI address, NUMA node, links. Every other answer (the
"Not Supported"s, bytes, the XID wait's timeout) stays what the real driver said.

``python -m tests.nvml_builders > tests/fixtures/nvml/hgx-8-nvlink.json`` rebuilds the HGX
fixture; a unit test checks the committed file is what this module builds.
"""

from __future__ import annotations

import copy
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "nvml"
H100_SINGLE = FIXTURES / "h100-single.json"
HGX_8_NVLINK = FIXTURES / "hgx-8-nvlink.json"

NOT_SUPPORTED = {"error": "Not Supported", "code": 3}
# nvmlGpuTopologyLevel_t: GPUs under one CPU, and across CPUs.
TOPOLOGY_NODE, TOPOLOGY_SYSTEM = 40, 50
P2P_OK, P2P_NOT_SUPPORTED = 0, 5
LINKS = 18


@dataclass(frozen=True)
class GpuSpec:
    """One GPU of a built node: its PCI bus (``"18"``), NUMA node (None: Not Supported),
    the far end's bus of each active NVLink link, and the GPUs NVLink P2P reaches."""

    bus: str
    numa: int | None = None
    links: tuple[str, ...] = ()
    p2p: frozenset[int] = frozenset()


def bus_id(bus: str) -> str:
    return f"00000000:{bus.upper()}:00.0"


def _pci(bus: str) -> dict[str, Any]:
    return {
        "busIdLegacy": f"0000:{bus.upper()}:00.0",
        "domain": 0,
        "bus": int(bus, 16),
        "device": 0,
        "pciDeviceId": 590352606,
        "pciSubSystemId": 381751518,
        "busId": bus_id(bus),
    }


def _h100_block() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The recording's system calls, and the calls of its one GPU."""
    calls = json.loads(H100_SINGLE.read_text())["calls"]
    first = next(i for i, c in enumerate(calls) if c["call"] == "nvmlDeviceGetName")
    return calls[:first], calls[first:]


def recording(specs: Sequence[GpuSpec]) -> dict[str, Any]:
    """A recording of a node with these GPUs, in the replay's format."""
    system, block = _h100_block()
    calls = []
    for template in system:
        entry = copy.deepcopy(template)
        if entry["call"] == "nvmlDeviceGetCount":
            entry["ok"] = len(specs)
        calls.append(entry)
    for index, spec in enumerate(specs):
        for template in block:
            call = template["call"]
            rest = {k: v for k, v in copy.deepcopy(template).items() if k != "call"}
            entry = {"call": call, "device": index, **rest}
            if call in ("nvmlDeviceGetNvLinkState", "nvmlDeviceGetNvLinkRemotePciInfo"):
                continue  # written below, per link
            if call == "nvmlDeviceGetUUID":
                entry["ok"] = f"GPU-5e1ec7ed-0000-4000-8000-{index:012x}"
            elif call == "nvmlDeviceGetSerial":
                entry["ok"] = str(1652824014976 + index)
            elif call == "nvmlDeviceGetPciInfo":
                entry["ok"] = _pci(spec.bus)
            elif call in ("nvmlDeviceGetMinorNumber", "nvmlDeviceGetBoardId"):
                entry["ok"] = index
            elif call == "nvmlDeviceGetNumaNodeId" and spec.numa is not None:
                entry = {"call": call, "device": index, "args": [], "ok": spec.numa}
            elif call == "nvmlDeviceRegisterEvents.xid":
                calls.extend(_links(index, spec))
                calls.extend(_pairs(index, specs))
            calls.append(entry)
    return {"calls": calls}


def _links(index: int, spec: GpuSpec) -> list[dict[str, Any]]:
    entries = []
    for link in range(LINKS):
        active = link < len(spec.links)
        base = {"device": index, "args": [link]}
        entries.append({"call": "nvmlDeviceGetNvLinkState", **base, "ok": int(active)})
        remote = {"ok": _pci(spec.links[link])} if active else NOT_SUPPORTED
        entries.append({"call": "nvmlDeviceGetNvLinkRemotePciInfo", **base, **remote})
    return entries


def _pairs(index: int, specs: Sequence[GpuSpec]) -> list[dict[str, Any]]:
    entries = []
    spec = specs[index]
    for peer, other in enumerate(specs):
        if peer == index:
            continue
        base = {"device": index, "peer": peer}
        near = spec.numa is not None and spec.numa == other.numa
        level = TOPOLOGY_NODE if near else TOPOLOGY_SYSTEM
        status = P2P_OK if peer in spec.p2p else P2P_NOT_SUPPORTED
        entries.append(
            {"call": "nvmlDeviceGetTopologyCommonAncestor", **base, "args": [], "ok": level}
        )
        entries.append({"call": "nvmlDeviceGetP2PStatus.nvlink", **base, "args": [2], "ok": status})
    return entries


HGX_BUSES = ("18", "2a", "3a", "5d", "9a", "ab", "ba", "db")


def hgx_8_nvlink() -> dict[str, Any]:
    """Eight GPUs in two NVLink quads, [0-3] on NUMA node 0 and [4-7] on 1: each GPU's 18
    links, six to each of the three others of its quad."""
    specs = []
    for index, bus in enumerate(HGX_BUSES):
        quad = range(0, 4) if index < 4 else range(4, 8)
        peers = [HGX_BUSES[j] for j in quad if j != index]
        links = tuple(peers[link // 6] for link in range(LINKS))
        p2p = frozenset(j for j in quad if j != index)
        specs.append(GpuSpec(bus=bus, numa=index // 4, links=links, p2p=p2p))
    return recording(specs)


def dumps(document: dict[str, Any]) -> str:
    return json.dumps(document, indent=1) + "\n"


if __name__ == "__main__":
    sys.stdout.write(dumps(hgx_8_nvlink()))
