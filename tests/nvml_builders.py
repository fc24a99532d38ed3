"""Hand-built NVML recordings for multi-GPU nodes, on the shapes a real H100 answered.

A node that could not be recorded (an NVLink node, a node behind NVSwitches) is built from
the recorded H100's own calls, repeated per GPU with a ``"device"`` key, changing only what
differs between GPUs: identity, PCI address, NUMA node, links. Every other answer (the
"Not Supported"s, bytes, the XID wait's timeout) stays what the real driver said.

``python -m tests.nvml_builders > tests/fixtures/nvml/hgx-8-nvlink.json`` rebuilds the HGX
fixture, and ``python -m tests.nvml_builders h100-mig > tests/fixtures/nvml/h100-mig.json``
the MIG one; a unit test checks each committed file is what this module builds.
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
H100_MIG = FIXTURES / "h100-mig.json"

NOT_SUPPORTED = {"error": "Not Supported", "code": 3}
NOT_FOUND = {"error": "Not Found", "code": 6}  # pynvml's NVMLError_NotFound
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
    # In MIG mode when given: (profile, UUID) per MIG device index, None where none is
    # configured; the GPU answers as an H100 in MIG mode does (no utilisation).
    migs: tuple[tuple[str, str] | None, ...] | None = None


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
            elif spec.migs is not None and call in _IN_MIG_MODE:
                calls.extend(_in_mig_mode(call, index, spec.migs))
                continue
            elif call == "nvmlDeviceRegisterEvents.xid":
                calls.extend(_links(index, spec))
                calls.extend(_pairs(index, specs))
            calls.append(entry)
    return {"calls": calls}


# The calls a GPU in MIG mode answers otherwise than the recorded H100 (MIG off) did.
_IN_MIG_MODE = (
    "nvmlDeviceGetMigMode",
    "nvmlDeviceGetMaxMigDeviceCount",
    "nvmlDeviceGetUtilizationRates",
)


def _in_mig_mode(
    call: str, index: int, migs: Sequence[tuple[str, str] | None]
) -> list[dict[str, Any]]:
    """``call`` as a GPU in MIG mode answers it; after its MIG device count, each MIG device
    index: its UUID and name, or NOT_FOUND for both where none is configured (the handle
    call fails)."""
    base = {"call": call, "device": index, "args": []}
    if call == "nvmlDeviceGetMigMode":
        return [{**base, "ok": [1, 1]}]
    if call == "nvmlDeviceGetUtilizationRates":
        return [{**base, **NOT_SUPPORTED}]
    entries: list[dict[str, Any]] = [{**base, "ok": len(migs)}]
    for mig, device in enumerate(migs):
        at = {"device": index, "args": [mig]}
        uuid = {"ok": device[1]} if device else NOT_FOUND
        name = {"ok": f"NVIDIA H100 80GB HBM3 MIG {device[0]}"} if device else NOT_FOUND
        entries.append({"call": "nvmlDeviceGetMigDeviceHandleByIndex.uuid", **at, **uuid})
        entries.append({"call": "nvmlDeviceGetMigDeviceHandleByIndex.name", **at, **name})
    return entries


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


def mig_uuid(gpu: int, mig: int) -> str:
    return f"MIG-5e1ec7ed-0000-4000-9000-{gpu:04x}{mig:08x}"


# GPU 0 of the MIG fixture: three 1g.10gb and one 2g.20gb (5 of an H100's 7 compute slices),
# MIG device indices 4-6 empty.
H100_MIG_LAYOUT: tuple[tuple[str, str] | None, ...] = (
    ("1g.10gb", mig_uuid(0, 0)),
    ("1g.10gb", mig_uuid(0, 1)),
    ("1g.10gb", mig_uuid(0, 2)),
    ("2g.20gb", mig_uuid(0, 3)),
    None,
    None,
    None,
)


def h100_mig() -> dict[str, Any]:
    """Two H100s on PCIe: GPU 0 in MIG mode (:data:`H100_MIG_LAYOUT`), GPU 1 whole."""
    return recording([GpuSpec(bus="18", migs=H100_MIG_LAYOUT), GpuSpec(bus="2a")])


def dumps(document: dict[str, Any]) -> str:
    return json.dumps(document, indent=1) + "\n"


BUILT = {"hgx-8-nvlink": hgx_8_nvlink, "h100-mig": h100_mig}

if __name__ == "__main__":
    sys.stdout.write(dumps(BUILT[sys.argv[1] if len(sys.argv) > 1 else "hgx-8-nvlink"]()))
