"""Hand-built NVML recordings for multi-GPU nodes, on the shapes a real H100 answered.

A node that could not be recorded (an NVLink node, a node behind NVSwitches) is built from
the recorded H100's own calls, repeated per GPU with a ``"device"`` key, changing only what
differs between GPUs: identity, PCI address, NUMA node, links. Every other answer (the
"Not Supported"s, bytes, the XID wait's timeout) stays what the real driver said.

``python -m tests.nvml_builders > tests/fixtures/nvml/hgx-8-nvlink.json`` rebuilds the HGX
fixture, and ``python -m tests.nvml_builders h100-mig > tests/fixtures/nvml/h100-mig.json``
the MIG one, ``... hgx-8-minors > tests/fixtures/nvml/hgx-8-minors.json`` the HGX node with
device node minors that are not its indices; a unit test checks each committed file is what
this module builds.
"""

from __future__ import annotations

import copy
import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "nvml"
H100_SINGLE = FIXTURES / "h100-single.json"
H200_SINGLE = FIXTURES / "h200-single.json"  # recorded by scripts/device-check
HGX_8_NVLINK = FIXTURES / "hgx-8-nvlink.json"
HGX_8_MINORS = FIXTURES / "hgx-8-minors.json"
MIG_MINORS = FIXTURES / "mig-minors.txt"  # recorded on an H200: gpu0 and gpu1's lines
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
    # configured; the GPU answers as an H100 in MIG mode does (no utilisation). MIG device
    # index m is GPU instance m + 1, compute instance 0.
    migs: tuple[tuple[str, str] | None, ...] | None = None
    # Its device node's minor number (/dev/nvidia<minor>); None: its index, as on the
    # recorded H100.
    minor: int | None = None


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
            if call in _IDENTITY:
                entry["ok"] = _IDENTITY[call](index, spec)
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


# What differs between GPUs of a built node: identity, PCI address, device node.
_IDENTITY: dict[str, Callable[[int, GpuSpec], Any]] = {
    "nvmlDeviceGetUUID": lambda index, _: f"GPU-5e1ec7ed-0000-4000-8000-{index:012x}",
    "nvmlDeviceGetSerial": lambda index, _: str(1652824014976 + index),
    "nvmlDeviceGetPciInfo": lambda _, spec: _pci(spec.bus),
    "nvmlDeviceGetMinorNumber": lambda index, spec: index if spec.minor is None else spec.minor,
    "nvmlDeviceGetBoardId": lambda index, _: index,
}

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
        instance = {"ok": mig + 1} if device else NOT_FOUND
        compute = {"ok": 0} if device else NOT_FOUND
        entries.append({"call": "nvmlDeviceGetMigDeviceHandleByIndex.uuid", **at, **uuid})
        entries.append({"call": "nvmlDeviceGetMigDeviceHandleByIndex.name", **at, **name})
        entries.append(
            {"call": "nvmlDeviceGetMigDeviceHandleByIndex.gpuInstanceId", **at, **instance}
        )
        entries.append(
            {"call": "nvmlDeviceGetMigDeviceHandleByIndex.computeInstanceId", **at, **compute}
        )
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


# Where the driver numbered the device nodes otherwise than NVML's PCI order, as on many
# real machines: GPU i's node is /dev/nvidia<HGX_MINORS[i]>.
HGX_MINORS = (2, 3, 0, 1, 6, 7, 4, 5)


def hgx_8_nvlink(minors: Sequence[int | None] = (None,) * 8) -> dict[str, Any]:
    """Eight GPUs in two NVLink quads, [0-3] on NUMA node 0 and [4-7] on 1: each GPU's 18
    links, six to each of the three others of its quad; device node minors as given."""
    specs = []
    for index, bus in enumerate(HGX_BUSES):
        quad = range(0, 4) if index < 4 else range(4, 8)
        peers = [HGX_BUSES[j] for j in quad if j != index]
        links = tuple(peers[link // 6] for link in range(LINKS))
        p2p = frozenset(j for j in quad if j != index)
        specs.append(GpuSpec(bus=bus, numa=index // 4, links=links, p2p=p2p, minor=minors[index]))
    return recording(specs)


def hgx_8_minors() -> dict[str, Any]:
    """:func:`hgx_8_nvlink` with device node minors that are not the indices
    (:data:`HGX_MINORS`)."""
    return hgx_8_nvlink(HGX_MINORS)


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
    """Two H100s on PCIe: GPU 0 in MIG mode (:data:`H100_MIG_LAYOUT`), GPU 1 whole; their
    device nodes swapped (GPU 0 is /dev/nvidia1), so that a node named by index is wrong."""
    return recording([GpuSpec(bus="18", migs=H100_MIG_LAYOUT, minor=1), GpuSpec(bus="2a", minor=0)])


def dumps(document: dict[str, Any]) -> str:
    return json.dumps(document, indent=1) + "\n"


BUILT = {"hgx-8-nvlink": hgx_8_nvlink, "hgx-8-minors": hgx_8_minors, "h100-mig": h100_mig}

if __name__ == "__main__":
    sys.stdout.write(dumps(BUILT[sys.argv[1] if len(sys.argv) > 1 else "hgx-8-nvlink"]()))
