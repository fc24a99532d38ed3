"""What filter saw of each pending pod, so that bind (which gets only name, namespace, UID
and node) knows what the pod needs. Bounded: the oldest entries go first."""

from __future__ import annotations

from collections import OrderedDict

from extender.model import PodRequest

__all__ = ["PendingPods"]


class PendingPods:
    def __init__(self, capacity: int = 10_000) -> None:
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self._capacity = capacity
        self._pods: OrderedDict[str, PodRequest] = OrderedDict()

    def __len__(self) -> int:
        return len(self._pods)

    def remember(self, request: PodRequest) -> None:
        if not request.uid:
            return
        self._pods[request.uid] = request
        self._pods.move_to_end(request.uid)
        while len(self._pods) > self._capacity:
            self._pods.popitem(last=False)

    def get(self, uid: str) -> PodRequest | None:
        return self._pods.get(uid)

    def find(self, namespace: str, name: str) -> PodRequest | None:
        """By name (a scan: for operators' questions, not the hot path)."""
        return next(
            (
                r
                for r in reversed(self._pods.values())
                if (r.namespace, r.name) == (namespace, name)
            ),
            None,
        )

    def forget(self, uid: str) -> None:
        self._pods.pop(uid, None)
