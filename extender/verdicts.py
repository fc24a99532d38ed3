"""Filter's verdicts: why a node cannot host a pod (:class:`Reason`, the order in which
reasons win, which ones preemption may resolve) and filter's answer (:class:`FilterVerdict`,
its :class:`Rejection` groups).

Why a module of its own: the reasons and the answer are filter's vocabulary, read by every
room that judges a node (policy, gangs, quotas, addressing, the waits, explain, the shell's
wire encoding), while :mod:`extender.model` describes pods and nodes. They depend on nothing
else of the core. :mod:`extender.model` still names them, where their callers have long
imported them from.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum

__all__ = ["PRECEDENCE", "RANKED", "FilterVerdict", "Reason", "Rejection"]


class Reason(IntEnum):
    """Why a node cannot host a pod. The numbers name a reason and mean nothing else: a new
    reason takes the next number. Which reason wins when several apply is :data:`PRECEDENCE`'s
    order; whether preemption may help, :attr:`resolvable`."""

    FITS = 0
    UNKNOWN_NODE = 1
    INVALID_POD = 2
    NO_GPUS = 3
    GPU_MODEL = 4
    GPU_MEMORY = 5
    GPU_TOTAL = 6
    CPU_THRESHOLD = 7
    CPU_TOTAL = 8
    IP_UNKNOWN_POOL = 9
    IP_NO_POOL = 10
    IP_NOT_IN_POOL = 11
    IP_STICKY_BUSY = 12
    IP_TAKEN = 13
    IP_EXHAUSTED = 14
    GPU_FREE = 15
    CPU_FREE = 16
    IP_TAKEN_HERE = 17  # held by a lower-priority pod on this very node: evicting it helps
    IP_EXHAUSTED_EVICTABLE = 18  # lower-priority holders of the pool run on this node
    # Whole-pod reasons of gangs (every node gets them alike).
    GANG_NOT_FOUND = 19
    GANG_QUORUM = 20
    GANG_CAPACITY = 21  # the group does not fit now: evicting pods may help
    GPU_UNHEALTHY = 22  # the node agent marked GPUs unhealthy: too few healthy ones remain
    # GPU shares: the node's GPUs are smaller than the share (or their memory is unknown);
    # too few of its GPUs have the memory, or the compute, free for it now.
    GPU_SHARE_SIZE = 23
    GPU_SHARE_MEMORY = 24
    GPU_SHARE_CORES = 25
    # MIG devices: the node has too few healthy ones of the profile at all; too few are free now.
    GPU_MIG_PROFILE = 26
    GPU_MIG_FREE = 27
    # Whole-pod reasons of team quotas (extender.quotas): the pod (or its gang) would take its
    # namespace over its quota's max; or over its min, borrowing what the rule does not lend.
    QUOTA_MAX = 28
    QUOTA_BORROW = 29
    # The node agent reports GPUs in use by containers schedext did not place (the kubelet's
    # PodResources): without them too few are free. Evicting other pods may still help.
    GPU_IN_USE = 30
    # Both the device plugin and DRA advertise the node's GPUs (extender.dra.ownership): either
    # may hand one out behind the other's back, so schedext hands out none (unless fenced).
    GPU_OWNER_MIXED = 31
    # The node's free GPUs are held for a gang that waited too long (extender.gang.holds):
    # lower- or equal-priority pods go elsewhere; no eviction lifts it.
    GANG_HOLD = 32

    @property
    def resolvable(self) -> bool:
        """Whether evicting pods from the node could make it fit (a preemption candidate)."""
        return self in _RESOLVABLE


# When several reasons apply to a node, the first of these wins: what no eviction can change
# (the node, the pod, the node's hardware, the address it can never give) before what
# preemption might fix (free GPUs, free CPU, an address a lower-priority pod holds here).
# Every reason but FITS stands here exactly once.
PRECEDENCE: tuple[Reason, ...] = (
    Reason.UNKNOWN_NODE,
    Reason.INVALID_POD,
    Reason.GPU_OWNER_MIXED,
    Reason.NO_GPUS,
    Reason.GPU_MODEL,
    Reason.GPU_MEMORY,
    Reason.GPU_TOTAL,
    Reason.GPU_UNHEALTHY,
    Reason.GPU_SHARE_SIZE,
    Reason.GPU_MIG_PROFILE,
    Reason.CPU_THRESHOLD,
    Reason.CPU_TOTAL,
    Reason.IP_UNKNOWN_POOL,
    Reason.IP_NO_POOL,
    Reason.IP_NOT_IN_POOL,
    Reason.IP_STICKY_BUSY,
    Reason.IP_TAKEN,
    Reason.IP_EXHAUSTED,
    Reason.QUOTA_MAX,
    Reason.QUOTA_BORROW,
    Reason.GPU_IN_USE,
    Reason.GPU_FREE,
    Reason.GPU_SHARE_MEMORY,
    Reason.GPU_SHARE_CORES,
    Reason.GPU_MIG_FREE,
    Reason.CPU_FREE,
    Reason.IP_TAKEN_HERE,
    Reason.IP_EXHAUSTED_EVICTABLE,
    Reason.GANG_NOT_FOUND,
    Reason.GANG_QUORUM,
    Reason.GANG_CAPACITY,
    Reason.GANG_HOLD,
)

# The filter's arrays hold ranks, not Reason numbers: FITS ranks 0, and every other reason its
# place in PRECEDENCE counted from 1, so that the reason that wins on a node is the smallest
# rank that applies. RANKED[rank] is the reason of a rank.
RANKED: tuple[Reason, ...] = (Reason.FITS, *PRECEDENCE)

_RESOLVABLE = frozenset(
    {
        Reason.GPU_IN_USE,
        Reason.GPU_FREE,
        Reason.GPU_SHARE_MEMORY,
        Reason.GPU_SHARE_CORES,
        Reason.GPU_MIG_FREE,
        Reason.CPU_FREE,
        Reason.IP_TAKEN_HERE,
        Reason.IP_EXHAUSTED_EVICTABLE,
        Reason.GANG_CAPACITY,
    }
)


@dataclass(frozen=True, slots=True)
class Rejection:
    """Nodes rejected for one reason."""

    message: str
    resolvable: bool  # whether preemption could help (FailedNodes only)
    nodes: Sequence[str]
    reason: Reason = Reason.INVALID_POD  # for metrics: rejections counted by reason
    # Whether every name is one the inventory holds: such names are known to need no JSON
    # escaping (see nodes.node_spec), which lets the encoder skip checking thousands of them.
    known_nodes: bool = True


@dataclass(frozen=True, slots=True)
class FilterVerdict:
    """Filter's answer: the nodes that passed, in input order (all known to the inventory),
    and the rejected ones grouped by reason (a few groups, so encoding them costs little even
    at thousands of nodes)."""

    passed: Sequence[str]
    rejections: tuple[Rejection, ...] = ()
    # Shortlist mode (extender.shortlist): how many nodes passed before ``passed`` was cut to
    # the best few; 0 when it was not. A shortlisted answer lists no rejected node.
    shortlisted_from: int = 0

    @property
    def feasible(self) -> int:
        """How many nodes passed, before any shortlist cut."""
        return self.shortlisted_from or len(self.passed)

    @property
    def failed(self) -> dict[str, str]:
        """Every rejected node and its reason. On the wire, those preemption may help go in
        ``FailedNodes`` and the others (:attr:`unresolvable`) in ``FailedAndUnresolvableNodes``."""
        return {node: r.message for r in self.rejections for node in r.nodes}

    @property
    def unresolvable(self) -> dict[str, str]:
        """Rejected nodes that preemption cannot help (``FailedAndUnresolvableNodes``)."""
        return {node: r.message for r in self.rejections if not r.resolvable for node in r.nodes}

    @property
    def why(self) -> str:
        """Why no node passed, in a line: each reason and how many nodes it turned away, the
        most first, then those preemption could help (three at most); "" when some node
        passed."""
        if self.passed:
            return ""
        if not self.rejections:
            return "no node was offered"
        ranked = sorted(self.rejections, key=lambda r: (-len(r.nodes), not r.resolvable))
        shown = [
            f"{r.message} ({len(r.nodes)} node{'s' if len(r.nodes) != 1 else ''})"
            for r in ranked[:3]
        ]
        if len(ranked) > 3:
            shown.append(f"{len(ranked) - 3} more reasons")
        return "; ".join(shown)
