"""``GET /inventory``: GPU occupancy per node, IP pools and gangs, as JSON (for operators,
the occupancy page and the tests).

Per GPU, ``holder`` names the pod holding it whole; ``share`` is null unless pods hold shares
of it, and then says what they hold in all (``memoryMiB``, ``cores``), the memory a new share
still has (``memoryFreeMiB``), and each of them (``pods``).

``quotas`` lists the team quotas that apply, one per namespace, and per resource each names:
``min``, ``used`` and ``max`` (null: no ceiling) in the core's unit (``unit``), the same as
Kubernetes quantities (``quantities``), and whether the min is stated (``guarantees``: only
then does the namespace lend and borrow it). ``shadowedQuotas``: second quotas of a
namespace, which do not apply, each with the one that does (``by``).

Per node, ``pools`` names the IP pools whose node selector picks it, and ``mig`` its MIG
devices per profile (``devices`` on healthy GPUs, ``free``). ``drift`` lists, one sentence
each, where the node's kubelet disagrees with schedext's placements (its agent's
``schedext.io/gpu-drift``), and per GPU ``inUse`` says who the kubelet says uses it when that
is not accounted for (null otherwise): such a GPU is held. ``driftProblem`` says why the
drift document was not read, if it was not. ``gpuOwner`` says who hands out its GPUs
(``device-plugin``, ``dra`` or ``mixed``), and ``dra`` what DRA says of it (null where DRA
knows nothing of it): the GPU drivers with slices for it; the devices advertised
(``devices``: uuid, pcieRoot, memory, ``unhealthy``: the taints that keep it from new pods,
``problem``: why it cannot be read), the ones claims hold (``heldDevices``: the GPU index it
is by the agent's UUIDs, or ``unmapped`` and why; the claims, the pods as "namespace/name"
(the UID where the name is unknown), the memory of its shares), and the held ones no slice
has readably (``unknownDevices``, with the reason); each list the first :data:`DRA_LISTED`,
and ``advertised``, ``held`` and ``unknown`` count them all. ``pending`` lists the pending
pods schedext knows (the first :data:`PENDING_LISTED` by namespace and name; ``pendingPods``
counts them all), each with what it asks for, and ``why``: why the last filter turned it away
(each reason and how many nodes it turned away; null when no filter did).

Per gang, beside the PodGroup status fields: the seconds its members still wait at the bind
barrier (``waitLeftSeconds``, null when none waits), and how its last wait ended without the
group completing (``lastFailure``: ``outcome`` ``timed_out`` or ``released``, and the
``reason``; null once it completes). ``hold``: the GPUs kept for a gang that waited too long
(docs/gangs.md), null when none stands: how many (``gpus``), on which nodes (``nodes``: name
to GPUs), the required topology level and domain they lie in (``level``, ``domain``; "" for
none), when it started, when it expires and since when the gang waits (``started``,
``expires``, ``waitingSince``: RFC 3339, UTC), the seconds it has left (``leftSeconds``) and
the GPU-seconds it has kept free GPUs idle so far (``idleGpuSeconds``: its cost).
``holdWhyNot`` says why a gang that waited long enough has no hold ("" when none is known).

:func:`document` is also what the read-only views port serves (app.service.views_listener)."""

from __future__ import annotations

import datetime as dt
import ipaddress
import time
from collections.abc import Sequence
from typing import Any

import orjson
from fastapi import APIRouter, Request, Response

from app.service.assembly import Service
from extender.devices.drift import describe
from extender.dra import DeviceRef, held_gpus
from extender.gang.holds import Hold
from extender.model import Holding, HoldingKind, PodRequest
from extender.node_state import NodeView
from extender.quotas import Kind, QuotaSpec
from extender.quotas.spec import show_amount
from extender.scheduler import Scheduler

__all__ = ["document", "router"]

router = APIRouter()

# The answer stays bounded however many pods wait: the page lists these, and counts the rest.
PENDING_LISTED = 500
# Per node, the DRA devices (and per device, the claims and pods) each list of ``dra`` shows.
DRA_LISTED = 64


@router.get("/inventory")
async def inventory(request: Request) -> Response:
    service: Service = request.app.state.service
    unsynced = service.not_synced()
    if unsynced:  # an empty inventory would look like a cluster with no GPUs
        body = {"Error": f"{unsynced}: no inventory to show yet"}
        return Response(orjson.dumps(body), status_code=503, media_type="application/json")
    return Response(orjson.dumps(document(service)), media_type="application/json")


