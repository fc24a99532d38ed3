"""The node agent's settings: defaults < environment (``SCHEDEXT_AGENT_...``) < CLI flags.

The agent's own group, apart from the extender's: the two processes share no setting but the
GPU resource name and the share resources, which each takes from its own configuration (the
``share_*`` keys here read as the extender's ``policy.shares.*``)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from extender import names
from extender.config import SHARE_PRESETS, ShareResources
from extender.devices.drift import SETTLE_S, DriftResources
from extender.devices.share_handle import ShareHandle, ShareHandleError, share_handle

__all__ = ["AgentSettings"]

_UNITS = {"MiB": 1, "GiB": 1024}


class AgentSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="SCHEDEXT_AGENT_", extra="forbid", frozen=True)

    # This node's name (the DaemonSet passes spec.nodeName through the downward API).
    node_name: str = Field(min_length=1)
    # The resource the device plugin registers: nvidia.com/gpu replaces the stock plugin.
    resource_name: str = names.GPU_RESOURCE
    device_plugin_dir: Path = Path("/var/lib/kubelet/device-plugins")
    socket_name: str = "schedext-gpu.sock"
    # How often health (ECC, retired pages, lost GPUs) and live use are read through NVML.
    # XID events arrive at once, on their own thread.
    poll_s: float = Field(default=10.0, gt=0)
    # Live use: at most one Node write per use_interval_s, only when a GPU's utilisation or
    # memory moved by use_threshold percentage points, and at least every use_refresh_s (below
    # the extender's policy.live_use_stale_s, 300 s by default).
    use_interval_s: float = Field(default=30.0, gt=0)
    use_threshold: int = Field(default=10, ge=0, le=100)
    use_refresh_s: float = Field(default=120.0, gt=0)
    # /healthz, /readyz and /metrics for the kubelet's probes and Prometheus (read-only).
    probe_host: str = "0.0.0.0"  # noqa: S104 (the pod's own address: the kubelet probes it)
    probe_port: int = Field(default=9401, ge=0, le=65535)
    kubeconfig: Path | None = None
    # Replay recorded NVML answers instead of the driver (tests, demos): app.agent.replay.
    nvml_replay: Path | None = None
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    # GPU shares (README "GPU shares on the node"): the share handle's device plugin on its own
    # socket, and share memory and cores written on the Node's status. Off: whole GPUs only.
    shares: bool = True
    # The resources shares are asked with, as the extender's policy.shares.* (a preset, then
    # each field over it; "" turns cores or count off). Both sides must agree.
    share_preset: Literal["schedext", "gpushare", "hami"] = "schedext"
    share_memory_resource: str | None = None
    share_memory_unit: Literal["MiB", "GiB"] | None = None
    share_cores_resource: str | None = None
    share_count_resource: str | None = None
    # Handle IDs per GPU (the count resource): at most this many containers hold a share of
    # one GPU at once, as the kubelet counts.
    share_slots: int = Field(default=32, ge=1, le=1024)
    share_socket_name: str = "schedext-gpu-shares.sock"
    # Run a CUDA MPS control daemon per GPU, so that a share's memory and SM limits bind.
    mps: bool = False
    # The daemons' pipe and log directories (<mps_dir>/<uuid>/pipe, .../log) and the /dev/shm
    # they share with their clients (<mps_dir>/shm): a host path, mounted at the same path.
    mps_dir: Path = Path("/run/schedext/mps")
    # The driver's MIG capability minors: which /dev/nvidia-caps node a MIG device's
    # container needs (extender.devices.device_nodes). Unreadable: the container runtime
    # adds those nodes from NVIDIA_VISIBLE_DEVICES, as before.
    mig_minors: Path = Path("/proc/driver/nvidia-caps/mig-minors")
    # Reconciliation with the kubelet's PodResources API (README "Drift"): its socket (the
    # DaemonSet mounts the kubelet's pod-resources directory), how often it is read (and at
    # once when a device plugin nudges it), how long one read may take, and how long a record
    # of a pod the kubelet no longer lists is kept before the agent releases it. A missing or
    # slow socket only turns reconciliation off until it answers.
    reconcile: bool = True
    pod_resources_socket: Path = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
    reconcile_s: float = Field(default=30.0, gt=0)
    pod_resources_deadline_s: float = Field(default=2.0, gt=0, le=60)
    # At least the settling time: a record is not even reported before that.
    stale_grace_s: float = Field(default=120.0, ge=SETTLE_S)

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
