"""Each gang's hold written on its PodGroup (annotation ``schedext.io/gang-hold``), so that a
restarted schedext, or a new leader, adopts it rather than choosing again
(extender.gang.holds).

Level-based and written only on change: after each review of the holds
(:meth:`HoldRecords.kick`), every PodGroup whose annotation differs from the hold that stands
for it (none: no annotation) gets one merge patch of its metadata. Only after a review: a new
leader has adopted the records before it compares them, so it never erases one it was about to
adopt. A PodGroup gone meanwhile is skipped; another failure is logged and retried at the next
review.
"""

from __future__ import annotations

import asyncio
import logging

from app.kube.api import KubeApi
from app.kube.errors import ApiError, ApiNotFoundError
from app.kube.status import PODGROUPS_PATH
from extender import names
from extender.gang.holds import hold_record
from extender.scheduler import Scheduler

__all__ = ["HoldRecords"]

log = logging.getLogger("schedext.holds")


class HoldRecords:
    def __init__(self, api: KubeApi, scheduler: Scheduler) -> None:
        self._api, self._scheduler = api, scheduler
        self._due = asyncio.Event()
        # What was last sent per group, while the watch has not shown it yet: not sent again.
        self._sent: dict[str, str] = {}

    def kick(self) -> None:
        """A review of the holds happened: compare the records soon."""
        self._due.set()

    async def run_forever(self) -> None:
        while True:
            await self._due.wait()
            self._due.clear()
            await self.write_once()

    async def write_once(self) -> None:
        wanted = {hold.group: hold_record(hold) for hold in self._scheduler.gang_holds()}
        sent, self._sent = self._sent, {}
        for spec in self._scheduler.pod_groups():
            record = wanted.get(spec.key, "")
            if spec.hold == record:
                continue
            if sent.get(spec.key) == record:
                self._sent[spec.key] = record
                continue
            path = f"{PODGROUPS_PATH}/namespaces/{spec.namespace}/podgroups/{spec.name}"
            body = {"metadata": {"annotations": {names.GANG_HOLD: record or None}}}
            try:
                await self._api.merge_patch(path, body)
            except ApiNotFoundError:
                continue
            except ApiError as error:
                log.warning("cannot record the hold on %s: %s", spec.key, error)
                continue
            self._sent[spec.key] = record
