"""The extender wire protocol, ``k8s.io/kube-scheduler/extender/v1``, exactly.

kube-scheduler encodes these types without json tags, so keys are Go field names
(``NodeNames``, ``FailedAndUnresolvableNodes``, ``PodUID``, ``NumPDBViolations``) and unset
fields are ``null``. Its decoder matches keys case-insensitively, so we read any case and
always write the Go spelling. Scores are JSON integers: Go refuses ``8.0`` for an int64.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from operator import itemgetter
from typing import Any

import numpy as np
import numpy.typing as npt
import orjson

from app.service.errors import RequestRejectedError
from extender import fields
from extender.model import RANKED, FilterVerdict, Rejection, Victim
from extender.packed import NameView, NodeSubset, PackedNames
from extender.preemption import NodeVictims

__all__ = [
    "BindingArgs",
    "ExtenderArgs",
    "PreemptionArgs",
    "WireError",
    "binding_args",
    "binding_result",
    "extender_args",
    "filter_error",
    "filter_result",
    "host_priorities",
    "host_scores",
    "preemption_args",
    "preemption_result",
]


class WireError(RequestRejectedError):
    """A request body that is not what the protocol says; the message says what is wrong."""


@dataclass(frozen=True, slots=True)
class ExtenderArgs:
    """Filter and prioritize requests. Exactly one of ``node_names`` (nodeCacheCapable: true)
    and ``nodes`` (full node objects, nodeCacheCapable: false) is set."""

    pod: Mapping[str, Any]
    # Names mode from kube-scheduler: PackedNames (the request's own bytes), else a list.
    node_names: Sequence[str]
    nodes: list[Mapping[str, Any]] | None


@dataclass(frozen=True, slots=True)
class VictimsArgs:
    victims: list[Victim]
    uids: list[str]
    num_pdb_violations: int


@dataclass(frozen=True, slots=True)
class PreemptionArgs:
    pod: Mapping[str, Any]
    candidates: dict[str, VictimsArgs]


@dataclass(frozen=True, slots=True)
class BindingArgs:
    name: str
    namespace: str
    uid: str
    node: str


# ------------------------------------------------------------------------------ decoding


def _document(body: bytes, what: str) -> Mapping[str, Any]:
    if not body:
        raise WireError(f"empty request body; expected {what} as JSON")
    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError as error:
        raise WireError(_not_json(body, error)) from None
    if not isinstance(document, Mapping):
        raise WireError(f"{what} must be a JSON object, got {_kind(document)}")
    return document


_GZIP = b"\x1f\x8b"  # the magic number every gzip stream starts with


def _not_json(body: bytes, error: orjson.JSONDecodeError) -> str:
    """Why ``body`` is not JSON, in words: not orjson's "surrogates not allowed" for a body
    that is compressed or not UTF-8."""
    if body.startswith(_GZIP):
        return (
            "request body is gzip-compressed: Content-Encoding is not supported, send the "
            "body as plain JSON"
        )
    try:
        body.decode("utf-8")
    except UnicodeDecodeError as bad:
        return (
            f"request body is not valid UTF-8 JSON (byte {bad.start} is not UTF-8): send "
            "JSON encoded in UTF-8"
        )
    return f"request body is not valid JSON ({error})"


def _pod(document: Mapping[str, Any], what: str) -> Mapping[str, Any]:
    pod = fields.get(document, "Pod")
    if not isinstance(pod, Mapping):
        raise WireError(f"{what}.Pod must be a pod object, got {_kind(pod)}")
    return pod


def extender_args(body: bytes) -> ExtenderArgs:
    packed = _packed_args(body)
    if packed is not None:
        return packed
    document = _document(body, "ExtenderArgs")
    pod = _pod(document, "ExtenderArgs")
    names = fields.get(document, "NodeNames")
    if names is not None:
        if not isinstance(names, list) or not _all_strings(names):
            raise WireError("ExtenderArgs.NodeNames must be a list of node names")
        return ExtenderArgs(pod=pod, node_names=names, nodes=None)
    node_list = fields.get(document, "Nodes")
    if node_list is None:
        raise WireError("ExtenderArgs has neither NodeNames nor Nodes")
    items = fields.get(node_list, "items") if isinstance(node_list, Mapping) else None
    if not isinstance(items, list) or not all(isinstance(n, Mapping) for n in items):
        raise WireError("ExtenderArgs.Nodes must be a NodeList with an items list of nodes")
    node_names = [fields.text(fields.obj(node, "metadata"), "name") for node in items]
    if not all(node_names):
        raise WireError("every node in ExtenderArgs.Nodes.items needs metadata.name")
    return ExtenderArgs(pod=pod, node_names=node_names, nodes=items)


_NAMES_KEY = b'"NodeNames":['


def _packed_args(body: bytes) -> ExtenderArgs | None:
    """The hot path: kube-scheduler's own encoding, ``{"Pod":{...},"Nodes":null,
    "NodeNames":["a",...]}`` with NodeNames last and every name plain. The names stay bytes
    (:class:`PackedNames`) and only the rest is decoded. Anything else (another key order,
    whitespace, escapes, a malformed body) returns None, and the body is decoded in full.

    The head, up to the NodeNames key, is decoded as an object of its own: that succeeds only
    if the key is at the top level (inside the pod, the braces would not balance), so the
    body as a whole is exactly that object plus the names."""
    at = body.find(_NAMES_KEY)
    if at < 0 or not body.endswith(b"]}"):
        return None
    names = PackedNames.parse(body, at + len(_NAMES_KEY), len(body) - 2)
    if names is None:
        return None
    head = body[:at]
    if not head.endswith(b","):
        return None
    try:
        document = orjson.loads(head[:-1] + b"}")
    except orjson.JSONDecodeError:
        return None
    if not isinstance(document, dict):
        return None
    return ExtenderArgs(pod=_pod(document, "ExtenderArgs"), node_names=names, nodes=None)


def _all_strings(values: list[Any]) -> bool:
    try:
        "".join(values)  # C-speed type check: fails on the first non-string
    except TypeError:
        return False
    return True


def preemption_args(body: bytes) -> PreemptionArgs:
    """Both shapes: ``NodeNameToMetaVictims`` (UIDs) and ``NodeNameToVictims`` (full pods)."""
    document = _document(body, "ExtenderPreemptionArgs")
    pod = _pod(document, "ExtenderPreemptionArgs")
    meta = fields.get(document, "NodeNameToMetaVictims")
    full = fields.get(document, "NodeNameToVictims")
    source, name = (
        (meta, "NodeNameToMetaVictims") if meta is not None else (full, "NodeNameToVictims")
    )
    if source is None:
        raise WireError(
            "ExtenderPreemptionArgs has neither NodeNameToMetaVictims nor NodeNameToVictims"
        )
    if not isinstance(source, Mapping):
        raise WireError(f"ExtenderPreemptionArgs.{name} must be an object keyed by node name")
    candidates: dict[str, VictimsArgs] = {}
    for node, value in source.items():
        where = f"{name}[{node!r}]"
        # Go decodes null into a nil *Victims: no victims on that node.
        entry = {} if value is None else value
        if not isinstance(entry, Mapping):
            raise WireError(
                f"{where} must be an object with Pods and NumPDBViolations, got {_kind(entry)}"
            )
        pods = fields.get(entry, "Pods")
        if pods is None:
            pods = []
        if not isinstance(pods, list):
            raise WireError(f"{where}.Pods must be a list of objects, got {_kind(pods)}")
        for index, victim in enumerate(pods):
            if not isinstance(victim, Mapping):
                raise WireError(f"{where}.Pods[{index}] must be an object, got {_kind(victim)}")
        pdb = fields.get(entry, "NumPDBViolations")
        if pdb is None:
            pdb = 0
        if not isinstance(pdb, int) or isinstance(pdb, bool) or pdb < 0:
            raise WireError(
                f"{where}.NumPDBViolations must be a non-negative integer, got {_kind(pdb)}"
            )
        victims = [_victim(p, full_pod=meta is None) for p in pods]
        if not all(v.uid for v in victims):
            uid = "metadata.uid" if meta is None else "UID"
            raise WireError(f"{where}: every victim needs a UID (Pods[].{uid}, a string)")
        candidates[str(node)] = VictimsArgs(
            victims=victims, uids=[v.uid for v in victims], num_pdb_violations=pdb
        )
    return PreemptionArgs(pod=pod, candidates=candidates)


def _victim(pod: Mapping[str, Any], *, full_pod: bool) -> Victim:
    """Victims are identified by UID; what they hold is the inventory's record (kube-scheduler
    sends full pods only when not nodeCacheCapable)."""
    if not full_pod:
        return Victim(uid=fields.text(pod, "UID"))
    return Victim(uid=fields.text(fields.obj(pod, "metadata"), "uid"))


def binding_args(body: bytes) -> BindingArgs:
    document = _document(body, "ExtenderBindingArgs")
    values = {}
    for key in ("PodName", "PodNamespace", "PodUID", "Node"):
        value = fields.get(document, key)
        if not isinstance(value, str) or not value:
            raise WireError(f"ExtenderBindingArgs.{key} must be a non-empty string")
        values[key] = value
    return BindingArgs(
        name=values["PodName"],
        namespace=values["PodNamespace"],
        uid=values["PodUID"],
        node=values["Node"],
    )


_kind = fields.kind


# ------------------------------------------------------------------------------ encoding


def filter_result(verdict: FilterVerdict, args: ExtenderArgs) -> bytes:
    """Answer in the field matching the request's mode: with nodeCacheCapable: false,
    kube-scheduler reads only ``Nodes`` (names alone would reject every node).

    Each rejected node is in exactly one map: ``FailedNodes`` when preemption may help,
    ``FailedAndUnresolvableNodes`` when it cannot. Listing the unresolvable ones in both only
    served kube-scheduler releases before 1.20, which did not know the second map; the
    ``kubescheduler.config.k8s.io/v1`` configuration schedext ships needs 1.25 or later, and
    kube-scheduler decodes every entry (thousands per call), so the copy was pure cost."""
    if args.nodes is None and not verdict.shortlisted_from:
        packed = _render_packed(verdict)
        if packed is not None:  # the hottest path: one buffer, from the request's bytes
            return packed
    passed = _names_json(verdict.passed)
    # A shortlist lists no rejected node (extender.shortlist): the pod goes to one of it.
    rejections = () if verdict.shortlisted_from else verdict.rejections
    bodies = [_rejection_json(r) for r in rejections]
    groups = list(zip(bodies, (r.resolvable for r in rejections), strict=True))
    failed = b",".join(body for body, resolvable in groups if resolvable)
    unresolvable = b",".join(body for body, resolvable in groups if not resolvable)
    if args.nodes is None:
        # Names mode, JSON written directly from the grouped verdict.
        head, after_passed, after_failed, tail = _FILTER_TEXTS
        return b"".join((head, passed, after_passed, failed, after_failed, unresolvable, tail))
    keep = set(verdict.passed)
    items = [n for n, name in zip(args.nodes, args.node_names, strict=True) if name in keep]
    return orjson.dumps(
        {
            "Nodes": {"metadata": {}, "items": items},
            "NodeNames": None,
            "FailedNodes": orjson.Fragment(b"{" + failed + b"}"),
            "FailedAndUnresolvableNodes": orjson.Fragment(b"{" + unresolvable + b"}"),
            "Error": "",
        }
    )


# A names-mode answer around its three sections: passed names, FailedNodes' entries and
# FailedAndUnresolvableNodes' entries.
_FILTER_TEXTS = (
    b'{"Nodes":null,"NodeNames":[',
    b'],"FailedNodes":{',
    b'},"FailedAndUnresolvableNodes":{',
    b'},"Error":""}',
)
_PASSED, _FAILED, _UNRESOLVABLE = 0, 1, 2


def _render_packed(verdict: FilterVerdict) -> bytes | None:
    """A names-mode answer for a verdict over packed names, written in one pass over the
    request's bytes into one buffer; None when the verdict is not of that kind."""
    passed = verdict.passed
    if not isinstance(passed, NodeSubset):
        return None
    names, codes = passed.source
    # One place per rank (a node subset's code is its reason's rank, not the reason's number).
    placements: list[tuple[int, bytes] | None] = [None] * len(RANKED)
    placements[passed.code()] = (_PASSED, b"")
    for rejection in verdict.rejections:
        nodes = rejection.nodes
        if not isinstance(nodes, NodeSubset) or nodes.source[1] is not codes:
            return None
        section = _FAILED if rejection.resolvable else _UNRESOLVABLE
        placements[nodes.code()] = (section, b":" + orjson.dumps(rejection.message))
    return names.render_sections(codes, placements, _FILTER_TEXTS)


