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
        scheduler.replace_nodes(snapshot.nodes)
        # DRA after the nodes (a held device is mapped by its node's GPU UUIDs), before the
        # pods (a pod naming a claim is charged where the claim holds devices).
        dra = (
            (scheduler.resource_slice_relist(), snapshot.resource_slices),
            (scheduler.device_class_relist(), snapshot.device_classes),
            (scheduler.device_taint_rule_relist(), snapshot.device_taint_rules),
            (scheduler.resource_claim_relist(), snapshot.resource_claims),
        )
        for dra_relist, objects in dra:
            dra_relist.add(objects)
            dra_relist.commit()
        scheduler.replace_pods(snapshot.pods)
        service.readiness.set_ready()
        log.info(
            "inventory synced",
            extra={"inventory": self.description, "nodes": len(scheduler.inventory.node_names())},
        )

    async def stop(self) -> None:
        return None
