"""Drift: where the kubelet's record of which container holds which device disagrees with
what schedext placed and what the node agent granted.

The kubelet is the last word on a node's devices: its PodResources API (``List``) names, per
container of every active pod, the device IDs it assigned for each resource. The agent's
ledger (:class:`~extender.devices.allocation.NodePod`) says what schedext chose for each pod
on the node (``gpu_ids``/``gpu_uuids``) and what the agent granted it (``allocated``, the
pod-level union). :func:`find_drift` compares the two and finds:

- **GPUs in use that schedext does not account for** (:class:`InUse`, by :class:`Cause`):
  a container of a pod the agent's ledger does not know holds them (``unknown-pod``); a pod
  holds a device that is neither what schedext chose for it nor what the agent granted it
  (``not-given``: the kubelet's naming and the agent's grant disagree, or something else
  allocated it); or a pod schedext did not place holds a whole GPU the agent picked for it
  (``not-placed``: schedext counts such a pod's GPUs, but cannot know which indices they
  are). The extender treats every one of them as held.
- **Stale records** (:class:`StaleRecord`): a pod whose allocation record names devices but
  which the kubelet no longer lists at all. A pod is listed from its admission, which comes
  right after its ``Allocate`` wrote the record, and until its containers are gone, which
  the API server may show seconds later: a record missing for less than :data:`SETTLE_S` is
  not reported. Past the grace period the record is *released*: the agent no longer counts
  its devices as given (:func:`ledger_view`), as the kubelet no longer does.

Device IDs, per resource: the whole-GPU resource's are GPU UUIDs; the share handle's are
``<GPU UUID>::<k>`` (:func:`~extender.devices.share_handle.slot_gpu` gives the GPU); MIG
resources' (``nvidia.com/mig-<profile>``) are MIG device UUIDs. Other resources are none of
the agent's business and are left out.

Purely computational: the kubelet's answer, the ledger and ``now`` (wall-clock Unix seconds)
go in, a :class:`Drift` comes out. The agent reads, publishes and keeps the previous answer.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum

from extender import names
from extender.devices.allocation import NodePod
from extender.devices.gpus import Gpu
from extender.devices.share_handle import slot_gpu

__all__ = [
    "KUBELET_UID_PREFIX",
    "NO_DRIFT",
    "SETTLE_S",
    "Cause",
    "Drift",
    "DriftResources",
    "InUse",
    "KubeletDevices",
    "StaleRecord",
    "describe",
    "find_drift",
    "in_use_text",
    "ledger_view",
    "stale_text",
]

# A record the kubelet does not list for less than this is not reported: the kubelet lists a
# pod once admitted, a moment after its Allocate wrote the record, and the API server shows a
# finished pod's terminal phase seconds after the kubelet stops listing it.
SETTLE_S = 5.0

# The prefix of the UIDs :func:`ledger_view` gives the pods only the kubelet knows.
KUBELET_UID_PREFIX = "kubelet:"


class Cause(Enum):
    """Why a device in use is not accounted for by schedext's placements."""

    UNKNOWN_POD = "unknown-pod"  # the agent's ledger does not know the pod
    NOT_GIVEN = "not-given"  # neither schedext's choice for the pod nor the agent's grant
    NOT_PLACED = "not-placed"  # a whole GPU of a pod schedext did not place (index unknown)


@dataclass(frozen=True, slots=True)
class KubeletDevices:
    """One container's devices of one resource, as the kubelet's ``List`` names them."""

    namespace: str
    pod: str
    container: str
    resource: str
    device_ids: tuple[str, ...]

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.pod}"


@dataclass(frozen=True, slots=True)
class DriftResources:
    """The resources the agent serves: whole GPUs, the share handle (None: shares off) and
    the MIG profiles (by prefix)."""

    gpu: str = names.GPU_RESOURCE
    share: str | None = names.SHARE_COUNT_RESOURCE
    mig_prefix: str = names.MIG_RESOURCE_PREFIX

    def unit(self, resource: str, device_id: str) -> tuple[str, bool] | None:
        """What ``device_id`` of ``resource`` holds: (a GPU's or a MIG device's UUID, whether
        it is a MIG device); None for a resource the agent does not serve."""
        if resource == self.gpu:
            return device_id, False
        if self.share is not None and resource == self.share:
            return slot_gpu(device_id), False
        if resource.startswith(self.mig_prefix):
            return device_id, True
        return None


