"""The two documents the node agent writes on its Node, and their readers.

``schedext.io/gpu-topology`` (written at start and on change only)::

    {"version": 2, "driver": "580.159.04",
     "groups": [[0, 1, 2, 3], [4, 5, 6, 7]],
     "gpus": [{"index": 0, "uuid": "GPU-...", "model": "NVIDIA H100 80GB HBM3",
               "memoryMiB": 81559, "pciBusId": "00000000:00:06.0", "numaNode": 0,
               "mig": false, "health": "Healthy", "reason": ""},
              {"index": 1, ..., "mig": true,
               "migs": [{"profile": "1g.10gb", "uuid": "MIG-..."}, ...]}, ...]}

``migs`` (a GPU in MIG mode: its MIG devices, at most :data:`MAX_MIGS`) is optional and written
only when there are some, so that a node without MIG writes the same text as before it existed
and a reader that predates it reads the rest as ever. Under NVIDIA's "mixed" strategy the
node's whole-GPU resource leaves out the GPUs in MIG mode, while the document lists every GPU
by NVML index: its indices may therefore reach the whole-GPU count plus the GPUs it marks
``"mig": true`` (a reader that predates this refuses such a document as "index outside",
which leaves it without topology, never handing out a wrong GPU).

Version 1 is today's ``{"groups": [...]}`` with no version key; it stays readable, so a
hand-written annotation keeps working. A newer version than this reader knows is refused
whole (as "no topology", with a reason): guessing at its meaning could hand out a GPU a newer
agent marked broken in a field we do not read.

``schedext.io/gpu-use`` (written at a bounded rate, only on a change beyond a threshold)::

    {"version": 1, "at": 1764072000, "gpus": [[0, 37, 20480], [1, 0, 512]]}

``at`` is the sample's wall-clock time (Unix seconds): a sample from an agent that stopped
writing grows stale and is then ignored. Each GPU is ``[index, utilisation %, MiB used]``.

Both readers are total: any input gives a value or a :class:`DocumentError` naming what is
wrong, never another exception. They are bounded: a document over :data:`MAX_DOCUMENT` bytes
is refused before it is parsed.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from extender.devices.gpus import HEALTHY, Gpu, GpuHealth, GpuUse, MigSlice
from extender.devices.mig_slices import is_profile

__all__ = [
    "MAX_DOCUMENT",
    "MAX_MIGS",
    "TOPOLOGY_VERSION",
    "USE_VERSION",
    "DocumentError",
    "Topology",
    "UseSample",
    "decode_topology",
    "decode_use",
    "encode_topology",
    "encode_use",
    "listed_gpus",
]

TOPOLOGY_VERSION = 2
USE_VERSION = 1
# Node annotations share the object's 256 KiB; 64 GPUs' entries take about 16 KiB.
MAX_DOCUMENT = 64 * 1024
_MAX_TEXT = 256  # a UUID, a model name, a health reason
MAX_MIGS = 16  # MIG devices per GPU (7 on an H100): a longer list is not a GPU's


class DocumentError(ValueError):
    """Why a published document was not read (shown by explain, an event and a metric)."""


GpuGroups = tuple[tuple[int, ...], ...]


@dataclass(frozen=True, slots=True)
class Topology:
    """What a topology annotation says: NVLink/NUMA groups of GPU indices, and (version 2)
    each GPU's identity and health."""

    groups: GpuGroups = ()
    gpus: tuple[Gpu, ...] = ()  # empty for a version 1 document
    driver: str = ""
    version: int = TOPOLOGY_VERSION

    def unhealthy(self) -> tuple[tuple[int, str], ...]:
        """(index, why) of each GPU published as unhealthy."""
        return tuple((g.index, g.health.reason) for g in self.gpus if not g.health.healthy)

    def mig_gpus(self) -> tuple[int, ...]:
        """Indices of the GPUs in MIG mode (never handed out whole)."""
        return tuple(g.index for g in self.gpus if g.mig_enabled)

    def uuids(self) -> tuple[str, ...]:
        """UUIDs by index when every GPU's is published, else ()."""
        by_index = {g.index: g.uuid for g in self.gpus}
        if not by_index or sorted(by_index) != list(range(len(by_index))):
            return ()
        return tuple(by_index[i] for i in range(len(by_index)))


@dataclass(frozen=True, slots=True)
class UseSample:
    at: float  # Unix seconds
    gpus: tuple[GpuUse, ...]


