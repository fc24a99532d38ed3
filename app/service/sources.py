"""Where the inventory comes from: a snapshot file, the embedded demo, or
(``app.service.cluster``) a live cluster watched by informers."""

from __future__ import annotations

import logging
from typing import Protocol

from app.service.assembly import Service
from app.service.snapshot import Snapshot

__all__ = ["InventorySource", "SnapshotSource"]

log = logging.getLogger("schedext.snapshot")


class InventorySource(Protocol):
    description: str
    # Whether pod events keep coming once started (a live cluster's watch). Without them
    # nothing ends filter's wait for preempted victims early (app.service.victims): it is off.
    watches_pods: bool

    async def start(self, service: Service) -> None:
        """Fill the inventory (or start filling it); mark the service ready once synced."""

    async def stop(self) -> None: ...


class SnapshotSource:
    """A fixed set of nodes and pods, loaded once. Binds are kept in memory."""

    watches_pods = False  # a victim leaves only if something deletes it here: nothing does

    def __init__(self, snapshot: Snapshot) -> None:
        self._snapshot = snapshot
        self.description = snapshot.source

    async def start(self, service: Service) -> None:
        scheduler, snapshot = service.scheduler, self._snapshot
        relists = (
            (scheduler.pod_group_relist(), snapshot.pod_groups),
            (scheduler.ip_pool_relist(), snapshot.ip_pools),
            (scheduler.ip_claim_relist(), snapshot.ip_claims),
        )
        for relist, objects in relists:
            relist.add(objects)
            relist.commit()
        for refused in scheduler.replace_quotas(snapshot.quotas):
            log.warning("%s (skipped)", refused)
        service.scheduler.replace_nodes(self._snapshot.nodes)
        service.scheduler.replace_pods(self._snapshot.pods)
        service.readiness.set_ready()

    async def stop(self) -> None:
        return None
