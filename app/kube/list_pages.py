"""List pages read as protobuf, decoded into the same plain values as shapes.py's JSON.

kube-apiserver serves a pod list page as protobuf for 0.4 to 0.6 of the CPU it spends on the
same page as JSON (``python -m loadtests.listformats``: 41 against 101 µs a pod, and 46.5
against 76 in another run; 20,000 pods in pages of 5,000). A cold sync of 300,000 pods runs
schedext and the API server on the same few CPUs, and serving the list was most of the API
server's share. So the pod and node lists ask for protobuf first (:data:`ACCEPT`); watches
stay JSON, as the API server encodes each event once for every watcher.

The messages (``wire/lists.proto``) name only the fields schedext reads: the protobuf runtime
(upb, in C) skips every other field by its length. What it gives is turned into the values the
JSON decoders give for the same object, field by field as the API server writes JSON (a field
it leaves out of JSON when empty is left out here), so the core cannot tell the two apart; a
test against a real API server holds them to the same meaning for every pod and node.

Turning upb's objects into dicts costs more per field than msgspec's JSON decoding, most of it
in a pod's containers. The pods of one template have byte-identical containers, affinity and
owner, so those are kept as bytes in the message and read once per template (:class:`_Shared`):
their values are shared between the pods of a template and, like every decoded value, never
changed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, Generic, TypeVar

from google.protobuf.message import DecodeError

from app.kube.wire import lists_pb2 as wire

__all__ = [
    "ACCEPT",
    "PROTOBUF",
    "forget_templates",
    "is_protobuf",
    "node_page",
    "pod_page",
    "status_fields",
]

JSON = dict[str, Any]
Value = TypeVar("Value")

PROTOBUF = "application/vnd.kubernetes.protobuf"
# Protobuf where the API server has it (built-in kinds), JSON otherwise.
ACCEPT = f"{PROTOBUF}, application/json"
MAGIC = b"k8s\x00"  # a protobuf answer's first bytes, before its runtime.Unknown envelope
PREFERRED = "preferredDuringSchedulingIgnoredDuringExecution"
AFFINITIES = ("nodeAffinity", "podAffinity", "podAntiAffinity")


def is_protobuf(body: bytes) -> bool:
    return body.startswith(MAGIC)


def pod_page(body: bytes) -> JSON:
    """A PodList answer as ``{"metadata": {...}, "items": [pod, ...]}``; ValueError for bytes
    that are not one."""
    page = _parse(wire.PodList, _unwrap(body))
    return {"metadata": _list_meta(page.metadata), "items": [_pod(p) for p in page.items]}


def node_page(body: bytes) -> JSON:
    """A NodeList answer, as :func:`pod_page`."""
    page = _parse(wire.NodeList, _unwrap(body))
    return {"metadata": _list_meta(page.metadata), "items": [_node(n) for n in page.items]}


def status_fields(body: bytes) -> tuple[str, str] | None:
    """(message, reason) of an error answered in protobuf (a ``Status``); None if it is not."""
    try:
        status = _parse(wire.Status, _unwrap(body))
    except ValueError:
        return None
    return status.message, status.reason


def _unwrap(body: bytes) -> memoryview:
    """The bytes of the envelope's ``raw`` field, where they lie in ``body``: found by reading
    the envelope's few field headers rather than by parsing it, which copied a page of 18 MB
    twice (7 µs a pod, as much as parsing the list)."""
    if not is_protobuf(body):
        raise ValueError("not a protobuf answer")
    at, end = len(MAGIC), len(body)
    try:
        while at < end:
            key, at = _varint(body, at)
            if key & 7 == 0:  # a varint field: none in runtime.Unknown, skipped all the same
                _, at = _varint(body, at)
                continue
            if key & 7 != 2:
                raise ValueError(f"unexpected wire type {key & 7} in a protobuf envelope")
            length, at = _varint(body, at)
            if key >> 3 == 2 and at + length <= end:  # raw
                return memoryview(body)[at : at + length]
            at += length
    except IndexError:
        pass
    raise ValueError("a protobuf envelope without its message")


def _varint(data: bytes, at: int) -> tuple[int, int]:
    value, shift = 0, 0
    while shift < 64:
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, at
        shift += 7
    raise ValueError("a varint longer than 10 bytes in a protobuf envelope")


def _parse(kind: Any, data: bytes | memoryview) -> Any:
    try:
        return kind.FromString(data)
    except DecodeError as error:
        raise ValueError(f"not a protobuf {kind.DESCRIPTOR.name}: {error}") from None


# ---------------------------------------------------------------- pods


class _Shared(Generic[Value]):
    """The parts that the pods of one template share byte for byte (their containers, their
    affinity, their owner), read once: a bounded book from the parts' bytes to their values.
    The oldest entry goes first (a cluster has far fewer templates than this), and parts
    larger than ``MAX_KEY_BYTES`` in all (a long command line, a large env) are read every time
    instead of kept, so that a book stays within a few megabytes."""

    CAPACITY = 1024
    MAX_KEY_BYTES = 8192

    def __init__(self, read: Callable[[tuple[bytes, ...]], Value]) -> None:
        self._read = read
        self._book: dict[tuple[bytes, ...], Value] = {}

    def read(self, parts: Iterable[bytes]) -> Value:
        key = tuple(parts)
        kept = self._book.get(key)
        if kept is None:
            kept = self._read(key)
            if sum(map(len, key)) > self.MAX_KEY_BYTES:
                return kept
            if len(self._book) >= self.CAPACITY:
                del self._book[next(iter(self._book))]
            self._book[key] = kept
        return kept

    def forget(self) -> None:
        self._book.clear()


def _containers(parts: tuple[bytes, ...]) -> list[JSON]:
    return [_container(part) for part in parts]


def _affinity(parts: tuple[bytes, ...]) -> JSON:
    """As shapes.py keeps it: per kind, its preferred terms as empty objects."""
    affinity = _parse(wire.Affinity, parts[0])
    values: JSON = {}
    for kind in AFFINITIES:
        if affinity.HasField(kind):
            terms = getattr(affinity, kind).preferredDuringSchedulingIgnoredDuringExecution
            values[kind] = {PREFERRED: [{} for _ in terms]} if terms else {}
    return values


def _owners(parts: tuple[bytes, ...]) -> list[JSON]:
    return [_owner(_parse(wire.OwnerReference, part)) for part in parts]


# One book each: a pod's containers and its init containers are read apart, so that the
# values of a template's containers are one list, as JSON has them.
_containers_read = _Shared(_containers)
_init_containers_read = _Shared(_containers)
_affinity_read = _Shared(_affinity)
_owners_read = _Shared(_owners)
_BOOKS = (_containers_read, _init_containers_read, _affinity_read, _owners_read)


def forget_templates() -> None:
    """Empty the books (benchmarks that measure reading templates afresh)."""
    for book in _BOOKS:
        book.forget()


def _pod(pod: Any) -> JSON:
    spec = pod.spec
    values: JSON = {"containers": _containers_read.read(spec.containers)}
    if spec.initContainers:
        values["initContainers"] = _init_containers_read.read(spec.initContainers)
    if spec.nodeName:
        values["nodeName"] = spec.nodeName
    if spec.HasField("priority"):
        values["priority"] = spec.priority
    if spec.preemptionPolicy:
        values["preemptionPolicy"] = spec.preemptionPolicy
    if spec.HasField("affinity"):
        values["affinity"] = _affinity_read.read((spec.affinity,))
    if spec.topologySpreadConstraints:
        values["topologySpreadConstraints"] = [
            _texts(c, "whenUnsatisfiable") for c in spec.topologySpreadConstraints
        ]
    if spec.overhead:
        values["overhead"] = _quantities(spec.overhead)
    if spec.HasField("resources"):
        values["resources"] = _resources(spec.resources)
    if spec.resourceClaims:
        values["resourceClaims"] = [
            {"name": c.name, **_texts(c, "resourceClaimName", "resourceClaimTemplateName")}
            for c in spec.resourceClaims
        ]
    return {"metadata": _meta(pod.metadata), "spec": values, "status": _pod_status(pod.status)}


def _container(data: bytes) -> JSON:
    container = _parse(wire.Container, data)
    values: JSON = {"name": container.name}
    if container.HasField("resources"):  # a struct, not a pointer: JSON always has it
        values["resources"] = _resources(container.resources)
    if container.restartPolicy:
        values["restartPolicy"] = container.restartPolicy
    return values


def _resources(resources: Any) -> JSON:
    values: JSON = {}
    if resources.limits:
        values["limits"] = _quantities(resources.limits)
    if resources.requests:
        values["requests"] = _quantities(resources.requests)
    if resources.claims:
        values["claims"] = [{"name": c.name, **_texts(c, "request")} for c in resources.claims]
    return values


def _pod_status(status: Any) -> JSON:
    values = _texts(status, "phase")
    if status.resourceClaimStatuses:
        values["resourceClaimStatuses"] = [
            {"name": s.name, **_texts(s, "resourceClaimName")} for s in status.resourceClaimStatuses
        ]
    if status.HasField("extendedResourceClaimStatus"):
        extended = status.extendedResourceClaimStatus
        values["extendedResourceClaimStatus"] = {
            "requestMappings": [
                {"containerName": m.containerName, "resourceName": m.resourceName,
                 "requestName": m.requestName}
                for m in extended.requestMappings
            ],
            "resourceClaimName": extended.resourceClaimName,
        }  # fmt: skip
    return values


# ---------------------------------------------------------------- nodes and metadata


def _node(node: Any) -> JSON:
    status = node.status
    values: JSON = {}
    if status.capacity:
        values["capacity"] = _quantities(status.capacity)
    if status.allocatable:
        values["allocatable"] = _quantities(status.allocatable)
    return {"metadata": _meta(node.metadata), "status": values}


def _meta(meta: Any) -> JSON:
    values = _texts(meta, "name", "namespace", "uid", "resourceVersion")
    # A comprehension, not dict(): upb's maps are iterated in C, where dict() goes through
    # the Mapping ABC's keys view in Python (1.75 against 2.7 µs for six labels).
    if labels := meta.labels:
        values["labels"] = {key: labels[key] for key in labels}
    if annotations := meta.annotations:
        values["annotations"] = {key: annotations[key] for key in annotations}
    if meta.ownerReferences:
        values["ownerReferences"] = _owners_read.read(meta.ownerReferences)
    return values


def _owner(owner: Any) -> JSON:
    values: JSON = {
        "apiVersion": owner.apiVersion,
        "kind": owner.kind,
        "name": owner.name,
        "uid": owner.uid,
    }
    if owner.HasField("controller"):
        values["controller"] = owner.controller
    if owner.HasField("blockOwnerDeletion"):
        values["blockOwnerDeletion"] = owner.blockOwnerDeletion
    return values


def _list_meta(meta: Any) -> JSON:
    return _texts(meta, "resourceVersion", "continue")


def _quantities(entries: Mapping[str, Any]) -> JSON:
    return {name: entries[name].string for name in entries}  # as _meta's maps


def _texts(message: Any, *names: str) -> JSON:
    """The named string fields that are not empty (JSON's ``omitempty``)."""
    values: JSON = {}
    for name in names:
        if text := getattr(message, name):
            values[name] = text
    return values
