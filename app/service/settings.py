"""Settings: defaults < YAML config file < environment (``SCHEDEXT_...``) < CLI flags.

Nested groups use ``__`` in environment names, e.g. ``SCHEDEXT_POLICY__GPU_SCORING=spread``
or ``SCHEDEXT_SERVER__MAX_BODY_BYTES=4194304``. The pure core receives only the small frozen
:class:`extender.policy.PolicyConfig` built from the ``policy`` group.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import ssl
import uuid
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    YamlConfigSettingsSource,
)

from extender import names, scoring
from extender.config import (
    SHARE_PRESETS,
    GpuScoring,
    PolicyConfig,
    SharePlacement,
    ShareResources,
)
from extender.quantity import QuantityError, to_milli

__all__ = ["BIND_ANSWER_MARGIN_S", "Settings", "load_settings"]

# What a bind needs beyond its barrier wait and API deadline: planning, the event loop's
# timers firing late, encoding the answer and its trip back to kube-scheduler.
BIND_ANSWER_MARGIN_S = 1.0


class _Group(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ServerSettings(_Group):
    host: str = "127.0.0.1"
    port: int = Field(default=8888, ge=0, le=65535)
    # Verbs are served at /<verb> and, when set, also at <path_prefix>/<verb>.
    path_prefix: str = ""
    max_body_bytes: int = Field(default=8 * 1024 * 1024, ge=1024)
    # A client that has not sent its whole body by then is cut off (slow-body defence).
    body_timeout_s: float = Field(default=10.0, gt=0)
    # A request's line and headers not all in by then (counted from its first byte, or for a
    # new connection from its opening) get a 408 and the connection closed: a client sending
    # them a byte at a time would otherwise hold its connection for ever. kube-scheduler
    # sends them in one write.
    header_timeout_s: float = Field(default=10.0, gt=0)
    access_log: bool = False
    # prioritize's answer to a request without ?full: the compact one kube-scheduler gets (the
    # hosts above the lowest score, lowered by it), or with true every host and its absolute
    # score, for callers that read the scores themselves.
    prioritize_full: bool = False
    # A constant-answer endpoint the latency benchmark compares against.
    bench_endpoints: bool = False
    # HTTPS: the server certificate chain and its key (PEM). With tls_client_ca_file every
    # client must present a certificate signed by that CA, or the TLS handshake fails before
    # any HTTP request is read (mTLS between kube-scheduler and schedext).
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None
    tls_client_ca_file: Path | None = None
    # bind moves pods, so the verbs must be reachable only over loopback or mTLS; this opts out.
    insecure_allow_remote: bool = False
    # A second listener, plain HTTP on every address, serving only /metrics and /healthz (for
    # Prometheus; see app.service.metrics_listener). Off by default.
    metrics_port: int | None = Field(default=None, ge=0, le=65535)
    # A third listener, plain HTTP on every address, serving only the read-only views
    # (/inventory, /explain/NAMESPACE/NAME, /healthz): what `kubectl schedext` reads through the
    # API server's service proxy (see app.service.views_listener). Off by default. A port apart from
    # the metrics one, so that a NetworkPolicy can let Prometheus scrape metrics without also
    # letting it read pod names, and the API server read the views without the metrics.
    views_port: int | None = Field(default=None, ge=0, le=65535)

    @field_validator("path_prefix")
    @classmethod
    def _normalise_prefix(cls, value: str) -> str:
        value = value.strip().rstrip("/")
        if value and not value.startswith("/"):
            value = "/" + value
        return value

    @model_validator(mode="after")
    def _tls_files_are_usable(self) -> ServerSettings:
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ValueError("server.tls_cert_file and server.tls_key_file go together")
        if self.tls_client_ca_file is not None and self.tls_cert_file is None:
            raise ValueError(
                "server.tls_client_ca_file needs server.tls_cert_file and server.tls_key_file: "
                "client certificates are only asked for over HTTPS"
            )
        if self.tls_cert_file is not None:
            # Load them now, so that a missing file or a key that does not match its
            # certificate is a clear settings error instead of a traceback from the server.
            context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            try:
                context.load_cert_chain(self.tls_cert_file, self.tls_key_file)
            except (OSError, ssl.SSLError) as error:
                raise ValueError(
                    f"cannot use server.tls_cert_file {self.tls_cert_file} with "
                    f"server.tls_key_file {self.tls_key_file}: {error}"
                ) from None
            if self.tls_client_ca_file is not None:
                try:
                    context.load_verify_locations(cafile=self.tls_client_ca_file)
                except (OSError, ssl.SSLError) as error:
                    raise ValueError(
                        f"cannot use server.tls_client_ca_file {self.tls_client_ca_file}: {error}"
                    ) from None
        return self

    @model_validator(mode="after")
    def _metrics_port_is_another_port(self) -> ServerSettings:
        if self.metrics_port and self.metrics_port == self.port:
            raise ValueError(
                f"server.metrics_port ({self.metrics_port}) must differ from server.port: it is "
                "a second listener"
            )
        if self.views_port and self.views_port in (self.port, self.metrics_port):
            raise ValueError(
                f"server.views_port ({self.views_port}) must differ from server.port and "
                "server.metrics_port: it is a listener of its own"
            )
        return self

    @model_validator(mode="after")
    def _bind_stays_on_loopback_or_mtls(self) -> ServerSettings:
        if self.insecure_allow_remote or self.client_auth or self._is_loopback(self.host):
            return self
        raise ValueError(
            f"refusing to listen on {self.host or 'every address'!r} without client "
            "certificates: bind moves pods, so it is served only on loopback (sidecar, "
            "--host 127.0.0.1) or over mTLS (--tls-cert-file, --tls-key-file and "
            "--tls-client-ca-file); --insecure-allow-remote (server.insecure_allow_remote) "
            "opts out"
        )

    @property
    def client_auth(self) -> bool:
        """Whether every client must present a certificate signed by the client CA."""
        return self.tls_cert_file is not None and self.tls_client_ca_file is not None

    def uvicorn_tls(self) -> dict[str, Any]:
        """uvicorn.run's TLS arguments; empty for plain HTTP."""
        if self.tls_cert_file is None:
            return {}
        return {
            "ssl_certfile": str(self.tls_cert_file),
            "ssl_keyfile": str(self.tls_key_file),
            "ssl_ca_certs": str(self.tls_client_ca_file) if self.tls_client_ca_file else None,
            # CERT_REQUIRED: no certificate, or one from another CA, fails the handshake.
            "ssl_cert_reqs": ssl.CERT_REQUIRED if self.client_auth else ssl.CERT_NONE,
        }

    @staticmethod
    def _is_loopback(host: str) -> bool:
        if host == "localhost":
            return True
        try:
            return ipaddress.ip_address(host.strip("[]")).is_loopback
        except ValueError:
            return False  # another name, or "" (every address)


