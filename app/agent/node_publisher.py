"""What the node agent writes on its own Node: the topology document (at start and on change
only) and the live-use sample (when :class:`~extender.devices.publishing.UseGate` says so).

Both are merge patches of one annotation each on the agent's own Node, nothing else: RBAC
grants ``patch`` on nodes, and the node authorizer, where the agent runs with the node's
identity, narrows that to its own Node."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from app.kube.api import KubeApi
from app.kube.errors import ApiError
from extender import names
from extender.devices import Topology, UseSample, encode_topology, encode_use
from extender.devices.publishing import UseGate

__all__ = ["NodePublisher"]

log = logging.getLogger("schedext.agent")


class NodePublisher:
    def __init__(
        self,
        api: KubeApi,
        node: str,
        gate: UseGate,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._api, self._node, self._gate = api, node, gate
        self._clock, self._wall = clock, wall
        self._topology: str | None = None  # the text on the Node, as last written or read
        self.writes = 0  # patches sent (a figure for the docs and the tests)

    @property
    def _path(self) -> str:
        return f"/api/v1/nodes/{self._node}"

    async def start(self) -> None:
        """Read what the Node carries now, so that a restarted agent with nothing new to say
        writes nothing."""
        node = await self._api.get(self._path)
        annotations = (node.get("metadata") or {}).get("annotations") or {}
        current = annotations.get(names.GPU_TOPOLOGY)
        self._topology = current if isinstance(current, str) else None

    async def topology(self, topology: Topology) -> bool:
        """Write the topology document if it differs from the Node's; True when written."""
        text = encode_topology(topology)
        if text == self._topology:
            return False
        await self._patch({names.GPU_TOPOLOGY: text})
        self._topology = text
        log.info(
            "published GPU topology",
            extra={
                "node": self._node,
                "gpus": len(topology.gpus),
                "groups": [list(g) for g in topology.groups],
                "unhealthy": [f"{i}: {why}" for i, why in topology.unhealthy()],
            },
        )
        return True

    async def use(self, sample: UseSample) -> bool:
        """Write the live-use sample if the gate says it is due; True when written."""
        now = self._clock()
        if not self._gate.due(sample, now):
            return False
        await self._patch({names.GPU_USE: encode_use(sample)})
        self._gate.written(sample, now)
        return True

    async def _patch(self, annotations: dict[str, str]) -> None:
        try:
            await self._api.merge_patch(self._path, {"metadata": {"annotations": annotations}})
        except ApiError:
            self._topology = None  # unknown now: the next change check writes again
            raise
        self.writes += 1
