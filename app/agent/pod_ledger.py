"""The pods on this node that ask for GPUs, as the device plugin needs them: a list+watch of
the node's own pods (``spec.nodeName`` field selector, so the agent reads only its node's
share of the cluster), and the allocation record written on each pod.

The record (``schedext.io/gpu-allocated``, by container: "main:GPU-a,GPU-b;setup:GPU-a") is
what makes allocation survive a restart of the agent, also between two containers of one pod:
a new agent reads it back from the list, and never gives the same pod's GPUs to another pod.
It is written before ``Allocate`` answers, and the ledger's own view takes it at once, so a
second ``Allocate`` in the next millisecond sees it too."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from app.kube.api import KubeApi
from app.kube.errors import ApiNotFoundError
from app.kube.watch import Relist, Resource
from extender import names
from extender.config import ShareResources
from extender.devices.allocation import NodePod
from extender.devices.containers import ContainerGrant, format_grants, granted_devices
from extender.node_pods import node_pod

__all__ = ["ApiPodLedger", "node_pods_resource"]

log = logging.getLogger("schedext.agent")

JSON = dict[str, Any]
_DEFAULT_SHARES = ShareResources()


def node_pods_resource(node: str) -> Resource:
    """This node's live pods (terminal ones hold no device)."""
    return Resource(
        name="pods",
        path="/api/v1/pods",
        field_selector=(f"spec.nodeName={node},status.phase!=Succeeded,status.phase!=Failed"),
    )


class ApiPodLedger:
    """The node's GPU pods (whole GPUs or shares, read with ``shares``' resource names) by
    UID, kept by a watch (this object is its sink)."""

    def __init__(
        self,
        api: KubeApi,
        *,
        gpu_resource: str = names.GPU_RESOURCE,
        shares: ShareResources = _DEFAULT_SHARES,
    ) -> None:
        self._api = api
        self._gpu_resource = gpu_resource
        self._shares = shares
        self._pods: dict[str, NodePod] = {}
        self.synced = False
        # Set once the first list is in: until then the plugin must not allocate, or a
        # restarted agent would not yet know what its predecessor gave out.
        self.listed = asyncio.Event()

    # ------------------------------------------------------------ the plugin's side

    def pods(self) -> Sequence[NodePod]:
        return tuple(self._pods.values())

    async def record(self, pod: NodePod, uuids: tuple[str, ...], container: str = "") -> None:
        """Add ``uuids``, as given to ``container``, to the pod's allocation record, on the pod
        (with its UID as a precondition: a pod re-created under the same name is another pod)
        and here."""
        current = self._pods.get(pod.uid, pod)
        grants = (*current.recorded(), ContainerGrant(container, uuids))
        body = {
            "metadata": {
                "uid": pod.uid,
                "annotations": {names.GPU_ALLOCATED: format_grants(grants)},
            }
        }
        try:
            await self._api.merge_patch(f"/api/v1/namespaces/{pod.namespace}/pods/{pod.name}", body)
        except ApiNotFoundError:
            # Gone already: the kubelet will not start its containers either.
            log.warning("pod gone before its GPUs were recorded", extra={"pod": pod.key})
            raise
        current = self._pods.get(pod.uid, pod)
        self._pods[pod.uid] = dataclasses.replace(
            current, grants=grants, allocated=granted_devices(grants)
        )

    # ------------------------------------------------------------ the watch's side

    @property
    def relist(self) -> Callable[[], Relist]:
        return lambda: _Relist(self)

    @property
    def upsert(self) -> Callable[[JSON], object]:
        return self._upsert

    @property
    def delete(self) -> Callable[[JSON], object]:
        return self._delete

    def _upsert(self, pod: JSON) -> None:
        decoded = node_pod(pod, gpu_resource=self._gpu_resource, shares=self._shares)
        uid = str((pod.get("metadata") or {}).get("uid", ""))
        if decoded is None:
            self._pods.pop(uid, None)
            return
        known = self._pods.get(uid)
        if known is not None and len(known.recorded()) > len(decoded.recorded()):
            # Our own record is ahead of the watch (written, not yet seen): keep it.
            decoded = _with_grants(decoded, known)
        self._pods[uid] = decoded

    def _delete(self, pod: JSON) -> None:
        self._pods.pop(str((pod.get("metadata") or {}).get("uid", "")), None)

    def _replace(self, pods: Iterable[JSON]) -> None:
        ahead = dict(self._pods)
        self._pods = {}
        for pod in pods:
            self._upsert(pod)
        for uid, known in ahead.items():
            current = self._pods.get(uid)
            if current is not None and len(known.recorded()) > len(current.recorded()):
                self._pods[uid] = _with_grants(current, known)
        self.synced = True
        self.listed.set()


def _with_grants(pod: NodePod, known: NodePod) -> NodePod:
    """``pod`` as the watch shows it, with the record this agent wrote and the watch has not
    echoed yet."""
    return dataclasses.replace(pod, grants=known.recorded(), allocated=known.allocated)


class _Relist:
    def __init__(self, ledger: ApiPodLedger) -> None:
        self._ledger = ledger
        self._items: list[JSON] = []

    def add(self, items: Iterable[JSON]) -> None:
        self._items.extend(items)

    def commit(self) -> None:
        self._ledger._replace(self._items)
