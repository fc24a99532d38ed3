"""The resource kinds a pod's GPU demand comes in, as one seam (:class:`Kind`).

Adding a kind: a module here that implements :class:`Kind`, its line in :data:`KINDS`, its
tests, and, for a device the node agent hands out, one allocator in ``app/agent``
(docs/architecture.md, "Where to add", walks through one).
"""

from __future__ import annotations

from typing import Any

from extender.kinds.kind import BoolArray, Column, Conditions, Kind, Placed
from extender.kinds.mig import MIG
from extender.kinds.share import SHARE
from extender.kinds.whole_gpu import WHOLE_GPU
from extender.model import Demand

__all__ = ["KINDS", "BoolArray", "Column", "Conditions", "Kind", "Placed", "asked"]

# A pod asks for at most one of these today (requests refuses a mix), but nothing here
# relies on it: the verbs apply every kind a pod asks for.
KINDS: tuple[Kind[Any], ...] = (WHOLE_GPU, SHARE, MIG)


def asked(demand: Demand) -> tuple[Kind[Any], ...]:
    """The kinds ``demand`` asks for, in :data:`KINDS` order."""
    return tuple(kind for kind in KINDS if kind.asks(demand))
