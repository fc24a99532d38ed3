"""Binders perform a :class:`extender.model.BindPlan`: they move the pod onto its node.

The port the service binds through (:class:`Binder`), the two ways a bind fails, and the
in-memory binder of the embedded demo and snapshot modes. The API binder, which posts
``pods/binding``, is :mod:`app.kube.binder`; it raises these errors, so they live here, below
the service.
"""

from __future__ import annotations

from typing import Protocol

from extender.model import BindPlan

__all__ = ["BindError", "BindOutcomeUnknownError", "Binder", "InMemoryBinder"]


class BindError(Exception):
    """The bind did not happen; ``str(error)`` is the message for kube-scheduler."""


class BindOutcomeUnknownError(BindError):
    """A Binding was sent and its answer never came (a timeout, a dropped connection, a 5xx):
    the API server may have written it. The pod may be bound as planned, so what the bind
    reserved must stay reserved until the watch tells (the pod bound, or gone) or the
    reservation's time runs out; giving it back at once would hand the same GPUs and address
    to the next pod (found by the fault soak, under a slowed API)."""


class Binder(Protocol):
    # True when a watch (not the binder) confirms the bind: the reservation then stays until
    # the pod is seen bound or gone.
    confirmed_by_watch: bool

    async def bind(self, plan: BindPlan) -> None:
        """Bind the pod as planned, or raise :class:`BindError`."""


class InMemoryBinder:
    """Records binds instead of writing them anywhere: the demo has no API server."""

    confirmed_by_watch = False

    def __init__(self) -> None:
        self.bound: dict[str, BindPlan] = {}

    async def bind(self, plan: BindPlan) -> None:
        self.bound[plan.uid] = plan