# ----------------------------------------------------------------------------- topology


def encode_topology(topology: Topology) -> str:
    """The annotation's value; the same topology always gives the same text, so that the
    agent can tell a change by comparing strings."""
    document = {
        "version": TOPOLOGY_VERSION,
        "driver": topology.driver,
        "groups": [list(group) for group in topology.groups],
        "gpus": [_gpu_entry(gpu) for gpu in sorted(topology.gpus, key=lambda g: g.index)],
    }
    return json.dumps(document, separators=(",", ":"), sort_keys=True)


def _gpu_entry(gpu: Gpu) -> dict[str, object]:
    entry: dict[str, object] = {
        "index": gpu.index,
        "uuid": gpu.uuid,
        "model": gpu.model,
        "memoryMiB": gpu.memory_mib,
        "pciBusId": gpu.pci_bus_id,
        "numaNode": gpu.numa_node,
        "mig": gpu.mig_enabled,
        "health": "Healthy" if gpu.health.healthy else "Unhealthy",
        "reason": gpu.health.reason,
    }
    if gpu.migs:
        entry["migs"] = [{"profile": m.profile, "uuid": m.uuid} for m in gpu.migs]
    return entry


def decode_topology(raw: str, gpu_count: int) -> Topology:
    """Read a topology annotation for a node with ``gpu_count`` GPUs; :class:`DocumentError`
    when it is malformed, inconsistent or of a version this reader does not know."""
    document = _load(raw)
    version = document.get("version", 1)
    if not isinstance(version, int) or isinstance(version, bool):
        raise DocumentError("version is not an integer")
    if version not in (1, TOPOLOGY_VERSION):
        raise DocumentError(
            f"version {version} is not supported (this schedext reads 1 and {TOPOLOGY_VERSION})"
        )
    if version == 1:
        return Topology(groups=_groups(document.get("groups"), gpu_count), version=1)
    raw_gpus = document.get("gpus", [])
    # The GPUs in MIG mode stand beside the whole-GPU count (see the module docstring).
    indices = gpu_count + _mig_mode_count(raw_gpus)
    groups = _groups(document.get("groups"), indices)
    gpus = _gpus(raw_gpus, indices)
    driver = document.get("driver", "")
    return Topology(groups=groups, gpus=gpus, driver=_text(driver, "driver"), version=version)


def listed_gpus(raw: str) -> int:
    """How many whole GPUs (not in MIG mode) a version 2 document lists; 0 when it lists none
    or cannot be read. The count to read it with on a node whose allocatable says nothing:
    one whose GPUs DRA hands out."""
    try:
        entries = _load(raw).get("gpus", [])
    except DocumentError:
        return 0
    if not isinstance(entries, list):
        return 0
    return sum(1 for e in entries if isinstance(e, Mapping) and e.get("mig") is not True)


def _groups(raw: object, gpu_count: int) -> GpuGroups:
    if not isinstance(raw, list) or not all(isinstance(g, list) and g for g in raw):
        raise DocumentError('expected {"groups": [[gpu indices], ...]}')
    seen: set[int] = set()
    parsed: list[tuple[int, ...]] = []
    for group in raw:
        if not all(_is_int(i) for i in group):
            raise DocumentError("GPU indices must be integers")
        members = tuple(sorted(group))
        if any(i < 0 or i >= gpu_count for i in members):
            raise DocumentError(f"GPU index outside 0..{gpu_count - 1}")
        if seen.intersection(members) or len(set(members)) != len(members):
            raise DocumentError("a GPU is listed twice")
        seen.update(members)
        parsed.append(members)
    return tuple(parsed)


def _mig_mode_count(raw: object) -> int:
    if not isinstance(raw, list):
        return 0
    return sum(1 for entry in raw if isinstance(entry, Mapping) and entry.get("mig") is True)


