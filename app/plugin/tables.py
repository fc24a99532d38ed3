"""What ``kubectl schedext`` prints, from what schedext's read-only views answer: plain
functions from JSON values to text, no I/O (``schedext explain`` prints
:func:`explanation_text` too).

The tables are kubectl's: upper-case headers, columns left-aligned and three spaces apart,
``-`` for nothing, each row one line however long its last column."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from app.plugin.asks import asks_text

__all__ = [
    "DEVICE_LEGEND",
    "device_map",
    "explanation_text",
    "gangs_of",
    "gangs_table",
    "nodes_table",
    "quotas_of",
    "quotas_table",
    "table",
]

JSON = Mapping[str, Any]
NONE = "-"


def table(headers: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """Columns as wide as their widest cell, three spaces apart; the last one unpadded."""
    cells = [[str(h) for h in headers], *([str(c) for c in row] for row in rows)]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = []
    for row in cells:
        padded = [cell.ljust(width) for cell, width in zip(row[:-1], widths, strict=False)]
        lines.append("   ".join([*padded, row[-1]]).rstrip())
    return "\n".join(lines)


# --------------------------------------------------------------------------- explain


def _share_line(request: JSON) -> str:
    """The share a pod asks for: ``share: 20000 MiB and 30% of the cores on each of 2 GPUs``
    while pending, ``... on GPUs 0, 3`` once placed."""
    share = f"share: {request['shareMemoryMiB']} MiB"
    if request.get("shareCores"):
        share += f" and {request['shareCores']}% of the cores"
    ids = request.get("gpuIds")
    if ids:
        return share + f" on GPU{'s' if len(ids) > 1 else ''} {', '.join(map(str, ids))}"
    shares = request["shares"]
    return share + (f" on each of {shares} GPUs" if shares > 1 else " on one GPU")


def explanation_text(answer: JSON) -> str:
    """``GET /explain/NAMESPACE/NAME``'s answer: the pod, what it needs, what holds it back,
    and each node's verdict."""
    lines = [
        f"pod {answer['pod']} ({answer['state']}"
        + (f" on {answer['node']})" if answer["node"] else ")")
    ]
    request = answer["request"]
    lines.append(asks_text(request))  # in words: what it asks, and nothing it does not
    if request.get("shares"):
        lines.append(_share_line(request))
    if answer["group"]:
        group = answer["group"]
        lines.append(
            f"group: {group['phase']}, {group['scheduled']} bound + {group['waiting']} waiting "
            f"of {group['members']} members"
        )
    if answer.get("groupHold"):  # its group's hold, or why it has none
        lines.append(answer["groupHold"])
    if answer["groupReason"]:
        lines.append(f"held back: {answer['groupReason']}")
    quota = answer.get("quota")
    if quota:
        lines.append(
            f"held back by quota {quota['quota']} ({quota['rule']}): "
            f"over by {quota['overBy']} {quota['resource']}"
        )
    width = max((len(n["node"]) for n in answer["nodes"]), default=4)
    for node in answer["nodes"]:
        verdict = "fits" if node["fits"] else ("busy" if node["resolvable"] else "no")
        # A node it fits: the score schedext gives it (0-10), as prioritize scores it.
        score = node.get("score")
        detail = f"score {score}" if score is not None else node["reason"] or ""
        lines.append(f"  {node['node']:<{width}}  {verdict:<4}  {detail}".rstrip())
        # Where the node's kubelet disagrees with schedext (its agent's drift).
        lines.extend(f"  {'':<{width}}  drift {line}" for line in node.get("drift") or ())
        # Who owns its GPUs, when not the device plugin alone; the devices claims hold.
        lines.extend(f"  {'':<{width}}  dra {line}" for line in node.get("dra") or ())
    if answer["state"] != "bound":
        lines.append(f"{len(answer['fits'])} of {len(answer['nodes'])} nodes fit")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- nodes

DEVICE_LEGEND = (
    "DEVICES: one mark per GPU, by index: U used whole, R reserved by a bind in progress, "
    "S shared, K in use by a container schedext did not place (the kubelet says, or a DRA "
    "claim holds it), X unhealthy, . free; | between NVLink groups. DRA: devices claims "
    "hold/advertised"
)


def device_map(gpus: Sequence[JSON]) -> str:
    """One mark per GPU, by index (see DEVICE_LEGEND): ``UU|S.``."""
    marks = []
    for i, gpu in enumerate(gpus):
        if i and gpu.get("group") is not None and gpu.get("group") != gpus[i - 1].get("group"):
            marks.append("|")
        if gpu.get("unhealthy"):
            marks.append("X")
        elif gpu.get("holder"):
            marks.append("R" if gpu.get("reserved") else "U")
        elif gpu.get("inUse"):
            marks.append("K")
        elif gpu.get("share"):
            marks.append("S")
        else:
            marks.append(".")
    return "".join(marks) or NONE


