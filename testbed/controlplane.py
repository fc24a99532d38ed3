"""A real, loopback-only Kubernetes control plane, for the end-to-end tests and the benchmarks
that need kube-scheduler and the API server as they are.

etcd, kube-apiserver, kube-scheduler and kube-controller-manager are the unmodified upstream
binaries that ``tests/e2e/controlplane/build.sh`` compiles from Go modules (cached outside the
repo). There is no kubelet: tests create Nodes as API objects (with status) and a bound pod stays
``Pending`` with ``spec.nodeName`` set, which is all a scheduler extender test needs to observe.
kube-controller-manager runs only when a test asks (``start_controller_manager``), with only the
controllers it names: the DRA tests need its resourceclaim controller, which makes the
ResourceClaims of a pod's ResourceClaimTemplates, and its garbage collector, which deletes them
with the pod.

Typical use::

    with ControlPlane(find_binaries()) as cp:
        cp.start_scheduler(SCHEDULER_CONFIG)   # text with a {{KUBECONFIG}} placeholder
        cp.api.create_node("n1", gpus=8)
        cp.api.create_pod("default", pod_manifest("p", requests={"cpu": "100m"}))
        assert cp.api.wait_pod_bound("default", "p") == "n1"

    # DRA: kube-controller-manager for the claims of ResourceClaimTemplates; DeviceTaintRule
    # (beta, off by default in v1.36) only when asked.
    with ControlPlane(find_binaries(), device_taint_rules=True) as cp:
        cp.start_controller_manager()   # DRA_CONTROLLERS
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import functools
import json
import os
import shutil
import ssl
import subprocess
import tempfile
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import httpx

from testbed.kubeapi import ApiError, KubeApi
from testbed.pki import CertAuthority, ClusterPki, file_stem, write_private
from testbed.processes import (
    STOP_GRACE_SECONDS,
    Component,
    ComponentError,
    free_port,
    free_ports,
)
from testbed.waiting import wait_for

# The build script stays beside the e2e tier (scripts/test, scripts/device-check and the docs
# run it by that path): a file this module runs, not a module it imports.
BUILD_SCRIPT = Path(__file__).resolve().parents[1] / "tests" / "e2e" / "controlplane" / "build.sh"
BIN_ENV = "SCHEDEXT_K8S_BIN"
KEEP_ENV = "SCHEDEXT_E2E_KEEP_WORKDIR"
KUBE_CONTROLLER_MANAGER = "kube-controller-manager"
COMPONENTS = ("etcd", "kube-apiserver", "kube-scheduler", KUBE_CONTROLLER_MANAGER)
# Every control plane needs these three. kube-controller-manager only where a test starts it:
# a bin dir built before it joined (or the device machine's pack, which leaves it out) lacks it.
REQUIRED_BINARIES = ("etcd", "kube-apiserver", "kube-scheduler")
# kube-controller-manager's controllers (--controllers names, v1.36). The resourceclaim
# controller creates a pod's ResourceClaims from its ResourceClaimTemplates, reserves nothing
# (kube-scheduler does), and when the pod is gone drops it from status.reservedFor, deallocates
# the claim and removes its finalizer; deleting the claim object itself (an ownerReference to
# the pod) is the garbage collector's.
RESOURCECLAIM_CONTROLLER = "resourceclaim-controller"
GARBAGE_COLLECTOR = "garbage-collector-controller"
DRA_CONTROLLERS = (RESOURCECLAIM_CONTROLLER, GARBAGE_COLLECTOR)
# DeviceTaintRule is served only as resource.k8s.io/v1beta2 in v1.36, a beta API version that
# is off by default, and its feature gate DRADeviceTaintRules is beta and off by default too.
DEVICE_TAINT_RULES_GATES: Mapping[str, bool] = {"DRADeviceTaintRules": True}
DEVICE_TAINT_RULES_API: Mapping[str, bool] = {"resource.k8s.io/v1beta2": True}
KUBECONFIG_PLACEHOLDER = "{{KUBECONFIG}}"
SERVICE_CLUSTER_IP_RANGE = "10.0.0.0/24"


def _check_bin_dir(bin_dir: Path) -> Path:
    missing = [c for c in REQUIRED_BINARIES if not os.access(bin_dir / c, os.X_OK)]
    if missing:
        raise FileNotFoundError(f"{bin_dir} lacks executables: {', '.join(missing)}")
    return bin_dir


@functools.cache
def find_binaries() -> Path:
    """Directory holding etcd, kube-apiserver and kube-scheduler (and kube-controller-manager,
    which only start_controller_manager() requires).

    ``$SCHEDEXT_K8S_BIN`` points at prebuilt binaries; otherwise run build.sh, which is a quick
    no-op once its cache is complete (a cold build takes minutes).
    """
    override = os.environ.get(BIN_ENV)
    if override:
        return _check_bin_dir(Path(override))
    # Our own script, by its path in this tree; stderr is inherited so build progress shows.
    proc = subprocess.run(  # noqa: S603
        ["bash", str(BUILD_SCRIPT)],  # noqa: S607 (bash from PATH, as scripts/test runs it)
        stdout=subprocess.PIPE,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{BUILD_SCRIPT} failed with exit code {proc.returncode}")
    lines = proc.stdout.strip().splitlines()
    if not lines:
        raise RuntimeError(f"{BUILD_SCRIPT} printed no bin directory")
    return _check_bin_dir(Path(lines[-1]))


_LIVE: weakref.WeakSet[ControlPlane] = weakref.WeakSet()


@atexit.register
def _stop_leftovers() -> None:
    for cp in list(_LIVE):
        with contextlib.suppress(Exception):
            cp.stop()


class ControlPlane:
    """etcd + kube-apiserver (+ kube-scheduler and kube-controller-manager on demand) on
    loopback, torn down on stop().

    Use as a context manager, or call start()/stop() (stop() is idempotent and safe to call
    after a failed start()).

    ``feature_gates`` go to kube-apiserver, kube-scheduler and kube-controller-manager alike
    (``--feature-gates``), ``runtime_config`` to kube-apiserver (``--runtime-config``, API
    versions such as ``resource.k8s.io/v1beta2``). ``device_taint_rules=True`` adds both that
    DeviceTaintRule needs (DEVICE_TAINT_RULES_GATES, DEVICE_TAINT_RULES_API). The default
    passes neither flag: resource.k8s.io/v1 (DRA, GA and locked on since v1.35) is served
    anyway, and so are the beta gates that are on by default (DRAExtendedResource among them).
    """

    def __init__(
        self,
        bin_dir: Path | None = None,
        work_dir: Path | None = None,
        *,
        apiserver_args: Sequence[str] = (),
        feature_gates: Mapping[str, bool] | None = None,
        runtime_config: Mapping[str, bool] | None = None,
        device_taint_rules: bool = False,
        startup_timeout: float = 120.0,
        keep_work_dir: bool | None = None,
    ) -> None:
        self.bin_dir = _check_bin_dir(bin_dir or find_binaries())
        self._owns_work_dir = work_dir is None
        self.work_dir = Path(work_dir or tempfile.mkdtemp(prefix="schedext-cp-")).resolve()
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.keep_work_dir = (
            keep_work_dir if keep_work_dir is not None else bool(os.environ.get(KEEP_ENV))
        )
        self.apiserver_args = list(apiserver_args)
        self.feature_gates = dict(feature_gates or {})
        self.runtime_config = dict(runtime_config or {})
        if device_taint_rules:
            self.feature_gates.update(DEVICE_TAINT_RULES_GATES)
            self.runtime_config.update(DEVICE_TAINT_RULES_API)
        self.startup_timeout = startup_timeout
        self.timings: dict[str, float] = {}  # seconds each component took to become ready
        self._components = {
            c: Component(c, self.work_dir / "logs" / f"{c}.log") for c in COMPONENTS
        }
        self._pki: ClusterPki | None = None
        self._api: KubeApi | None = None
        self.etcd_port = self.etcd_peer_port = self.apiserver_port = self.scheduler_port = 0
        self.controller_manager_port = 0

    # --- public properties ----------------------------------------------------------------

    @property
    def pki(self) -> ClusterPki:
        if self._pki is None:
            raise RuntimeError("control plane not started")
        return self._pki

    @property
    def api(self) -> KubeApi:
        if self._api is None:
            raise RuntimeError("control plane not started")
        return self._api

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.apiserver_port}"

    @property
    def etcd_url(self) -> str:
        return f"http://127.0.0.1:{self.etcd_port}"

    @property
    def token(self) -> str:
        return self.pki.admin_token

    @property
    def ca_cert(self) -> Path:
        return self.pki.ca.cert_path

    @property
    def kubeconfig(self) -> Path:
        return self.work_dir / "admin.kubeconfig"

    def issue_cert(
        self,
        common_name: str,
        *,
        sans: Sequence[str] = (),
        client: bool = False,
        server: bool = True,
        organizations: Sequence[str] = (),
    ) -> tuple[Path, Path]:
        """Issue a cert from the cluster CA (``self.ca_cert``); see CertAuthority.issue_cert."""
        return self.pki.ca.issue_cert(
            common_name, sans=sans, client=client, server=server, organizations=organizations
        )

    def new_ca(self, name: str) -> CertAuthority:
        """A separate CA (e.g. for mTLS between kube-scheduler and the extender)."""
        return CertAuthority.create(self.work_dir / "pki" / file_stem(name), name)

    # --- lifecycle ------------------------------------------------------------------------

    def __enter__(self) -> ControlPlane:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> ControlPlane:
        """Start etcd and kube-apiserver; return once /readyz is ok and `default` exists."""
        _LIVE.add(self)
        try:
            self._pki = ClusterPki.generate(self.work_dir / "pki")
            self._start_etcd()
            self.apiserver_port = free_port()
            self._api = KubeApi(self.server, self.token, self.ca_cert)
            self._start_apiserver()
            self._write_kubeconfig()
        except BaseException:
            self.stop()
            raise
        return self

    def start_scheduler(
        self, config_yaml: str, *, extra_args: Sequence[str] = (), timeout: float = 60.0
    ) -> None:
        """Start kube-scheduler with the caller's KubeSchedulerConfiguration text.

        ``{{KUBECONFIG}}`` in the text is replaced by the admin kubeconfig path (use it for
        ``clientConnection.kubeconfig``); nothing else is filled in.
        """
        comp = self._components["kube-scheduler"]
        if comp.running:
            raise RuntimeError("kube-scheduler is already running; stop_scheduler() first")
        config = self.work_dir / "scheduler-config.yaml"
        config.write_text(config_yaml.replace(KUBECONFIG_PLACEHOLDER, str(self.kubeconfig)))
        # Serve with a cert from our CA so that the health check can verify it.
        cert, key = self.pki.ca.issue_cert("kube-scheduler", sans=("127.0.0.1", "localhost"))
        self.scheduler_port = free_port()
        argv = [
            str(self.bin_dir / "kube-scheduler"),
            f"--config={config}",
            f"--authentication-kubeconfig={self.kubeconfig}",
            f"--authorization-kubeconfig={self.kubeconfig}",
            "--bind-address=127.0.0.1",  # the default is 0.0.0.0
            f"--secure-port={self.scheduler_port}",
            f"--tls-cert-file={cert}",
            f"--tls-private-key-file={key}",
            "--v=2",
            *self._feature_gate_args(),
            *extra_args,
        ]
        url = f"https://127.0.0.1:{self.scheduler_port}/healthz"
        self._launch("kube-scheduler", argv, lambda: self._https_ok(url), timeout)

    def stop_scheduler(self) -> None:
        self._components["kube-scheduler"].stop()

    @property
    def scheduler_running(self) -> bool:
        """Whether kube-scheduler was started and has not exited (it exits, for one, when
        it cannot renew its leader lease in time)."""
        return self._components["kube-scheduler"].running

    def scheduler_metrics(self) -> str:
        """kube-scheduler's /metrics text (the admin token passes its delegated authz)."""
        context = ssl.create_default_context(cafile=str(self.ca_cert))
        resp = httpx.get(
            f"https://127.0.0.1:{self.scheduler_port}/metrics",
            headers={"Authorization": f"Bearer {self.token}"},
            verify=context,
            timeout=5.0,
        )
        resp.raise_for_status()
        return resp.text

    def start_controller_manager(
        self,
        controllers: Sequence[str] = DRA_CONTROLLERS,
        *,
        extra_args: Sequence[str] = (),
        timeout: float = 60.0,
    ) -> None:
        """Start kube-controller-manager running only ``controllers`` (``--controllers``).

        It talks to kube-apiserver with a client certificate of its own (user
        ``system:kube-controller-manager``, group ``system:masters``): with
        ``--use-service-account-credentials=false`` every controller runs as that one user,
        and the bootstrap role of that name lacks what the controllers do (creating
        ResourceClaims, for one), while no serviceaccount-token controller runs to give each
        its own account. No cloud provider, no leader election; its secure port serves
        /healthz with a cert from the cluster CA, which is the readiness check.
        """
        comp = self._components[KUBE_CONTROLLER_MANAGER]
        if comp.running:
            raise RuntimeError(
                "kube-controller-manager is already running; stop_controller_manager() first"
            )
        if not controllers:
            raise ValueError("name at least one controller")
        binary = self.bin_dir / KUBE_CONTROLLER_MANAGER
        if not os.access(binary, os.X_OK):
            raise FileNotFoundError(
                f"{self.bin_dir} lacks kube-controller-manager (built before it joined the "
                f"control plane?): run {BUILD_SCRIPT} and use the bin dir it prints"
            )
        client_cert, client_key = self.pki.ca.issue_cert(
            "system:kube-controller-manager",
            client=True,
            server=False,
            organizations=("system:masters",),
        )
        kubeconfig = self.work_dir / "controller-manager.kubeconfig"
        self._write_kubeconfig_for(
            kubeconfig,
            "kube-controller-manager",
            {"client-certificate": str(client_cert), "client-key": str(client_key)},
        )
        cert, key = self.pki.ca.issue_cert(
            "kube-controller-manager", sans=("127.0.0.1", "localhost")
        )
        self.controller_manager_port = free_port()
        argv = [
            str(binary),
            f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            f"--controllers={','.join(controllers)}",
            "--use-service-account-credentials=false",
            "--leader-elect=false",
            "--bind-address=127.0.0.1",  # the default is 0.0.0.0
            f"--secure-port={self.controller_manager_port}",
            f"--tls-cert-file={cert}",
            f"--tls-private-key-file={key}",
            "--v=2",
            *self._feature_gate_args(),
            *extra_args,
        ]
        url = f"https://127.0.0.1:{self.controller_manager_port}/healthz"
        self._launch(KUBE_CONTROLLER_MANAGER, argv, lambda: self._https_ok(url), timeout)

    def stop_controller_manager(self) -> None:
        self._components[KUBE_CONTROLLER_MANAGER].stop()

    @property
    def controller_manager_running(self) -> bool:
        return self._components[KUBE_CONTROLLER_MANAGER].running

    def restart_apiserver(self, *, kill: bool = False, timeout: float | None = None) -> None:
        """Stop kube-apiserver and start it again on the same port against the same etcd.

        ``kill=True`` simulates a crash (SIGKILL) instead of a graceful SIGTERM shutdown.
        """
        self._components["kube-apiserver"].stop(grace=0.0 if kill else STOP_GRACE_SECONDS)
        self._start_apiserver(timeout)

    def stop(self) -> None:
        """Stop controller-manager, scheduler, apiserver, etcd (each by process group); always
        tries all of them."""
        errors: list[str] = []
        for name in reversed(COMPONENTS):
            try:
                self._components[name].stop()
            except Exception as exc:  # noqa: BLE001 - keep stopping the others
                errors.append(f"{name}: {exc}")
        if self._api is not None:
            self._api.close()
            self._api = None
        _LIVE.discard(self)
        if self._owns_work_dir and not self.keep_work_dir:
            shutil.rmtree(self.work_dir, ignore_errors=True)
        if errors:
            raise ComponentError("; ".join(errors))

    # --- logs -----------------------------------------------------------------------------

    def logs_tail(self, component: str, lines: int = 200) -> str:
        if component not in self._components:
            raise KeyError(f"unknown component {component!r}; known: {', '.join(COMPONENTS)}")
        return self._components[component].tail(lines)

    def dump_logs(self, lines: int = 200) -> str:
        """The tail of each component's log (kube-controller-manager's if it was started)."""
        return "\n".join(
            f"----- {name} (last {lines} lines) -----\n{self.logs_tail(name, lines)}"
            for name in COMPONENTS
            if name in REQUIRED_BINARIES or self._components[name].log_path.exists()
        )

    # --- internals ------------------------------------------------------------------------

    def _launch(
        self, name: str, argv: Sequence[str], ready: Callable[[], bool], timeout: float
    ) -> None:
        comp = self._components[name]
        # etcd reads ETCD_* and client-go KUBECONFIG etc.: the caller's environment must not leak
        # into the components' configuration.
        env = {k: v for k, v in os.environ.items() if not k.startswith(("ETCD_", "KUBE"))}
        started = time.monotonic()
        comp.start(argv, env)

        def check() -> bool:
            comp.check_alive()  # fail fast with the log instead of waiting for the deadline
            return ready()

        try:
            wait_for(
                check, timeout, 0.25, f"{name} not ready", retry_on=(httpx.HTTPError, ApiError)
            )
        except AssertionError as exc:
            raise ComponentError(f"{exc}\nlog tail ({comp.log_path}):\n{comp.tail(60)}") from None
        self.timings[name] = round(time.monotonic() - started, 2)

    def _start_etcd(self) -> None:
        self.etcd_port, self.etcd_peer_port = free_ports(2)
        peer = f"http://127.0.0.1:{self.etcd_peer_port}"
        data = self.work_dir / "etcd-data"
        data.mkdir(mode=0o700, exist_ok=True)
        argv = [
            str(self.bin_dir / "etcd"),
            "--name=schedext",
            f"--data-dir={data}",
            f"--listen-client-urls={self.etcd_url}",
            f"--advertise-client-urls={self.etcd_url}",
            f"--listen-peer-urls={peer}",  # the default peer listener is not loopback-only
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=schedext={peer}",
            "--unsafe-no-fsync",  # throwaway data: skip fsync, much faster on slow disks
            "--log-level=warn",
        ]

        def healthy() -> bool:
            resp = httpx.get(f"{self.etcd_url}/health", timeout=2.0)
            return resp.status_code == 200 and resp.json().get("health") == "true"

        self._launch("etcd", argv, healthy, self.startup_timeout)

    def _start_apiserver(self, timeout: float | None = None) -> None:
        pki = self.pki
        argv = [
            str(self.bin_dir / "kube-apiserver"),
            f"--etcd-servers={self.etcd_url}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={self.apiserver_port}",
            f"--tls-cert-file={pki.apiserver_cert}",
            f"--tls-private-key-file={pki.apiserver_key}",
            f"--client-ca-file={pki.ca.cert_path}",
            f"--token-auth-file={pki.token_file}",
            "--authorization-mode=RBAC",
            "--service-account-issuer=https://kubernetes.default.svc",
            f"--service-account-key-file={pki.sa_public_key}",
            f"--service-account-signing-key-file={pki.sa_private_key}",
            f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
            # A loopback advertise address is not a valid Endpoints IP for `kubernetes`.
            "--endpoint-reconciler-type=none",
            # No controller-manager: no `default` ServiceAccount, and nobody would remove the
            # not-ready taint that TaintNodesByCondition puts on new Nodes.
            "--disable-admission-plugins=ServiceAccount,TaintNodesByCondition",
            # Close watches on SIGTERM instead of waiting for them (up to --request-timeout,
            # 60s): without this a restart_apiserver() with a connected scheduler takes 10s+.
            "--shutdown-watch-termination-grace-period=2s",
            f"--cert-dir={self.work_dir / 'apiserver-certs'}",
            "--profiling=false",
            "--v=1",
            *self._feature_gate_args(),
            *(
                [f"--runtime-config={_flag_map(self.runtime_config)}"]
                if self.runtime_config
                else []
            ),
            *self.apiserver_args,
        ]

        def ready() -> bool:
            if self.api.get_text("/readyz") != "ok":
                return False
            self.api.apply_raw("GET", "/api/v1/namespaces/default")  # made by the apiserver
            return True

        self._launch("kube-apiserver", argv, ready, timeout or self.startup_timeout)

    def _feature_gate_args(self) -> list[str]:
        return [f"--feature-gates={_flag_map(self.feature_gates)}"] if self.feature_gates else []

    def _https_ok(self, url: str) -> bool:
        context = ssl.create_default_context(cafile=str(self.ca_cert))
        resp = httpx.get(url, verify=context, timeout=2.0)
        return resp.status_code == 200 and resp.text == "ok"

    def _write_kubeconfig(self) -> None:
        self._write_kubeconfig_for(self.kubeconfig, "schedext-admin", {"token": self.token})

    def _write_kubeconfig_for(self, path: Path, user: str, credentials: Mapping[str, str]) -> None:
        ca_data = base64.b64encode(self.ca_cert.read_bytes()).decode()
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "schedext-e2e",
                    "cluster": {"server": self.server, "certificate-authority-data": ca_data},
                }
            ],
            "users": [{"name": user, "user": dict(credentials)}],
            "contexts": [
                {"name": "schedext-e2e", "context": {"cluster": "schedext-e2e", "user": user}}
            ],
            "current-context": "schedext-e2e",
        }
        # JSON is valid YAML, and both client-go and the Python client read it.
        write_private(path, json.dumps(config, indent=2).encode())


def _flag_map(values: Mapping[str, bool]) -> str:
    """``{"A": True, "b/v1": False}`` as component flags take it: ``A=true,b/v1=false``."""
    return ",".join(f"{key}={str(value).lower()}" for key, value in sorted(values.items()))