@dataclass(frozen=True, slots=True, order=True)
class InUse:
    """A device the kubelet says a container holds, which schedext does not account for."""

    uuid: str  # the GPU's UUID (whole, or the GPU of a share), or the MIG device's
    pod: str  # namespace/name
    container: str
    resource: str
    cause: Cause = dataclasses.field(compare=False)
    mig: bool = False


@dataclass(frozen=True, slots=True, order=True)
class StaleRecord:
    """A pod's allocation record that the kubelet no longer backs: it does not list the pod."""

    pod: str  # namespace/name
    uid: str
    uuids: tuple[str, ...]  # what the record names
    since: float  # wall-clock Unix seconds of the first read that did not list the pod
    released: bool = False  # past the grace period: the agent no longer counts the record


@dataclass(frozen=True, slots=True)
class Drift:
    """The drift of one node. ``missing``: per pod UID, since when the kubelet has not listed
    a pod with a record, reported or not yet (the next :func:`find_drift` call's memory)."""

    in_use: tuple[InUse, ...] = ()
    stale: tuple[StaleRecord, ...] = ()
    missing: Mapping[str, float] = dataclasses.field(default_factory=dict, compare=False)

    def __bool__(self) -> bool:
        return bool(self.in_use or self.stale)

    def released(self) -> frozenset[str]:
        """The UIDs of the pods whose records are released."""
        return frozenset(s.uid for s in self.stale if s.released)


NO_DRIFT = Drift()


def find_drift(
    kubelet: Iterable[KubeletDevices],
    pods: Sequence[NodePod],
    gpus: Sequence[Gpu],
    *,
    resources: DriftResources,
    now: float,
    grace_s: float,
    missing: Mapping[str, float] | None = None,
) -> Drift:
    """Compare the kubelet's ``List`` with the agent's ledger (see the module docstring).

    ``gpus``: this node's GPUs (schedext's ``gpu_ids`` are indices). ``missing``: the previous
    answer's :attr:`Drift.missing`, so that a record's absence is timed from the first read
    that missed it. A record is reported once missing for :data:`SETTLE_S`, and released once
    missing for ``grace_s``."""
    listed = list(kubelet)
    by_key: dict[str, NodePod] = {}
    for pod in sorted(pods, key=lambda p: p.uid):  # one pod per name, whatever the order
        by_key.setdefault(pod.key, pod)
    uuid_by_index = {gpu.index: gpu.uuid for gpu in gpus}
    in_use: dict[tuple[str, str], InUse] = {}
    for entry in sorted(listed, key=lambda e: (e.key, e.container, e.resource)):
        known = by_key.get(entry.key)
        for device_id in entry.device_ids:
            unit = resources.unit(entry.resource, device_id)
            if unit is None:
                continue
            uuid, mig = unit
            cause = _cause(
                known, uuid, whole=entry.resource == resources.gpu, by_index=uuid_by_index
            )
            if cause is not None:
                found = InUse(uuid, entry.key, entry.container, entry.resource, cause, mig)
                in_use.setdefault((uuid, entry.key), found)
    stale, still = _stale(listed, pods, now=now, grace_s=grace_s, missing=missing or {})
    return Drift(in_use=tuple(sorted(in_use.values())), stale=stale, missing=still)


def _cause(
    pod: NodePod | None, uuid: str, *, whole: bool, by_index: Mapping[int, str]
) -> Cause | None:
    if pod is None:
        return Cause.UNKNOWN_POD
    chosen = pod.gpu_uuids
    if chosen is None and pod.gpu_ids is not None:
        chosen = tuple(by_index[i] for i in pod.gpu_ids if i in by_index)
    if uuid not in pod.allocated and uuid not in (chosen or ()):
        return Cause.NOT_GIVEN
    if whole and pod.gpu_ids is None:
        return Cause.NOT_PLACED
    return None