def document(service: Service) -> dict[str, Any]:
    """The inventory as ``GET /inventory`` answers it."""
    inv = service.scheduler.inventory
    nodes: list[dict[str, Any]] = []
    for name in sorted(inv.node_names()):
        view = inv.node(name)
        if view is None:
            continue
        holders = {h.uid: h for h in view.holdings}
        group_of = {i: g for g, members in enumerate(view.spec.gpu_groups) for i in members}
        uuids = view.spec.gpu_uuids
        unhealthy = dict(view.spec.gpu_unhealthy)
        in_use: dict[int, list[str]] = {}
        for outside in view.spec.gpu_in_use:
            in_use.setdefault(outside.gpu, []).append(outside.why)
        sample = view.spec.gpu_use
        use = {
            u.index: {"utilisation": u.utilisation, "memoryUsedMiB": u.memory_used_mib}
            for u in (sample.gpus if sample is not None else ())
        }
        nodes.append(
            {
                "name": name,
                "gpuModel": view.spec.gpu_model,
                "gpuMemoryMiB": view.spec.gpu_memory_mib,
                "gpus": [
                    {
                        "index": index,
                        "uuid": uuids[index] if index < len(uuids) else None,
                        "group": group_of.get(index),
                        "holder": holders[uid].key if uid in holders else None,
                        "reserved": uid in holders and holders[uid].kind.value == "reserved",
                        "unhealthy": unhealthy.get(index),
                        "inUse": "; ".join(in_use[index]) if index in in_use else None,
                        "use": use.get(index),
                        "share": _share(view, index, holders),
                    }
                    for index, uid in enumerate(view.holders)
                ],
                "anonymousGpus": view.anonymous_gpus,
                "pools": list(inv.addresses.pools_selecting(view.spec.labels)),
                "mig": {
                    profile: {"devices": count.healthy, "free": count.free}
                    for profile, count in view.mig.counts().items()
                },
                "freeGpus": len(view.free_gpu_ids),
                # device-plugin, dra or mixed (both advertise the GPUs): docs/dra.md
                "gpuOwner": service.scheduler.gpu_owner(name).value,
                "dra": _dra(service.scheduler, name, uuids),
                "sharedGpus": sum(1 for uids in view.share_holders if uids),
                "cpuMilli": {"allocatable": view.spec.cpu_milli, "free": view.cpu_free},
                "topologyProblem": view.spec.topology_problem,
                "useProblem": view.spec.use_problem,
                "drift": list(_drift(view)),
                "driftProblem": view.spec.drift_problem,
                "useSampledAt": sample.at if sample is not None else None,
            }
        )
    book = inv.addresses
    pools = [
        {
            "name": pool.name,
            "size": pool.size,
            "free": book.free_count(pool),
            "allocated": pool.size - book.free_count(pool),
            "nodeSelector": dict(pool.node_selector),
            "problem": pool.problem,
            "holders": sorted(
                ({"address": str(ipaddress.ip_address(u.address)), "pod": u.pod, "node": u.node}
                 for u in book.uses_in(pool)),
                key=lambda h: ipaddress.ip_address(h["address"]),
            ),
        }
        for pool in sorted(book.pools(), key=lambda p: p.name)
    ]  # fmt: skip
    gangs = []
    now, wall = service.clock(), time.time()  # the barrier's deadlines; holds' Unix times
    for spec in sorted(service.scheduler.pod_groups(), key=lambda g: g.key):
        status = service.scheduler.group_status(spec.key)
        if status is None:
            continue
        deadline = service.scheduler.gang_deadline(spec.key)
        failure = service.scheduler.gang_failure(spec.key)
        hold, why_not = service.scheduler.gang_hold(spec.key)
        gangs.append(
            {
                "group": spec.key,
                "minMember": spec.min_member,
                "members": status.members,
                "scheduled": status.scheduled,
                "running": status.running,
                "waiting": status.waiting,
                "phase": status.phase,
                "waitLeftSeconds": None if deadline is None else round(max(0.0, deadline - now), 1),
                "lastFailure": None
                if failure is None
                else {"outcome": failure.kind.value, "reason": failure.reason},
                "hold": _hold(service.scheduler, hold, wall) if hold is not None else None,
                "holdWhyNot": why_not,
            }
        )
    return {
        "nodes": nodes,
        "pools": pools,
        "gangs": gangs,
        "quotas": [_quota(service.scheduler, spec) for spec in service.scheduler.quotas()],
        "shadowedQuotas": [
            {"quota": entry.quota.key, "by": entry.by.key}
            for entry in service.scheduler.shadowed_quotas()
        ],
        "pendingPods": service.scheduler.pending_count,
        "pending": [
            {**_pending(r), "why": service.scheduler.pending_why(r.uid) or None}
            for r in service.scheduler.pending_pods(PENDING_LISTED)
        ],
        "reservations": service.scheduler.reservation_count,
    }


def _hold(scheduler: Scheduler, hold: Hold, wall: float) -> dict[str, Any]:
    """A gang's hold as ``gangs[].hold`` shows it (times as its PodGroup's record has them)."""
    return {
        "gpus": hold.gpus,
        "nodes": dict(hold.need),
        "level": hold.level,
        "domain": hold.domain,
        "started": _rfc3339(hold.started),
        "expires": _rfc3339(hold.expires),
        "waitingSince": _rfc3339(hold.waiting_since),
        "leftSeconds": round(max(0.0, hold.expires - wall), 1),
        "idleGpuSeconds": round(scheduler.hold_idle(hold.group), 1),
    }


