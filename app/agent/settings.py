"""The node agent's settings: defaults < environment (``SCHEDEXT_AGENT_...``) < CLI flags.

The agent's own group, apart from the extender's: the two processes share no setting but the
GPU resource name and the share resources, which each takes from its own configuration (the
``share_*`` keys here read as the extender's ``policy.shares.*``)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from app.stdio import settings_sources as sources
from extender import names
from extender.config import SHARE_PRESETS, ShareResources
from extender.devices.drift import SETTLE_S, DriftResources
from extender.devices.share_handle import ShareHandle, ShareHandleError, share_handle
from extender.dra import DEFAULT_GPU_DRIVER

__all__ = ["AgentSettings", "load_agent_settings"]

PREFIX = "SCHEDEXT_AGENT_"

_UNITS = {"MiB": 1, "GiB": 1024}


class AgentSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix=PREFIX, extra="forbid", frozen=True)

    node_name: str = Field(
        min_length=1,
        description="The Node it publishes on: this node's name (required; the DaemonSet "
        "passes `spec.nodeName` through the downward API).",
    )
    resource_name: str = Field(
        default=names.GPU_RESOURCE,
        description="The resource the device plugin registers: `nvidia.com/gpu` replaces the "
        "stock plugin. The extender's `policy.gpu_resource` must match.",
    )
    device_plugin_dir: Path = Field(
        default=Path("/var/lib/kubelet/device-plugins"),
        description="The kubelet's device-plugin directory, where the agent's sockets are.",
    )
    socket_name: str = Field(
        default="schedext-gpu.sock", description="The whole-GPU plugin's socket, in that directory."
    )
    # A node whose GPUs a DRA driver hands out must not advertise them a second time through
    # a device plugin (the "mixed" node): app.agent.dra_drivers decides, app.agent.plugin_switch
    # acts.
    device_plugin: Literal["auto", "on", "off"] = Field(
        default="auto",
        description="Whether the agent serves its device plugins (the whole GPUs, each MIG "
        "profile and, with `shares`, the share handle, which is a device-plugin resource too "
        "and follows this switch; share memory and cores on the Node's status are then written "
        "as 0). `on`: always, as before DRA. `off`: never: a node whose GPUs NVIDIA's DRA "
        "driver hands out through ResourceClaims. `auto`: unless one of `dra_drivers` is "
        "registered with the kubelet (its socket in `plugins_registry_dir`), checked at start "
        "and every `dra_poll_s`. Topology, health and live use are published in every mode.",
    )
    dra_drivers: list[Annotated[str, Field(min_length=1)]] = Field(
        default_factory=lambda: [DEFAULT_GPU_DRIVER],
        description="The DRA drivers that hand out this node's GPUs, as their kubelet "
        "plugins name themselves (`<driver>-reg.sock`): with `device_plugin` auto, one of "
        "them registered turns the device plugins off.",
    )
    plugins_registry_dir: Path = Field(
        default=Path("/var/lib/kubelet/plugins_registry"),
        description="The kubelet's plugin registration directory, where a DRA driver's "
        "registration socket is (read-only: only names are read; the DaemonSet mounts it with "
        "`device_plugin` auto).",
    )
    dra_poll_s: float = Field(
        default=2.0,
        gt=0,
        description="With `device_plugin` auto: seconds between reads of `plugins_registry_dir`.",
    )
    dra_gone_s: float = Field(
        default=30.0,
        ge=0,
        description="With `device_plugin` auto: seconds a DRA driver must stay unregistered "
        "before the device plugins register again (a driver's pod restarting is not the node "
        "going back to the device plugin). A driver that appears turns them off at the next "
        "read.",
    )
    # XID events arrive at once, on their own thread.
    poll_s: float = Field(
        default=10.0,
        gt=0,
        description="Seconds between NVML reads of health (uncorrectable ECC errors, retired "
        "pages pending, lost GPUs) and live use; XID events arrive at once.",
    )
    use_interval_s: float = Field(
        default=30.0,
        gt=0,
        description="Live use (`schedext.io/gpu-use`): at most one Node write per this many "
        "seconds.",
    )
    use_threshold: int = Field(
        default=10,
        ge=0,
        le=100,
        description="Live use is written only when a GPU's utilisation or memory moved by this "
        "many percentage points since the last write, or after `use_refresh_s`.",
    )
    use_refresh_s: float = Field(
        default=120.0,
        gt=0,
        description="Live use is written at least every this many seconds, moved or not (at "
        "least `use_interval_s`; keep it below the extender's `policy.live_use_stale_s`).",
    )
    probe_host: str = Field(
        default="0.0.0.0",  # noqa: S104 (the pod's own address: the kubelet probes it)
        description="The address of the probe port.",
    )
    probe_port: int = Field(
        default=9401,
        ge=0,
        le=65535,
        description="`/healthz`, `/readyz` (published, pods listed, plugin listening) and "
        "`/metrics`, for the kubelet's probes and Prometheus (read-only).",
    )
    kubeconfig: Path | None = Field(
        default=None, description="Credentials for the API server. null: in-cluster."
    )
    # app.agent.replay.
    nvml_replay: Path | None = Field(
        default=None,
        description="Replay recorded NVML answers (`python -m app.agent.record`) instead of the "
        "driver: tests, demos.",
    )
    log_level: Literal["debug", "info", "warning", "error"] = Field(
        default="info", description="The least severe log lines written (JSON, on stderr)."
    )
    shares: bool = Field(
        default=True,
        description="Serve GPU shares: the share handle's device plugin on its own socket, and "
        "share memory and cores on the Node's status. false: whole GPUs only.",
    )
    # Both sides must agree.
    share_preset: Literal["schedext", "gpushare", "hami"] = Field(
        default="schedext",
        description="The resources shares are asked with, read as the extender's "
        "`policy.shares.preset`; the `share_*` resource keys below override it one by one, as "
        "the extender's `policy.shares.*` do.",
    )
    share_memory_resource: str | None = Field(
        default=None, description="As the extender's `policy.shares.memory_resource`."
    )
    share_memory_unit: Literal["MiB", "GiB"] | None = Field(
        default=None, description="As the extender's `policy.shares.memory_unit`."
    )
    share_cores_resource: str | None = Field(
        default=None,
        description='As the extender\'s `policy.shares.cores_resource` ("" turns cores off).',
    )
    share_count_resource: str | None = Field(
        default=None,
        description='As the extender\'s `policy.shares.count_resource` ("" turns the count off).',
    )
    share_slots: int = Field(
        default=32,
        ge=1,
        le=1024,
        description="Handle IDs per GPU (the count resource): at most this many containers hold "
        "a share of one GPU at once, as the kubelet counts.",
    )
    share_socket_name: str = Field(
        default="schedext-gpu-shares.sock", description="The share plugin's socket."
    )
    mps: bool = Field(
        default=False,
        description="Run a CUDA MPS control daemon per GPU, so that a share's memory and SM "
        "limits bind.",
    )
    mps_dir: Path = Field(
        default=Path("/run/schedext/mps"),
        description="Where the daemons' pipe and log directories are (`<mps_dir>/<uuid>/pipe`, "
        "`.../log`), and the `/dev/shm` they share with their clients (`<mps_dir>/shm`): a "
        "host path, mounted at the same path.",
    )
    # extender.devices.device_nodes.
    mig_minors: Path = Field(
        default=Path("/proc/driver/nvidia-caps/mig-minors"),
        description="The driver's MIG capability minors: a MIG device's container gets its "
        "`/dev/nvidia-caps/nvidia-cap<N>` nodes from it. Unreadable: the NVIDIA container "
        "runtime adds them from `NVIDIA_VISIBLE_DEVICES`, as before.",
    )
    # A missing or slow socket only turns reconciliation off until it answers.
    reconcile: bool = Field(
        default=True,
        description="Reconcile with the kubelet's PodResources API: publish on the Node "
        "(`schedext.io/gpu-drift`) where it disagrees with schedext's records.",
    )
    pod_resources_socket: Path = Field(
        default=Path("/var/lib/kubelet/pod-resources/kubelet.sock"),
        description="The kubelet's PodResources socket (the DaemonSet mounts its directory "
        "read-only).",
    )
    reconcile_s: float = Field(
        default=30.0,
        gt=0,
        description="Seconds between PodResources reads (and one at once when a device plugin "
        "nudges).",
    )
    pod_resources_deadline_s: float = Field(
        default=2.0, gt=0, le=60, description="The most seconds one PodResources read may take."
    )
    # At least the settling time: a record is not even reported before that.
    stale_grace_s: float = Field(
        default=120.0,
        ge=SETTLE_S,
        description="Seconds a record the kubelet no longer backs is kept before the agent "
        "releases it.",
    )

    @model_validator(mode="after")
    def _refresh_after_interval(self) -> AgentSettings:
        if self.use_refresh_s < self.use_interval_s:
            raise ValueError("use_refresh_s must be >= use_interval_s")
        return self

    @model_validator(mode="after")
    def _shares_servable(self) -> AgentSettings:
        self.share_resources()  # names that are no extended resource: a ValueError here
        if self.shares:
            try:
                self.share_handle()
            except ShareHandleError as error:
                raise ValueError(
                    f"GPU shares cannot be served: {error}. Name a share count resource such as "
                    f"{names.SHARE_COUNT_RESOURCE} (share_count_resource, as the extender's "
                    "policy.shares.count_resource), or set shares=false for whole GPUs only"
                ) from None
            if self.share_socket_name == self.socket_name:
                raise ValueError("share_socket_name must differ from socket_name")
        elif self.mps:
            raise ValueError("mps enforces shares' limits: it needs shares on")
        return self

    def share_resources(self) -> ShareResources:
        """The preset with each ``share_*`` field over it (as ``policy.shares.resources()``)."""
        base = SHARE_PRESETS[self.share_preset]
        unit = (
            base.memory_unit_mib
            if self.share_memory_unit is None
            else _UNITS[self.share_memory_unit]
        )
        cores, count = self.share_cores_resource, self.share_count_resource
        return ShareResources(
            memory=self.share_memory_resource or base.memory,
            memory_unit_mib=unit,
            cores=base.cores if cores is None else (cores or None),
            count=base.count if count is None else (count or None),
        )

    def share_handle(self) -> ShareHandle:
        return share_handle(self.share_resources(), self.resource_name, slots=self.share_slots)

    def drift_resources(self) -> DriftResources:
        """The resources whose devices the agent reconciles: those it serves."""
        share = self.share_handle().resource if self.shares else None
        return DriftResources(gpu=self.resource_name, share=share)


def load_agent_settings(
    flags: Mapping[str, Any], environ: Mapping[str, str] | None = None
) -> AgentSettings:
    """The agent's settings: defaults < ``SCHEDEXT_AGENT_*`` variables < ``flags`` (by key).
    Raises :class:`app.stdio.settings_sources.SettingsError`: a variable that names no
    setting, or is no JSON where a list is expected, and each invalid value with its source."""
    layers = sources.Layers()
    layers.add(
        *sources.read_environment(
            AgentSettings,
            os.environ if environ is None else environ,
            prefix=PREFIX,
            delimiter=None,
        )
    )
    layers.add(
        flags,
        {
            (key,): sources.Origin(
                "flag", ("--no-" if value is False else "--") + key.replace("_", "-")
            )
            for key, value in flags.items()
        },
    )
    return sources.load(
        AgentSettings, layers, hints={"node_name": f"--node-name or {PREFIX}NODE_NAME"}
    )
