"""A real, loopback-only Kubernetes control plane for end-to-end tests.

etcd, kube-apiserver and kube-scheduler are the unmodified upstream binaries that
``tests/e2e/controlplane/build.sh`` compiles from Go modules (cached outside the repo).
There is no kubelet and no kube-controller-manager: tests create Nodes as API objects
(with status) and a bound pod stays ``Pending`` with ``spec.nodeName`` set, which is all a
scheduler extender test needs to observe.

Typical use::

    with ControlPlane(find_binaries()) as cp:
        cp.start_scheduler(SCHEDULER_CONFIG)   # text with a {{KUBECONFIG}} placeholder
        cp.api.create_node("n1", gpus=8)
        cp.api.create_pod("default", pod_manifest("p", requests={"cpu": "100m"}))
        assert cp.api.wait_pod_bound("default", "p") == "n1"
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import ctypes
import datetime as dt
import functools
import ipaddress
import json
import os
import re
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

T = TypeVar("T")
JSON = dict[str, Any]

BUILD_SCRIPT = Path(__file__).resolve().parent / "controlplane" / "build.sh"
BIN_ENV = "SCHEDEXT_K8S_BIN"
KEEP_ENV = "SCHEDEXT_E2E_KEEP_WORKDIR"
COMPONENTS = ("etcd", "kube-apiserver", "kube-scheduler")
KUBECONFIG_PLACEHOLDER = "{{KUBECONFIG}}"
SERVICE_CLUSTER_IP_RANGE = "10.0.0.0/24"
APISERVER_SANS = (
    "127.0.0.1",
    "localhost",
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "10.0.0.1",  # first IP of SERVICE_CLUSTER_IP_RANGE: the `kubernetes` Service
)
STOP_GRACE_SECONDS = 10.0
KILL_WAIT_SECONDS = 10.0


class ComponentError(RuntimeError):
    """A control-plane process exited early or never became ready."""


class ApiError(RuntimeError):
    """kube-apiserver answered with a non-2xx status."""

    def __init__(self, method: str, path: str, status: int, body: str) -> None:
        super().__init__(f"{method} {path} -> HTTP {status}: {body[:2000]}")
        self.status = status
        self.body = body

    def json(self) -> JSON:
        """The Status object kube-apiserver sent, or {} if the body was not JSON."""
        try:
            parsed = json.loads(self.body)
        except ValueError:
            return {}
        return parsed if isinstance(parsed, dict) else {}


# ---------------------------------------------------------------------------------------------
# Polling
# ---------------------------------------------------------------------------------------------


def wait_for(
    predicate: Callable[[], T],
    timeout: float = 30.0,
    interval: float = 0.2,
    message: str = "condition not met",
    *,
    retry_on: tuple[type[BaseException], ...] = (httpx.TransportError,),
) -> T:
    """Poll ``predicate`` until it returns a truthy value, and return that value.

    Exceptions of the ``retry_on`` types count as "not yet" (e.g. the apiserver restarting).
    On timeout raises AssertionError with ``message`` and the last value or exception seen.
    """
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        try:
            value = predicate()
        except retry_on as exc:
            last = exc
        else:
            if value:
                return value
            last = value
        if time.monotonic() >= deadline:
            raise AssertionError(f"{message} (waited {timeout:g}s; last observed: {last!r})")
        time.sleep(interval)


# ---------------------------------------------------------------------------------------------
# PKI
# ---------------------------------------------------------------------------------------------


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _write_private(path: Path, data: bytes) -> None:
    path.write_bytes(data)
    path.chmod(0o600)


def _pem_key(key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _general_names(sans: Sequence[str]) -> list[x509.GeneralName]:
    names: list[x509.GeneralName] = []
    for san in sans:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(san)))
        except ValueError:
            names.append(x509.DNSName(san))
    return names


@dataclass(frozen=True)
class CertAuthority:
    """A throwaway CA that writes PEM files into ``directory``.

    Keys are ECDSA P-256: quick to generate and accepted by Go, OpenSSL and Python's ssl.
    """

    directory: Path
    cert_path: Path
    key_path: Path
    _cert: x509.Certificate = field(repr=False)
    _key: ec.EllipticCurvePrivateKey = field(repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    @classmethod
    def create(
        cls, directory: Path, name: str = "schedext-test-ca", *, valid_days: int = 7
    ) -> CertAuthority:
        directory.mkdir(parents=True, exist_ok=True)
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = _now()
        cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(hours=1))  # tolerate small clock skew
            .not_valid_after(now + dt.timedelta(days=valid_days))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
            .sign(key, hashes.SHA256())
        )
        stem = _file_stem(name)
        cert_path, key_path = directory / f"{stem}.crt", directory / f"{stem}.key"
        cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        _write_private(key_path, _pem_key(key))
        return cls(directory, cert_path, key_path, cert, key)

    def issue_cert(
        self,
        common_name: str,
        *,
        sans: Sequence[str] = (),
        client: bool = False,
        server: bool = True,
        organizations: Sequence[str] = (),
        valid_days: int = 7,
    ) -> tuple[Path, Path]:
        """Issue a leaf certificate; return ``(cert_path, key_path)``.

        ``sans`` entries that parse as IP addresses become IP SANs, the rest DNS SANs.
        ``organizations`` become O= entries (Kubernetes reads them as groups for client certs).
        """
        if not (client or server):
            raise ValueError("a certificate must allow client and/or server auth")
        key = ec.generate_private_key(ec.SECP256R1())
        attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, org) for org in organizations]
        attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
        usages = [ExtendedKeyUsageOID.SERVER_AUTH] if server else []
        usages += [ExtendedKeyUsageOID.CLIENT_AUTH] if client else []
        now = _now()
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name(attrs))
            .issuer_name(self._cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(hours=1))
            .not_valid_after(now + dt.timedelta(days=valid_days))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=False,
                    crl_sign=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self._key.public_key()), False
            )
        )
        if sans:
            builder = builder.add_extension(
                x509.SubjectAlternativeName(_general_names(sans)), critical=False
            )
        cert = builder.sign(self._key, hashes.SHA256())
        cert_path, key_path = self._unique_paths(_file_stem(common_name))
        cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        _write_private(key_path, _pem_key(key))
        return cert_path, key_path

    def _unique_paths(self, stem: str) -> tuple[Path, Path]:
        # Two certs for the same CN (e.g. server and client) must not overwrite each other.
        with self._lock:
            for i in range(1000):
                name = stem if i == 0 else f"{stem}-{i}"
                crt, key = self.directory / f"{name}.crt", self.directory / f"{name}.key"
                if not crt.exists():
                    crt.touch()
                    return crt, key
        raise RuntimeError(f"too many certificates named {stem!r} in {self.directory}")


def _file_stem(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("._") or "cert"


@dataclass(frozen=True)
class ClusterPki:
    """Everything kube-apiserver needs for TLS, service accounts and a static admin token."""

    directory: Path
    ca: CertAuthority
    apiserver_cert: Path
    apiserver_key: Path
    sa_private_key: Path
    sa_public_key: Path
    token_file: Path
    admin_token: str = field(repr=False)

    @classmethod
    def generate(cls, directory: Path) -> ClusterPki:
        directory.mkdir(parents=True, exist_ok=True)
        ca = CertAuthority.create(directory, "schedext-cluster-ca")
        apiserver_cert, apiserver_key = ca.issue_cert(
            "kube-apiserver", sans=APISERVER_SANS, server=True
        )
        # Service-account tokens are signed with RSA (RS256 is what every client expects).
        sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        sa_private, sa_public = directory / "sa.key", directory / "sa.pub"
        _write_private(sa_private, _pem_key(sa_key))
        sa_public.write_bytes(
            sa_key.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )
        # Static token file: token,user,uid,"group". system:masters bypasses RBAC, so the token
        # works even before the RBAC bootstrap roles exist.
        token = secrets.token_hex(16)
        token_file = directory / "tokens.csv"
        _write_private(
            token_file, f'{token},schedext-admin,schedext-admin,"system:masters"\n'.encode()
        )
        return cls(
            directory, ca, apiserver_cert, apiserver_key, sa_private, sa_public, token_file, token
        )


# ---------------------------------------------------------------------------------------------
# Binaries
# ---------------------------------------------------------------------------------------------


def _check_bin_dir(bin_dir: Path) -> Path:
    missing = [c for c in COMPONENTS if not os.access(bin_dir / c, os.X_OK)]
    if missing:
        raise FileNotFoundError(f"{bin_dir} lacks executables: {', '.join(missing)}")
    return bin_dir


@functools.cache
def find_binaries() -> Path:
    """Directory holding etcd, kube-apiserver and kube-scheduler.

    ``$SCHEDEXT_K8S_BIN`` points at prebuilt binaries; otherwise run build.sh, which is a quick
    no-op once its cache is complete (a cold build takes minutes).
    """
    override = os.environ.get(BIN_ENV)
    if override:
        return _check_bin_dir(Path(override))
    proc = subprocess.run(  # stderr is inherited so build progress stays visible
        ["bash", str(BUILD_SCRIPT)], stdout=subprocess.PIPE, text=True, check=False
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{BUILD_SCRIPT} failed with exit code {proc.returncode}")
    lines = proc.stdout.strip().splitlines()
    if not lines:
        raise RuntimeError(f"{BUILD_SCRIPT} printed no bin directory")
    return _check_bin_dir(Path(lines[-1]))


# ---------------------------------------------------------------------------------------------
# Processes
# ---------------------------------------------------------------------------------------------


def free_ports(count: int) -> list[int]:
    """``count`` distinct loopback TCP ports that were free a moment ago."""
    # Keep every socket bound until all are chosen, so the kernel cannot hand out one twice.
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(count)]
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return [int(sock.getsockname()[1]) for sock in socks]


def free_port() -> int:
    """A loopback TCP port that was free a moment ago."""
    return free_ports(1)[0]


# Looked up in the parent: the child may only make the call between fork and exec.
_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform == "linux" else None
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    # Runs in the child between fork and exec: ask Linux to SIGKILL it if the test process dies
    # without tearing down (e.g. CI kills pytest), so no etcd/apiserver outlives the run.
    if _LIBC is not None:
        _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


class _Component:
    """One child process in its own process group, logging to a file."""

    def __init__(self, name: str, log_path: Path) -> None:
        self.name = name
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, argv: Sequence[str], env: Mapping[str, str]) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            log.write(f"\n===== {time.strftime('%H:%M:%S')} {' '.join(argv)}\n".encode())
            log.flush()
            # PDEATHSIG fires when the *thread* that forked exits: only use it from the main one.
            in_main = threading.current_thread() is threading.main_thread()
            self.proc = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=dict(env),
                start_new_session=True,  # own process group: stop() kills the whole group
                preexec_fn=_die_with_parent if in_main else None,  # noqa: PLW1509
            )

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def check_alive(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            raise ComponentError(
                f"{self.name} exited with code {self.proc.returncode}; "
                f"log tail ({self.log_path}):\n{self.tail(60)}"
            )

    def stop(self, grace: float = STOP_GRACE_SECONDS) -> None:
        """SIGTERM the process group, SIGKILL it after ``grace`` seconds (at once if 0)."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        steps = [(signal.SIGKILL, KILL_WAIT_SECONDS)]
        if grace > 0:
            steps.insert(0, (signal.SIGTERM, grace))
        for sig, wait in steps:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, sig)  # pgid == pid because of start_new_session
            try:
                proc.wait(wait)
            except subprocess.TimeoutExpired:
                continue
            break
        else:
            raise ComponentError(f"{self.name} (pid {proc.pid}) survived SIGKILL")

    def tail(self, lines: int = 200) -> str:
        try:
            data = self.log_path.read_bytes()
        except FileNotFoundError:
            return "<no log>"
        return "\n".join(data.decode(errors="replace").splitlines()[-lines:])