def _stale(
    listed: Sequence[KubeletDevices],
    pods: Sequence[NodePod],
    *,
    now: float,
    grace_s: float,
    missing: Mapping[str, float],
) -> tuple[tuple[StaleRecord, ...], dict[str, float]]:
    keys = {entry.key for entry in listed}
    still: dict[str, float] = {}
    stale: list[StaleRecord] = []
    for pod in pods:
        if not pod.allocated or pod.key in keys:
            continue
        since = still[pod.uid] = min(missing.get(pod.uid, now), now)
        if now - since >= SETTLE_S:
            released = now - since >= grace_s
            stale.append(StaleRecord(pod.key, pod.uid, pod.allocated, since, released))
    return tuple(sorted(stale)), still


def ledger_view(
    pods: Sequence[NodePod], drift: Drift, *, whole: str = names.GPU_RESOURCE
) -> tuple[NodePod, ...]:
    """The pods the agent's allocation decisions should see, given ``drift``: without the
    pods whose records are released (their devices are free as far as the kubelet knows),
    and with a stand-in for each pod only the kubelet knows, holding the whole GPUs (of the
    ``whole`` resource) and MIG devices the kubelet says it holds, so that the agent never
    picks those for another pod. A stand-in never waits for an ``Allocate`` (it holds as many
    devices as it asks for).

    A share an unknown pod holds is left out: its GPU may carry other shares. Devices a known
    pod holds against its record (``not-given``) are left to the pod: the agent granted it
    others, which is what the container got."""
    released = drift.released()
    kept = [pod for pod in pods if pod.uid not in released]
    foreign: dict[str, list[str]] = {}
    for use in drift.in_use:
        if use.cause is Cause.UNKNOWN_POD and (use.mig or use.resource == whole):
            foreign.setdefault(use.pod, []).append(use.uuid)
    for key, uuids in sorted(foreign.items()):
        namespace, _, name = key.partition("/")
        held = tuple(dict.fromkeys(uuids))
        kept.append(
            NodePod(
                uid=KUBELET_UID_PREFIX + key,
                namespace=namespace,
                name=name,
                gpus=len(held),
                allocated=held,
            )
        )
    return tuple(kept)


# ---------------------------------------------------------------------------- sentences

_WHY = {
    Cause.UNKNOWN_POD: "a container schedext did not place",
    Cause.NOT_GIVEN: "{pod}/{container}, which was given other devices",
    Cause.NOT_PLACED: "{pod}, a pod schedext did not place",
}


def in_use_text(use: InUse, index: int | None) -> str:
    """``GPU 3 in use by a container schedext did not place (kubelet: ns/pod/container)``."""
    device = f"MIG device {use.uuid}" if use.mig else f"GPU {use.uuid if index is None else index}"
    why = _WHY[use.cause].format(pod=use.pod, container=use.container)
    return f"{device} in use by {why} (kubelet: {use.pod}/{use.container})"


def stale_text(record: StaleRecord, indices: Sequence[int | None]) -> str:
    """``stale record: ns/pod holds GPUs 2, 3 but the kubelet no longer lists it (released)``."""
    named = [
        str(i) if i is not None else uuid for i, uuid in zip(indices, record.uuids, strict=True)
    ]
    state = "released" if record.released else "not yet released"
    devices = f"GPU{'s' if len(named) > 1 else ''} {', '.join(named)}"
    return (
        f"stale record: {record.pod} holds {devices} but the kubelet no longer lists it ({state})"
    )


def describe(drift: Drift, index_of: Mapping[str, int]) -> tuple[str, ...]:
    """One sentence per drift entry, GPUs by index where ``index_of`` (UUID to index) knows
    them: what explain, the inventory and the events show."""
    lines = [in_use_text(use, None if use.mig else index_of.get(use.uuid)) for use in drift.in_use]
    lines += [stale_text(s, [index_of.get(u) for u in s.uuids]) for s in drift.stale]
    return tuple(lines)
