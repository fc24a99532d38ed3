"""Watch events that change nothing the intake reads: most pod updates after a bind.

Once a pod is bound, the kubelet updates its status again and again (conditions, container
statuses, its IP), and controllers touch labels and annotations schedext never reads; each
update is a watch event, and decoding the pod's holding again to find it unchanged costs more
than everything else an event costs in-process (``loadtests.intakebench``). The intake
therefore keeps, per bound pod, a *mark*: a digest of every field any of its readers reads
(:func:`fingerprint`) and the holding it left in the inventory. An event whose digest equals
the mark, while the books still show what applying it left, is skipped: applying it again
would change nothing.

Which fields: the pod's ``spec`` whole (the requests, ``nodeName``, priority, DRA's claims,
all rarely changed); of its metadata the uid, name, namespace and owner references (a
StatefulSet's identity), and the labels and annotations schedext reads (every ``schedext.io/``
key, the gang label, the workload type, the topology keys of Kueue and KAI); of its status
the phase and DRA's two claim fields. What is left out (``resourceVersion``,
``managedFields``, conditions, container statuses, IPs, times, other labels and annotations)
is read by none of them; a unit test changes every field the readers read and asserts that
the event is applied, and every other one and asserts that it is skipped.

Only plain bound pods are marked (not a gang's members, nor pods with DRA claims), and a mark
goes with its pod (deleted, finished, unbound) and with every relist: memory is one small
entry per bound pod that has changed since the last list. The shell reports both
(``schedext_pod_events_skipped_total``, ``schedext_pod_marks``).
"""

from __future__ import annotations

import zlib
from typing import Any, Protocol

import orjson

from extender import fields, names
from extender.dra import ClaimsLedger
from extender.evictions import EvictionBook
from extender.fields import JSONObject
from extender.gang import GangBook
from extender.inventory import Inventory
from extender.model import Holding
from extender.pending import PendingPods
from extender.quotas import Departures
from extender.wakeups import WakeUps

__all__ = ["PodMarks", "bound", "fingerprint"]

_MASK64 = (1 << 64) - 1
_PREFIX = "schedext.io/"
# Label and annotation keys read outside schedext's own prefix.
_KEYS = frozenset({names.POD_GROUP_LABEL, names.WORKLOAD_TYPE, *names.TOPOLOGY_KEYS})


def _read(value: Any) -> Any:
    """Of a labels or annotations map, the keys schedext reads (anything else as it is)."""
    if type(value) is not dict:
        return value
    kept = None
    for key in value:
        if key in _KEYS or key.startswith(_PREFIX):
            if kept is None:
                kept = {}
            kept[key] = value[key]
    return kept


def fingerprint(pod: JSONObject) -> int | None:
    """A digest of every field of ``pod`` the intake reads, 96 bits (Python's keyed 64-bit
    hash and a CRC-32 of their JSON); None when it cannot be taken (values that are not
    JSON): such an event is never skipped."""
    meta = fields.obj(pod, "metadata")
    status = fields.obj(pod, "status")
    read = (
        fields.get(meta, "uid"),
        fields.get(meta, "name"),
        fields.get(meta, "namespace"),
        fields.get(meta, "ownerReferences"),
        _read(fields.get(meta, "labels")),
        _read(fields.get(meta, "annotations")),
        fields.get(pod, "spec"),
        fields.get(status, "phase"),
        fields.get(status, "resourceClaimStatuses"),
        fields.get(status, "extendedResourceClaimStatus"),
    )
    try:
        text = orjson.dumps(read)
    except TypeError:  # orjson.JSONEncodeError: a Mapping that is no dict, a huge integer
        return None
    return (hash(text) & _MASK64) << 32 | zlib.crc32(text)


class Books(Protocol):
    """The books a pod event writes (:class:`extender.intake.Books`), as read here."""

    @property
    def inventory(self) -> Inventory: ...
    @property
    def pending(self) -> PendingPods: ...
    @property
    def wakeups(self) -> WakeUps: ...
    @property
    def evictions(self) -> EvictionBook: ...
    @property
    def departures(self) -> Departures: ...
    @property
    def gangs(self) -> GangBook: ...
    @property
    def dra(self) -> ClaimsLedger: ...


class PodMarks:
    """Per bound pod (uid): the fingerprint last applied and the holding it left."""

    def __init__(self) -> None:
        self._marks: dict[str, tuple[int, Holding]] = {}
        self.skipped = 0  # events found to change nothing, ever

    def __len__(self) -> int:
        return len(self._marks)

    def applied(self, books: Books, uid: str, mark: int) -> bool:
        """Whether an event of pod ``uid`` with fingerprint ``mark`` would change nothing:
        the same fingerprint was the last applied, and the books still show exactly what
        applying it left (its holding, and nothing pending, waiting, approved or in a gang
        for it: filter, preempt and bind may have written some since)."""
        last = self._marks.get(uid)
        if last is None or last[0] != mark:
            return False
        unchanged = (
            books.inventory.holding(uid) is last[1]
            and not books.pending.knows(uid)
            and not books.wakeups.knows(uid)
            and not books.evictions.knows(uid)
            and not books.departures.knows(uid)
            and books.gangs.group_of(uid) is None
            and not books.dra.knows_pod(uid)
        )
        self.skipped += unchanged
        return unchanged

    def record(self, books: Books, holding: Holding, mark: int | None) -> None:
        """The intake applied a bound pod's event of fingerprint ``mark``; ``holding`` is
        what it decoded and recorded (the inventory keeps it, or an equal one it had)."""
        held = books.inventory.holding(holding.uid)
        if mark is None or held is None or holding.group is not None:
            self._marks.pop(holding.uid, None)
            return
        self._marks[held.uid] = (mark, held)

    def forget(self, uid: str) -> None:
        self._marks.pop(uid, None)

    def clear(self) -> None:
        self._marks.clear()


def bound(pod: JSONObject) -> bool:
    """Whether ``pod`` names a node (only those are marked)."""
    return bool(fields.text(fields.obj(pod, "spec"), "nodeName"))
