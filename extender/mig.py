"""MIG devices (NVIDIA Multi-Instance GPU), the core's rules: what a pod asks for, what a
node offers, which devices bind gives, and the filter's messages.

**Resources.** NVIDIA's "mixed" strategy: each MIG profile is its own resource,
``nvidia.com/mig-<profile>`` (``nvidia.com/mig-1g.10gb: 2``), served by the node agent's
device plugin; a GPU in MIG mode is never part of the whole-GPU resource. A pod may ask for
several profiles, in whole numbers, and never beside whole GPUs or GPU shares.

**Nodes.** The agent's topology document lists every GPU by NVML index, and each GPU in MIG
mode with its MIG devices (profile, UUID). Under the mixed strategy the node's allocatable
``nvidia.com/gpu`` leaves the GPUs in MIG mode out, so the document lists more GPUs than
allocatable counts: :func:`node_gpus` reads it when it lists exactly the allocatable GPUs
plus those in MIG mode (or, with a device plugin that counts MIG GPUs as whole ones, exactly
the allocatable GPUs), and then counts only the GPUs not in MIG mode as whole. A document
that matches neither is read as before MIG existed (groups only, no UUIDs, no MIG devices).

**Placement.** Bind packs (:func:`choose_mig`): a pod's MIG devices go onto the GPU with the
most MIG devices in use already, then the lowest index, so that idle GPUs stay idle; it
writes their UUIDs in ``schedext.io/mig-uuids``, which the agent's ``Allocate`` hands to the
containers and a restarted schedext reads back. Reconfiguring a GPU's MIG layout is not
schedext's: it schedules onto the layout the node has.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NamedTuple

from extender import fields
from extender.devices.document import Topology
from extender.devices.mig_slices import is_profile, pick_slices
from extender.fields import JSONObject
from extender.mig_state import MigView
from extender.model import Demand, Holding, MigSlot
from extender.names import MIG_RESOURCE_PREFIX
from extender.quantity import NANO

__all__ = [
    "GpuShape",
    "MigRequestError",
    "choose_mig",
    "demand",
    "held",
    "met_after",
    "mig_messages",
    "node_gpus",
    "resource_names",
]

_MAX_PROFILES = 8  # distinct profiles one pod asks for: more is not a real pod
_MAX_COUNT = 64  # MIG devices of one profile: more than any node has
_MAX_SCANNED = 64  # resource names looked at per pod, so a hostile spec costs little

Mig = tuple[tuple[str, int], ...]


class MigRequestError(ValueError):
    """A pod's MIG resources cannot be understood (becomes its PodRequestError)."""


def resource_names(spec: JSONObject) -> tuple[str, ...]:
    """The ``nvidia.com/mig-*`` resources the pod's containers (and init containers) name
    in requests or limits, sorted."""
    found: dict[str, None] = {}
    for kind in ("containers", "initContainers"):
        for container in fields.objects(spec, kind):
            block = fields.obj(container, "resources")
            for part in (fields.obj(block, "requests"), fields.obj(block, "limits")):
                for name in part:
                    if name.startswith(MIG_RESOURCE_PREFIX) and len(found) < _MAX_SCANNED:
                        found[name] = None
    return tuple(sorted(found))


def demand(totals: Mapping[str, int], resources: Sequence[str], *, beside: str | None) -> Mig:
    """A pending pod's MIG devices per profile, from its effective requests (nano-units);
    ``beside``: what else the pod takes (whole GPUs, a share), if anything. Raises
    :class:`MigRequestError` for a name that is not a profile, a fraction, too many, or MIG
    beside anything else."""
    asked: list[tuple[str, int]] = []
    for resource in resources:
        profile = resource[len(MIG_RESOURCE_PREFIX) :]
        if not is_profile(profile):
            raise MigRequestError(f"{resource} is not a MIG resource: {profile!r} is no profile")
        count, fraction = divmod(totals.get(resource, 0), NANO)
        if fraction:
            raise MigRequestError(
                f"{resource} must be a whole number, got {totals[resource] / NANO:g}"
            )
        if count > _MAX_COUNT:
            raise MigRequestError(f"{resource} must be at most {_MAX_COUNT}, got {count}")
        if count:
            asked.append((profile, count))
    if len(asked) > _MAX_PROFILES:
        raise MigRequestError(f"a pod may ask for at most {_MAX_PROFILES} MIG profiles")
    if asked and beside:
        raise MigRequestError(
            f"a pod takes MIG devices ({MIG_RESOURCE_PREFIX}*) or {beside}, not both: "
            "split it into two pods"
        )
    return tuple(asked)