def _gib(mib: float) -> str:
    return f"{mib / 1024:.1f}".removesuffix(".0")


def _share_memory(node: JSON) -> str:
    """What the shares on the node hold, of the memory of the devices they share."""
    shared = [g["share"] for g in node["gpus"] if g.get("share")]
    if not shared:
        return NONE
    held = sum(s["memoryMiB"] for s in shared)
    size = node.get("gpuMemoryMiB")
    if not size:
        return f"{_gib(held)}Gi"
    return f"{_gib(held)}/{_gib(size * len(shared))}Gi"


def _cores(milli: int) -> str:
    return f"{milli / 1000:.1f}".removesuffix(".0")


def _dra(node: JSON) -> str:
    """The node's DRA devices that claims hold, of those advertised: ``1/4``; ``-`` for a
    node DRA knows nothing of."""
    dra = node.get("dra")
    return f"{dra['held']}/{dra['advertised']}" if dra else NONE


def nodes_table(inventory: JSON) -> str:
    """Per GPU node (GPUs schedext counts, or DRA devices): its model, GPUs (total, free,
    each device's state), who hands them out (OWNER: device-plugin, dra or mixed), its DRA
    devices held of those advertised, the shares it holds, the pool addresses given to its
    pods, its free CPU; then the cluster's totals, and the address pools."""
    addresses: dict[str, int] = {}
    for pool in inventory.get("pools", []):
        for holder in pool["holders"]:
            addresses[holder["node"]] = addresses.get(holder["node"], 0) + 1
    gpu_nodes = [n for n in inventory["nodes"] if n["gpus"] or n.get("dra")]
    rows = [
        (
            node["name"],
            node["gpuModel"] or NONE,
            len(node["gpus"]),
            node["freeGpus"],
            device_map(node["gpus"]),
            node.get("gpuOwner") or NONE,
            _dra(node),
            node["sharedGpus"],
            _share_memory(node),
            addresses.get(node["name"], 0),
            f"{_cores(node['cpuMilli']['free'])}/{_cores(node['cpuMilli']['allocatable'])}",
        )
        for node in gpu_nodes
    ]
    headers = ("NODE", "MODEL", "GPUS", "FREE", "DEVICES", "OWNER", "DRA", "SHARED",
               "SHARE MEMORY", "ADDRESSES", "CPU FREE")  # fmt: skip
    parts = [table(headers, rows) if rows else "no GPU nodes"]
    total = sum(len(n["gpus"]) for n in gpu_nodes)
    free = sum(n["freeGpus"] for n in gpu_nodes)
    shared = sum(n["sharedGpus"] for n in gpu_nodes)
    unhealthy = sum(1 for n in gpu_nodes for g in n["gpus"] if g.get("unhealthy"))
    summary = f"GPUs: {total - free} of {total} in use"
    if total:
        summary += f" ({100 * (total - free) // total}%)"
    summary += f", {shared} shared, {unhealthy} unhealthy"
    anonymous = sum(n.get("anonymousGpus", 0) for n in gpu_nodes)
    if anonymous:
        # Held by pods bound without schedext's GPU annotation: counted, index unknown.
        summary += f", {anonymous} held by pods placed without schedext (index unknown)"
    outside = sum(1 for n in gpu_nodes for g in n["gpus"] if g.get("inUse") and not g.get("holder"))
    if outside:
        summary += f", {outside} in use by containers schedext did not place (kubelet)"
    others = len(inventory["nodes"]) - len(gpu_nodes)
    held = sum(n["dra"]["held"] for n in gpu_nodes if n.get("dra"))
    if held:
        summary += f", {held} DRA device{'s' if held != 1 else ''} held by claims"
    if others:
        summary += f"; {others} node{'s' if others != 1 else ''} without GPUs not listed"
    parts.append(summary)
    if rows:
        parts.append(DEVICE_LEGEND)
    drift = _drift_lines(inventory["nodes"])
    if drift:
        parts.append("\nwhere the kubelet and schedext disagree (the node agents' drift):")
        parts.extend(drift)
    pools = inventory.get("pools", [])
    if pools:
        pool_rows = [
            (
                pool["name"],
                pool["allocated"],
                pool["free"],
                pool["size"],
                ",".join(f"{k}={v}" for k, v in sorted(pool["nodeSelector"].items())) or NONE,
                pool["problem"] or NONE,
            )
            for pool in pools
        ]
        pool_headers = ("POOL", "ALLOCATED", "FREE", "SIZE", "NODE SELECTOR", "PROBLEM")
        parts.append("\n" + table(pool_headers, pool_rows))
    return "\n".join(parts)


