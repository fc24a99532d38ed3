"""Whether this node's GPUs are handed out by a DRA driver, and so whether the agent's device
plugins should serve: a node that advertises its GPUs both through a device plugin
(``nvidia.com/gpu``) and through DRA (``gpu.nvidia.com`` ResourceSlices) has two owners for
each GPU, the "mixed" node the extender's inventory flags.

Detection is local and needs no RBAC: a DRA kubelet plugin registers with the kubelet through
the plugin watcher, by a unix socket in ``/var/lib/kubelet/plugins_registry/``, named
``<driver>-reg.sock`` by the kubeletplugin library that NVIDIA's driver uses
(``k8s.io/dynamic-resource-allocation/kubeletplugin``). The kubelet's watcher
(``pkg/kubelet/pluginmanager/pluginwatcher``) ignores dot files and anything that is not a
socket, and so does :func:`registered_drivers`.

:func:`device_plugin_wanted` is the decision, values in and a value out;
:func:`registered_drivers` is the one directory read it needs. Acting on it (and watching it
change) is :mod:`app.agent.plugin_switch`'s.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

__all__ = [
    "Decision",
    "DevicePluginMode",
    "RegisteredDriver",
    "device_plugin_wanted",
    "registered_drivers",
]

DevicePluginMode = Literal["auto", "on", "off"]


@dataclass(frozen=True, slots=True)
class RegisteredDriver:
    """A GPU DRA driver the kubelet knows: its name and its registration socket."""

    driver: str
    socket: Path

    @property
    def where(self) -> str:
        """The socket as the log line names it: ``plugins_registry/<file>``."""
        return f"{self.socket.parent.name}/{self.socket.name}"


@dataclass(frozen=True, slots=True)
class Decision:
    """Serve the device plugins or not, and why, in words for the log and the probes."""

    register: bool
    why: str

    @property
    def log_line(self) -> str:
        """What the agent logs at start and on each change."""
        return f"device plugin {'on' if self.register else 'off'}: {self.why}"

    def __str__(self) -> str:
        """What the probes show: registered (asked of the kubelet) or off, and why."""
        return f"{'registered' if self.register else 'off'}: {self.why}"


def device_plugin_wanted(
    mode: DevicePluginMode, found: Sequence[RegisteredDriver] | None
) -> Decision:
    """``found``: the GPU DRA drivers registered with the kubelet, or None when the
    registration directory could not be read (read only in ``auto``; ignored otherwise)."""
    if mode == "on":
        return Decision(True, "device_plugin is set to on")
    if mode == "off":
        return Decision(False, "device_plugin is set to off")
    if found is None:
        # Not mounted, or no kubelet plugin ever ran here: nothing says DRA serves the GPUs,
        # and a node with no device plugin would have none to give.
        return Decision(True, "the kubelet's plugin registry cannot be read: no DRA driver seen")
    if found:
        first = found[0]
        return Decision(
            False, f"DRA driver {first.driver} is registered with the kubelet ({first.where})"
        )
    return Decision(True, "no DRA GPU driver is registered with the kubelet")


def registered_drivers(
    directory: Path, drivers: Iterable[str]
) -> tuple[RegisteredDriver, ...] | None:
    """The ``drivers`` with a registration socket in ``directory`` (the kubelet's
    ``plugins_registry``), in the order of ``drivers``; None when it cannot be read. A name
    counts when it starts with ``<driver>-`` (``gpu.nvidia.com-reg.sock``, or a suffix of the
    driver's choosing), so that ``gpu.nvidia.com`` never matches ``gpu.nvidia.com.example``."""
    try:
        with os.scandir(directory) as listing:
            entries = sorted(listing, key=lambda e: e.name)
    except OSError:
        return None
    sockets = [e for e in entries if not e.name.startswith(".") and _is_socket(e)]
    found = []
    for driver in drivers:
        match = next((e for e in sockets if e.name.startswith(f"{driver}-")), None)
        if match is not None:
            found.append(RegisteredDriver(driver, directory / match.name))
    return tuple(found)


def _is_socket(entry: os.DirEntry[str]) -> bool:
    try:
        return stat.S_ISSOCK(entry.stat(follow_symlinks=False).st_mode)
    except OSError:  # gone since the listing
        return False