def _rfc3339(seconds: float) -> str:
    return dt.datetime.fromtimestamp(seconds, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _dra(scheduler: Scheduler, name: str, uuids: Sequence[str]) -> dict[str, Any] | None:
    """What DRA says of node ``name``; None where it knows nothing of it."""
    node = scheduler.dra_node(name)
    if not node.drivers and not node.held:
        return None
    mapping = held_gpus(node, uuids)
    gpus = {held.held.ref: held.gpu for held in mapping.mapped}
    unmapped = {entry.held.ref: entry.why for entry in mapping.unmapped}
    return {
        "drivers": list(node.drivers),
        "advertised": len(node.devices),
        "held": len(node.held),
        "unknown": len(node.unknown),
        "devices": [
            {
                **_device(state.ref),
                "uuid": state.uuid or None,
                "pcieRoot": state.device.pcie_root or None,
                "memoryMiB": state.device.memory_mib,
                "unhealthy": state.unhealthy or None,
                "problem": state.unknown or None,
            }
            for state in node.devices[:DRA_LISTED]
        ],
        "heldDevices": [
            {
                **_device(held.ref),
                "uuid": held.uuid or None,
                "gpu": gpus.get(held.ref),
                "unmapped": unmapped.get(held.ref),
                "claims": list(held.claims[:DRA_LISTED]),
                "pods": [scheduler.dra_pod_key(uid) or uid for uid in held.pods[:DRA_LISTED]],
                "shareMemoryMiB": None if held.whole else held.memory_mib,
            }
            for held in node.held[:DRA_LISTED]
        ],
        "unknownDevices": [
            {**_device(held.ref), "reason": held.unknown} for held in node.unknown[:DRA_LISTED]
        ],
    }


def _device(ref: DeviceRef) -> dict[str, str]:
    return {"driver": ref.driver, "pool": ref.pool, "name": ref.device}


def _drift(view: NodeView) -> tuple[str, ...]:
    spec = view.spec
    if not spec.drift:
        return ()
    return describe(spec.drift, {uuid: i for i, uuid in enumerate(spec.gpu_uuids)})


def _share(view: NodeView, index: int, holders: dict[str, Holding]) -> dict[str, Any] | None:
    """What the pods sharing GPU ``index`` hold; None where none does."""
    uids = view.share_holders[index] if index < len(view.share_holders) else ()
    if not uids:
        return None
    pods = sorted((holders[uid] for uid in uids if uid in holders), key=lambda h: h.key)
    return {
        "memoryMiB": view.share_memory[index],
        "cores": view.share_cores[index],
        # An unhealthy device takes no share, and pods bound past a device's memory leave it
        # none: 0 then, never negative.
        "memoryFreeMiB": max(0, view.share_room[index][0]),
        "pods": [
            {
                "pod": h.key,
                "memoryMiB": h.share.memory_mib,
                "cores": h.share.cores,
                "reserved": h.kind is HoldingKind.RESERVED,
            }
            for h in pods
        ],
    }


def _pending(request: PodRequest) -> dict[str, Any]:
    """A pending pod and what it asks for (its ``gpuModel`` hint and address included)."""
    ip = request.ip
    return {
        "pod": request.key,
        "namespace": request.namespace,
        "name": request.name,
        "gpus": request.gpus,
        "shares": request.share.devices,
        "shareMemoryMiB": request.share.memory_mib,
        "mig": dict(request.mig),
        "cpuMilli": request.cpu_milli,
        "gpuModel": request.gpu_model,
        "group": request.group,
        "address": None if ip is None else ip.address,
        "pools": [] if ip is None else list(ip.pools),
    }


# Each kind's unit in ``quotas``: the core's integers, as the tally keeps them.
_UNITS = {
    Kind.GPUS: "GPUs",
    Kind.SHARE_MEMORY: "MiB",
    Kind.SHARE_CORES: "percent",
    Kind.CPU: "milliCPU",
    Kind.MEMORY: "bytes",
}


def _quota(scheduler: Scheduler, spec: QuotaSpec) -> dict[str, Any]:
    """A quota that applies: per resource it names, its min, what the namespace uses, its max."""
    use = scheduler.namespace_use(spec.namespace)
    unit = spec.share_unit_mib
    resources = []
    for limit in spec.limits:
        used = use[limit.kind]
        resources.append(
            {
                "resource": limit.resource,
                "unit": _UNITS[limit.kind],
                "min": limit.min,
                "used": used,
                "max": limit.max,
                "guarantees": limit.guarantees,
                "quantities": {
                    "min": show_amount(limit.kind, limit.min, unit),
                    "used": show_amount(limit.kind, used, unit),
                    "max": None if limit.max is None else show_amount(limit.kind, limit.max, unit),
                },
            }
        )
    return {
        "quota": spec.key,
        "namespace": spec.namespace,
        "name": spec.name,
        "borrowWeight": spec.borrow_weight,
        "resources": resources,
    }