class ShareSettings(_Group):
    """GPU shares: the resources pods ask for them with, and where they go.

    ``preset`` names the resources of the scheduler a cluster moves from (``schedext``,
    ``gpushare``: ``aliyun.com/gpu-mem`` in GiB; ``hami``: ``nvidia.com/gpumem`` in MiB,
    ``nvidia.com/gpucores``, ``nvidia.com/gpu`` counting the devices); the fields below
    override it one by one ("" turns cores or count off)."""

    preset: Literal["schedext", "gpushare", "hami"] = "schedext"
    memory_resource: str | None = None
    memory_unit: Literal["MiB", "GiB"] | None = None
    cores_resource: str | None = None
    count_resource: str | None = None
    # A share must name the count resource (the agent's handle to give it its GPU).
    count_required: bool = True
    placement: Literal["pack", "spread"] = "pack"
    weight: int = Field(default=7, ge=0)

    def resources(self) -> ShareResources:
        base = SHARE_PRESETS[self.preset]
        unit = base.memory_unit_mib if self.memory_unit is None else _UNITS[self.memory_unit]
        return ShareResources(
            memory=self.memory_resource or base.memory,
            memory_unit_mib=unit,
            cores=base.cores if self.cores_resource is None else (self.cores_resource or None),
            count=base.count if self.count_resource is None else (self.count_resource or None),
            count_required=self.count_required,
        )


_UNITS = {"MiB": 1, "GiB": 1024}