def _names_json(names: Sequence[str]) -> bytes:
    """The inside of a JSON array of node names the inventory knows: valid Kubernetes node
    names (checked when the node was added), which never need escaping."""
    if isinstance(names, NameView):  # still the request's bytes
        return names.plain()
    return ('"' + '","'.join(names) + '"').encode() if names else b""


def _rejection_json(rejection: Rejection) -> bytes:
    """``"node":"reason",...`` for one group of rejected nodes (inside of an object)."""
    message = orjson.dumps(rejection.message)
    if isinstance(rejection.nodes, NameView):  # plain names, still the request's bytes
        return rejection.nodes.render(b":" + message, b",")
    if not rejection.known_nodes:  # names straight from the request: let orjson escape them
        return orjson.dumps(dict.fromkeys(rejection.nodes, rejection.message))[1:-1]
    text = message.decode()
    return ('"' + f'":{text},"'.join(rejection.nodes) + f'":{text}').encode()


def filter_error(message: str) -> bytes:
    return orjson.dumps(
        {
            "Nodes": None,
            "NodeNames": None,
            "FailedNodes": None,
            "FailedAndUnresolvableNodes": None,
            "Error": message,
        }
    )


def host_priorities(node_names: Sequence[str], scores: npt.NDArray[np.int64]) -> bytes:
    """``[{"Host": name, "Score": n}, ...]`` for the hosts scored above the lowest score, less
    that score, written per score value (at most 11 groups).

    kube-scheduler adds ``score * weight`` to each listed host's total and nothing to a host
    not listed, then takes the highest total: lowering every host's score by the same amount
    leaves its choice as it was, and the hosts at the lowest score need no entry. In a GPU
    cluster most hosts tie at the bottom (idle ones, for bin-packing), so the answer kube-
    scheduler decodes for every pod shrinks from a host per feasible node to a few. (Those
    hosts are then ranked among themselves by kube-scheduler's node order rather than its
    random tie-breaker, as hosts no extender scores always are.)"""
    if not node_names:
        return b"[]"
    scores = scores - scores.min()
    if isinstance(node_names, PackedNames):  # plain names: written from the request's bytes
        return b"[" + node_names.render_scores(scores) + b"]"
    listed = np.flatnonzero(scores)
    node_names = [node_names[i] for i in listed.tolist()]
    scores = scores[listed]
    if not node_names:
        return b"[]"
    if not _safe_names(node_names):
        return orjson.dumps(
            [{"Host": n, "Score": s} for n, s in zip(node_names, scores.tolist(), strict=True)]
        )
    # Sort names by score with one C-level gather, then write each run of equal scores with
    # one join: far cheaper than a dict per host.
    order = np.argsort(scores, kind="stable")
    ranked = scores[order]
    hosts = itemgetter(*order.tolist())(node_names) if len(order) > 1 else (node_names[0],)
    cuts = (np.flatnonzero(np.diff(ranked)) + 1).tolist()
    parts = []
    for start, end in zip([0, *cuts], [*cuts, len(ranked)], strict=True):
        score = int(ranked[start])
        parts.append(
            '{"Host":"'
            + f'","Score":{score}}},{{"Host":"'.join(hosts[start:end])
            + f'","Score":{score}}}'
        )
    return ("[" + ",".join(parts) + "]").encode()


