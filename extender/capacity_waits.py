"""The pods filter turned away for something another pod holds, sent back to kube-scheduler
when schedext sees it freed.

kube-scheduler retries a pod that an extender rejected on the next cluster event it sees (it
files the rejection under a stand-in plugin, "Extender", that every event requeues), and with
an empty active queue it does not wait for the pod's backoff (SchedulerPopFromBackoffQ, on
since 1.33). When a pod holding what another waits for is deleted, kube-scheduler and
schedext each learn it from their own watch: kube-scheduler retries the waiting pod within a
millisecond, and schedext, a step behind, still finds the node full. Unless another event
comes, the pod then waits, with the room free, for kube-scheduler's flush of unschedulable
pods (``podMaxInUnschedulablePodsDuration``, five minutes). Measured: a share waiting for
GPU memory, retried twice within milliseconds of a share's deletion and refused both times,
waited for the flush in 4 runs of 10 on an idle machine. kube-scheduler does not see some
freeings at all: an IPPool made larger, or a GPU the node agent marks healthy again.

So filter records the pods it turns away, under what they wait for (a :data:`Wait`: a kind
and a key). When schedext's own books see such a thing freed, the shell nudges the waiting
pods (an update of the pod is an event kube-scheduler requeues it on), and their retry meets
books that already have the room. The kinds, and what frees them
(:mod:`extender.wakeups` says which pod waits for what, and tells this book what freed):

========  ==========================  ========================================================
kind      key                         freed by
========  ==========================  ========================================================
address   the IPPool                  an address of it no longer held; the pool created or
                                      changed
gpu       a GPU model the pod may     a pod holding GPUs or a share of one leaving a node of
          use (a node class)          that model; a node added or its GPUs changed
share     the same                    the same
mig       the MIG profile             a pod holding a MIG device of that profile leaving; a
                                      node added or its MIG devices changed
quota     the namespace, or           a pod leaving the namespace (and, for ``BORROWING``,
          ``BORROWING`` for a pod     any namespace with a team quota); a team quota created,
          held back from borrowing    changed or deleted
hold      "" (any hold)               a gang's hold ending (extender.gang.holds)
========  ==========================  ========================================================

Bounded, so that a freeing cannot turn into a storm of API writes: each freeing nudges at
most ``per_event`` of the pods waiting for it, the oldest waiter first (the pod turned away
longest ago, counted from its last nudge: a pod nudged and turned away again joins the end,
so that pods too large for what freed do not keep the others from their turn); a pod waiting
on several keys freed together is nudged once; and no pod is nudged twice within
``interval_s``: a nudge due sooner waits for its time (:meth:`WaitBook.next_at` says when,
for the shell's timer), and is dropped if filter turns the pod away again meanwhile (that
judgement already saw what freed). A nudged pod is forgotten until filter turns it away
again. The book holds at most ``capacity`` pods (the oldest go first), and the owner forgets
a pod once it is bound or deleted.
"""

from __future__ import annotations

import heapq
import itertools
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from extender.model import Holding, NodeSpec

__all__ = ["BORROWING", "Nudge", "Vacancies", "Wait", "WaitBook", "WaitKind"]


class WaitKind(StrEnum):
    """What a pod waits for; the metric's label (``schedext_requeues_total{kind}``). A
    resource kind (:mod:`extender.kinds`) waits under its own name (``Kind.name``): the
    shipped ones are named here too, and a new one needs no member."""

    ADDRESS = "address"
    GPU = "gpu"
    SHARE = "share"
    MIG = "mig"
    QUOTA = "quota"
    HOLD = "hold"  # GPUs held for a starving gang (extender.gang.holds): any hold ending


Wait = tuple[str, str]  # a kind and its key (a pool, a GPU model, a profile, a namespace)
BORROWING = ""  # the quota key of pods held back from borrowing (no namespace is named "")


@dataclass(frozen=True, slots=True)
class Nudge:
    """Have kube-scheduler retry ``pod`` (namespace/name): ``kind`` freed for it."""

    pod: str
    uid: str
    kind: str  # a WaitKind, or a resource kind's name


class Vacancies(Protocol):
    """What the inventory tells, as it happens, of what may have made room: it knows what
    was held, the listener who waits for it (:class:`extender.wakeups.WakeUps`)."""

    def vacated(self, holding: Holding, spec: NodeSpec | None) -> None:
        """A pod stopped holding ``holding`` (deleted, finished, its reservation given up or
        expired); ``spec``: its node's, when the node is known."""

    def node_changed(self, old: NodeSpec | None, new: NodeSpec) -> None:
        """A node was added (``old`` None) or its spec changed."""