class PolicySettings(_Group):
    gpu_resource: str = names.GPU_RESOURCE
    cpu_intensive_min_cpu: str = "2000m"
    gpu_scoring: Literal["binpack", "spread"] = "binpack"
    allocation_weight: int = Field(default=7, ge=0)
    topology_weight: int = Field(default=3, ge=0)
    rack_weight: int = Field(default=10, ge=0)
    ip_weight: int = Field(default=3, ge=0)
    # Any scorer's weight by its name (extender.scoring), over the knobs above; the one way to
    # weigh a scorer that has no knob of its own. {"topology": 5, "cpu_only": 0}
    weights: dict[str, int] = Field(default_factory=dict)
    rack_label: str = names.RACK_LABEL
    zone_label: str = names.ZONE_LABEL
    # The node agent's live-use samples older than this are ignored (the live_use scorer,
    # weight 0 unless weights.live_use says otherwise).
    live_use_stale_s: float = Field(default=300.0, gt=0)
    shares: ShareSettings = ShareSettings()
    # Shortlist mode: filter answers only this many feasible nodes, the best by schedext's
    # scorers, and the scheduler configuration registers no prioritizeVerb (one call per pod
    # instead of two). 0: filter answers every feasible node and prioritize scores them.
    shortlist: int = Field(default=1, ge=0, le=1000)
    # The shortlist of a pod with soft preferences (preferred affinities, a ScheduleAnyway
    # topology spread), for kube-scheduler's Score plugins to choose from; also how many nodes
    # tied for the best a shortlist keeps. 0: as shortlist, and no tie kept.
    shortlist_preferred: int = Field(default=8, ge=0, le=1000)
    # A pod filter turned away for GPUs, a share's memory or cores, a MIG device, an address
    # or quota headroom is sent back to kube-scheduler (the schedext.io/requeued-at nudge)
    # when schedext's watch sees that freed: kube-scheduler's own retry may have come before
    # schedext's watch saw it. How many waiting pods one freeing sends back, the longest
    # waiting first; a pod is sent back at most once a second. Each is one pod patch.
    requeue_per_event: int = Field(default=8, ge=1, le=1000)

    @field_validator("cpu_intensive_min_cpu")
    @classmethod
    def _cpu_quantity(cls, value: str) -> str:
        try:
            if to_milli(value) < 0:
                raise ValueError("must not be negative")
        except QuantityError:
            raise ValueError(f"not a CPU quantity: {value!r}") from None
        return value

    def config(self) -> PolicyConfig:
        return PolicyConfig(
            gpu_resource=self.gpu_resource,
            cpu_intensive_min_cpu_milli=to_milli(self.cpu_intensive_min_cpu),
            gpu_scoring=GpuScoring(self.gpu_scoring),
            allocation_weight=self.allocation_weight,
            topology_weight=self.topology_weight,
            rack_weight=self.rack_weight,
            ip_weight=self.ip_weight,
            weights=tuple(sorted(self.weights.items())),
            rack_label=self.rack_label,
            zone_label=self.zone_label,
            live_use_stale_s=self.live_use_stale_s,
            shares=self.shares.resources(),
            share_placement=SharePlacement(self.shares.placement),
            share_weight=self.shares.weight,
            shortlist=self.shortlist,
            shortlist_preferred=self.shortlist_preferred,
            requeue_per_event=self.requeue_per_event,
        )

    @model_validator(mode="after")
    def _policy_is_valid(self) -> PolicySettings:
        """Build the core's config once now: what it refuses (an unknown scorer name, a
        resource name without a domain) is a settings error, reported as one at start."""
        scoring.weights(self.config())
        return self


class BindSettings(_Group):
    # How long a GPU reservation made by bind lives without the pod being seen bound.
    reservation_ttl_s: float = Field(default=60.0, gt=0)
    # Pending pods remembered between filter and bind.
    pending_capacity: int = Field(default=10_000, ge=1)
    # The API binder's whole budget: the sticky address claim, the Binding, its retries and
    # the reads that explain a conflict, each call capped at what is left of it.
    api_deadline_s: float = Field(default=8.0, gt=0)
    api_attempts: int = Field(default=4, ge=1)
    # kube-scheduler's extender httpTimeout (manifests/scheduler-config.yaml). A bind may wait
    # at the gang barrier and then write to the API server: both, and a moment to answer,
    # must fit inside it, or kube-scheduler gives up on a bind that still goes through.
    extender_http_timeout_s: float = Field(default=30.0, gt=0)


class GangSettings(_Group):
    # How long members wait at the bind barrier when the PodGroup sets no
    # scheduleTimeoutSeconds, and the cap on any group's wait (see bind.extender_http_timeout_s).
    default_timeout_s: float = Field(default=20.0, gt=0)
    max_wait_s: float = Field(default=20.0, gt=0)
    # How often PodGroup status (phase, scheduled, running) is written back when it changed.
    status_interval_s: float = Field(default=2.0, gt=0)


class QuotaSettings(_Group):
    # How often each ElasticQuota's status.used is written back, at most, when it changed.
    status_interval_s: float = Field(default=10.0, gt=0)


class PreemptionSettings(_Group):
    # protect: gang members are never victims; whole-group: a gang is evicted whole on a node
    # and its members elsewhere count as PDB violations (see extender.preemption).
    gang_victims: Literal["protect", "whole-group"] = "protect"
    # When kube-scheduler offers a preemptor the node whose victims preempt approved while
    # schedext's watch still shows them, filter waits up to this long for the watch to catch
    # up (kube-scheduler has seen them go); 0 never waits. See extender.evictions.
    victim_wait_s: float = Field(default=1.0, ge=0, le=10)
    # How long an approval of victims is remembered for that (the victims' termination
    # grace period included).
    victim_memory_s: float = Field(default=120.0, gt=0)


class IPSettings(_Group):
    # How often sticky IPClaims of vanished StatefulSet identities are looked for (each is
    # re-checked against the API server before it is deleted).
    claim_release_interval_s: float = Field(default=30.0, gt=0)


