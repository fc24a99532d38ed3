"""One GPU as the node agent sees it, and its health and live use: plain values, built by the
agent's NVML reader and published in the Node's annotations."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["HEALTHY", "Gpu", "GpuHealth", "GpuUse", "MigSlice"]


@dataclass(frozen=True, slots=True)
class GpuHealth:
    """Whether a GPU may be handed out, and if not, why (shown in filter reasons and events:
    "XID 79: GPU fell off the bus", "uncorrectable ECC errors: 2", "device lost")."""

    healthy: bool = True
    reason: str = ""


HEALTHY = GpuHealth()


@dataclass(frozen=True, slots=True)
class MigSlice:
    """One MIG device of a GPU in MIG mode: its profile ("1g.10gb", the name NVIDIA's mixed
    strategy gives the resource ``nvidia.com/mig-1g.10gb``) and its UUID ("MIG-...", what
    NVIDIA_VISIBLE_DEVICES takes). Its health is its GPU's."""

    profile: str
    uuid: str
    # Its GPU instance and compute instance ids, which name its /dev/nvidia-caps nodes
    # (gpu<minor>/gi<gi>/access, gpu<minor>/gi<gi>/ci<ci>/access); None where NVML did not
    # say (the container runtime then adds them from NVIDIA_VISIBLE_DEVICES).
    gpu_instance: int | None = None
    compute_instance: int | None = None


@dataclass(frozen=True, slots=True)
class Gpu:
    """One physical GPU, and its MIG devices when it is in MIG mode."""

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
    # In MIG mode: the MIG devices configured on it now, in NVML's order (schedext never
    # changes the layout). A GPU in MIG mode is never handed out whole.
    migs: tuple[MigSlice, ...] = ()
    # N of its device node /dev/nvidiaN (NVML's minor number), which need not be its index;
    # None where NVML did not say, and the index is the best guess. Used on its node only.
    minor: int | None = None

    @property
    def device_node(self) -> str:
        """Its device node's name under /dev: "nvidia<minor>"."""
        return f"nvidia{self.index if self.minor is None else self.minor}"


@dataclass(frozen=True, slots=True)
class GpuUse:
    """One GPU's sampled use."""

    index: int
    utilisation: int  # percent of time a kernel ran, 0..100
    memory_used_mib: int
