"""Whether this replica may answer the verbs, and why not.

A module of its own, importing nothing of ``app``: the service, its health routes and the
Kubernetes writers beside it in ``app.kube`` (status, claim release) all read it, and
``app.kube`` must not depend on the service (``app.service``) that assembles it."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Readiness"]


@dataclass(slots=True)
class Readiness:
    """Whether verbs may be answered: the inventory is synced and, with leader election, this
    replica leads. ``reason`` says why not."""

    synced: bool = False
    sync_reason: str = "inventory not synced"
    leading: bool = True  # stays True without leader election
    leader: str = ""
    terms: int = 0  # how many times it became ready (synced and leading)
    stopping: bool = False  # a stop began (SIGTERM): answer nothing new, hand over

    @property
    def ready(self) -> bool:
        return self.synced and self.leading and not self.stopping

    @property
    def reason(self) -> str:
        return next((why for why in self.checks().values() if why), "")

    def checks(self) -> dict[str, str]:
        """Each check of ``ready`` by name, with why it fails ("" when it passes): what
        ``/readyz/<check>`` answers. A standby passes ``synced`` (its pod is Ready) and fails
        ``leader`` (the Service does not select its pod, nor may it answer verbs)."""
        return {
            "synced": "" if self.synced else self.sync_reason,
            "leader": ""
            if self.leading
            else f"not the leader (the leader is {self.leader or 'not elected yet'})",
            "stopping": "this replica is stopping" if self.stopping else "",
        }

    def set_ready(self) -> None:
        was = self.ready
        self.synced, self.sync_reason = True, ""
        self._began(was)

    def set_not_ready(self, reason: str) -> None:
        self.synced, self.sync_reason = False, reason

    def set_stopping(self) -> None:
        self.stopping = True

    def set_leading(self, leading: bool, leader: str) -> None:
        was = self.ready
        self.leading, self.leader = leading, leader
        self._began(was)

    def _began(self, was: bool) -> None:
        if self.ready and not was:
            self.terms += 1
