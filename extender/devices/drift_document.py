"""The drift document the node agent writes on its Node (``schedext.io/gpu-drift``), and its
reader.

Written only when it changes, removed when the node has no drift::

    {"version": 1,
     "inUse": [{"uuid": "GPU-...", "pod": "ml/ghost", "container": "main",
                "resource": "nvidia.com/gpu", "cause": "unknown-pod"},
               {"uuid": "MIG-...", "mig": true, ...}],
     "stale": [{"pod": "ml/done", "uid": "...", "uuids": ["GPU-..."],
                "since": 1764072000, "released": false}]}

``cause`` is one of ``unknown-pod``, ``not-given``, ``not-placed``
(:class:`~extender.devices.drift.Cause`); ``mig`` is written only when true; ``since`` is the
wall-clock Unix second from which the kubelet has not listed the pod. The lists are sorted, so
that the same drift always gives the same text and the agent can tell a change by comparing
strings. At most :data:`MAX_IN_USE` and :data:`MAX_STALE` entries are written (the rest are
counted in ``"omitted"``): far more than a node has devices, and well within
:data:`~extender.devices.document.MAX_DOCUMENT`.

The reader is total and bounded, like the topology's: any input gives a
:class:`~extender.devices.drift.Drift` or a :class:`~extender.devices.document.DocumentError`.
A version other than :data:`DRIFT_VERSION` is refused whole: the extender then reads the node
as having no drift, and says so, rather than guess at what a newer agent meant.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from extender.devices.document import MAX_DOCUMENT, DocumentError
from extender.devices.drift import Cause, Drift, InUse, StaleRecord

__all__ = ["DRIFT_VERSION", "MAX_IN_USE", "MAX_STALE", "decode_drift", "encode_drift"]

DRIFT_VERSION = 1
MAX_IN_USE = 256
MAX_STALE = 128
_MAX_TEXT = 320  # a UUID, a namespace/name, a container or resource name
_MAX_UUIDS = 64  # devices one record names


def encode_drift(drift: Drift) -> str:
    """The annotation's value (canonical: sorted keys and entries, no spaces)."""
    in_use, stale = drift.in_use[:MAX_IN_USE], drift.stale[:MAX_STALE]
    document: dict[str, object] = {
        "version": DRIFT_VERSION,
        "inUse": [_in_use_entry(use) for use in in_use],
        "stale": [
            {
                "pod": s.pod,
                "uid": s.uid,
                "uuids": list(s.uuids[:_MAX_UUIDS]),
                "since": int(s.since),
                "released": s.released,
            }
            for s in stale
        ],
    }
    omitted = len(drift.in_use) - len(in_use) + len(drift.stale) - len(stale)
    if omitted:
        document["omitted"] = omitted
    return json.dumps(document, separators=(",", ":"), sort_keys=True)


def _in_use_entry(use: InUse) -> dict[str, object]:
    entry: dict[str, object] = {
        "uuid": use.uuid,
        "pod": use.pod,
        "container": use.container,
        "resource": use.resource,
        "cause": use.cause.value,
    }
    if use.mig:
        entry["mig"] = True
    return entry


def decode_drift(raw: str) -> Drift:
    """Read a drift annotation; :class:`DocumentError` when it is malformed or of a version
    this reader does not know."""
    if len(raw) > MAX_DOCUMENT:
        raise DocumentError(f"longer than {MAX_DOCUMENT} bytes")
    try:
        document = json.loads(raw)
    except (ValueError, RecursionError):
        raise DocumentError("not JSON") from None
    if not isinstance(document, Mapping):
        raise DocumentError("not a JSON object")
    version = document.get("version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise DocumentError("version is not an integer")
    if version != DRIFT_VERSION:
        raise DocumentError(
            f"version {version} is not supported (this schedext reads {DRIFT_VERSION})"
        )
    in_use = tuple(_in_use(e) for e in _entries(document.get("inUse", []), "inUse", MAX_IN_USE))
    stale = tuple(_stale(e) for e in _entries(document.get("stale", []), "stale", MAX_STALE))
    return Drift(in_use=in_use, stale=stale)


def _entries(raw: object, name: str, most: int) -> list[Mapping[str, object]]:
    if not isinstance(raw, list) or len(raw) > most:
        raise DocumentError(f"{name} is not a list of at most {most}")
    if not all(isinstance(entry, Mapping) for entry in raw):
        raise DocumentError(f"an {name} entry is not an object")
    return raw


def _in_use(entry: Mapping[str, object]) -> InUse:
    cause = entry.get("cause")
    try:
        parsed = Cause(cause)
    except ValueError:
        raise DocumentError(f"inUse: cause {cause!r} is not one this schedext knows") from None
    return InUse(
        uuid=_text(entry.get("uuid"), "inUse: uuid", empty=False),
        pod=_pod(entry.get("pod"), "inUse"),
        container=_text(entry.get("container", ""), "inUse: container"),
        resource=_text(entry.get("resource", ""), "inUse: resource"),
        cause=parsed,
        mig=entry.get("mig") is True,
    )


def _stale(entry: Mapping[str, object]) -> StaleRecord:
    uuids = entry.get("uuids")
    if not isinstance(uuids, list) or len(uuids) > _MAX_UUIDS:
        raise DocumentError(f"stale: uuids is not a list of at most {_MAX_UUIDS}")
    since = entry.get("since")
    if not isinstance(since, int | float) or isinstance(since, bool) or since < 0:
        raise DocumentError("stale: since is not a time")
    return StaleRecord(
        pod=_pod(entry.get("pod"), "stale"),
        uid=_text(entry.get("uid", ""), "stale: uid"),
        uuids=tuple(_text(u, "stale: uuids", empty=False) for u in uuids),
        since=float(since),
        released=entry.get("released") is True,
    )


def _pod(value: object, where: str) -> str:
    pod = _text(value, f"{where}: pod", empty=False)
    namespace, slash, name = pod.partition("/")
    if not (slash and namespace and name):
        raise DocumentError(f"{where}: pod {pod!r} is not namespace/name")
    return pod


def _text(value: object, name: str, *, empty: bool = True) -> str:
    if not isinstance(value, str) or len(value) > _MAX_TEXT or (not empty and not value):
        least = 0 if empty else 1
        raise DocumentError(f"{name} is not a string of {least} to {_MAX_TEXT} characters")
    return value
