"""Holds: GPUs kept for a gang that has waited too long, so that a stream of small pods cannot
starve it.

A gang needs all its GPUs free at once. While 1-GPU pods come and go, each GPU that frees is
taken by the next small pod, and a 32-GPU gang may never see 32 free together; the bind
barrier holds capacity only once the gang already fits. So a gang that has waited longer than
``hold_after_s``, and would fit if the running pods of no higher priority that are in no gang
finished, gets a **hold** (:mod:`~extender.gang.hold_choice` chooses where): the nodes it would
take and how many whole GPUs on each (``need``).

While a hold stands, filter keeps off its GPUs every pod that is not a member of its gang and
whose priority is not higher than the gang's (:meth:`HoldBook.keep_off`): on a held node such
a pod passes only if the node's free GPUs, less what the pod takes, still cover the need. So
what frees there accumulates for the gang, and the small pods go anywhere else (backfill). A
pod of higher priority is not kept off, and may preempt as ever.

A hold ends when the gang has all its members placed or is gone (ENDED), or at its maximum age
(EXPIRED); a gang whose hold expired waits afresh before it may get another. The shell writes
each hold on its PodGroup (:data:`~extender.names.GANG_HOLD`, only when it starts or ends), so
that a new leader adopts it (:meth:`HoldBook.adopt`) instead of choosing again.

Bounded: one hold per gang, at most ``capacity`` gangs.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum

import numpy as np

from extender.inventory import BoolArray, IdArray, Inventory
from extender.model import FilterVerdict, PodRequest, Reason, Rejection

__all__ = [
    "Hold",
    "HoldBook",
    "HoldEvent",
    "HoldEventKind",
    "hold_record",
    "hold_text",
    "read_hold_record",
]


@dataclass(frozen=True, slots=True)
class Hold:
    """GPUs kept for ``group``: per node, how many whole GPUs (``need``). Times are Unix
    seconds (they outlive the process, on the PodGroup)."""

    group: str
    priority: int
    need: tuple[tuple[str, int], ...]
    started: float
    expires: float
    waiting_since: float
    level: str = ""  # the required level it lies in ("" for none)
    domain: str = ""  # and the domain's name

    @property
    def gpus(self) -> int:
        return sum(gpus for _, gpus in self.need)

    @property
    def where(self) -> str:
        """The domain, or the nodes, in words."""
        if self.domain:
            return f"{self.level} {self.domain}"
        nodes = [node for node, _ in self.need]
        return ", ".join(nodes[:4]) + (f" and {len(nodes) - 4} more" if len(nodes) > 4 else "")


class HoldEventKind(Enum):
    STARTED = "started"
    ENDED = "ended"  # the gang placed its members, or is gone
    EXPIRED = "expired"  # it reached its maximum age


@dataclass(frozen=True, slots=True)
class HoldEvent:
    kind: HoldEventKind
    hold: Hold
    reason: str = ""
    uid: str = ""  # the PodGroup's, for its event


class HoldBook:
    """The holds that stand, by gang and by node; the events the shell has not taken yet;
    and the GPU-seconds each left idle."""

    def __init__(self, capacity: int = 1024) -> None:
        self._capacity = capacity
        self._holds: dict[str, Hold] = {}
        self._by_node: dict[str, list[Hold]] = {}
        self._events: list[HoldEvent] = []
        self.idle_gpu_s: dict[str, float] = {}  # per gang: free GPUs kept, times seconds
        self.idle_now = 0  # free GPUs kept for holds at the last review
        self.idle_total = 0.0  # GPU-seconds kept idle by every hold so far
        self._changes = 0  # holds started or ended: the held-node mask is rebuilt
        self._mask: tuple[tuple[int, int], BoolArray] | None = None

    def __len__(self) -> int:
        return len(self._holds)

    def get(self, group: str) -> Hold | None:
        return self._holds.get(group)

    def holds(self) -> list[Hold]:
        return sorted(self._holds.values(), key=lambda h: h.group)

    def on_node(self, node: str) -> list[Hold]:
        return list(self._by_node.get(node, ()))

    def take_events(self) -> list[HoldEvent]:
        events, self._events = self._events, []
        return events

    # ------------------------------------------------------------- changes

    def start(self, hold: Hold, *, uid: str = "", reason: str = "") -> None:
        """A new hold (or one adopted from its PodGroup: ``reason`` says so)."""
        if hold.group in self._holds or len(self._holds) >= self._capacity:
            return
        self._holds[hold.group] = hold
        for node, _ in hold.need:
            self._by_node.setdefault(node, []).append(hold)
        self.idle_gpu_s.setdefault(hold.group, 0.0)
        self._changes += 1
        self._events.append(HoldEvent(HoldEventKind.STARTED, hold, reason, uid))

    def end(self, group: str, kind: HoldEventKind, reason: str, *, uid: str = "") -> None:
        hold = self._holds.pop(group, None)
        if hold is None:
            return
        for node, _ in hold.need:
            on = [h for h in self._by_node.get(node, ()) if h.group != group]
            if on:
                self._by_node[node] = on
            else:
                self._by_node.pop(node, None)
        self.idle_gpu_s.pop(group, None)
        self._changes += 1
        self._events.append(HoldEvent(kind, hold, reason, uid))

    def clear(self) -> None:
        """Forget every hold, with no event (a replica that answers anew: it adopts the
        records instead, :meth:`~extender.gang.hold_keeper.HoldKeeper.take_over`)."""
        self._holds.clear()
        self._by_node.clear()
        self.idle_gpu_s.clear()
        self._changes += 1

    def account(self, inventory: Inventory, seconds: float) -> int:
        """Count the free GPUs each hold keeps idle now, over the ``seconds`` since the last
        review: the hold's cost. Returns how many are kept now."""
        total = 0
        for hold in self._holds.values():
            idle = sum(min(_free(inventory, node), gpus) for node, gpus in hold.need)
            self.idle_gpu_s[hold.group] = self.idle_gpu_s.get(hold.group, 0.0) + idle * seconds
            total += idle
        self.idle_total += total * seconds
        self.idle_now = total
        return total

    # -------------------------------------------------------------- filter

    def keep_off(
        self, inventory: Inventory, request: PodRequest, verdict: FilterVerdict, ids: IdArray
    ) -> tuple[FilterVerdict, IdArray]:
        """Of the nodes that passed, reject those whose free GPUs are held for a gang, unless
        ``request`` is of that gang or of higher priority, or leaves the gang its need."""
        if not self._by_node or not len(ids) or not (request.gpus or request.share.devices):
            return verdict, ids
        takes = request.gpus or request.share.devices  # a share may open a whole GPU
        kept: dict[str, list[str]] = {}
        gone: list[int] = []  # positions in ``verdict.passed``
        free = inventory.arrays.gpu_free
        # Only the held nodes among those that passed are looked at (a few, of thousands).
        for position in np.flatnonzero(self._held_mask(inventory)[ids]).tolist():
            node, node_id = verdict.passed[position], int(ids[position])
            for hold in self._by_node.get(node, ()):
                if request.group == hold.group or request.priority > hold.priority:
                    continue
                need = dict(hold.need)[node]
                if int(free[node_id]) - takes < need:
                    kept.setdefault(hold.group, []).append(node)
                    gone.append(position)
                    break
        if not kept:
            return verdict, ids
        rejections = tuple(
            Rejection(
                f"schedext: this node's free GPUs are held for gang {group}, which has waited "
                f"since {_stamp(self._holds[group].waiting_since)} for all of its GPUs at once",
                resolvable=False,
                nodes=nodes,
                reason=Reason.GANG_HOLD,
            )
            for group, nodes in sorted(kept.items())
        )
        passed = list(verdict.passed)
        for position in reversed(gone):
            del passed[position]
        return FilterVerdict(passed, (*verdict.rejections, *rejections)), np.delete(ids, gone)

    def _held_mask(self, inventory: Inventory) -> BoolArray:
        """Per node slot, whether a hold names the node; kept until the holds or the
        inventory's layout change."""
        key = (inventory.layout, self._changes)
        if self._mask is None or self._mask[0] != key:
            mask = np.zeros(len(inventory.arrays.alive), dtype=np.bool_)
            mask[inventory.ids(list(self._by_node))] = True
            mask[0] = False  # names the inventory does not hold
            self._mask = (key, mask)
        return self._mask[1]

    def refuses(self, inventory: Inventory, request: PodRequest, node: str) -> Hold | None:
        """The hold that keeps ``request`` off ``node`` (bind's re-check), if any."""
        verdict = FilterVerdict([node])
        after, _ = self.keep_off(inventory, request, verdict, inventory.ids([node]))
        return None if after.passed else self._by_node[node][0]


