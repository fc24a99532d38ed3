"""Reconciliation with the kubelet: the agent reads the kubelet's PodResources periodically and
on demand, compares it with its ledger (:func:`extender.devices.drift.find_drift`), and
publishes the drift on its own Node (``schedext.io/gpu-drift``, on change only), where
schedext's node watch turns GPUs in use that it does not account for into held ones.

What the agent itself does with the drift: its device plugins allocate from
:class:`ReconciledLedger`, which leaves out records the kubelet no longer backs once released
(after ``stale_grace_s``) and stands in for pods only the kubelet knows, so that the agent
never picks their GPUs for another pod.

When the kubelet's socket is missing or slow, the agent goes on as it did before
reconciliation existed (nothing is published or released): one log line when reads start
failing and one when they come back, never one per poll, and
``schedext_agent_podresources_up`` says 0.

``reconcile_now()`` is the on-demand read. The device plugins may call :meth:`Reconciler.nudge`
after an ``Allocate`` (it never blocks, and the periodic loop reads at once); see
:meth:`Reconciler.reconcile_now` for why an ``Allocate`` should not await a read itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from app.agent.pod_resources import PodResources, PodResourcesError
from app.agent.ports import PodLedger
from app.kube.api import KubeApi
from app.kube.errors import ApiError
from app.kube.events import EventRecorder, NodeEvent
from extender import names
from extender.devices import DocumentError
from extender.devices.allocation import NodePod
from extender.devices.drift import (
    NO_DRIFT,
    Cause,
    Drift,
    DriftResources,
    describe,
    find_drift,
    ledger_view,
)
from extender.devices.drift_document import decode_drift, encode_drift
from extender.devices.gpus import Gpu

__all__ = ["DriftPublisher", "DriftStats", "ReconciledLedger", "Reconciler"]

log = logging.getLogger("schedext.agent.drift")

# An event's message is shown whole by kubectl describe: a long drift is cut, with a count.
_EVENT_LINES = 8


@dataclass(frozen=True, slots=True)
class DriftStats:
    """What the agent's /metrics says of reconciliation."""

    up: bool | None  # whether the last read answered (None: none yet)
    reads: int
    failures: int
    writes: int  # drift annotation patches sent
    # Entries of the current drift by kind: the in-use causes, "stale" and "released".
    kinds: tuple[tuple[str, int], ...]
    # What the kubelet may allocate of the agent's resources, as last read (GetAllocatable
    # Resources): 0 for a resource the agent serves means the kubelet has not taken its plugin.
    allocatable: tuple[tuple[str, int], ...] = ()


class DriftPublisher:
    """The drift annotation on the agent's own Node: a merge patch of that one annotation,
    sent only when its text changes, and ``null`` (removed) when the node has no drift."""

    def __init__(self, api: KubeApi, node: str) -> None:
        self._api, self._node = api, node
        self._text: str | None = None  # on the Node, as last written or read
        self._known = False  # whether _text is what the Node carries
        self.writes = 0

    async def start(self) -> Drift:
        """Read what the Node carries now: a restarted agent with nothing new writes nothing,
        and goes on timing the stale records its predecessor published."""
        node = await self._api.get(f"/api/v1/nodes/{self._node}")
        annotations = (node.get("metadata") or {}).get("annotations") or {}
        current = annotations.get(names.GPU_DRIFT)
        self._text, self._known = (current if isinstance(current, str) else None), True
        if self._text is None:
            return NO_DRIFT
        try:
            published = decode_drift(self._text)
        except DocumentError:
            return NO_DRIFT  # rewritten at the first read
        return Drift(published.in_use, published.stale, {s.uid: s.since for s in published.stale})

    async def publish(self, drift: Drift) -> bool:
        """Write ``drift`` if the Node says otherwise; True when written."""
        text = encode_drift(drift) if drift else None
        if self._known and text == self._text:
            return False
        body = {"metadata": {"annotations": {names.GPU_DRIFT: text}}}
        try:
            await self._api.merge_patch(f"/api/v1/nodes/{self._node}", body)
        except ApiError:
            self._known = False  # unknown now: the next read writes again
            raise
        self._text, self._known = text, True
        self.writes += 1
        return True


