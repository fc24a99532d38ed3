"""The node agent's settings: defaults < environment (``SCHEDEXT_AGENT_...``) < CLI flags.

The agent's own group, apart from the extender's: the two processes share no setting but the
GPU resource name, which each takes from its own configuration."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from extender import names

__all__ = ["AgentSettings"]


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

    @model_validator(mode="after")
    def _refresh_after_interval(self) -> AgentSettings:
        if self.use_refresh_s < self.use_interval_s:
            raise ValueError("use_refresh_s must be >= use_interval_s")
        return self