def _drift_lines(nodes: Sequence[JSON]) -> list[str]:
    """Per node, each drift sentence, and a drift document schedext could not read."""
    lines = []
    for node in nodes:
        lines += [f"  {node['name']}: {line}" for line in node.get("drift") or ()]
        if node.get("driftProblem"):
            lines.append(f"  {node['name']}: not read: {node['driftProblem']}")
    return lines


# ----------------------------------------------------------------------------- gangs


def _in(namespace: str | None, key: str) -> bool:
    """Whether ``key`` (NAMESPACE/NAME) is in ``namespace`` (None: every namespace)."""
    return namespace is None or key.split("/", 1)[0] == namespace


def gangs_of(inventory: JSON, namespace: str | None) -> list[JSON]:
    return [g for g in inventory.get("gangs", []) if _in(namespace, g["group"])]


def _failure(gang: JSON) -> str:
    failure = gang.get("lastFailure")
    if not failure:
        return NONE
    outcome = "timed out" if failure["outcome"] == "timed_out" else failure["outcome"]
    return f"{outcome}: {failure['reason']}"


def _hold(gang: JSON) -> str:
    """The GPUs held for the gang (docs/gangs.md), where and for how long still:
    ``16 on rack a, 4m left``; ``8 on n1, n2, 40s left``."""
    hold = gang.get("hold")
    if not hold:
        return NONE
    if hold.get("domain"):
        # A level is a label key: its last part names it (topology.kubernetes.io/rack: rack).
        where = f"{hold['level'].rsplit('/', 1)[-1]} {hold['domain']}"
    else:
        nodes = sorted(hold.get("nodes") or {})
        where = ", ".join(nodes[:2]) + (f" +{len(nodes) - 2}" if len(nodes) > 2 else "")
    return f"{hold['gpus']} on {where}, {_duration(hold.get('leftSeconds') or 0)} left"


def _duration(seconds: float) -> str:
    """``45s``, ``4m``, ``1h5m``: whole units, rounded down."""
    whole = int(seconds)
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m"
    hours, minutes = divmod(whole // 60, 60)
    return f"{hours}h{minutes}m" if minutes else f"{hours}h"


def gangs_table(gangs: Sequence[JSON]) -> str:
    """Per PodGroup: its phase, members placed (bound, or reserved at the bind barrier) of
    minMember, the members that exist, those waiting at the barrier and for how long still,
    the GPUs held for it if it waited too long for room (HOLD), and how its last wait ended
    when it did not complete."""
    if not gangs:
        return "no gangs"
    rows = []
    for gang in gangs:
        namespace, _, name = gang["group"].partition("/")
        left = gang.get("waitLeftSeconds")
        rows.append(
            (
                namespace,
                name,
                gang["phase"],
                f"{gang['scheduled'] + gang['waiting']}/{gang['minMember']}",
                gang["members"],
                gang["scheduled"],
                gang["waiting"],
                NONE if left is None else f"{left:g}s",
                _hold(gang),
                _failure(gang),
            )
        )
    headers = ("NAMESPACE", "GROUP", "PHASE", "PLACED/MIN", "MEMBERS", "BOUND", "WAITING",
               "WAIT LEFT", "HOLD", "LAST FAILURE")  # fmt: skip
    return table(headers, rows)


# ---------------------------------------------------------------------------- quotas


def quotas_of(inventory: JSON, namespace: str | None) -> dict[str, list[JSON]]:
    return {
        "quotas": [q for q in inventory.get("quotas", []) if _in(namespace, q["quota"])],
        "shadowedQuotas": [
            s for s in inventory.get("shadowedQuotas", []) if _in(namespace, s["quota"])
        ],
    }


def quotas_table(quotas: JSON) -> str:
    """Per team quota and resource it names: min, used, max (as Kubernetes quantities), and
    whether the team borrows (uses more than a min it was guaranteed); then the quotas that
    do not apply (a second quota in a namespace)."""
    rows = []
    for quota in quotas["quotas"]:
        for resource in quota["resources"]:
            shown = resource["quantities"]
            borrowing = resource["guarantees"] and resource["used"] > resource["min"]
            rows.append(
                (
                    quota["namespace"],
                    quota["name"],
                    resource["resource"],
                    shown["min"],
                    shown["used"],
                    shown["max"] if shown["max"] is not None else "none",
                    "yes" if borrowing else "no",
                )
            )
    headers = ("NAMESPACE", "QUOTA", "RESOURCE", "MIN", "USED", "MAX", "BORROWING")
    parts = [table(headers, rows) if rows else "no team quotas"]
    for shadowed in quotas["shadowedQuotas"]:
        parts.append(f"not applied: {shadowed['quota']} ({shadowed['by']} applies instead)")
    return "\n".join(parts)
