"""Settings: defaults < YAML config file < environment (``SCHEDEXT_...``) < CLI flags.

Nested groups use ``__`` in environment names, e.g. ``SCHEDEXT_POLICY__GPU_SCORING=spread``
or ``SCHEDEXT_SERVER__MAX_BODY_BYTES=4194304``. The pure core receives only the small frozen
:class:`extender.policy.PolicyConfig` built from the ``policy`` group.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import socket
import ssl
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from app.stdio import settings_sources as sources
from app.stdio.settings_sources import (
    Layers,
    Origin,
    SettingsError,
    read_environment,
    read_file,
)
from extender import names, scoring
from extender.config import (
    SHARE_PRESETS,
    DraConfig,
    GpuScoring,
    PolicyConfig,
    SharePlacement,
    ShareResources,
)
from extender.quantity import QuantityError, to_milli

__all__ = [
    "BIND_ANSWER_MARGIN_S",
    "REDACTED",
    "Settings",
    "SettingsError",
    "load_settings",
    "read_settings",
]

# What a bind needs beyond its barrier wait and API deadline: planning, the event loop's
# timers firing late, encoding the answer and its trip back to kube-scheduler.
BIND_ANSWER_MARGIN_S = 1.0


class _Group(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ServerSettings(_Group):
    """The listeners: the verbs' address and port, TLS, and the metrics and views ports."""

    host: str = Field(
        default="127.0.0.1",
        description="The address the verbs listen on. Keep `bind` on loopback (sidecar) unless "
        "you add mTLS: any other address needs `tls_client_ca_file`, or "
        "`insecure_allow_remote`.",
    )
    port: int = Field(
        default=8888,
        ge=0,
        le=65535,
        description="The port of the verbs, `/ui`, `/inventory`, `/explain`, `/metrics` and the "
        "health checks.",
    )
    path_prefix: str = Field(
        default="",
        description="Also serve the verbs under this prefix, at `<path_prefix>/<verb>`; they "
        "are always served at `/<verb>`.",
    )
    max_body_bytes: int = Field(
        default=8 * 1024 * 1024,
        ge=1024,
        description="The largest request body accepted; a larger one gets a specific error.",
    )
    body_timeout_s: float = Field(
        default=10.0,
        gt=0,
        description="A client that has not sent its whole body within this many seconds is cut "
        "off (slow-body defence).",
    )
    # kube-scheduler sends the request line and headers in one write; a client sending them a
    # byte at a time would otherwise hold its connection for ever.
    header_timeout_s: float = Field(
        default=10.0,
        gt=0,
        description="A request whose line and headers are not all in within this many seconds "
        "(counted from its first byte, or for a new connection from its opening) gets a 408, "
        "and the connection is closed.",
    )
    max_header_bytes: int = Field(
        default=64 * 1024,
        ge=1024,
        description="The largest request line and headers accepted, on every listener (the "
        "verbs', `metrics_port`, `views_port`): a larger head gets a 431, and the connection is "
        "closed.",
    )
    access_log: bool = Field(default=False, description="Log one line per HTTP request.")
    prioritize_full: bool = Field(
        default=False,
        description="prioritize's answer to a request without `?full`: false, the compact one "
        "kube-scheduler gets (the hosts above the lowest score, lowered by it); true, every "
        "host and the score schedext gives it, for callers that read the scores themselves "
        "(`?full=0` still answers the compact one).",
    )
    bench_endpoints: bool = Field(
        default=False,
        description="Add the constant-answer endpoint the latency benchmark compares against "
        "(`--bench-endpoints`).",
    )
    tls_cert_file: Path | None = Field(
        default=None,
        description="Serve HTTPS with this certificate chain (PEM); goes with `tls_key_file`.",
    )
    tls_key_file: Path | None = Field(
        default=None, description="The private key of `tls_cert_file` (PEM)."
    )
    tls_client_ca_file: Path | None = Field(
        default=None,
        description="Require every client to present a certificate signed by this CA (PEM), "
        "or the TLS handshake fails before any HTTP request is read: mTLS between "
        "kube-scheduler and schedext. Needs `tls_cert_file`.",
    )
    insecure_allow_remote: bool = Field(
        default=False,
        description="Allow a `host` other than loopback without client certificates. `bind` "
        "moves pods, so the verbs are otherwise reachable only over loopback or mTLS: anyone "
        "who can reach the port could bind pods. For demos only.",
    )
    # See app.service.metrics_listener.
    metrics_port: int | None = Field(
        default=None,
        ge=0,
        le=65535,
        description="A second listener, plain HTTP on every address, that serves only "
        "`/metrics` and `/healthz`, for Prometheus (9090 in the manifests). null: none.",
    )
    # See app.service.views_listener. A port apart from the metrics one, so that a NetworkPolicy can
    # let Prometheus scrape metrics without also letting it read pod names, and the API server
    # read the views without the metrics.
    views_port: int | None = Field(
        default=None,
        ge=0,
        le=65535,
        description="A third listener, plain HTTP on every address, that serves only the "
        "read-only views `/inventory`, `/explain/NAMESPACE/NAME` and `/healthz`: what "
        "`kubectl schedext` reads through the API server's service proxy (9091 in the "
        "manifests). null: none.",
    )

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
            f"refusing to listen on {self.host or 'every address'!r} (server.host) without client "
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
    """GPU shares: the resources pods ask for them with, and where they go."""

    preset: Literal["schedext", "gpushare", "hami"] = Field(
        default="schedext",
        description="The resources pods ask for shares with, as the scheduler a cluster moves "
        "from names them: `schedext` (`schedext.io/gpu-memory` in MiB, "
        "`schedext.io/gpu-cores`, `schedext.io/gpu-shares`), `gpushare` "
        "(`aliyun.com/gpu-mem` in GiB; no cores, no count: always one GPU) or `hami` "
        "(`nvidia.com/gpumem` in MiB, `nvidia.com/gpucores`, and `nvidia.com/gpu` counting "
        "shares in a pod that also asks for memory or cores). The keys below override it one "
        "by one.",
    )
    memory_resource: str | None = Field(
        default=None,
        description="The resource of a share's GPU memory, on each GPU it shares; null: the "
        "preset's.",
    )
    memory_unit: Literal["MiB", "GiB"] | None = Field(
        default=None, description="The unit of `memory_resource`; null: the preset's."
    )
    cores_resource: str | None = Field(
        default=None,
        description="The resource of a share's percent of each GPU's SMs; null: the preset's, "
        '"" for none.',
    )
    count_resource: str | None = Field(
        default=None,
        description="The resource that says on how many distinct GPUs a share is (the node "
        "agent's device-plugin handle); null: the preset's, \"\" for none (always one GPU).",
    )
    count_required: bool = Field(
        default=True,
        description="A share pod must name the count resource: the kubelet calls a device "
        "plugin only for the resources a pod asks for, so without it the agent never gives the "
        "pod its GPU, and a CUDA image would see every GPU of the node. false: a missing count "
        "means one GPU, for clusters that give shares their devices some other way.",
    )
    placement: Literal["pack", "spread"] = Field(
        default="pack",
        description="`pack`: a share goes on the fullest device that has room, so that whole "
        "devices stay free for whole-GPU pods; `spread`: on the emptiest.",
    )
    weight: int = Field(default=7, ge=0, description="The share scorer's share of the 0..10 score.")

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
    """What filter and prioritize decide by: the GPU resource, the scorers' weights, shortlist
    mode, and the pods sent back when what they wait for frees."""

    gpu_resource: str = Field(
        default=names.GPU_RESOURCE,
        description="The extended resource that counts whole GPUs, in pods and in node "
        "allocatable (for example `example.com/gpu`); the node agent's `resource_name` must "
        "match.",
    )
    cpu_intensive_min_cpu: str = Field(
        default="2000m",
        description="Pods labelled `workload-type: CPU-intensive` go only to nodes with at "
        "least this much allocatable CPU (a CPU quantity), and enough of it free.",
    )
    gpu_scoring: Literal["binpack", "spread"] = Field(
        default="binpack",
        description="How prioritize places GPU pods: `binpack` fills the fullest GPU node "
        "first, `spread` the emptiest.",
    )
    allocation_weight: int = Field(
        default=7,
        ge=0,
        description="The share of the 0..10 score that GPU allocation (binpack or spread, and "
        "MIG packing) gets.",
    )
    topology_weight: int = Field(
        default=3,
        ge=0,
        description='The share of the score that "the GPUs fit in one NVLink/NUMA group" gets.',
    )
    rack_weight: int = Field(
        default=10,
        ge=0,
        description="Gang members: the share of the score that the rack (or zone) of their "
        "group's placed members gets.",
    )
    ip_weight: int = Field(
        default=3,
        ge=0,
        description="Pods that ask for an address: the share of the score that the free share "
        "of the node's pool gets.",
    )
    weights: dict[str, int] = Field(
        default_factory=dict,
        description="Any scorer's weight by its name (`extender/scoring/`), over the knobs "
        "above: the one way to weigh a scorer that has no knob of its own, such as "
        "`{topology: 5, cpu_only: 0}` (`live_use` weighs 0 unless set here). In the "
        "environment, as JSON: `SCHEDEXT_POLICY__WEIGHTS='{\"live_use\": 2}'`.",
    )
    rack_label: str = Field(
        default=names.RACK_LABEL,
        description="The node label of a node's rack, where gang members prefer to join their "
        "group.",
    )
    zone_label: str = Field(
        default=names.ZONE_LABEL,
        description="The node label of a node's zone, gang members' choice after the rack.",
    )
    live_use_stale_s: float = Field(
        default=300.0,
        gt=0,
        description="The node agents' live-use samples (`schedext.io/gpu-use`) older than this "
        "many seconds are ignored by the `live_use` scorer.",
    )
    shares: ShareSettings = ShareSettings()
    shortlist: int = Field(
        default=1,
        ge=0,
        le=1000,
        description="Shortlist mode: filter answers only this many feasible nodes, the best by "
        "schedext's scorers, and the scheduler configuration registers no `prioritizeVerb` "
        "(one call per pod instead of two). 0: full mode, filter answers every feasible node "
        "and prioritize scores them (add `prioritizeVerb: prioritize`).",
    )
    shortlist_preferred: int = Field(
        default=8,
        ge=0,
        le=1000,
        description="The shortlist of a pod with soft preferences (preferred affinities, a "
        "`ScheduleAnyway` topology spread), for kube-scheduler's Score plugins to choose "
        "from; also how many nodes tied for the best a shortlist keeps. 0: as `shortlist`, "
        "and no tie kept.",
    )
    # kube-scheduler's own retry may have come before schedext's watch saw the freeing.
    topology_levels: list[str] = Field(
        default=[names.CLIQUE_LABEL, names.RACK_LABEL, names.SPINE_LABEL, names.ZONE_LABEL],
        min_length=1,
        description="A gang's topology levels, narrowest first: node label keys. A PodGroup "
        "names one in `schedext.io/topology-required` (every member in one domain of it, or "
        "none placed) or `schedext.io/topology-preferred`; Kueue's and KAI's annotations are "
        "read as aliases. A node without a level's label is a domain of its own "
        "(docs/gangs.md).",
    )
    requeue_per_event: int = Field(
        default=8,
        ge=1,
        le=1000,
        description="A pod filter turned away for GPUs, a share's memory or cores, a MIG "
        "device, an address or quota headroom is sent back to kube-scheduler (the "
        "`schedext.io/requeued-at` nudge) when schedext sees that freed: how many waiting pods "
        "one freeing sends back, the longest waiting first. A pod is sent back at most once a "
        "second; each is one pod patch.",
    )

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
            topology_levels=tuple(level.strip() for level in self.topology_levels),
        )

    @model_validator(mode="after")
    def _policy_is_valid(self) -> PolicySettings:
        """Build the core's config once now: what it refuses (an unknown scorer name, a
        resource name without a domain) is a settings error, reported as one at start."""
        config = self.config()
        try:
            scoring.weights(config)
        except ValueError as error:
            raise ValueError(f"{error} (policy.weights)") from None
        return self


