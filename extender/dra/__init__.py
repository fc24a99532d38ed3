"""Dynamic Resource Allocation (``resource.k8s.io/v1``), as far as schedext must see it: the
GPUs that ResourceClaims hold, so that schedext never hands one out twice (issue 31).

Pure, like the rest of the core: the shell watches the objects and hands them to the
decoders; the book keeps what they say.

* :mod:`~extender.dra.slices`, :mod:`~extender.dra.claims`, :mod:`~extender.dra.pod_claims`,
  :mod:`~extender.dra.classes`, :mod:`~extender.dra.taint_rules`: the decoders, one per
  object (``decode_slice``, ``decode_claim``, ``decode_pod_claims``, ``decode_device_class``,
  ``decode_taint_rule``), total and bounded (:mod:`~extender.dra.api`): any input gives a
  value, with a ``problem`` when part of it cannot be read, or None when it has no name.
* :mod:`~extender.dra.ledger`: :class:`ClaimsLedger`, the book: per node, the devices the GPU
  drivers advertise and the ones claims hold, charged to pods and claims
  (:mod:`~extender.dra.node_view`'s :class:`NodeDra`, rebuilt on write), over
  :mod:`~extender.dra.device_index` (each pool's newest generation).
* :mod:`~extender.dra.ownership`: whether a node's GPUs are the device plugin's, DRA's, or
  both's; :mod:`~extender.dra.gpu_indices`: held devices as schedext's GPU indices by UUID;
  :mod:`~extender.dra.capacity`: a DRA node's GPUs counted for filter and prioritize.
* :mod:`~extender.dra.fence`: the DeviceTaintRules schedext publishes on the GPUs it binds
  (``dra.fence``), named and diffed against those the ledger sees.
"""

from extender.dra.capacity import DraGpus, dra_gpus, uuid_groups
from extender.dra.claims import Allocated, Asked, Claim, decode_claim
from extender.dra.classes import DeviceClass, decode_device_class
from extender.dra.fence import (
    FENCE_EFFECT,
    FENCE_KEY,
    FENCE_PREFIX,
    HELD,
    FenceDiff,
    FenceRule,
    fence_diff,
    fence_name,
    is_fence,
)
from extender.dra.gpu_indices import GpuMapping, HeldGpu, Unmapped, held_gpus
from extender.dra.ledger import DEFAULT_GPU_DRIVER, ClaimsLedger, Problem
from extender.dra.node_view import Charge, DeviceState, HeldDevice, NodeDra
from extender.dra.ownership import Ownership, ownership
from extender.dra.pod_claims import PodClaims, decode_pod_claims
from extender.dra.slices import DeviceRef, DeviceTaint, ResourceSlice, SliceDevice, decode_slice
from extender.dra.taint_rules import MANAGED_BY, TaintRule, decode_taint_rule

__all__ = [
    "DEFAULT_GPU_DRIVER",
    "FENCE_EFFECT",
    "FENCE_KEY",
    "FENCE_PREFIX",
    "HELD",
    "MANAGED_BY",
    "Allocated",
    "Asked",
    "Charge",
    "Claim",
    "ClaimsLedger",
    "DeviceClass",
    "DeviceRef",
    "DeviceState",
    "DeviceTaint",
    "DraGpus",
    "FenceDiff",
    "FenceRule",
    "GpuMapping",
    "HeldDevice",
    "HeldGpu",
    "NodeDra",
    "Ownership",
    "PodClaims",
    "Problem",
    "ResourceSlice",
    "SliceDevice",
    "TaintRule",
    "Unmapped",
    "decode_claim",
    "decode_device_class",
    "decode_pod_claims",
    "decode_slice",
    "decode_taint_rule",
    "dra_gpus",
    "fence_diff",
    "fence_name",
    "held_gpus",
    "is_fence",
    "ownership",
    "uuid_groups",
]