def _gpus(raw: object, gpu_count: int) -> tuple[Gpu, ...]:
    if not isinstance(raw, list):
        raise DocumentError("gpus is not a list")
    gpus: dict[int, Gpu] = {}
    for entry in raw:
        if not isinstance(entry, Mapping):
            raise DocumentError("a gpus entry is not an object")
        index = entry.get("index")
        if not _is_int(index) or not 0 <= index < gpu_count:  # type: ignore[operator]
            raise DocumentError(f"gpus: index {index!r} outside 0..{gpu_count - 1}")
        assert isinstance(index, int)
        if index in gpus:
            raise DocumentError(f"gpus: GPU {index} is listed twice")
        health = entry.get("health", "Healthy")
        if health not in ("Healthy", "Unhealthy"):
            raise DocumentError(f"gpus: GPU {index} health {health!r} is not Healthy or Unhealthy")
        reason = _text(entry.get("reason", ""), "reason")
        numa = entry.get("numaNode")
        memory = entry.get("memoryMiB", 0)
        mig = entry.get("mig") is True
        gpus[index] = Gpu(
            index=index,
            uuid=_text(entry.get("uuid", ""), "uuid"),
            model=_text(entry.get("model", ""), "model"),
            memory_mib=memory if _is_int(memory) and memory >= 0 else 0,
            pci_bus_id=_text(entry.get("pciBusId", ""), "pciBusId"),
            numa_node=numa if _is_int(numa) else None,
            mig_enabled=mig,
            health=HEALTHY if health == "Healthy" else GpuHealth(False, reason or "unhealthy"),
            migs=_migs(entry.get("migs", []), index, mig),
        )
    ordered = tuple(gpus[i] for i in sorted(gpus))
    uuids = [m.uuid for gpu in ordered for m in gpu.migs]
    if len(set(uuids)) != len(uuids):
        raise DocumentError("gpus: a MIG device is listed twice")
    return ordered


def _migs(raw: object, index: int, mig: bool) -> tuple[MigSlice, ...]:
    if not isinstance(raw, list) or len(raw) > MAX_MIGS:
        raise DocumentError(f"gpus: GPU {index} migs is not a list of at most {MAX_MIGS}")
    if raw and not mig:
        raise DocumentError(f"gpus: GPU {index} lists MIG devices but is not in MIG mode")
    slices = []
    for entry in raw:
        if not isinstance(entry, Mapping):
            raise DocumentError(f"gpus: GPU {index} has a migs entry that is not an object")
        profile = _text(entry.get("profile"), "profile")
        uuid = _text(entry.get("uuid"), "uuid")
        if not is_profile(profile) or not uuid:
            raise DocumentError(
                f"gpus: GPU {index} has a MIG device without a profile name or a UUID"
            )
        slices.append(MigSlice(profile, uuid))
    return tuple(slices)


# ---------------------------------------------------------------------------------- use


def encode_use(sample: UseSample) -> str:
    document = {
        "version": USE_VERSION,
        "at": int(sample.at),
        "gpus": [[u.index, u.utilisation, u.memory_used_mib] for u in sample.gpus],
    }
    return json.dumps(document, separators=(",", ":"))


def decode_use(raw: str, gpu_count: int) -> UseSample:
    document = _load(raw)
    if document.get("version") != USE_VERSION:
        raise DocumentError(f"version {document.get('version')!r} is not supported")
    at = document.get("at")
    if not isinstance(at, int | float) or isinstance(at, bool) or at < 0:
        raise DocumentError("at is not a time")
    rows = document.get("gpus")
    if not isinstance(rows, list):
        raise DocumentError("gpus is not a list")
    use: dict[int, GpuUse] = {}
    for row in rows:
        if not (isinstance(row, Sequence) and len(row) == 3 and all(_is_int(x) for x in row)):
            raise DocumentError("a gpus entry is not [index, utilisation, MiB used]")
        index, utilisation, used = row
        if not 0 <= index < gpu_count or index in use:
            raise DocumentError(f"GPU index {index} outside 0..{gpu_count - 1} or repeated")
        use[index] = GpuUse(index, min(max(utilisation, 0), 100), max(used, 0))
    return UseSample(at=float(at), gpus=tuple(use[i] for i in sorted(use)))


# --------------------------------------------------------------------------------- parts


def _load(raw: str) -> Mapping[str, object]:
    if len(raw) > MAX_DOCUMENT:
        raise DocumentError(f"longer than {MAX_DOCUMENT} bytes")
    try:
        document = json.loads(raw)
    except (ValueError, RecursionError):
        raise DocumentError("not JSON") from None
    if not isinstance(document, Mapping):
        raise DocumentError("not a JSON object")
    return document


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _text(value: object, name: str) -> str:
    if not isinstance(value, str) or len(value) > _MAX_TEXT:
        raise DocumentError(f"{name} is not a string of at most {_MAX_TEXT} characters")
    return value