class BindSettings(_Group):
    """bind: its reservations, and its budget on the API server."""

    reservation_ttl_s: float = Field(
        default=60.0,
        gt=0,
        description="GPUs (and an address) reserved by a bind that never completed are freed "
        "after this many seconds, unless the watch has shown the pod bound or gone first.",
    )
    pending_capacity: int = Field(
        default=10_000, ge=1, description="Pending pods remembered between filter and bind."
    )
    api_deadline_s: float = Field(
        default=8.0,
        gt=0,
        description="The API binder's whole budget in seconds: the sticky address claim, the "
        "Binding, its retries and the reads that explain a conflict, each call capped at what "
        "is left of it.",
    )
    api_attempts: int = Field(
        default=4,
        ge=1,
        description="How many times the Binding is posted at most, after a conflict or a "
        "transient error, within `api_deadline_s`.",
    )
    # A bind may wait at the gang barrier and then write to the API server: both, and a
    # moment to answer, must fit inside it, or kube-scheduler gives up on a bind that still
    # goes through.
    extender_http_timeout_s: float = Field(
        default=30.0,
        gt=0,
        description="kube-scheduler's extender `httpTimeout` "
        "(`manifests/scheduler-config.yaml`; the chart sets it from this). "
        "`gang.max_wait_s` + `api_deadline_s` + 1 s to answer must fit in it: schedext "
        "refuses to start otherwise.",
    )


