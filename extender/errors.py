"""Errors of the scheduling core.

    Exception
     +-- ValueError
     |    +-- QuantityError        (quantity.py) not a Kubernetes quantity
     |    |    +-- QuantityRangeError   (quantity.py) over 2^63-1 in magnitude
     |    +-- PodRequestError      (here) a pod's resources/annotations are unreadable
     +-- InventoryConflictError         (inventory.py) GPU indices already held
     +-- BindRefusedError               (here) bind cannot go ahead; the message says why

Outcomes a scheduler expects (a node that does not fit) are values (:class:`Reason`), not
exceptions; these are for requests that cannot be answered as asked.
"""

from __future__ import annotations


class BindRefusedError(Exception):
    """Bind cannot go ahead. ``str(error)`` is the message for kube-scheduler."""


class PodRequestError(ValueError):
    """A pod whose resources or schedext annotations cannot be understood (raised where they
    are decoded: extender.requests, extender.resource_totals)."""

    @property
    def reason(self) -> str:
        """What kube-scheduler is told, by every verb that refuses the pod for it."""
        return f"schedext: invalid pod: {self}"
