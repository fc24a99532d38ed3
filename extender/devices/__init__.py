"""The node half's values and decisions: what a node agent knows of its GPUs, the documents it
publishes on the Node (read back by the inventory), and how it matches the kubelet's device
requests to the pods schedext bound. Pure, like the rest of the core: NVML, gRPC and the API
server stay in the agent's shell (``app/agent``)."""

from extender.devices.document import (
    TOPOLOGY_VERSION,
    USE_VERSION,
    DocumentError,
    Topology,
    UseSample,
    decode_topology,
    decode_use,
    encode_topology,
    encode_use,
)
from extender.devices.gpus import HEALTHY, Gpu, GpuHealth, GpuUse, MigSlice

__all__ = [
    "HEALTHY",
    "TOPOLOGY_VERSION",
    "USE_VERSION",
    "DocumentError",
    "Gpu",
    "GpuHealth",
    "GpuUse",
    "MigSlice",
    "Topology",
    "UseSample",
    "decode_topology",
    "decode_use",
    "encode_topology",
    "encode_use",
]
