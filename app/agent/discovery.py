"""What the node's GPUs are, how they are linked and whether they are fit, read through
:class:`~app.agent.nvml.Nvml`; and their live use.

The rules that a real machine taught (the H100 recording in the tests shows each):

- "Not Supported" is an answer, not a fault: a VM has no NUMA node for its GPU, a GPU with
  row remapping has no retired-pages status, a lone GPU has no NVLink. Such a fact is
  unknown and the GPU stays healthy. The same holds for any other error on an optional fact.
- GPU_IS_LOST from any call means the GPU fell off the bus: it is published unhealthy,
  "device lost", with what was read of it before.
- Memory comes in bytes and is published in MiB.

The reader asks; the pure core decides what the answers mean for scheduling
(:func:`extender.devices.links.nvlink_groups` folds the NVLink peers read here).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial

from app.agent.mig_discovery import read_migs
from app.agent.nvml import (
    ERROR_GPU_IS_LOST,
    FEATURE_ENABLED,
    MIB,
    MIG_ENABLED,
    NVLINK_LINKS,
    P2P_STATUS_OK,
    Nvml,
    NvmlError,
    optional,
)
from extender.devices.gpus import HEALTHY, Gpu, GpuHealth, GpuUse, MigSlice
from extender.devices.links import pci_key

__all__ = ["LOST", "read_node", "sample_use"]

# Also what the XID watch reports for a GPU lost while it waits.
LOST = GpuHealth(healthy=False, reason="device lost")


@dataclass(slots=True)
class _Read:
    """One GPU as far as it was read (a GPU lost halfway keeps what came before)."""

    index: int
    uuid: str = ""
    model: str = ""
    memory_mib: int = 0
    pci_bus_id: str = ""
    numa_node: int | None = None
    minor: int | None = None
    mig_enabled: bool = False
    migs: tuple[MigSlice, ...] = ()
    problems: list[str] = field(default_factory=list)
    remote_bus_ids: list[str] = field(default_factory=list)
    lost: bool = False


def read_node(nvml: Nvml) -> tuple[str, tuple[Gpu, ...]]:
    """The driver version and every GPU NVML lists, by index. Raises :class:`NvmlError`
    only when the node itself cannot be read (driver version, GPU count) or a GPU's UUID
    cannot be read for a reason other than its loss: a GPU without its UUID cannot be named
    to the kubelet, so the caller retries rather than publishing half a node."""
    driver = nvml.driver_version()
    reads = [_read_gpu(nvml, index) for index in range(nvml.device_count())]
    peers = _nvlink_peers(nvml, reads)
    return driver, tuple(
        Gpu(
            index=read.index,
            uuid=read.uuid,
            model=read.model,
            memory_mib=read.memory_mib,
            pci_bus_id=read.pci_bus_id,
            numa_node=read.numa_node,
            mig_enabled=read.mig_enabled,
            health=_health(read),
            nvlink_peers=peers[read.index],
            migs=read.migs,
            minor=read.minor,
        )
        for read in reads
    )


def sample_use(nvml: Nvml) -> tuple[GpuUse, ...]:
    """Each GPU's utilisation and memory in use; a lost GPU, or one whose memory cannot be
    read, is left out (no sample rather than a made-up zero). Utilisation that NVML does not
    report (Not Supported with MIG on) reads as 0: the memory in use still says the GPU is
    busy."""
    samples = []
    for index in range(nvml.device_count()):
        try:
            memory = nvml.memory(index)
            utilisation = optional(partial(nvml.utilisation, index))
        except NvmlError:
            continue
        samples.append(GpuUse(index, min(max(utilisation or 0, 0), 100), memory.used // MIB))
    return tuple(samples)


# ------------------------------------------------------------------------------- parts


def _read_gpu(nvml: Nvml, index: int) -> _Read:
    read = _Read(index)
    try:
        read.uuid = nvml.uuid(index)
        read.model = optional(lambda: nvml.name(index)) or ""
        memory = optional(lambda: nvml.memory(index))
        read.memory_mib = memory.total // MIB if memory else 0
        read.pci_bus_id = optional(lambda: nvml.pci_bus_id(index)) or ""
        read.numa_node = optional(lambda: nvml.numa_node(index))
        read.minor = optional(lambda: nvml.minor_number(index))
        mig = optional(lambda: nvml.mig_mode(index))
        read.mig_enabled = mig is not None and mig[0] == MIG_ENABLED  # the current mode
        if read.mig_enabled:
            read.migs = read_migs(nvml, index)
        errors = optional(lambda: nvml.ecc_uncorrected(index))
        if errors:
            read.problems.append(f"uncorrectable ECC errors: {errors}")
        if optional(lambda: nvml.retired_pages_pending(index)) == FEATURE_ENABLED:
            read.problems.append("retired pages pending")
        for link in range(NVLINK_LINKS):
            if optional(partial(nvml.nvlink_state, index, link)) != FEATURE_ENABLED:
                continue
            remote = optional(partial(nvml.nvlink_remote_bus_id, index, link))
            if remote:
                read.remote_bus_ids.append(remote)
    except NvmlError as error:
        if error.code != ERROR_GPU_IS_LOST:
            raise
        read.lost = True
    return read


def _nvlink_peers(nvml: Nvml, reads: Sequence[_Read]) -> dict[int, tuple[str, ...]]:
    """Each GPU's NVLink peers by PCI bus id. A link whose far end is another GPU names it
    directly. A link to anything else is an NVSwitch: which GPUs it reaches is not in the
    link, so each pair of such GPUs is asked whether NVLink P2P works between them."""
    gpus = {pci_key(read.pci_bus_id): read for read in reads if read.pci_bus_id}
    peers: dict[int, set[str]] = {read.index: set() for read in reads}
    switched: list[_Read] = []
    for read in reads:
        for remote in read.remote_bus_ids:
            other = gpus.get(pci_key(remote))
            if other is None:
                if not switched or switched[-1] is not read:
                    switched.append(read)
            elif other.index != read.index:
                peers[read.index].add(other.pci_bus_id)
    for position, read in enumerate(switched):
        for other in switched[position + 1 :]:
            if _p2p_over_nvlink(nvml, read.index, other.index):
                peers[read.index].add(other.pci_bus_id)
                peers[other.index].add(read.pci_bus_id)
    return {index: tuple(sorted(bus_ids)) for index, bus_ids in peers.items()}


def _p2p_over_nvlink(nvml: Nvml, index: int, peer: int) -> bool:
    try:
        return nvml.p2p_nvlink_status(index, peer) == P2P_STATUS_OK
    except NvmlError:
        return False  # a GPU lost since it was read is published as lost anyway


def _health(read: _Read) -> GpuHealth:
    if read.lost:
        return LOST
    if read.problems:
        return GpuHealth(healthy=False, reason="; ".join(read.problems))
    return HEALTHY
