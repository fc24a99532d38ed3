"""Gangs: all-or-nothing placement of a PodGroup, built from filter and bind.

kube-scheduler's extender protocol has no Permit phase, so schedext makes bind the barrier:

* **Filter** rejects a member (every node, unresolvable) while fewer than ``minMember`` pods
  of its group exist; then (preemption may help) while the cluster's free resources cannot
  cover the PodGroup's ``minResources`` (:func:`min_resources_gap`), or the members not yet
  placed cannot all find free GPUs, or room for their GPU shares, at once (:func:`fits_all`,
  an exact bin-packing search of whole GPUs after a greedy placement of the shares);
  and on each node where the member would leave the rest no room (:func:`member_nodes`).
* **Bind** reserves the member's node and GPUs (every later filter sees them) and makes the
  member wait until reserved + bound members reach ``minMember``; then all waiting members
  are bound, each with its own Binding (a member whose Binding fails gives its reservation
  back and is retried alone: the others stay bound). A group that does not complete within
  its timeout releases every reservation it holds, and its waiting binds fail, so
  kube-scheduler retries them.

**Competing groups.** Two groups that each need most of the cluster could each reserve part of
it and wait for each other. The rule: *the older group wins* (PodGroup creationTimestamp, then
namespace/name). When a member cannot complete its group because of GPUs reserved by waiting
members of other groups, then either its group is older than all of them, and their
reservations are released (they retry later), or it is not, and it releases its own group's
reservations and its bind fails. Exactly one group keeps its reservations, so no two groups
wait on each other. The rule is the same after a restart, since the age is read from the API.

Everything here is pure: the caller passes ``now`` and performs the effects, which are
returned as :class:`GangEvent` values (wake or fail the waiting binds).

The rooms: :mod:`~extender.gang.spec` (PodGroups decoded, minResources),
:mod:`~extender.gang.book` (members, the barrier, events), :mod:`~extender.gang.packing` (the
whole-group fit search), :mod:`~extender.gang.share_packing` (where the members' GPU shares
go, for that search) and :mod:`~extender.gang.coordinator` (the decisions each verb asks for,
over the book and the inventory).
"""

from __future__ import annotations

from extender.gang.book import GangBook, GangEvent, GangEventKind
from extender.gang.coordinator import OPEN, GangCoordinator, GangGate
from extender.gang.packing import FitCache, fits_all, member_nodes
from extender.gang.spec import PodGroupSpec, min_resources_gap, pod_group_spec

__all__ = [
    "OPEN",
    "FitCache",
    "GangBook",
    "GangCoordinator",
    "GangEvent",
    "GangEventKind",
    "GangGate",
    "PodGroupSpec",
    "fits_all",
    "member_nodes",
    "min_resources_gap",
    "pod_group_spec",
]