_LIVE: weakref.WeakSet[ControlPlane] = weakref.WeakSet()


@atexit.register
def _stop_leftovers() -> None:
    for cp in list(_LIVE):
        with contextlib.suppress(Exception):
            cp.stop()


# ---------------------------------------------------------------------------------------------
# REST helper
# ---------------------------------------------------------------------------------------------


def pod_manifest(
    name: str,
    *,
    requests: Mapping[str, str] | None = None,
    limits: Mapping[str, str] | None = None,
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    scheduler_name: str | None = None,
    priority_class: str | None = None,
    node_selector: Mapping[str, str] | None = None,
    image: str = "registry.invalid/pause:never-pulled",
) -> JSON:
    """A minimal single-container Pod. Nothing runs it (no kubelet), so the image is fake.

    terminationGracePeriodSeconds is 0 so that deleting the pod (also as a preemption victim)
    removes it at once instead of leaving it Terminating forever without a kubelet.
    """
    resources: JSON = {}
    if requests:
        resources["requests"] = dict(requests)
    if limits:
        resources["limits"] = dict(limits)
    spec: JSON = {
        "containers": [{"name": "main", "image": image, "resources": resources}],
        "terminationGracePeriodSeconds": 0,
    }
    if scheduler_name:
        spec["schedulerName"] = scheduler_name
    if priority_class:
        spec["priorityClassName"] = priority_class
    if node_selector:
        spec["nodeSelector"] = dict(node_selector)
    metadata: JSON = {"name": name}
    if labels:
        metadata["labels"] = dict(labels)
    if annotations:
        metadata["annotations"] = dict(annotations)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def statefulset_manifest(
    name: str,
    *,
    replicas: int,
    namespace: str | None = None,
    labels: Mapping[str, str] | None = None,
) -> JSON:
    """A StatefulSet object selecting ``app: name``. No controller runs here: tests create its
    pods themselves (with ownerReferences to it)."""
    metadata: JSON = {"name": name}
    if namespace:
        metadata["namespace"] = namespace
    if labels:
        metadata["labels"] = dict(labels)
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": metadata,
        "spec": {
            "replicas": replicas,
            "serviceName": name,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "main", "image": "registry.invalid/pause"}]},
            },
        },
    }


