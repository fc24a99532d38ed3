"""``schedext agent``: the node agent's command line (registered by :mod:`app.cli`)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import sys
from pathlib import Path

from app.agent.nvml import Nvml, NvmlError
from app.agent.settings import AgentSettings, load_agent_settings
from app.stdio import logs
from app.stdio.settings_sources import SettingsError

__all__ = ["add_command"]

log = logging.getLogger("schedext.agent")


def add_command(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    agent = commands.add_parser(
        "agent",
        help="run the node agent (NVML, the GPU device plugin, the Node's GPU annotations)",
        description=(
            "Run on each GPU node (a DaemonSet): read the GPUs through NVML, publish their "
            "topology, health and use on the Node, and serve the kubelet device plugins that "
            "give each container exactly the GPUs, or the GPU shares, schedext chose. Every "
            "setting also comes from an environment variable SCHEDEXT_AGENT_<KEY> "
            "(SCHEDEXT_AGENT_NODE_NAME), and some from the flags below, which win; "
            "docs/configuration.md lists them all."
        ),
    )
    agent.add_argument("--node-name", help="this node's name (default: $SCHEDEXT_AGENT_NODE_NAME)")
    agent.add_argument("--kubeconfig", type=Path, help="credentials (default: in-cluster)")
    agent.add_argument("--resource-name", help="the resource to register")
    agent.add_argument("--device-plugin-dir", type=Path, help="the kubelet's plugin directory")
    agent.add_argument("--socket-name", help="this plugin's socket file name")
    agent.add_argument(
        "--device-plugin",
        choices=["auto", "on", "off"],
        help="serve the device plugins: auto (default) unless a DRA GPU driver is registered "
        "with the kubelet",
    )
    agent.add_argument(
        "--plugins-registry-dir", type=Path, help="the kubelet's plugin registration directory"
    )
    agent.add_argument("--poll-s", type=float, help="seconds between health and use reads")
    agent.add_argument("--probe-port", type=int, help="/healthz, /readyz and /metrics port")
    agent.add_argument("--probe-host", help="address of the probe port (default 0.0.0.0)")
    agent.add_argument("--nvml-replay", type=Path, help="replay recorded NVML answers (tests)")
    agent.add_argument(
        "--shares",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="serve GPU shares: the share handle's plugin and share capacity on the Node",
    )
    agent.add_argument(
        "--share-preset", choices=["schedext", "gpushare", "hami"], help="share resource names"
    )
    agent.add_argument("--share-slots", type=int, help="share handle devices per GPU")
    agent.add_argument("--share-socket-name", help="the share plugin's socket file name")
    agent.add_argument(
        "--mps",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="run a CUDA MPS daemon per GPU, so that shares' limits bind",
    )
    agent.add_argument("--mps-dir", type=Path, help="MPS pipes, logs and /dev/shm (host path)")
    agent.add_argument(
        "--mig-minors",
        type=Path,
        help="the driver's MIG capability minors (default /proc/driver/nvidia-caps/mig-minors)",
    )
    agent.add_argument(
        "--reconcile",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="compare the kubelet's PodResources with the agent's records (publish the drift)",
    )
    agent.add_argument(
        "--pod-resources-socket", type=Path, help="the kubelet's PodResources socket"
    )
    agent.add_argument("--reconcile-s", type=float, help="seconds between PodResources reads")
    agent.add_argument(
        "--stale-grace-s", type=float, help="seconds before a stale record is released"
    )
    agent.add_argument(
        "--log-level",
        choices=["debug", "info", "warning", "error"],
        help="the least severe log lines written, as JSON on stderr",
    )
    _state_defaults(agent)
    agent.set_defaults(handler=run)


def _state_defaults(parser: argparse.ArgumentParser) -> None:
    """End the help of each flag that sets a setting with the setting's default, where the
    help does not say it already."""
    fields = AgentSettings.model_fields
    for action in parser._actions:  # argparse has no public list of them
        info = fields.get(action.dest)
        if info is None or info.is_required() or action.help is None or "default" in action.help:
            continue
        value = info.get_default(call_default_factory=True)
        if value is None:
            shown = "none"
        elif isinstance(value, bool):
            shown = "on" if value else "off"
        elif isinstance(value, float):
            shown = f"{value:g}"
        elif isinstance(value, list):
            shown = ", ".join(str(v) for v in value)
        else:
            shown = str(value)
        action.help = f"{action.help} (default {shown})".replace("%", "%%")


def run(args: argparse.Namespace) -> int:
    flags = {
        key: value
        for key in (
            "node_name", "kubeconfig", "resource_name", "device_plugin_dir", "socket_name",
            "device_plugin", "plugins_registry_dir",
            "poll_s", "probe_port", "probe_host", "nvml_replay", "log_level", "shares",
            "share_preset", "share_slots", "share_socket_name", "mps", "mps_dir", "mig_minors",
            "reconcile", "pod_resources_socket", "reconcile_s", "stale_grace_s",
        )
        if (value := getattr(args, key)) is not None
    }  # fmt: skip
    try:
        settings = load_agent_settings(flags)
    except SettingsError as problem:
        for line in problem.lines:
            print(f"schedext agent: invalid settings: {line}", file=sys.stderr)  # noqa: T201
        return 2
    logs.configure(settings.log_level)
    try:
        nvml = _open_nvml(settings)
    except (NvmlError, ValueError, OSError) as error:
        print(f"schedext agent: {error}", file=sys.stderr)  # noqa: T201
        return 1
    try:
        return asyncio.run(_serve(settings, nvml))
    except NvmlError as error:
        print(f"schedext agent: cannot read the GPUs: {error}", file=sys.stderr)  # noqa: T201
        return 1
    except ValueError as error:  # credentials
        print(f"schedext agent: {error}", file=sys.stderr)  # noqa: T201
        return 1
    finally:
        nvml.close()


def _open_nvml(settings: AgentSettings) -> Nvml:
    if settings.nvml_replay is not None:
        from app.agent.replay import ReplayBackend  # noqa: PLC0415 (tests and demos only)

        return ReplayBackend(settings.nvml_replay)
    # Imported here: loading the NVML binding is the driver's business, not the CLI's.
    from app.agent.pynvml_backend import PynvmlBackend  # noqa: PLC0415

    return PynvmlBackend()


async def _serve(settings: AgentSettings, nvml: Nvml) -> int:
    # Imported here: `schedext serve` parses this module's flags, and must not load gRPC.
    from app.agent.probes import AgentState, probe_app  # noqa: PLC0415
    from app.agent.runner import Agent  # noqa: PLC0415
    from app.kube.api import KubeApi  # noqa: PLC0415
    from app.kube.config import load_cluster_config  # noqa: PLC0415

    api = KubeApi(load_cluster_config(settings.kubeconfig))
    agent = Agent(settings, nvml, api)
    state = AgentState(
        ready=agent.ready,
        gpus=lambda: agent.devices.current() if agent.devices is not None else (),
        writes=lambda: agent.publisher.writes,
        drift=lambda: agent.reconciler.stats() if agent.reconciler is not None else None,
        device_plugin=lambda: agent.switch.decision,
    )
    from aiohttp import web  # noqa: PLC0415

    runner = web.AppRunner(probe_app(state), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, settings.probe_host, settings.probe_port)
    await site.start()
    main = asyncio.current_task()
    assert main is not None
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, main.cancel)
    try:
        await agent.run()
    except asyncio.CancelledError:
        log.info("schedext agent stopping")
    finally:
        await runner.cleanup()
        with contextlib.suppress(Exception):
            await api.close()
    return 0
