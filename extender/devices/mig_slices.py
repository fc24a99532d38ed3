"""MIG devices by profile: the profile names (what NVML calls a MIG device, what the
resource is called), and which free MIG devices of one node a pod gets. The one rule both
halves use: schedext's bind for the devices it writes on the pod (``extender.mig``) and the
node agent for pods schedext did not bind (``extender.devices.mig_allocation``).

A profile is NVIDIA's name for a MIG device's size: ``1g.10gb`` (one compute slice, 10 GB),
``3g.40gb``, ``1g.10gb+me``, ``1c.3g.40gb``. NVIDIA's "mixed" strategy advertises each as its
own resource, ``nvidia.com/mig-<profile>``; schedext uses the same names so that pod specs
written for NVIDIA's device plugin schedule unchanged.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import TypeVar

from extender import names

__all__ = ["MAX_PROFILE", "is_profile", "pick_slices", "profile_from_name", "resource_name"]

MAX_PROFILE = 40  # "1c.3g.40gb+me" is 13: a longer name is not a profile
# Lower case letters, digits and the profile's punctuation; no spaces, no slashes: it is the
# last part of a resource name.
_PROFILE = re.compile(r"[a-z0-9]([a-z0-9.+_-]{0,38}[a-z0-9])?")
# nvmlDeviceGetName of a MIG device: "NVIDIA H100 80GB HBM3 MIG 1g.10gb".
_MIG_NAME = " MIG "
T = TypeVar("T")


def is_profile(text: str) -> bool:
    """Whether ``text`` can be a MIG profile name (and so a resource name's last part)."""
    return bool(_PROFILE.fullmatch(text))


def profile_from_name(name: str) -> str | None:
    """The profile in a MIG device's NVML name ("NVIDIA H100 80GB HBM3 MIG 1g.10gb" gives
    "1g.10gb"): what follows the last " MIG ". None when the name carries none."""
    _, marker, profile = name.rpartition(_MIG_NAME)
    profile = profile.strip()
    return profile if marker and is_profile(profile) else None


def resource_name(profile: str) -> str:
    """``nvidia.com/mig-<profile>``, the resource of a profile's MIG devices."""
    return f"{names.MIG_RESOURCE_PREFIX}{profile}"


def pick_slices(
    free: Sequence[tuple[int, T]], busy: Mapping[int, int], count: int
) -> tuple[T, ...] | None:
    """``count`` of the ``free`` MIG devices ((GPU index, the device) in the node's order),
    packed:
    on the GPU with the most MIG devices in use first (``busy``: in use per GPU index), then
    the lowest GPU index, then the node's order. Packing keeps whole GPUs' worth of MIG
    devices free together, for pods that need several, and leaves idle GPUs idle. None when
    fewer than ``count`` are free."""
    if count <= 0:
        return ()
    if len(free) < count:
        return None
    order = sorted(range(len(free)), key=lambda i: (-busy.get(free[i][0], 0), free[i][0], i))
    return tuple(free[i][1] for i in order[:count])
