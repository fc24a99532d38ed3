"""The device plugin on its unix socket, registered with the kubelet, for as long as the agent
runs: :func:`serve` is one asyncio task.

The kubelet learns of a plugin only through ``Registration.Register`` on its ``kubelet.sock``,
and forgets it whenever it restarts: it then deletes every socket in the device-plugin
directory, ours included, and waits for plugins to register again. So the task watches our
socket file and the kubelet's (by inode and change time: a restarted kubelet's socket is a new
file) and, on any change, serves on a fresh socket and registers again. A kubelet that is not
there yet is retried with a bounded, growing backoff.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import grpc

from app.agent.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc
from extender.names import GPU_RESOURCE

__all__ = ["API_VERSION", "DEVICE_PLUGIN_DIR", "KUBELET_SOCKET", "Endpoint", "serve"]

log = logging.getLogger("schedext.agent.registration")

API_VERSION = "v1beta1"
DEVICE_PLUGIN_DIR = Path("/var/lib/kubelet/device-plugins")
KUBELET_SOCKET = "kubelet.sock"

_FileId = tuple[int, int]


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where the plugin listens and how it registers."""

    directory: Path = DEVICE_PLUGIN_DIR
    socket_name: str = "schedext-gpu.sock"
    resource_name: str = GPU_RESOURCE
    # Only the kubelet (root) may talk to the socket: whoever can, moves GPUs between pods.
    socket_mode: int = 0o600
    register_timeout_s: float = 5.0
    retry_first_s: float = 0.5
    retry_max_s: float = 30.0
    # How often the socket files are checked for a kubelet restart.
    poll_s: float = 1.0
    # How long in-flight calls may finish when the server is replaced or stopped.
    stop_grace_s: float = 2.0

    @property
    def socket(self) -> Path:
        return self.directory / self.socket_name

    @property
    def kubelet_socket(self) -> Path:
        return self.directory / KUBELET_SOCKET


async def serve(
    plugin: api_pb2_grpc.DevicePluginServicer, endpoint: Endpoint | None = None
) -> None:
    """Serve ``plugin`` and keep it registered until cancelled; on cancellation the server
    stops (``stop_grace_s``) and its socket file is removed. Never returns otherwise."""
    endpoint = endpoint or Endpoint()
    while True:
        server = await _start(plugin, endpoint)
        try:
            ours = _identity(endpoint.socket)
            kubelet = await _register(endpoint)
            await _until_replaced(endpoint, ours, kubelet)
            log.info("kubelet restarted: registering again", extra={"socket": endpoint.socket})
        finally:
            # Shielded: a cancellation mid-stop must still leave no server behind.
            await asyncio.shield(server.stop(endpoint.stop_grace_s))
            with contextlib.suppress(FileNotFoundError):
                if _identity(endpoint.socket) == ours:
                    endpoint.socket.unlink()


async def _start(plugin: api_pb2_grpc.DevicePluginServicer, endpoint: Endpoint) -> grpc.aio.Server:
    endpoint.directory.mkdir(parents=True, exist_ok=True)
    # A socket left by an earlier run (or by the kubelet's sweep racing us) blocks the bind.
    with contextlib.suppress(FileNotFoundError):
        endpoint.socket.unlink()
    server = grpc.aio.server()
    api_pb2_grpc.add_DevicePluginServicer_to_server(plugin, server)
    server.add_insecure_port(f"unix://{endpoint.socket}")
    await server.start()
    os.chmod(endpoint.socket, endpoint.socket_mode)
    return server


async def _register(endpoint: Endpoint) -> _FileId | None:
    """Register until the kubelet accepts; returns which kubelet socket file did."""
    request = api_pb2.RegisterRequest(
        version=API_VERSION,
        endpoint=endpoint.socket_name,  # relative to the kubelet's device-plugin directory
        resource_name=endpoint.resource_name,
        options=api_pb2.DevicePluginOptions(
            pre_start_required=False, get_preferred_allocation_available=True
        ),
    )
    delay = endpoint.retry_first_s
    while True:
        kubelet = _identity(endpoint.kubelet_socket)
        if kubelet is not None:
            try:
                async with grpc.aio.insecure_channel(f"unix://{endpoint.kubelet_socket}") as ch:
                    stub = api_pb2_grpc.RegistrationStub(ch)
                    await stub.Register(request, timeout=endpoint.register_timeout_s)
            except grpc.aio.AioRpcError as error:
                log.warning(
                    "kubelet registration failed",
                    extra={"code": error.code().name, "reason": error.details(), "retry_s": delay},
                )
            else:
                log.info(
                    "registered with the kubelet",
                    extra={"resource": endpoint.resource_name, "socket": endpoint.socket_name},
                )
                return kubelet
        else:
            log.info("waiting for the kubelet", extra={"socket": str(endpoint.kubelet_socket)})
        await asyncio.sleep(delay)
        delay = min(delay * 2, endpoint.retry_max_s)


async def _until_replaced(
    endpoint: Endpoint, ours: _FileId | None, kubelet: _FileId | None
) -> None:
    """Return once our socket file is gone or replaced, or the kubelet's socket is a new file
    (a missing kubelet socket alone is not a restart: it reappears, then differs)."""
    while True:
        await asyncio.sleep(endpoint.poll_s)
        if _identity(endpoint.socket) != ours:
            return
        now = _identity(endpoint.kubelet_socket)
        if now is not None and now != kubelet:
            return


def _identity(path: Path) -> _FileId | None:
    """Which file is at ``path``: its inode and change time, since a filesystem reuses a freed
    inode number at once (ext4 does), and a restarted kubelet's socket may get its old one."""
    try:
        status = path.stat()
    except FileNotFoundError:
        return None
    return (status.st_ino, status.st_ctime_ns)