def hold_record(hold: Hold) -> str:
    """The hold as its PodGroup carries it (:data:`~extender.names.GANG_HOLD`)."""
    return json.dumps(
        {
            "started": _stamp(hold.started),
            "expires": _stamp(hold.expires),
            "waitingSince": _stamp(hold.waiting_since),
            "priority": hold.priority,
            "level": hold.level,
            "domain": hold.domain,
            "nodes": dict(hold.need),
        },
        sort_keys=True,
        separators=(",", ":"),
    )


def hold_text(hold: Hold) -> str:
    """The hold in words, as explain tells it of a member's group."""
    return (
        f"holding {hold.gpus} GPUs on {hold.where} for the group since {_stamp(hold.started)}, "
        f"until {_stamp(hold.expires)}"
    )


def read_hold_record(group: str, text: str) -> Hold | None:
    """A hold from its PodGroup's annotation; None when it does not read as one (the next
    review then chooses afresh)."""
    try:
        data = json.loads(text)
        nodes = data["nodes"]
        need = tuple(sorted((str(n), g) for n, g in _items(nodes) if isinstance(g, int) and g > 0))
        return Hold(
            group=group,
            priority=int(data.get("priority", 0)),
            need=need,
            started=_unstamp(data["started"]),
            expires=_unstamp(data["expires"]),
            waiting_since=_unstamp(data.get("waitingSince", data["started"])),
            level=str(data.get("level", "")),
            domain=str(data.get("domain", "")),
        ) if need else None  # fmt: skip
    except (ValueError, TypeError, KeyError, AttributeError):
        return None


def _items(nodes: object) -> Iterable[tuple[object, object]]:  # a JSON object's
    if not isinstance(nodes, dict):
        raise TypeError("nodes is not an object")
    return nodes.items()


def _free(inventory: Inventory, node: str) -> int:
    if node not in inventory:
        return 0
    return max(0, int(inventory.arrays.gpu_free[inventory.ids([node])[0]]))


def _stamp(seconds: float) -> str:
    return dt.datetime.fromtimestamp(seconds, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _unstamp(text: object) -> float:
    if not isinstance(text, str):
        raise TypeError("not a timestamp")
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