class GangSettings(_Group):
    """Gangs (PodGroups): the wait at the bind barrier, and the status write-back."""

    default_timeout_s: float = Field(
        default=20.0,
        gt=0,
        description="How long members wait at the bind barrier when the PodGroup sets no "
        "`scheduleTimeoutSeconds`.",
    )
    max_wait_s: float = Field(
        default=20.0,
        gt=0,
        description="The cap on any group's wait at the barrier (+ `bind.api_deadline_s` + 1 s "
        "<= `bind.extender_http_timeout_s`).",
    )
    status_interval_s: float = Field(
        default=2.0,
        gt=0,
        description="How often a PodGroup's status (phase, scheduled, running) is written "
        "back, when it changed.",
    )
    hold_after_s: float = Field(
        default=120.0,
        ge=0,
        description="How long a gang waits for room, all its members there, before it may get "
        "a hold: the GPUs it would take are kept from pods of no higher priority outside it "
        "as they free (docs/gangs.md, Holds). 0: never.",
    )
    hold_max_s: float = Field(
        default=900.0,
        gt=0,
        description="How long a hold lasts at most; the gang then waits `hold_after_s` "
        "afresh before it may get another.",
    )


class QuotaSettings(_Group):
    """Team quotas (ElasticQuota)."""

    status_interval_s: float = Field(
        default=10.0,
        gt=0,
        description="How often each ElasticQuota's `status.used` is written back, at most, "
        "when it changed.",
    )