_RETRIES_ON_429 = 10


class KubeApi:
    """Small synchronous REST client for kube-apiserver: CA-verified TLS and a bearer token."""

    wait_for = staticmethod(wait_for)

    def __init__(self, server: str, token: str, ca_cert: Path, *, timeout: float = 10.0) -> None:
        # An SSLContext, not a CA path: httpx deprecates verify=<path>.
        context = ssl.create_default_context(cafile=str(ca_cert))
        self._client = httpx.Client(
            base_url=server,
            verify=context,
            headers={"Authorization": f"Bearer {token}", "Accept": "application/json"},
            timeout=timeout,
        )

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> KubeApi:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def apply_raw(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        params: Mapping[str, str] | None = None,
        content_type: str = "application/json",
    ) -> JSON:
        """Send any request; return the decoded JSON body ({} if empty). Non-2xx -> ApiError.

        For PATCH pass e.g. ``content_type="application/merge-patch+json"``.
        """
        content = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": content_type} if content is not None else {}
        # 429 with Retry-After is the API server asking to come back: right after a CRD is
        # created or changed its storage is "(re)initializing" for a moment. Retried a few
        # times, as client-go does; anything else is the caller's to judge.
        for _ in range(_RETRIES_ON_429):
            resp = self._client.request(
                method, path, content=content, headers=headers, params=dict(params or {})
            )
            if resp.status_code != 429:
                break
            time.sleep(min(float(resp.headers.get("Retry-After") or 1), 5.0))
        if resp.status_code >= 300:
            raise ApiError(method, path, resp.status_code, resp.text)
        if not resp.content:
            return {}
        decoded = resp.json()
        return decoded if isinstance(decoded, dict) else {"value": decoded}

    def get_text(self, path: str) -> str:
        """GET a non-JSON endpoint such as /readyz or /version."""
        resp = self._client.get(path, headers={"Accept": "*/*"})
        if resp.status_code >= 300:
            raise ApiError("GET", path, resp.status_code, resp.text)
        return resp.text

    # --- namespaces -----------------------------------------------------------------------

    def create_namespace(self, name: str, *, labels: Mapping[str, str] | None = None) -> JSON:
        metadata: JSON = {"name": name}
        if labels:
            metadata["labels"] = dict(labels)
        body = {"apiVersion": "v1", "kind": "Namespace", "metadata": metadata}
        return self.apply_raw("POST", "/api/v1/namespaces", body)

    # --- nodes ----------------------------------------------------------------------------

    def create_node(
        self,
        name: str,
        *,
        cpu: str = "8",
        memory: str = "32Gi",
        pods: str = "110",
        gpus: int = 0,
        gpu_resource: str = "nvidia.com/gpu",
        labels: Mapping[str, str] | None = None,
        annotations: Mapping[str, str] | None = None,
        taints: Sequence[Mapping[str, Any]] | None = None,
        extended: Mapping[str, str] | None = None,
    ) -> JSON:
        """Create a schedulable Node with its status in one POST (no kubelet will report it).
        ``extended``: more resources in its capacity and allocatable (what a device plugin or
        the node agent advertises).

        The node registry keeps status on create; later status changes need PUT .../status.
        """
        resources = {"cpu": cpu, "memory": memory, "pods": pods}
        if gpus:
            resources[gpu_resource] = str(gpus)
        resources.update(extended or {})
        now = _now().strftime("%Y-%m-%dT%H:%M:%SZ")
        metadata: JSON = {
            "name": name,
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                **(labels or {}),
            },
        }
        if annotations:
            metadata["annotations"] = dict(annotations)
        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": metadata,
            "spec": {"taints": [dict(t) for t in taints or []]},
            "status": {
                "capacity": resources,
                "allocatable": resources,
                "conditions": [
                    {
                        "type": "Ready",
                        "status": "True",
                        "reason": "KubeletReady",
                        "message": "fake node created by the e2e harness",
                        "lastHeartbeatTime": now,
                        "lastTransitionTime": now,
                    }
                ],
            },
        }
        return self.apply_raw("POST", "/api/v1/nodes", node)

    def get_node(self, name: str) -> JSON:
        return self.apply_raw("GET", f"/api/v1/nodes/{name}")

    def delete_node(self, name: str, *, missing_ok: bool = True) -> None:
        self._delete(f"/api/v1/nodes/{name}", missing_ok=missing_ok)

    # --- pods -----------------------------------------------------------------------------

    def create_pod(self, namespace: str, manifest: Mapping[str, Any]) -> JSON:
        pod = {"apiVersion": "v1", "kind": "Pod", **manifest}
        return self.apply_raw("POST", f"/api/v1/namespaces/{namespace}/pods", pod)

    def get_pod(self, namespace: str, name: str) -> JSON:
        return self.apply_raw("GET", f"/api/v1/namespaces/{namespace}/pods/{name}")

    def list_pods(self, namespace: str, label_selector: str | None = None) -> list[JSON]:
        params = {"labelSelector": label_selector} if label_selector else None
        items: list[JSON] = self.apply_raw(
            "GET", f"/api/v1/namespaces/{namespace}/pods", params=params
        ).get("items", [])
        return items

    def delete_pod(self, namespace: str, name: str, *, missing_ok: bool = True) -> None:
        """Delete immediately (grace 0): without a kubelet a graceful delete never completes."""
        self._delete(f"/api/v1/namespaces/{namespace}/pods/{name}", missing_ok=missing_ok)

    def events_for(self, namespace: str, pod_name: str) -> list[JSON]:
        """core/v1 Events about a pod (Scheduled, FailedScheduling, Preempted...), oldest first."""
        selector = f"involvedObject.kind=Pod,involvedObject.name={pod_name}"
        items: list[JSON] = self.apply_raw(
            "GET", f"/api/v1/namespaces/{namespace}/events", params={"fieldSelector": selector}
        ).get("items", [])

        def when(event: JSON) -> str:
            return str(
                event.get("lastTimestamp")
                or event.get("eventTime")
                or event.get("metadata", {}).get("creationTimestamp")
                or ""
            )

        return sorted(items, key=when)

    def wait_pod_bound(self, namespace: str, name: str, timeout: float = 30.0) -> str:
        """Wait until the scheduler bound the pod; return its spec.nodeName."""

        def node_name() -> str:
            return str(self.get_pod(namespace, name).get("spec", {}).get("nodeName") or "")

        try:
            return wait_for(node_name, timeout, 0.2, f"pod {namespace}/{name} not bound")
        except AssertionError as exc:
            # The scheduler's events say why (FailedScheduling: "0/3 nodes are available...").
            raise AssertionError(f"{exc}; events: {self._event_summary(namespace, name)}") from None

    def _event_summary(self, namespace: str, name: str) -> str:
        try:
            events = self.events_for(namespace, name)
        except (ApiError, httpx.HTTPError) as exc:
            return f"<events unavailable: {exc}>"
        return "; ".join(f"{e.get('reason')}: {e.get('message')}" for e in events[-5:])

    def _delete(self, path: str, *, missing_ok: bool) -> None:
        options = {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0}
        try:
            self.apply_raw("DELETE", path, options)
        except ApiError as exc:
            if not (missing_ok and exc.status == 404):
                raise


