"""One GPU as the node agent sees it, and its health and live use: plain values, built by the
agent's NVML reader and published in the Node's annotations."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["HEALTHY", "Gpu", "GpuHealth", "GpuUse"]


@dataclass(frozen=True, slots=True)
class GpuHealth:
    """Whether a GPU may be handed out, and if not, why (shown in filter reasons and events:
    "XID 79: GPU fell off the bus", "uncorrectable ECC errors: 2", "device lost")."""

    healthy: bool = True
    reason: str = ""


HEALTHY = GpuHealth()


@dataclass(frozen=True, slots=True)
class Gpu:
    """One physical GPU (MIG slices are the GPU-sharing issue's; here only whether MIG is on)."""

    index: int  # NVML's index, the one schedext.io/gpu-ids names
    uuid: str  # "GPU-6bd689b3-..."; what NVIDIA_VISIBLE_DEVICES takes
    model: str = ""
    memory_mib: int = 0
    pci_bus_id: str = ""  # "00000000:00:06.0"
    numa_node: int | None = None  # None: NVML does not know (common on VMs)
    mig_enabled: bool = False
    health: GpuHealth = HEALTHY
    # PCI bus ids of the GPUs this one reaches over an active NVLink (or NVLink P2P); the
    # agent folds them into groups, and only the groups are published.
    nvlink_peers: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class GpuUse:
    """One GPU's sampled use."""

    index: int
    utilisation: int  # percent of time a kernel ran, 0..100
    memory_used_mib: int
