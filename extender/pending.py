"""What filter saw of each pending pod, so that bind (which gets only name, namespace, UID
and node) knows what the pod needs, and what waits per namespace (team quotas: who wants to
borrow). Also the pods filter refused as invalid, with why, so that a bind of one says so
rather than that the pod never went through filter; and why the last filter turned each pending
pod away, if it did (what /inventory and the occupancy page show). Bounded: the oldest entries
go first."""

from __future__ import annotations

import heapq
from collections import OrderedDict

from extender.model import PodRequest
from extender.tally import Amounts, NamespaceTally

__all__ = ["PendingPods"]


class PendingPods:
    def __init__(self, capacity: int = 10_000) -> None:
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self._capacity = capacity
        self._pods: OrderedDict[str, PodRequest] = OrderedDict()
        # The resourceVersion each request was decoded from, where known: filter of the same
        # object version (kube-scheduler's copy of what the watch saw) reuses the request.
        self._versions: dict[str, str] = {}
        self._wanted = NamespaceTally()
        self._refused: OrderedDict[str, str] = OrderedDict()  # uid -> filter's reason
        self._why: dict[str, str] = {}  # uid -> why the last filter turned a pending pod away

    def __len__(self) -> int:
        return len(self._pods)

    def remember(self, request: PodRequest, version: str = "") -> None:
        """Keep ``request``, decoded from the pod's object at ``version`` ("": unknown)."""
        if not request.uid:
            return
        self._refused.pop(request.uid, None)
        old = self._pods.get(request.uid)
        if old is not None:
            self._wanted.remove(old)
        self._pods[request.uid] = request
        if version:
            self._versions[request.uid] = version
        elif old is not request:
            self._versions.pop(request.uid, None)
        self._wanted.add(request)
        self._pods.move_to_end(request.uid)
        while len(self._pods) > self._capacity:
            uid, oldest = self._pods.popitem(last=False)
            self._wanted.remove(oldest)
            self._why.pop(uid, None)
            self._versions.pop(uid, None)

    def get(self, uid: str) -> PodRequest | None:
        return self._pods.get(uid)

    def decoded(self, uid: str, version: str) -> PodRequest | None:
        """The request kept for ``uid`` if it was decoded from object version ``version``."""
        if version and self._versions.get(uid) == version:
            return self._pods.get(uid)
        return None

    def knows(self, uid: str) -> bool:
        """Whether anything is kept of ``uid``: its request, a refusal, a reason it waits."""
        return uid in self._pods or uid in self._refused or uid in self._why

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

    def listing(self, limit: int) -> tuple[PodRequest, ...]:
        """The first ``limit`` pending pods by namespace and name (what the occupancy page
        lists): a bounded read, however many pods wait."""
        return tuple(heapq.nsmallest(limit, self._pods.values(), key=lambda r: r.key))

    def wanted(self, namespace: str) -> Amounts:
        """What the namespace's pending pods ask for together."""
        return self._wanted.of(namespace)

    def judged(self, uid: str, why: str) -> None:
        """Filter's last verdict on pending pod ``uid``: why it turned the pod away on every
        node ("": some node passed it). Kept while the pod is pending, whatever the watch
        says of it meanwhile."""
        if uid not in self._pods:
            return
        if why:
            self._why[uid] = why
        else:
            self._why.pop(uid, None)

    def why(self, uid: str) -> str:
        """Why the last filter turned the pending pod away; "" when none did."""
        return self._why.get(uid, "")

    def forget(self, uid: str) -> None:
        self._refused.pop(uid, None)
        self._why.pop(uid, None)
        self._versions.pop(uid, None)
        request = self._pods.pop(uid, None)
        if request is not None:
            self._wanted.remove(request)

    def refuse(self, uid: str, reason: str) -> None:
        """Filter found the pod's request invalid (``reason``, its words): it is no longer
        pending as an earlier filter saw it."""
        if not uid:
            return
        self.forget(uid)
        self._refused[uid] = reason
        while len(self._refused) > self._capacity:
            self._refused.popitem(last=False)

    def refusal(self, uid: str) -> str | None:
        """Why filter last refused the pod as invalid; None when it did not."""
        return self._refused.get(uid)