# ---------------------------------------------------------------------------------------------
# Control plane
# ---------------------------------------------------------------------------------------------


class ControlPlane:
    """etcd + kube-apiserver (+ kube-scheduler on demand) on loopback, torn down on stop().

    Use as a context manager, or call start()/stop() (stop() is idempotent and safe to call
    after a failed start()).
    """

    def __init__(
        self,
        bin_dir: Path | None = None,
        work_dir: Path | None = None,
        *,
        apiserver_args: Sequence[str] = (),
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
        self.startup_timeout = startup_timeout
        self.timings: dict[str, float] = {}  # seconds each component took to become ready
        self._components = {
            c: _Component(c, self.work_dir / "logs" / f"{c}.log") for c in COMPONENTS
        }
        self._pki: ClusterPki | None = None
        self._api: KubeApi | None = None
        self.etcd_port = self.etcd_peer_port = self.apiserver_port = self.scheduler_port = 0

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
        return CertAuthority.create(self.work_dir / "pki" / _file_stem(name), name)

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

    def restart_apiserver(self, *, kill: bool = False, timeout: float | None = None) -> None:
        """Stop kube-apiserver and start it again on the same port against the same etcd.

        ``kill=True`` simulates a crash (SIGKILL) instead of a graceful SIGTERM shutdown.
        """
        self._components["kube-apiserver"].stop(grace=0.0 if kill else STOP_GRACE_SECONDS)
        self._start_apiserver(timeout)

    def stop(self) -> None:
        """Stop scheduler, apiserver, etcd (each by process group); always tries all three."""
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
        return "\n".join(
            f"----- {name} (last {lines} lines) -----\n{self.logs_tail(name, lines)}"
            for name in COMPONENTS
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
            *self.apiserver_args,
        ]

        def ready() -> bool:
            if self.api.get_text("/readyz") != "ok":
                return False
            self.api.apply_raw("GET", "/api/v1/namespaces/default")  # made by the apiserver
            return True

        self._launch("kube-apiserver", argv, ready, timeout or self.startup_timeout)

    def _https_ok(self, url: str) -> bool:
        context = ssl.create_default_context(cafile=str(self.ca_cert))
        resp = httpx.get(url, verify=context, timeout=2.0)
        return resp.status_code == 200 and resp.text == "ok"

    def _write_kubeconfig(self) -> None:
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
            "users": [{"name": "schedext-admin", "user": {"token": self.token}}],
            "contexts": [
                {
                    "name": "schedext-e2e",
                    "context": {"cluster": "schedext-e2e", "user": "schedext-admin"},
                }
            ],
            "current-context": "schedext-e2e",
        }
        # JSON is valid YAML, and both client-go and the Python client read it.
        _write_private(self.kubeconfig, json.dumps(config, indent=2).encode())