class DraSettings(_Group):
    """Dynamic Resource Allocation: whose devices are GPUs, and the fence (docs/dra.md)."""

    gpu_drivers: list[str] = Field(
        default=[names.DRA_GPU_DRIVER],
        min_length=1,
        description="The DRA drivers whose ResourceSlices and claims hold GPUs. A node with "
        "slices of one of them is DRA's (or mixed, if it also has the device plugin's "
        "`nvidia.com/gpu`).",
    )
    fence: bool = Field(
        default=False,
        description="On a mixed node, publish a DeviceTaintRule (NoSchedule) for each GPU "
        "schedext binds, so that DRA's allocator never picks it, and serve the node. Needs "
        "`resource.k8s.io/v1beta2` and the `DRADeviceTaintRules` gate (beta, off by default in "
        "v1.36) and the fence's RBAC (`manifests/rbac-dra-fence.yaml`; the chart adds it with "
        "this setting): schedext refuses to start without them. Off: a mixed node is refused "
        "to schedext's GPU pods.",
    )

    def config(self) -> DraConfig:
        return DraConfig(gpu_drivers=tuple(self.gpu_drivers), fence=self.fence)

    @model_validator(mode="after")
    def _dra_is_valid(self) -> DraSettings:
        """Build the core's config now: what it refuses is a settings error at start, and
        `schedext config --check` says so too."""
        self.config()
        return self


class PreemptionSettings(_Group):
    """preempt: gang victims, and filter's wait for approved victims to go."""

    # See extender.preemption.
    gang_victims: Literal["protect", "whole-group"] = Field(
        default="protect",
        description="`protect`: gang members are never victims; `whole-group`: a gang is "
        "evicted whole on a node, and its members elsewhere count as PDB violations.",
    )
    # See extender.evictions.
    victim_wait_s: float = Field(
        default=1.0,
        ge=0,
        le=10,
        description="When kube-scheduler offers a preemptor the node whose victims `preempt` "
        "approved while schedext's watch still shows them, filter waits up to this many "
        "seconds for the watch to catch up. 0: never (nor ever without a cluster).",
    )
    victim_memory_s: float = Field(
        default=120.0,
        gt=0,
        description="How long `preempt`'s approved victims are remembered for that, their "
        "termination grace period included.",
    )


class IPSettings(_Group):
    """Static IPs: the release of sticky claims."""

    claim_release_interval_s: float = Field(
        default=30.0,
        gt=0,
        description="How often the sticky IPClaims of vanished StatefulSet identities are "
        "looked for and released (each re-checked against the API server before it is "
        "deleted).",
    )


