"""What each pod filter turned away waits for, and what the books saw freed: the waits of
:mod:`extender.capacity_waits` (which says why), kind by kind.

A pod waits for a **device** (a whole GPU, a share of one, or a MIG device of a profile) when
some node turned it away for a reason on :data:`_DEVICE_REASONS`: what a pod leaving that
node, or a change of the node, may give. Whole GPUs and shares wait under each GPU model the
pod may use (a node class: its model hint's, every model without one; an A100 freed wakes no
one waiting for H100s), MIG devices under their profile. Nodes are not looked at one by one:
a filter that turns a pod away on every node costs a few microseconds more, not a pass over
thousands of names. A pod waits for an **address** under its pools, for **quota** headroom under
its namespace (max) or :data:`~extender.capacity_waits.BORROWING` (held back from borrowing:
any team's use going down may lend it room).

What frees each (the inventory tells :class:`WakeUps` as it happens, through
:class:`~extender.capacity_waits.Vacancies`): a pod leaving a node frees its GPUs and shares
(whole GPUs and shares of the node's model alike: a share gone may leave a device whole, a
whole GPU gone takes shares), its MIG devices by profile, and headroom in its namespace if a
team quota applies there; a node added, or one that had no GPU, may give anything; a node
changed frees its models and profiles; a team quota changed frees every quota wait; a pending
pod gone frees borrowing (what it asked weighs in the sharing of what may be borrowed). The
address book keeps its own record of freed addresses (an address vacated and held again in
one step frees nothing) and hands it over at :meth:`WakeUps.take`.

A resource kind says which of its reasons a freeing may lift, its own keys and what frees
them (:class:`extender.kinds.Kind`: ``freed_by_departure``, ``freed_by_node``, ``waits``,
``departure_frees``, ``node_frees``), under its own name (the metric's label). Anything else
a pod may wait for: a member of :class:`~extender.capacity_waits.WaitKind`; where filter
turns a pod away for it, the keys it then waits under (:meth:`WakeUps.turned_away` or
:meth:`WakeUps.held_back`); where the books see it freed, a call of ``freed`` with the same
keys. The shell sends the nudges and counts them by kind with nothing more.
"""

from __future__ import annotations

from extender.addressing import ip_context, waits_for_address
from extender.capacity_waits import BORROWING, Nudge, Wait, WaitBook, WaitKind
from extender.inventory import Inventory
from extender.kinds import KINDS, asked
from extender.model import FilterVerdict, Holding, NodeSpec, PodRequest, QuotaHold, Reason
from extender.pending import PendingPods
from extender.quotas import QuotaBook

__all__ = ["WakeUps"]

# Why a node turns a device away that a pod leaving it (each kind's freed_by_departure) or a
# change of the node may change (a node schedext has not seen yet included). Not the reasons
# of nodes of another kind (no GPU at all, another model): they are most nodes, and they wait.
_FREED_BY_NODE = frozenset({Reason.UNKNOWN_NODE, Reason.GPU_MEMORY})
_DEVICE_REASONS = _FREED_BY_NODE.union(
    *(kind.freed_by_departure | kind.freed_by_node for kind in KINDS)
)


class WakeUps:
    """The pods turned away and what they wait for (a :class:`WaitBook`), fed by filter and
    by the books' changes; :meth:`take` says which to send back."""

    def __init__(self, book: WaitBook, quotas: QuotaBook) -> None:
        self._book, self._quotas = book, quotas

    def __len__(self) -> int:
        return len(self._book)

    def knows(self, uid: str) -> bool:
        """Whether pod ``uid`` waits, or is due a nudge."""
        return self._book.knows(uid)

    # ------------------------------------------------------------- filter's side

    def turned_away(
        self, inventory: Inventory, request: PodRequest, verdict: FilterVerdict
    ) -> None:
        """Filter turned ``request`` away on every node it was offered: remember what it
        waits for (nothing a freeing can give: it is forgotten)."""
        self._addresses_freed(inventory)  # before it waits: those were no use to it
        on: set[Wait] = set()
        if any(r.reason in _DEVICE_REASONS for r in verdict.rejections):
            for kind in asked(request):
                on.update((kind.name, key) for key in kind.waits(inventory, request))
        if request.ip is not None and waits_for_address({r.reason for r in verdict.rejections}):
            context = ip_context(inventory, request)
            if context is not None:
                pools = [pool.name for pool in context.pools] + list(context.missing_pools)
                on.update((WaitKind.ADDRESS, pool) for pool in pools)
        if any(r.reason is Reason.GANG_HOLD for r in verdict.rejections):
            on.add((WaitKind.HOLD, ""))
        self._book.wait(request.uid, request.key, on)

    def hold_ended(self, gpus: int) -> None:
        """A gang's hold of ``gpus`` ended: the pods it kept off them may go there."""
        self._book.freed(WaitKind.HOLD, "", count=max(1, gpus))

    def held_back(self, request: PodRequest, hold: QuotaHold) -> None:
        """Its team quota held ``request`` back (``hold``): over max, it waits for its own
        namespace's use to go down; borrowing, for any team's."""
        key = request.namespace if hold.reason is Reason.QUOTA_MAX else BORROWING
        self._book.wait(request.uid, request.key, [(WaitKind.QUOTA, key)])

    def forget(self, uid: str) -> None:
        """The pod is bound: it waits no more."""
        self._book.forget(uid)

    def pod_gone(self, uid: str, pending: PodRequest | None) -> None:
        """The pod was deleted (``pending``: what it asked, if it was pending): it waits no
        more, and what it asked no longer weighs against other teams' borrowing."""
        self._book.forget(uid)
        if pending is not None and self._quotas.applying(pending.namespace) is not None:
            self._book.freed(WaitKind.QUOTA, BORROWING)

    # ------------------------------------------------------------ what freed

    def vacated(self, holding: Holding, spec: NodeSpec | None) -> None:
        """The inventory no longer holds ``holding`` (see
        :class:`~extender.capacity_waits.Vacancies`)."""
        book = self._book
        # Every kind, not only the one the pod asked for: a share gone may leave a GPU whole.
        for kind in KINDS:
            for key, count in kind.departure_frees(holding, spec) if spec is not None else ():
                book.freed(kind.name, key, count)
        if self._quotas.applying(holding.namespace) is not None:
            book.freed(WaitKind.QUOTA, holding.namespace)
            book.freed(WaitKind.QUOTA, BORROWING)

    def node_changed(self, old: NodeSpec | None, new: NodeSpec) -> None:
        """A node was added or its spec changed (see
        :class:`~extender.capacity_waits.Vacancies`)."""
        for kind in KINDS:
            keys = kind.node_frees(old, new)
            if keys is None:
                self._book.freed(kind.name)  # any of it: a node that now has the kind
            for key in keys or ():
                self._book.freed(kind.name, key)

    def quotas_changed(self) -> None:
        """A team quota was created, changed or deleted: any quota wait may be over."""
        self._book.freed(WaitKind.QUOTA)

    # ------------------------------------------------------------- the shell's side

    def take(self, now: float, inventory: Inventory, pending: PendingPods) -> list[Nudge]:
        """The nudges to send now, for pods still pending (see :meth:`WaitBook.take`)."""
        self._addresses_freed(inventory)
        return [n for n in self._book.take(now) if pending.get(n.uid) is not None]

    def next_at(self) -> float | None:
        """When a nudge held back by the book's interval may go (the shell's timer)."""
        return self._book.next_at()

    def _addresses_freed(self, inventory: Inventory) -> None:
        for pool in inventory.addresses.take_freed():
            self._book.freed(WaitKind.ADDRESS, pool)
