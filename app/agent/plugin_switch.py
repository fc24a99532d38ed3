"""The agent's device plugins, served while they are wanted (:mod:`app.agent.dra_drivers`
decides): with ``device_plugin`` on, always; off, never; auto, as long as no GPU DRA driver is
registered with the kubelet, watched for as long as the agent runs, since a driver may be
installed, or removed, under a running agent (a node moving from the device plugin to DRA, or
back).

Turning the plugins off cancels their :func:`~app.agent.registration.serve` tasks, which stop
their gRPC servers and remove their sockets. The kubelet has no call to unregister a device
plugin; it notices the plugin's ListAndWatch stream end, and its device manager
(``pkg/kubelet/cm/devicemanager``: the v1beta1 client's ``Run`` returns, ``disconnectClient``,
``ManagerImpl.PluginDisconnected``) marks every device of the resource unhealthy at once, so
that allocatable drops to 0 and no new pod is admitted with it. After
``endpointStopGracePeriod`` (5 minutes) the resource's capacity is set to 0 too. Pods already
running keep their devices. Turning them on again is a fresh start: new sockets, registered
anew.

A driver that appears turns the plugins off at the next read; one that goes must stay gone for
``gone_s`` before they register again, so that a DRA driver's pod restarting (its socket gone
for a few seconds) does not briefly put the node's GPUs on both sides.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from app.agent.deviceplugin.v1beta1 import api_pb2_grpc
from app.agent.dra_drivers import (
    Decision,
    DevicePluginMode,
    device_plugin_wanted,
    registered_drivers,
)
from app.agent.registration import Endpoint, serve

__all__ = ["PluginSwitch", "Plugins"]

log = logging.getLogger("schedext.agent")

Plugins = Sequence[tuple[api_pb2_grpc.DevicePluginServicer, Endpoint]]


class PluginSwitch:
    def __init__(
        self,
        mode: DevicePluginMode,
        *,
        registry: Path,
        drivers: Sequence[str],
        poll_s: float,
        gone_s: float,
        on_change: Callable[[Decision], None] = lambda _: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._mode, self._registry, self._drivers = mode, registry, tuple(drivers)
        self._poll_s, self._gone_s = poll_s, gone_s
        self._on_change, self._clock = on_change, clock
        self.decision: Decision | None = None  # None: not decided yet
        self._gone_since: float | None = None  # a driver went: since when (monotonic)
        self.reads = 0  # of the registry so far (the tests wait on it)

    def read(self) -> Decision:
        """The decision as the registry says now (read only in auto)."""
        found = None
        if self._mode == "auto":
            found = registered_drivers(self._registry, self._drivers)
            self.reads += 1
        return device_plugin_wanted(self._mode, found)

    def start(self) -> Decision:
        """The first decision, logged: made before anything is published, so that share
        capacity is never written only to be withdrawn at once."""
        self.decision = self.read()
        log.info(self.decision.log_line, extra=self._extra(self.decision))
        return self.decision

    async def run(self, plugins: Plugins) -> None:
        """Serve ``plugins`` while wanted, until cancelled; a plugin's failure is raised."""
        if self.decision is None:
            self.start()
        tasks: list[asyncio.Task[None]] = []
        try:
            while True:
                decision = self.decision
                assert decision is not None
                if decision.register and not tasks:
                    tasks = [
                        asyncio.create_task(
                            serve(servicer, endpoint), name=f"agent-plugin-{endpoint.resource_name}"
                        )
                        for servicer, endpoint in plugins
                    ]
                elif not decision.register and tasks:
                    await _stop(tasks)
                    tasks = []
                if self._mode != "auto":  # nothing to watch: the plugins, or nothing, for good
                    await _until_failed(tasks, None)
                else:
                    await _until_failed(tasks, self._poll_s)
                    self.poll()
        finally:
            await _stop(tasks)

    def poll(self) -> Decision:
        """Read the registry again and adopt what it says, with the grace a departed driver
        gets; returns the decision now in force (:meth:`run` serves by it)."""
        if self.decision is None:
            return self.start()
        self._take(self.decision, self.read())
        return self.decision

    def _take(self, current: Decision, read: Decision) -> None:
        if read.register == current.register:
            self._gone_since = None
            self.decision = read  # the same way, perhaps another driver named
            return
        if read.register:  # the driver went: wait out a restart before serving again
            now = self._clock()
            if self._gone_since is None:
                self._gone_since = now
                log.debug("DRA driver gone; waiting before the device plugin registers again")
            if now - self._gone_since < self._gone_s:
                return
        self._gone_since = None
        self.decision = read
        log.info(read.log_line, extra=self._extra(read))
        self._on_change(read)

    def _extra(self, decision: Decision) -> dict[str, object]:
        return {
            "mode": self._mode,
            "device_plugin": "registered" if decision.register else "off",
            "registry": str(self._registry),
        }


async def _until_failed(tasks: list[asyncio.Task[None]], timeout: float | None) -> None:
    """Wait ``timeout`` seconds (None: until cancelled), or until one of ``tasks`` ends: its
    error is raised (a plugin's :func:`serve` never returns otherwise)."""
    if not tasks:
        if timeout is None:
            await asyncio.Event().wait()  # never set
        else:
            await asyncio.sleep(timeout)
        return
    done, _ = await asyncio.wait(tasks, timeout=timeout, return_when=asyncio.FIRST_EXCEPTION)
    for task in done:
        task.result()
        raise RuntimeError(f"{task.get_name()} stopped serving")


async def _stop(tasks: list[asyncio.Task[None]]) -> None:
    """Cancel the plugins and wait until each has stopped its server and removed its socket."""
    for task in tasks:
        task.cancel()
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