class LeaderSettings(_Group):
    """Leader election on a coordination.k8s.io Lease (several replicas, one active)."""

    enabled: bool = Field(
        default=False,
        description="Leader election (`--leader-elect`): every replica keeps its informers "
        "warm, and only the holder of the Lease answers the verbs and writes.",
    )
    lease_name: str = Field(default="schedext", description="The Lease's name.")
    namespace: str = Field(
        default="",
        description="The Lease's namespace. \"\": the pod's own (`POD_NAMESPACE` from the "
        "downward API), else `default`.",
    )
    identity: str = Field(
        default="",
        description='This replica\'s name in the Lease. "": the host name and a random suffix, '
        "unique per process.",
    )
    lease_duration_s: float = Field(
        default=15.0,
        gt=0,
        description="How long the Lease holds without renewal: a standby takes over once it "
        "has expired.",
    )
    # See app.kube.leader: a bind the old leader started may still write for up to
    # bind.api_deadline_s after it stopped renewing.
    renew_deadline_s: float = Field(
        default=5.0,
        gt=0,
        description="A leader that could not renew within this many seconds stops leading "
        "(+ `bind.api_deadline_s` < `lease_duration_s`).",
    )
    retry_period_s: float = Field(
        default=2.0,
        gt=0,
        description="Seconds between tries to take or renew the Lease (below `renew_deadline_s`).",
    )
    # The Service selects that label; see app.kube.role.
    pod_name: str = Field(
        default="",
        description="This replica's own pod, which carries the label "
        '`schedext.io/role=leader` while it leads. "": `POD_NAME` from the downward API; '
        "without a pod name no pod is labelled.",
    )
    pod_namespace: str = Field(
        default="",
        description="That pod's namespace. \"\": `POD_NAMESPACE`, else the Lease's.",
    )
    label_resync_s: float = Field(
        default=30.0,
        gt=0,
        description="How often the own pod is read again, to put a label edited by hand right.",
    )

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
    dra: DraSettings = DraSettings()
    snapshot: Path | None = Field(
        default=None,
        description="Serve the nodes and pods of this file instead of the demo: what `kubectl "
        "get nodes,pods -A -o json` (or `-o yaml`) prints, or a NodeList/PodList.",
    )
    kubeconfig: Path | None = Field(
        default=None,
        description="Watch the cluster of this kubeconfig. null: in a pod, its in-cluster "
        "credentials; elsewhere, without a snapshot either, the embedded demo inventory.",
    )
    log_level: Literal["debug", "info", "warning", "error"] = Field(
        default="info", description="The least severe log lines written (JSON, on stderr)."
    )

    def policy_config(self) -> PolicyConfig:
        """The core's config: the policy group's, with DRA's."""
        return dataclasses.replace(self.policy.config(), dra=self.dra.config())

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
        settings_cls: type[BaseSettings],  # noqa: ARG003 (the sources of pydantic-settings)
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,  # noqa: ARG003 (no .env files)
        file_secret_settings: PydanticBaseSettingsSource,  # noqa: ARG003 (no secrets dir)
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return init_settings, env_settings


# What `serve` never logs: the paths of private keys and credentials.
REDACTED = frozenset({"server.tls_key_file", "kubeconfig"})
# The environment of `schedext agent`, which `serve` leaves to it.
AGENT_PREFIX = "SCHEDEXT_AGENT_"


def read_settings(
    config_file: Path | None = None,
    overrides: Mapping[str, Any] | None = None,
    *,
    flags: Mapping[str, str] | None = None,
    environ: Mapping[str, str] | None = None,
) -> tuple[Settings, Layers]:
    """Settings from the file, the environment and ``overrides`` (CLI flags, nested as dicts;
    ``flags`` names the flag of each dotted key, for messages), and where each came from.
    Raises :class:`SettingsError`, one line per problem, each naming its source."""
    layers = Layers()
    if config_file is not None:
        layers.add(*read_file(config_file))
    config = Settings.model_config
    layers.add(
        *read_environment(
            Settings,
            os.environ if environ is None else environ,
            prefix=config["env_prefix"],
            delimiter=config["env_nested_delimiter"],
            ignore=(AGENT_PREFIX,),
        )
    )
    given = dict(overrides or {})
    named = flags or {}
    layers.add(
        given,
        {
            path: Origin(
                "flag",
                named.get(".".join(path), "a command-line flag"),
                whole=not isinstance(value, Mapping),
            )
            for path, value in _paths(given, ())
        },
    )
    return sources.load(Settings, layers), layers


def _paths(values: Mapping[str, Any], at: tuple[str, ...]) -> list[tuple[tuple[str, ...], Any]]:
    found: list[tuple[tuple[str, ...], Any]] = []
    for key, value in values.items():
        found.append(((*at, key), value))
        if isinstance(value, Mapping):
            found += _paths(value, (*at, key))
    return found


def load_settings(config_file: Path | None = None, **overrides: Any) -> Settings:
    """Settings from the environment and an optional YAML file; ``overrides`` (CLI flags,
    nested as dicts) win over both. Raises :class:`SettingsError` (a ValueError)."""
    return read_settings(config_file, overrides)[0]
