"""Who hands out a node's GPUs: the device plugin, DRA, or both (:class:`Ownership`).

A node's GPUs reach pods through NVIDIA's device plugin (the ``nvidia.com/gpu`` extended
resource, or schedext's own agent serving it) or through DRA (ResourceSlices of a GPU driver,
``gpu.nvidia.com`` by default). DRA owns the node when a GPU driver publishes slices for it;
the node is *mixed* when it also advertises the device-plugin resource: NVIDIA's two
components then offer the same GPUs twice, and either may hand one out behind the other's
back. Counts alone cannot prove the two sets are the same GPUs; one node's GPUs are one set,
so both advertisers on one node are read as the same GPUs (the safe reading).
"""

from __future__ import annotations

from enum import Enum

from extender.dra.node_view import NodeDra

__all__ = ["Ownership", "ownership"]


class Ownership(Enum):
    DEVICE_PLUGIN = "device-plugin"
    DRA = "dra"
    MIXED = "mixed"


def ownership(node: NodeDra, device_plugin_gpus: int) -> Ownership:
    """Who owns ``node``'s GPUs, from what the claims ledger knows of it (``drivers``: the
    GPU drivers with slices for it) and its device-plugin GPUs (``nvidia.com/gpu``
    allocatable). A node neither advertises is the device plugin's, as before DRA."""
    if not node.drivers:
        return Ownership.DEVICE_PLUGIN
    return Ownership.MIXED if device_plugin_gpus > 0 else Ownership.DRA