@dataclass(slots=True)
class _Waiter:
    pod: str
    turn: int  # its place in line: smaller waited longer
    on: frozenset[Wait]


class WaitBook:
    """Bounded in size (``capacity`` pods) and in what each freeing sends back."""

    def __init__(self, *, per_event: int = 8, interval_s: float = 1.0, capacity: int = 10_000):
        if per_event < 1 or interval_s < 0 or capacity < 1:
            raise ValueError("per_event and capacity must be >= 1, interval_s >= 0")
        self._per_event, self._interval_s, self._capacity = per_event, interval_s, capacity
        self._turns = itertools.count()
        self._waiters: dict[str, _Waiter] = {}  # by uid, in line order
        self._on: dict[Wait, dict[str, None]] = {}  # each key's waiters
        self._due: OrderedDict[str, Nudge] = OrderedDict()  # chosen, held back by the interval
        self._sent: OrderedDict[str, float] = OrderedDict()  # last nudge per uid, oldest first

    def __len__(self) -> int:
        """How many pods wait, or are due a nudge."""
        return len(self._waiters) + len(self._due)

    def knows(self, uid: str) -> bool:
        """Whether pod ``uid`` waits, or is due a nudge."""
        return uid in self._waiters or uid in self._due

    def waiting(self, kind: str, key: str) -> bool:
        """Whether some pod waits for ``key`` of ``kind``."""
        return (kind, key) in self._on

    def wait(self, uid: str, pod: str, on: Iterable[Wait]) -> None:
        """Filter turned ``uid`` (``pod``: namespace/name) away for want of ``on``. A pod
        that waits already keeps its place; the keys are the latest judgement's (none: it
        waits for nothing a freeing gives, and is forgotten)."""
        keys = frozenset(on)
        if not keys:
            self.forget(uid)
            return
        if not uid:
            return
        self._due.pop(uid, None)  # judged after the freeing it was due a nudge for
        waiter = self._waiters.get(uid)
        if waiter is None:
            waiter = self._waiters[uid] = _Waiter(pod, next(self._turns), frozenset())
        for key in waiter.on - keys:
            self._drop(key, uid)
        for key in keys - waiter.on:
            self._on.setdefault(key, {})[uid] = None
        waiter.on = keys
        while len(self._waiters) > self._capacity:
            self.forget(next(iter(self._waiters)))

    def forget(self, uid: str) -> None:
        """The pod is bound, gone, or chosen for a nudge: it waits no more."""
        self._due.pop(uid, None)
        waiter = self._waiters.pop(uid, None)
        if waiter is not None:
            for key in waiter.on:
                self._drop(key, uid)

    def freed(self, kind: str, key: str | None = None, count: int = 1) -> None:
        """``count`` of ``key`` of ``kind`` were freed (None: of every key of the kind): the
        ``per_event`` pods waiting longest for it, for each, are due a nudge."""
        keys = [w for w in self._on if w[0] == kind] if key is None else [(kind, key)]
        candidates = {uid for w in keys for uid in self._on.get(w, ())}
        if not candidates:
            return
        turn = self._turn
        for uid in heapq.nsmallest(self._per_event * count, candidates, key=turn):
            nudge = Nudge(self._waiters[uid].pod, uid, kind)
            self.forget(uid)
            self._due[uid] = nudge
        while len(self._due) > self._capacity:
            self._due.popitem(last=False)

    def take(self, now: float) -> list[Nudge]:
        """The nudges due, but those whose pod was nudged less than ``interval_s`` ago: they
        wait for :meth:`next_at`."""
        sent: list[Nudge] = []
        for uid, nudge in list(self._due.items()):
            last = self._sent.get(uid)
            if last is None or now - last >= self._interval_s:
                del self._due[uid]
                self._sent[uid] = now
                self._sent.move_to_end(uid)
                sent.append(nudge)
        while self._sent and (
            len(self._sent) > self._capacity
            or now - next(iter(self._sent.values())) >= self._interval_s
        ):
            self._sent.popitem(last=False)
        return sent

    def next_at(self) -> float | None:
        """When the first nudge held back by the interval may go; None when none is."""
        times = [self._sent[uid] for uid in self._due if uid in self._sent]
        return min(times) + self._interval_s if times else None

    def _turn(self, uid: str) -> int:
        return self._waiters[uid].turn

    def _drop(self, key: Wait, uid: str) -> None:
        waiters = self._on.get(key)
        if waiters is not None:
            waiters.pop(uid, None)
            if not waiters:
                del self._on[key]