def held(totals: Mapping[str, int], resources: Sequence[str]) -> Mig:
    """A bound pod's MIG devices per profile, read leniently (a bound pod is a fact: a
    fraction counts as the next whole device, a name that is no profile is left out)."""
    out = []
    for resource in resources:
        profile = resource[len(MIG_RESOURCE_PREFIX) :]
        count = -(-totals.get(resource, 0) // NANO)
        if is_profile(profile) and count > 0:
            out.append((profile, min(count, _MAX_COUNT)))
    return tuple(out[:_MAX_PROFILES])


class GpuShape(NamedTuple):
    """A node's GPUs as the inventory counts them (see the module docstring)."""

    gpu_count: int  # whole GPUs
    gpu_mig: tuple[int, ...]  # indices of the GPUs in MIG mode
    gpu_uuids: tuple[str, ...]  # by index, every GPU's; () when not published or not trusted
    mig_slices: tuple[MigSlot, ...]


def node_gpus(allocatable: int, topology: Topology) -> GpuShape:
    """The whole GPUs, MIG GPUs and MIG devices of a node whose allocatable GPU resource
    counts ``allocatable`` and whose agent published ``topology``."""
    listed = len(topology.gpus)
    mig = topology.mig_gpus()
    if mig and listed in (allocatable, allocatable + len(mig)):
        slices = tuple(
            MigSlot(gpu.index, s.profile, s.uuid) for gpu in topology.gpus for s in gpu.migs
        )
        return GpuShape(listed - len(mig), mig, topology.uuids(), slices)
    # Without MIG (or a document that fits no reading of it): UUIDs only when the document
    # lists exactly the GPUs allocatable counts.
    return GpuShape(allocatable, (), topology.uuids() if listed == allocatable else (), ())


def choose_mig(view: MigView, mig: Mig) -> tuple[str, ...] | None:
    """The UUIDs of the MIG devices to give a pod asking ``mig``, packed (see the module
    docstring; a pod's devices of several profiles pack onto each other too). None when
    the node lacks them."""
    busy = view.busy()
    chosen: list[str] = []
    for profile, count in mig:
        free = [(view.slots[position].gpu, position) for position in view.free(profile)]
        picked = pick_slices(sorted(free, key=lambda f: f[1]), busy, count)
        if picked is None:
            return None
        for position in picked:
            gpu = view.slots[position].gpu
            busy[gpu] = busy.get(gpu, 0) + 1
            chosen.append(view.slots[position].uuid)
    return tuple(chosen)


def met_after(view: MigView, need: Demand, victims: Sequence[Holding]) -> bool:
    """Whether the node has ``need``'s MIG devices free once ``victims`` are evicted (each
    frees the devices of every profile it asked for)."""
    for profile, count in need.mig:
        freed = sum(dict(victim.mig).get(profile, 0) for victim in victims)
        if len(view.free(profile)) + freed < count:
            return False
    return True


def mig_messages(mig: Mig) -> tuple[str, str]:
    """The filter's two MIG messages for a pod asking ``mig``: too few healthy MIG devices
    of its profiles on the node at all; too few free now. Named by the pod's need."""
    if len(mig) == 1:
        profile, count = mig[0]

        def some(kind: str) -> str:
            if count == 1:
                return f"no {kind} MIG {profile} slice"
            return f"fewer than {count} {kind} MIG {profile} slices"

        return f"schedext: node has {some('healthy')}", f"schedext: {some('free')}"
    need = ", ".join(f"{profile} x{count}" for profile, count in mig)
    return (
        f"schedext: node has too few healthy MIG slices for {need}",
        f"schedext: too few free MIG slices for {need}",
    )
