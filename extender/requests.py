"""Decoding what a pod asks for (``PodRequest``) and what a bound pod holds (``Holding``),
from its effective request per resource (:mod:`extender.resource_totals`)."""

from __future__ import annotations

import dataclasses
import functools
import ipaddress
from collections.abc import Mapping
from typing import Any

from extender import asks, fields, mig, names
from extender.config import ShareResources, lenient
from extender.dra import decode_pod_claims
from extender.errors import PodRequestError
from extender.fields import JSONObject
from extender.model import (
    NO_SHARE,
    ClaimPolicy,
    GpuShare,
    Holding,
    HoldingKind,
    IPRequest,
    PodRequest,
    WorkloadClass,
)
from extender.quantity import NANO
from extender.resource_totals import CPU, MEMORY

__all__ = [
    "PodRequestError",
    "gpu_ids_annotation",
    "group_key",
    "holding_from_pod",
    "pod_request",
    "statefulset_identity",
]

_DEFAULT_SHARES = ShareResources()
_MAX_SHARE_MIB = 1 << 24  # 16 TiB: a larger share is a unit mistake (10Gi read as MiB)
_MAX_SHARES = 64  # more GPUs than any node has: a larger count is a typo
_TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})
_WORKLOADS = {w.value.casefold(): w for w in WorkloadClass if w.value}


def pod_request(
    pod: JSONObject,
    *,
    gpu_resource: str = names.GPU_RESOURCE,
    shares: ShareResources = _DEFAULT_SHARES,
) -> PodRequest:
    """Decode the scheduling needs of ``pod``; raise :class:`PodRequestError` with a reason,
    also for a field schedext reads that is of the wrong JSON type (``metadata.annotations``
    a list, ``spec`` a string: :func:`extender.fields.strict_obj`): never read as absent,
    which would drop the rule it states."""
    try:
        return _pod_request(pod, gpu_resource, shares)
    except fields.ShapeError as error:
        raise PodRequestError(str(error)) from None


def _pod_request(pod: JSONObject, gpu_resource: str, shares: ShareResources) -> PodRequest:
    meta = fields.strict_obj(pod, "metadata", "")
    spec = fields.strict_obj(pod, "spec", "")
    mig_names, totals = asks.asked(spec, _resources(gpu_resource, shares))
    gpus, share = _gpus_or_share(totals, gpu_resource, shares, spec=spec)
    beside = f"whole GPUs ({gpu_resource})" if gpus else "GPU shares" if share else None
    try:
        asked = mig.demand(totals, mig_names, beside=beside)
    except mig.MigRequestError as error:
        raise PodRequestError(str(error)) from None
    labels = fields.strict_string_map(meta, "labels", "metadata")
    annotations = fields.strict_string_map(meta, "annotations", "metadata")
    return PodRequest(
        **_demand(meta, spec, totals, gpus=gpus, share=share, migs=asked, strict=True),
        workload=_workload(labels, annotations),
        gpu_model=_hint(annotations, labels, names.GPU_MODEL),
        gpu_memory_mib=_gpu_memory(annotations, labels),
        preempt_never=fields.strict_text(spec, "preemptionPolicy", "spec") == "Never",
        ip=_ip_request(meta, annotations),
        soft_preferences=_states_preferences(spec),
        claims=_claims(pod, spec),
        topology=_topology(annotations) if group_key(meta) is not None else (),
    )