def host_scores(node_names: Sequence[str], scores: npt.NDArray[np.int64]) -> bytes:
    """``[{"Host": name, "Score": n}, ...]`` for every host, in the request's order, with the
    score schedext gives it (0-10): prioritize's full answer (``?full=1``), for callers who
    read the scores themselves. kube-scheduler chooses the same with :func:`host_priorities`,
    which it decodes faster."""
    return orjson.dumps(
        [{"Host": n, "Score": s} for n, s in zip(node_names, scores.tolist(), strict=True)]
    )


def _safe_names(names: Sequence[str]) -> bool:
    """Whether every name can be written into JSON as it is (no quote, backslash or control
    character): true of every real node name; false only for hostile or broken requests."""
    joined = '","'.join(names)
    return joined.count('"') == 2 * (len(names) - 1) and "\\" not in joined and joined.isprintable()


def preemption_result(args: PreemptionArgs, chosen: Mapping[str, NodeVictims]) -> bytes:
    """Always ``NodeNameToMetaVictims``, whatever shape came in: per kept node, its victims by
    UID in decreasing priority, and kube-scheduler's PDB violation count (plus, under the
    whole-group gang policy, the gang members the eviction breaks elsewhere)."""
    result = {
        node: {
            "Pods": [{"UID": uid} for uid in victims.uids],
            "NumPDBViolations": args.candidates[node].num_pdb_violations
            + victims.extra_pdb_violations,
        }
        for node, victims in chosen.items()
        if node in args.candidates and victims.uids
    }
    return orjson.dumps({"NodeNameToMetaVictims": result})


def binding_result(error: str = "") -> bytes:
    return orjson.dumps({"Error": error})


def error_body(message: str) -> bytes:
    """A 4xx body for verbs whose result type has no Error field (prioritize, preempt)."""
    return orjson.dumps({"Error": message})
