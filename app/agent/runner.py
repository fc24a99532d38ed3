"""The node agent's one process: read the GPUs through NVML, publish them on the Node, keep
the device plugin registered with the kubelet, and watch health.

What runs, as tasks of one event loop (plus the XID watch's own thread):
- at start, the GPUs are read (:func:`~app.agent.discovery.read_node`; NVML failing here
  ends the process with a clear message) and the topology document is written when the Node
  does not carry it already;
- the pod watch (this node's pods) feeds the ledger the plugin allocates from;
- the device plugin serves and re-registers when the kubelet restarts, while it is wanted
  (:mod:`app.agent.plugin_switch`: with ``device_plugin`` auto, not while a GPU DRA driver is
  registered with the kubelet, watched all along; topology, health and use are published in
  every case);
- with shares on (:mod:`app.agent.sharing`): the MPS daemons, when asked for, start before
  the plugins register; the share handle's plugin serves beside the whole-GPU one; share
  memory and cores are written on the Node's status with the topology, on change (as 0
  while the plugins are off: without the share handle's plugin no share can be given);
- every ``poll_s``: health is read again (ECC, retired pages, lost GPUs) and use is sampled.
  A health change goes to ListAndWatch at once and to the Node's topology document, which
  the extender's node watch turns into "never hand out this GPU";
- an XID event marks its GPU unhealthy at once. XIDs are sticky: the GPU stays unhealthy until
  the agent restarts (after the node's GPUs were reset or replaced);
- with ``reconcile`` on, once the node's pods are listed: the kubelet's PodResources are read
  every ``reconcile_s`` and compared with the ledger; the drift goes on the Node
  (:mod:`app.agent.reconciliation`), and the plugins allocate from the ledger as the drift
  corrects it (:attr:`Agent.allocations`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from app.agent.discovery import read_node, sample_use
from app.agent.gpu_allocator import GpuAllocator, WholeGpus
from app.agent.memory import StaticDevices
from app.agent.mig_allocator import mig_allocators, mig_endpoint, read_mig_minors
from app.agent.node_publisher import NodePublisher
from app.agent.nvml import Nvml, NvmlError
from app.agent.plugin_switch import PluginSwitch
from app.agent.pod_ledger import ApiPodLedger, node_pods_resource
from app.agent.pod_resources import KubeletPodResources, PodResources
from app.agent.ports import PodLedger
from app.agent.reconciliation import DriftPublisher, ReconciledLedger, Reconciler
from app.agent.registration import Endpoint
from app.agent.servicer import Allocator, DevicePluginServicer
from app.agent.settings import AgentSettings
from app.agent.sharing import Shares
from app.agent.xid_watch import GpuFault, XidWatch
from app.kube.api import KubeApi
from app.kube.errors import ApiError
from app.kube.events import ApiEventRecorder
from app.kube.watch import WatchHooks, watch_forever
from extender.devices import Gpu, GpuHealth, Topology, UseSample
from extender.devices.links import nvlink_groups
from extender.devices.publishing import UseGate

__all__ = ["Agent"]

log = logging.getLogger("schedext.agent")


class Agent:
    def __init__(
        self,
        settings: AgentSettings,
        nvml: Nvml,
        api: KubeApi,
        *,
        wall: Callable[[], float] = time.time,
        pod_resources: PodResources | None = None,
    ) -> None:
        self.settings, self._nvml, self._api, self._wall = settings, nvml, api, wall
        self.ledger = ApiPodLedger(
            api, gpu_resource=settings.resource_name, shares=settings.share_resources()
        )
        self.shares = Shares.from_settings(settings, api)  # None: whole GPUs only
        gate = UseGate(
            interval_s=settings.use_interval_s,
            threshold=settings.use_threshold,
            refresh_s=settings.use_refresh_s,
        )
        self._gate = gate
        self.publisher = NodePublisher(api, settings.node_name, gate)
        self._wake = asyncio.Event()  # a health change: publish now, not at the next poll
        self.devices: StaticDevices | None = None
        self._driver = ""
        self._faults: dict[int, GpuHealth] = {}  # sticky: from XID events
        self.published = asyncio.Event()  # the topology is on the Node
        # Whether the device plugins serve (a DRA driver may own the GPUs): a change wakes the
        # publisher, which writes share capacity as the plugins now stand.
        self.switch = PluginSwitch(
            settings.device_plugin,
            registry=settings.plugins_registry_dir,
            drivers=settings.dra_drivers,
            poll_s=settings.dra_poll_s,
            gone_s=settings.dra_gone_s,
            on_change=lambda _: self._wake.set(),
        )
        # Reconciliation with the kubelet (None: off); the plugins allocate from its view.
        self.events = ApiEventRecorder(api)
        self.reconciler = self._reconciler(pod_resources) if settings.reconcile else None
        self.allocations: PodLedger = (
            self.ledger
            if self.reconciler is None
            else ReconciledLedger(self.ledger, self.reconciler)
        )

    def _reconciler(self, source: PodResources | None) -> Reconciler:
        settings = self.settings
        return Reconciler(
            source
            or KubeletPodResources(
                settings.pod_resources_socket, deadline_s=settings.pod_resources_deadline_s
            ),
            self.ledger,
            lambda: self.devices.current() if self.devices is not None else (),
            DriftPublisher(self._api, settings.node_name),
            self.events,
            node=settings.node_name,
            resources=settings.drift_resources(),
            interval_s=settings.reconcile_s,
            grace_s=settings.stale_grace_s,
            wall=self._wall,
        )

    @property
    def endpoint(self) -> Endpoint:
        return Endpoint(
            directory=self.settings.device_plugin_dir,
            socket_name=self.settings.socket_name,
            resource_name=self.settings.resource_name,
        )

    @property
    def plugins_wanted(self) -> bool:
        """Whether the device plugins serve, as last decided (False before the first)."""
        return self.switch.decision is not None and self.switch.decision.register

    def ready(self) -> bool:
        """Readiness: the GPUs are published, the node's pods are listed, and the plugins
        listen, or are off by decision (a DRA node)."""
        return (
            self.published.is_set()
            and self.ledger.synced
            and self.switch.decision is not None
            and (
                not self.plugins_wanted
                or (self.endpoint.socket.exists() and (self.shares is None or self.shares.ready()))
            )
        )

    async def run(self) -> None:
        """Until cancelled. Raises :class:`NvmlError` when the GPUs cannot be read at start."""
        self._driver, gpus = await asyncio.to_thread(read_node, self._nvml)
        if not gpus:
            raise NvmlError(0, "NVML lists no GPU on this node")
        self.devices = StaticDevices(gpus, nvlink_groups(gpus))
        self._gate.memory_mib = tuple(g.memory_mib for g in gpus)
        log.info(
            "GPUs read",
            extra={
                "node": self.settings.node_name,
                "driver": self._driver,
                "gpus": [f"{g.index}: {g.model} {g.uuid}" for g in gpus],
                "groups": [list(g) for g in self.devices.groups()],
            },
        )
        self.switch.start()  # before share capacity is first written
        loop = asyncio.get_running_loop()
        xids = XidWatch(
            self._nvml,
            [g.index for g in gpus],
            lambda fault: self._from_thread(loop, fault),
        )
        # One servicer per resource, over one lock: the whole GPUs (never a GPU in MIG mode:
        # its MIG devices have their own resources, one per profile, NVIDIA's "mixed"
        # strategy), each MIG profile, and the share handle.
        caps = read_mig_minors(self.settings.mig_minors) if any(g.migs for g in gpus) else {}
        allocators: list[tuple[Allocator[Any], Endpoint]] = [
            (GpuAllocator(WholeGpus(self.devices), resource=self.settings.resource_name),
             self.endpoint),
            *((m, mig_endpoint(self.endpoint, m.profile))
              for m in mig_allocators(self.devices, caps=caps)),
        ]  # fmt: skip
        if self.shares is not None:
            allocators.append((self.shares.allocator(self.devices), self.shares.endpoint))
        lock = asyncio.Lock()
        tasks = [
            asyncio.create_task(self._publish_forever(), name="agent-publish"),
            asyncio.create_task(
                watch_forever(
                    self._api,
                    node_pods_resource(self.settings.node_name),
                    self.ledger,
                    hooks=WatchHooks(),
                ),
                name="agent-pods",
            ),
        ]
        xids.start()
        await self.events.start()
        try:
            if self.shares is not None:  # MPS daemons up before a share is handed out
                tasks += [asyncio.create_task(c) for c in await self.shares.prepare(self.devices)]
            # The plugin registers only once the node's pods (and their allocation records)
            # are listed: a restarted agent must know what it gave out before it gives more.
            await _first(self.ledger.listed.wait(), tasks)
            if self.reconciler is not None:  # compared with a listed ledger only
                tasks.append(asyncio.create_task(self.reconciler.run(), name="agent-reconcile"))
            plugins = [
                (DevicePluginServicer(allocator, self.allocations, lock=lock), endpoint)
                for allocator, endpoint in allocators
            ]
            tasks.append(asyncio.create_task(self.switch.run(plugins), name="agent-plugins"))
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            for task in done:
                task.result()  # a task that ended raises its error here
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            await asyncio.to_thread(xids.stop, 5.0)
            await self.events.stop()
            if self.reconciler is not None:
                await self.reconciler.close()

    # ------------------------------------------------------------------ health

    def _from_thread(self, loop: asyncio.AbstractEventLoop, fault: GpuFault) -> None:
        loop.call_soon_threadsafe(self._fault, fault)

    def _fault(self, fault: GpuFault) -> None:
        """An XID or a lost GPU, from the watch's thread (handed over to the loop)."""
        log.warning(
            "GPU unhealthy",
            extra={"gpu": fault.index, "xid": fault.xid, "reason": fault.health.reason},
        )
        self._faults[fault.index] = fault.health
        self._apply(self._current())

    def _current(self) -> tuple[Gpu, ...]:
        assert self.devices is not None
        return self.devices.current()

    def _apply(self, read: tuple[Gpu, ...]) -> None:
        """Take a fresh read of the GPUs (with the sticky XID faults over it) if health
        changed: ListAndWatch sends it, and the next publish writes the Node."""
        assert self.devices is not None
        merged = tuple(
            dataclasses.replace(g, health=self._faults[g.index])
            if g.index in self._faults and g.health.healthy
            else g
            for g in read
        )
        if [g.health for g in merged] != [g.health for g in self.devices.current()]:
            self.devices.set_gpus(merged)
            self._wake.set()

    # ------------------------------------------------------------------ publishing

    async def _publish_forever(self) -> None:
        await self._retrying(self.publisher.start)
        while True:
            assert self.devices is not None
            topology = Topology(
                groups=self.devices.groups(), gpus=self.devices.current(), driver=self._driver
            )
            await self._retrying(functools.partial(self.publisher.topology, topology))
            self.published.set()
            if self.shares is not None:
                try:  # none while the plugins are off: no share could be handed out
                    await self.shares.publish(topology.gpus if self.plugins_wanted else ())
                except ApiError as error:  # the next poll reads the Node and tries again
                    log.warning("cannot write share capacity", extra={"error": str(error)})
            use = await asyncio.to_thread(sample_use, self._nvml)
            try:
                await self.publisher.use(UseSample(at=self._wall(), gpus=use))
            except ApiError as error:  # the next poll tries again; the topology is written
                log.warning("cannot write live use", extra={"error": str(error)})
            # asyncio.timeout, not wait_for: on Python 3.11, wait_for swallows a cancellation
            # that comes with the wake-up set, and the agent would then not stop.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.settings.poll_s):
                    await self._wake.wait()
            self._wake.clear()
            try:
                _, read = await asyncio.to_thread(read_node, self._nvml)
            except NvmlError as error:
                log.warning("cannot read the GPUs again", extra={"error": str(error)})
                continue
            self._apply(read)

    async def _retrying(self, call: Callable[[], Awaitable[object]]) -> None:
        """``call()`` until the API server takes it (a Node write must not be lost)."""
        delay = 0.5
        while True:
            try:
                await call()
                return
            except ApiError as error:
                log.warning("Node write failed; retrying", extra={"error": str(error)})
                await asyncio.sleep(delay)
                delay = min(delay * 2, 30.0)


async def _first(waited: Awaitable[object], tasks: list[asyncio.Task[None]]) -> None:
    """Wait for ``waited``, unless one of ``tasks`` fails first (its error is raised)."""
    waiter = asyncio.ensure_future(waited)
    done, _ = await asyncio.wait([waiter, *tasks], return_when=asyncio.FIRST_COMPLETED)
    for task in done:
        if task is not waiter:
            waiter.cancel()
            task.result()