def _topology(annotations: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """A gang member's topology annotations (Kueue writes its podset's on the pods)."""
    return tuple(sorted((k, v) for k, v in annotations.items() if k in names.TOPOLOGY_KEYS))


def _claims(pod: JSONObject, spec: JSONObject) -> tuple[str, ...]:
    """The DRA claims the pod names ("namespace/name"; most pods name none: no decoding)."""
    if not fields.get(spec, "resourceClaims"):
        return ()
    claims = decode_pod_claims(pod)
    return claims.keys if claims is not None else ()


_PREFERRED = "preferredDuringSchedulingIgnoredDuringExecution"


def _states_preferences(spec: JSONObject) -> bool:
    """Whether the pod asks kube-scheduler's Score plugins for something: a preferred node or
    pod (anti-)affinity term, or a topology spread it may break (``ScheduleAnyway``)."""
    affinity = fields.obj(spec, "affinity")
    if any(fields.objects(fields.obj(affinity, kind), _PREFERRED) for kind in _AFFINITIES):
        return True
    spreads = fields.objects(spec, "topologySpreadConstraints")
    return any(fields.text(c, "whenUnsatisfiable") == "ScheduleAnyway" for c in spreads)


_AFFINITIES = ("nodeAffinity", "podAffinity", "podAntiAffinity")


@functools.lru_cache(maxsize=8)  # one or two configurations a process: not per pod
def _resources(gpu_resource: str, shares: ShareResources) -> tuple[str, ...]:
    return tuple(dict.fromkeys((CPU, MEMORY, gpu_resource, *shares.names())))


def _whole(totals: Mapping[str, int], resource: str, unit: str) -> int:
    """A resource that counts things, as an integer; PodRequestError when it is a fraction."""
    count, fraction = divmod(totals[resource], NANO)
    if fraction:
        raise PodRequestError(
            f"{resource} must be a whole number{unit}, got {totals[resource] / NANO:g}"
        )
    return count


def _gpus_or_share(
    totals: Mapping[str, int],
    gpu_resource: str,
    shares: ShareResources,
    *,
    spec: JSONObject | None = None,
) -> tuple[int, GpuShare]:
    """Whole GPUs, or a share of some GPUs: never both in one pod (a container that needs a
    whole device and one that needs a slice are two pods' worth of placement). ``spec``: a
    pending pod's, to tell a count of 0 from none (a bound pod's is read leniently)."""
    unit = " of GiB" if shares.memory_unit_mib == 1024 else " of MiB"
    memory = _whole(totals, shares.memory, unit) * shares.memory_unit_mib
    cores = _whole(totals, shares.cores, " percent") if shares.cores else 0
    count_shares = shares.count == gpu_resource  # HAMi: nvidia.com/gpu counts the shares
    count = _whole(totals, shares.count, "") if shares.count and not count_shares else 0
    gpus = _whole(totals, gpu_resource, "")
    if not (memory or cores or count):
        return gpus, NO_SHARE
    if count_shares:
        gpus, count = 0, gpus
    if gpus:
        raise PodRequestError(
            f"a pod takes whole GPUs ({gpu_resource}) or shares of GPUs ({shares.memory}), "
            "not both: split it into two pods"
        )
    if not memory:
        raise PodRequestError(f"a GPU share needs {shares.memory} (the memory it may use)")
    if memory > _MAX_SHARE_MIB:
        raise PodRequestError(
            f"{shares.memory} counts{unit[3:]}: {memory} MiB is more than any GPU has "
            f"(for 10 GiB of {shares.memory}, write {10240 // shares.memory_unit_mib}, not 10Gi)"
        )
    if cores and not 1 <= cores <= 100:
        raise PodRequestError(
            f"{shares.cores} must be 1 to 100 (percent of a GPU's SMs; 0, as left out, sets no "
            f"limit), got {cores}"
        )
    if shares.count is not None and not count:
        if spec is not None and _names(spec, shares.count):
            raise PodRequestError(
                f"{shares.count} must be at least 1 (on how many GPUs the share is), got 0"
            )
        if shares.count_required:
            raise PodRequestError(
                f"a GPU share must name {shares.count} in its limits (1 for a share of one "
                "GPU): the node agent gives a share its GPU through that resource"
            )
        count = 1
    if shares.count is None:
        count = 1
    if count > _MAX_SHARES:
        raise PodRequestError(f"{shares.count} must be at most {_MAX_SHARES}, got {count}")
    return 0, GpuShare(count, memory, cores)


def _names(spec: JSONObject, resource: str) -> bool:
    """Whether a container of ``spec`` names ``resource`` in its requests or limits."""
    for kind in ("containers", "initContainers"):
        for container in fields.objects(spec, kind):
            block = fields.obj(container, "resources")
            if resource in fields.obj(block, "requests") or resource in fields.obj(block, "limits"):
                return True
    return False


def holding_from_pod(
    pod: JSONObject,
    *,
    gpu_resource: str = names.GPU_RESOURCE,
    shares: ShareResources = _DEFAULT_SHARES,
) -> Holding | None:
    """What a bound, non-terminal pod holds on its node; None for pods that hold nothing."""
    spec = fields.obj(pod, "spec")
    node = fields.text(spec, "nodeName")
    phase = fields.text(fields.obj(pod, "status"), "phase")
    if not node or phase in _TERMINAL_PHASES:
        return None
    meta = fields.obj(pod, "metadata")
    try:
        mig_names, totals = asks.asked(spec, _resources(gpu_resource, shares))
    except PodRequestError:
        # A bound pod is a fact, not a request: count what we cannot read as nothing rather
        # than losing the whole pod (its GPU ids, if annotated, still count below).
        mig_names = mig.resource_names(spec)
        totals = dict.fromkeys(_resources(gpu_resource, shares) + mig_names, 0)
    annotations = fields.string_map(meta, "annotations")
    gpu_ids = gpu_ids_annotation(annotations.get(names.GPU_IDS))
    share = _held_share(totals, gpu_resource, shares, annotations)
    gpus = 0 if share else max(0, _ceil_div(totals[gpu_resource], NANO))
    if gpu_ids is not None and len(gpu_ids) != (share.devices or gpus):
        # The annotation is what the node agent was told to expose; trust it for the count too.
        if share:
            share = dataclasses.replace(share, devices=len(gpu_ids))
        else:
            gpus = len(gpu_ids)
    uuids = gpu_uuids_annotation(annotations.get(names.GPU_UUIDS))
    return Holding(
        **_demand(meta, spec, totals, gpus=gpus, share=share, migs=mig.held(totals, mig_names)),
        node=node,
        kind=HoldingKind.BOUND,
        gpu_ids=gpu_ids,
        gpu_uuids=uuids if gpu_ids is not None and uuids and len(uuids) == len(gpu_ids) else None,
        mig_uuids=gpu_uuids_annotation(annotations.get(names.MIG_UUIDS)),
        running=phase == "Running",
        ip=_held_address(annotations.get(names.IP)),
        ip_pool=annotations.get(names.IP_POOL) or None,
    )


def _held_share(
    totals: Mapping[str, int],
    gpu_resource: str,
    shares: ShareResources,
    annotations: Mapping[str, str],
) -> GpuShare:
    """A bound pod's share: what bind wrote (the annotations are the record), else what its
    resources ask, read leniently: a bound pod is counted, never refused."""
    try:
        asked = _gpus_or_share(totals, gpu_resource, lenient(shares))[1]
    except PodRequestError:
        asked = NO_SHARE
    memory = fields.whole_number(annotations.get(names.GPU_SHARE_MEMORY, "").strip())
    if not memory:
        return asked
    cores = fields.whole_number(annotations.get(names.GPU_SHARE_CORES, "").strip())
    return GpuShare(asked.devices or 1, memory, min(100, cores or 0))


def _demand(
    meta: JSONObject,
    spec: JSONObject,
    totals: Mapping[str, int],
    *,
    gpus: int,
    share: GpuShare = NO_SHARE,
    migs: tuple[tuple[str, int], ...] = (),
    strict: bool = False,
) -> dict[str, Any]:
    """The fields of :class:`~extender.model.Demand`, read the same way for a pending pod and
    a bound one (``gpus``: the caller's reading of the GPU total, which differs). ``strict``
    (a pending pod): a field that is not what Kubernetes says it is raises
    :class:`PodRequestError`; a bound pod is a fact, and counted as well as it can be."""
    text = _strict_text if strict else _text
    return {
        "uid": text(meta, "uid"),
        "namespace": text(meta, "namespace") or "default",
        "name": text(meta, "name"),
        "gpus": gpus,
        "share": share,
        "mig": migs,
        "cpu_milli": _ceil_div(totals[CPU], NANO // 1000),
        "memory_bytes": _ceil_div(totals[MEMORY], NANO),
        "priority": _priority(spec, strict=strict),
        "group": group_key(meta),
    }


def _strict_text(meta: JSONObject, name: str) -> str:
    return fields.strict_text(meta, name, "metadata")


def _text(meta: JSONObject, name: str) -> str:
    return fields.text(meta, name)


_INT32 = range(-(2**31), 2**31)


def _priority(spec: JSONObject, *, strict: bool) -> int:
    """``spec.priority``, an int32 that the API server sets from the priority class; absent:
    0, as kube-scheduler reads it. Anything else is refused, never read as 0: it decides who
    may evict whom."""
    value = fields.get(spec, "priority")
    if value is None:
        return 0
    if type(value) is int and value in _INT32:
        return value
    if strict:
        raise PodRequestError(
            f"spec.priority must be a whole number (an int32, as the priority class sets it), "
            f"got {fields.quoted(value)}"
        )
    return 0


def statefulset_identity(meta: JSONObject) -> str | None:
    """``sts/<namespace>/<statefulset>/<ordinal>`` for a pod a StatefulSet controls."""
    owner = next(
        (
            o
            for o in fields.objects(meta, "ownerReferences")
            if fields.text(o, "kind") == "StatefulSet" and fields.get(o, "controller") is True
        ),
        None,
    )
    if owner is None:  # most pods: no name to take apart
        return None
    prefix, _, text = fields.text(meta, "name").rpartition("-")
    ordinal = fields.whole_number(text)
    if ordinal is None or prefix != fields.text(owner, "name"):
        return None
    namespace = fields.text(meta, "namespace") or "default"
    return f"sts/{namespace}/{prefix}/{ordinal}"


def _ip_request(meta: JSONObject, annotations: Mapping[str, str]) -> IPRequest | None:
    address, pools = annotations.get(names.IP), annotations.get(names.IP_POOL)
    policy_text = annotations.get(names.IP_POLICY, "").strip()
    if address is None and pools is None:
        if policy_text:
            raise PodRequestError(
                f"annotation {names.IP_POLICY} needs {names.IP_POOL} or {names.IP} as well"
            )
        return None
    normalized = None
    if address is not None:
        try:
            normalized = str(ipaddress.ip_address(address.strip()))
        except ValueError:
            raise PodRequestError(
                f"annotation {names.IP}={address!r} is not an IP address"
            ) from None
    pool_names = tuple(p.strip() for p in (pools or "").split(",") if p.strip())
    if pools is not None and not pool_names:
        raise PodRequestError(f"annotation {names.IP_POOL} names no pool")
    policy = None
    identity = None
    if policy_text:
        try:
            policy = ClaimPolicy(policy_text)
        except ValueError:
            allowed = " or ".join(p.value for p in ClaimPolicy)
            raise PodRequestError(
                f"annotation {names.IP_POLICY}={policy_text!r} must be {allowed}"
            ) from None
        identity = statefulset_identity(meta)
        if identity is None:
            raise PodRequestError(
                f"annotation {names.IP_POLICY} needs a pod of a StatefulSet (<name>-<ordinal>)"
            )
    return IPRequest(address=normalized, pools=pool_names, policy=policy, identity=identity)


def _held_address(value: str | None) -> str | None:
    if value is None:
        return None
    try:
        return str(ipaddress.ip_address(value.strip()))
    except ValueError:
        return None


def group_key(meta: JSONObject) -> str | None:
    """``namespace/name`` of the PodGroup a pod joins with the coscheduling label."""
    group = fields.string_map(meta, "labels").get(names.POD_GROUP_LABEL, "").strip()
    if not group:
        return None
    return f"{fields.text(meta, 'namespace') or 'default'}/{group}"


def gpu_ids_annotation(value: str | None) -> tuple[int, ...] | None:
    """Parse ``schedext.io/gpu-ids`` ("0,1,3"); None when absent or unreadable."""
    if value is None:
        return None
    parts = [fields.whole_number(p.strip()) for p in value.split(",") if p.strip()]
    if not parts or None in parts:
        return None
    ids = tuple(sorted({p for p in parts if p is not None}))
    return ids if len(ids) == len(parts) else None


_MAX_UUIDS = 64  # more than any node has GPUs: a longer list is not ours


def gpu_uuids_annotation(value: str | None) -> tuple[str, ...] | None:
    """Parse ``schedext.io/gpu-uuids`` ("GPU-a,GPU-b"), or ``schedext.io/mig-uuids``; None
    when absent or unreadable."""
    if value is None or len(value) > _MAX_UUIDS * 64:
        return None
    parts = [p.strip() for p in value.split(",")]
    if not parts or len(parts) > _MAX_UUIDS or not all(parts) or len(set(parts)) != len(parts):
        return None
    return tuple(parts)


def _ceil_div(value: int, unit: int) -> int:
    return -((-value) // unit)


def _hint(annotations: Mapping[str, str], labels: Mapping[str, str], key: str) -> str | None:
    value = annotations.get(key, labels.get(key))
    if value is None:
        return None
    return value.strip() or None


def _workload(labels: Mapping[str, str], annotations: Mapping[str, str]) -> WorkloadClass:
    raw = labels.get(names.WORKLOAD_TYPE, annotations.get(names.WORKLOAD_TYPE))
    if raw is None or not raw.strip():
        return WorkloadClass.UNSPECIFIED
    workload = _WORKLOADS.get(raw.strip().casefold())
    if workload is None:
        allowed = " or ".join(w.value for w in WorkloadClass if w.value)
        raise PodRequestError(f"label {names.WORKLOAD_TYPE}={raw!r} must be {allowed}")
    return workload


def _gpu_memory(annotations: Mapping[str, str], labels: Mapping[str, str]) -> int | None:
    raw = _hint(annotations, labels, names.GPU_MEMORY_MIB)
    if raw is None:
        return None
    mib = fields.whole_number(raw)
    if not mib:
        raise PodRequestError(
            f"annotation {names.GPU_MEMORY_MIB}={fields.quoted(raw)} must be a positive whole "
            "number of MiB"
        )
    return mib