class Reconciler:
    """Reads, compares, publishes; one read at a time."""

    def __init__(
        self,
        source: PodResources,
        ledger: PodLedger,
        gpus: Callable[[], Sequence[Gpu]],
        publisher: DriftPublisher,
        events: EventRecorder,
        *,
        node: str,
        resources: DriftResources,
        interval_s: float,
        grace_s: float,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._source, self._ledger, self._gpus = source, ledger, gpus
        self._publisher, self._events = publisher, events
        self._node, self.resources = node, resources
        self._interval_s, self._grace_s, self._wall = interval_s, grace_s, wall
        self.drift = NO_DRIFT
        self._lock = asyncio.Lock()
        self._wake = asyncio.Event()
        self._up: bool | None = None
        self._reads = self._failures = 0
        self._allocatable: dict[str, int] = {}
        self._told: frozenset[tuple[str, ...]] = frozenset()  # entries events have named

    async def start(self) -> None:
        """Take up what the Node carries (a restart neither repeats events nor restarts the
        stale records' grace). An API error leaves that to the first write."""
        try:
            self.drift = await self._publisher.start()
        except ApiError as error:
            log.warning("cannot read the Node's drift annotation", extra={"error": str(error)})
        self._told = _entries(self.drift)

    async def run(self) -> None:
        """Until cancelled: a read every ``interval_s``, and at once when nudged."""
        await self.start()
        while True:
            try:
                await self.reconcile_now()
            except Exception as error:  # noqa: BLE001 - reconciliation never stops the agent
                log.warning(
                    "reconciliation with the kubelet failed",
                    extra={"node": self._node, "error": f"{type(error).__name__}: {error}"},
                )
            # asyncio.timeout, not wait_for: see the runner's publish loop.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._interval_s):
                    await self._wake.wait()
            self._wake.clear()

    def nudge(self) -> None:
        """Read again now (from the periodic loop; returns at once)."""
        self._wake.set()

    async def reconcile_now(self) -> Drift:
        """Read the kubelet's PodResources, compare, publish on change; the drift as it now
        stands (the previous one when the kubelet cannot be read).

        For the device plugins: the kubelet lists a pod only once it has admitted it, and it
        admits it after every ``Allocate`` of the pod answered; a read awaited inside
        ``Allocate`` sees the pod's new record without the pod, and that record is then
        timed as missing. So an ``Allocate`` should call :meth:`nudge` (or schedule this on
        a task) after it answers, not await it while it holds its lock. A record missing for
        less than :data:`~extender.devices.drift.SETTLE_S` is not reported either way."""
        async with self._lock:
            try:
                listed = await self._source.list()
                allocatable = await self._source.allocatable()
            except PodResourcesError as error:
                self._failures += 1
                if self._up is not False:
                    log.warning(
                        "cannot read the kubelet's PodResources: GPUs are not reconciled "
                        "with the kubelet until it answers",
                        extra={"node": self._node, "error": str(error)},
                    )
                self._up = False
                return self.drift
            if self._up is False:
                log.info("the kubelet's PodResources answers again", extra={"node": self._node})
            self._up = True
            self._reads += 1
            self._allocatable = {
                name: count
                for name, count in allocatable.items()
                if self.resources.unit(name, "") is not None
            }
            gpus = self._gpus()
            drift = find_drift(
                listed,
                self._ledger.pods(),
                gpus,
                resources=self.resources,
                now=self._wall(),
                grace_s=self._grace_s,
                missing=self.drift.missing,
            )
            changed, self.drift = drift != self.drift, drift
            if changed:
                self._tell(drift, {g.uuid: g.index for g in gpus})
            try:
                await self._publisher.publish(drift)
            except ApiError as error:  # the next read writes again
                log.warning("cannot write the drift annotation", extra={"error": str(error)})
            return drift

    def _tell(self, drift: Drift, index_of: dict[str, int]) -> None:
        """A log line on every change; a Warning event on the Node naming what is new."""
        lines = describe(drift, index_of)
        if not drift:
            log.info("no GPU drift", extra={"node": self._node})
        else:
            log.warning("GPU drift", extra={"node": self._node, "drift": list(lines)})
        entries = _entries(drift)
        new = entries - self._told
        self._told = entries
        if not new:
            return
        shown = [line for line, entry in zip(lines, _ordered(drift), strict=True) if entry in new]
        message = "; ".join(shown[:_EVENT_LINES])
        if len(shown) > _EVENT_LINES:
            message += f"; and {len(shown) - _EVENT_LINES} more"
        self._events.record(NodeEvent(self._node, "GpuDrift", message))

    async def close(self) -> None:
        await self._source.close()

    def stats(self) -> DriftStats:
        kinds = {cause.value: 0 for cause in Cause} | {"stale": 0, "released": 0}
        for use in self.drift.in_use:
            kinds[use.cause.value] += 1
        for record in self.drift.stale:
            kinds["released" if record.released else "stale"] += 1
        return DriftStats(
            up=self._up,
            reads=self._reads,
            failures=self._failures,
            writes=self._publisher.writes,
            kinds=tuple(kinds.items()),
            allocatable=tuple(sorted(self._allocatable.items())),
        )


def _ordered(drift: Drift) -> list[tuple[str, ...]]:
    """Each entry's identity, in :func:`describe`'s order."""
    return [("in-use", u.uuid, u.pod, u.cause.value) for u in drift.in_use] + [
        ("stale", s.uid, str(s.released)) for s in drift.stale
    ]


def _entries(drift: Drift) -> frozenset[tuple[str, ...]]:
    return frozenset(_ordered(drift))


class ReconciledLedger:
    """The ledger the device plugins allocate from: the pod watch's, as the current drift
    corrects it (:func:`~extender.devices.drift.ledger_view`). Records still go to the pods,
    and each one nudges the reconciler."""

    def __init__(self, ledger: PodLedger, reconciler: Reconciler) -> None:
        self._ledger, self._reconciler = ledger, reconciler

    def pods(self) -> Sequence[NodePod]:
        reconciler = self._reconciler
        return ledger_view(self._ledger.pods(), reconciler.drift, whole=reconciler.resources.gpu)

    async def record(self, pod: NodePod, uuids: tuple[str, ...], container: str = "") -> None:
        await self._ledger.record(pod, uuids, container)
        # Read the kubelet again on each Allocate, from the periodic loop: never awaited here
        # (see Reconciler.reconcile_now), and a record of a pod the kubelet does not list yet
        # is only timed, not reported, for its first seconds.
        self._reconciler.nudge()