class LeaderSettings(_Group):
    """Leader election on a coordination.k8s.io Lease (several replicas, one active)."""

    enabled: bool = False
    lease_name: str = "schedext"
    # Default: the pod's own namespace (POD_NAMESPACE from the downward API), else "default".
    namespace: str = ""
    # Default: the host name plus a random suffix, unique per process.
    identity: str = ""
    lease_duration_s: float = Field(default=15.0, gt=0)
    renew_deadline_s: float = Field(default=5.0, gt=0)
    retry_period_s: float = Field(default=2.0, gt=0)
    # This replica's own pod, which carries the label schedext.io/role=leader while it leads
    # (the Service selects that label; see app.kube.role). Default: POD_NAME and
    # POD_NAMESPACE from the downward API; without a pod name no pod is labelled.
    pod_name: str = ""
    pod_namespace: str = ""
    # How often the pod is read again to put a label edited by hand right.
    label_resync_s: float = Field(default=30.0, gt=0)

    def lease_namespace(self) -> str:
        return self.namespace or os.environ.get("POD_NAMESPACE", "") or "default"

    def own_pod(self) -> tuple[str, str] | None:
        """(namespace, name) of the pod this replica runs in, when known."""
        name = self.pod_name or os.environ.get("POD_NAME", "")
        if not name:
            return None
        namespace = self.pod_namespace or os.environ.get("POD_NAMESPACE", "")
        return namespace or self.lease_namespace(), name

    def holder_identity(self) -> str:
        return self.identity or f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="SCHEDEXT_", env_nested_delimiter="__", extra="forbid", frozen=True
    )

    server: ServerSettings = ServerSettings()
    policy: PolicySettings = PolicySettings()
    bind: BindSettings = BindSettings()
    gang: GangSettings = GangSettings()
    ip: IPSettings = IPSettings()
    quota: QuotaSettings = QuotaSettings()
    preemption: PreemptionSettings = PreemptionSettings()
    leader: LeaderSettings = LeaderSettings()
    snapshot: Path | None = None
    kubeconfig: Path | None = None
    log_level: Literal["debug", "info", "warning", "error"] = "info"

    @model_validator(mode="after")
    def _bind_fits_in_the_extender_timeout(self) -> Settings:
        """A bind waits at most gang.max_wait_s at the barrier, then spends at most
        bind.api_deadline_s on the API server (everything it writes runs under that one
        deadline), then answers."""
        budget = self.gang.max_wait_s + self.bind.api_deadline_s + BIND_ANSWER_MARGIN_S
        if budget > self.bind.extender_http_timeout_s:
            raise ValueError(
                f"gang.max_wait_s ({self.gang.max_wait_s:g}) + bind.api_deadline_s "
                f"({self.bind.api_deadline_s:g}) + {BIND_ANSWER_MARGIN_S:g}s to answer must "
                f"not exceed bind.extender_http_timeout_s "
                f"({self.bind.extender_http_timeout_s:g}), kube-scheduler's extender "
                "httpTimeout: kube-scheduler would give up on binds that still go through"
            )
        return self

    @model_validator(mode="after")
    def _one_leader_binds_at_a_time(self) -> Settings:
        """A leader that stops renewing may still be finishing a bind; the next one must not
        take over before that bind has ended (see app.kube.leader)."""
        leader = self.leader
        if not leader.enabled:
            return self
        if leader.renew_deadline_s + self.bind.api_deadline_s >= leader.lease_duration_s:
            raise ValueError(
                f"leader.renew_deadline_s ({leader.renew_deadline_s:g}) + bind.api_deadline_s "
                f"({self.bind.api_deadline_s:g}) must stay below leader.lease_duration_s "
                f"({leader.lease_duration_s:g})"
            )
        if leader.retry_period_s >= leader.renew_deadline_s:
            raise ValueError("leader.retry_period_s must be shorter than leader.renew_deadline_s")
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,  # noqa: ARG003 (no .env files)
        file_secret_settings: PydanticBaseSettingsSource,  # noqa: ARG003 (no secrets dir)
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return init_settings, env_settings, YamlConfigSettingsSource(settings_cls)


def load_settings(config_file: Path | None = None, **overrides: Any) -> Settings:
    """Settings from the environment and an optional YAML file; ``overrides`` (CLI flags,
    nested as dicts) win over both."""
    if config_file is None:
        return Settings(**overrides)
    if not config_file.is_file():
        raise FileNotFoundError(f"config file not found: {config_file}")
    from_file = type(
        "Settings",
        (Settings,),
        {"model_config": {**Settings.model_config, "yaml_file": str(config_file)}},
    )
    settings: Settings = from_file(**overrides)
    return settings
