"""The node-level share resources on the agent's own Node: share memory and cores in
``status.capacity`` and ``status.allocatable`` (what to write is
:func:`extender.devices.share_handle.node_capacity`'s).

This is the documented way to advertise a node-level extended resource: a patch of the
Node's status. The kubelet keeps capacity it does not manage when it updates the status, and
derives allocatable from capacity for it; the agent writes allocatable too, so that a cluster
whose kubelet has not done so yet (or has no kubelet, as the tests) reads the same. kube-
scheduler's NodeResourcesFit then counts share memory like any resource, and its preemption
can find victims for it. Written at start when the Node differs, and whenever the sharable
GPUs change (a GPU turning unhealthy takes its memory out).

A kubelet that registers its Node anew after losing its device state (a rebooted node) zeroes
the extended resources it does not manage; the agent's pod restarts with it, and its first
write puts them back.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from app.kube.api import KubeApi
from app.kube.errors import ApiError

__all__ = ["NodeCapacity"]

log = logging.getLogger("schedext.agent")

_FIELDS = ("capacity", "allocatable")


class NodeCapacity:
    def __init__(self, api: KubeApi, node: str) -> None:
        self._api, self._node = api, node
        # The Node's status.capacity and allocatable as last read or written; None: unknown.
        self._status: dict[str, dict[str, str]] | None = None
        self.writes = 0

    @property
    def _path(self) -> str:
        return f"/api/v1/nodes/{self._node}"

    async def start(self) -> None:
        """Read what the Node carries, so that a restarted agent with nothing new writes
        nothing."""
        node = await self._api.get(self._path)
        status = node.get("status") or {}
        self._status = {field: _strings(status.get(field)) for field in _FIELDS}

    async def write(self, capacity: Mapping[str, str]) -> bool:
        """Set ``capacity`` in the Node's capacity and allocatable if either differs; True
        when written. Resources not named are left as they are."""
        if self._status is None:
            await self.start()
        assert self._status is not None
        if all(
            self._status[field].get(name) == value
            for field in _FIELDS
            for name, value in capacity.items()
        ):
            return False
        body = {"status": {field: dict(capacity) for field in _FIELDS}}
        try:
            await self._api.merge_patch(f"{self._path}/status", body)
        except ApiError:
            self._status = None  # unknown now: read again before the next write
            raise
        for field in _FIELDS:
            self._status[field].update(capacity)
        self.writes += 1
        log.info(
            "published GPU share capacity", extra={"node": self._node, "capacity": dict(capacity)}
        )
        return True


def _strings(value: Any) -> dict[str, str]:
    if not isinstance(value, dict):
        return {}
    return {str(k): str(v) for k, v in value.items()}
