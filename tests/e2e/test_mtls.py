"""mTLS mode against the real kube-scheduler: schedext serves HTTPS and requires a client
certificate of its CA in the TLS handshake; kube-scheduler presents one (``tlsConfig`` of the
extender) and its pods are bound. A caller without a certificate, or with one from another CA,
never gets an HTTP request through. schedext as deploy-mtls.yaml runs it needs nothing but
the `schedext` ServiceAccount of rbac.yaml, and `schedext explain` reaches it with a client
certificate. And schedext refuses to listen beyond loopback unless client certificates are
required (or the operator opts out explicitly)."""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import shlex
import signal
import socket
import ssl
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from app.kube.role import LEADER, ROLE_LABEL
from testbed.controlplane import KUBECONFIG_PLACEHOLDER as KUBECONFIG
from testbed.controlplane import ControlPlane
from testbed.kubeapi import ApiError as HarnessApiError
from testbed.kubeapply import (
    SYSTEM_NAMESPACE,
    Kube,
    documents,
    pod_labels,
    service_account_kubeconfig,
    stand_in_pod,
)
from testbed.manifests import pod_manifest
from testbed.processes import free_port
from testbed.waiting import wait_for
from tests.e2e.conftest import (
    GPU,
    GROUP_LABEL,
    ROOT,
    SCHEDEXT,
    Cluster,
    Schedext,
    _reset,
    eventually,
    scheduler_config,
)
from tests.e2e.test_scheduling import H100

MTLS_MANIFEST = ROOT / "manifests" / "mtls" / "deploy-mtls.yaml"
SERVICE_NAME = "schedext.schedext-system.svc"  # the server name in deploy-mtls.yaml
FIXTURES = ROOT / "tests" / "fixtures"
BIND_COUNT = re.escape('schedext_request_duration_seconds_count{verb="bind"}')
NVLINK = [[0, 1, 2, 3], [4, 5, 6, 7]]
_namespaces = itertools.count(1)


# --- certificates ------------------------------------------------------------------------


@dataclass(frozen=True)
class Pki:
    ca_cert: Path
    server: tuple[Path, Path]  # schedext's certificate and key
    client: tuple[Path, Path]  # kube-scheduler's
    stranger: tuple[Path, Path]  # a client certificate from another CA

    def context(self, client: tuple[Path, Path] | None) -> ssl.SSLContext:
        """A client context that verifies schedext and presents ``client``, if any."""
        context = ssl.create_default_context(cafile=str(self.ca_cert))
        if client is not None:
            context.load_cert_chain(*client)
        return context


@pytest.fixture(scope="module")
def pki(control_plane: ControlPlane) -> Pki:
    ca = control_plane.new_ca("schedext-mtls-ca")
    # As deploy-mtls.yaml asks: the service name and (here) loopback, for "server auth", and
    # "client auth" too, because the pod's probes present schedext's own certificate.
    server = ca.issue_cert("schedext", sans=("127.0.0.1", SERVICE_NAME), server=True, client=True)
    client = ca.issue_cert("schedext-scheduler", client=True, server=False)
    other_ca = control_plane.new_ca("schedext-mtls-other-ca")
    stranger = other_ca.issue_cert("schedext-scheduler", client=True, server=False)
    return Pki(ca.cert_path, server, client, stranger)


# --- schedext over mTLS, and a cluster of our own ----------------------------------------


class TlsSchedext(Schedext):
    """conftest's ``schedext serve --kubeconfig`` process with the arguments of the schedext
    container in deploy-mtls.yaml (every address, HTTPS, client certificates required), only
    the port and the mounted Secret's files replaced; reached over mTLS."""

    def __init__(
        self, kubeconfig: Path, log_path: Path, pki: Pki, *, env: dict[str, str] | None = None
    ) -> None:
        super().__init__(kubeconfig, log_path, env=env)
        self.metrics_port, self.views_port = free_port(), free_port()
        self.extra_args = tuple(
            mtls_container_args(pki, self.port, self.metrics_port, self.views_port)
        )
        self.url = f"https://127.0.0.1:{self.port}"
        self.context = pki.context(pki.client)

    def _ready(self) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:
            raise AssertionError(f"schedext exited with {self.process.returncode}:\n{self.tail()}")
        try:
            answer = httpx.get(f"{self.url}/readyz", verify=self.context, timeout=2)
        except httpx.TransportError:
            return False
        return answer.status_code == 200

    def get(self, path: str) -> Any:
        return httpx.get(f"{self.url}{path}", verify=self.context, timeout=10).json()

    def bind_count(self) -> float:
        text = httpx.get(f"{self.url}/metrics", verify=self.context, timeout=10).text
        match = re.search(rf"^{BIND_COUNT} (\S+)$", text, re.M)
        return float(match.group(1)) if match else 0.0


@contextlib.contextmanager
def running_cluster(
    control_plane: ControlPlane,
    request: pytest.FixtureRequest,
    schedext: Schedext,
    scheduler_yaml: Callable[[Schedext], str],
    *,
    scheduler_args: tuple[str, ...] = (),
) -> Iterator[Cluster]:
    """What conftest's ``cluster`` fixture does, with a schedext and a KubeSchedulerConfiguration
    of the caller's: a clean cluster, a namespace, both started; logs shown on failure."""
    api = control_plane.api
    control_plane.stop_scheduler()
    _reset(api)
    namespace = f"e2e-{request.node.module.__name__.rsplit('_', 1)[-1]}-{next(_namespaces)}"
    api.create_namespace(namespace)
    ensure_namespace(control_plane, SYSTEM_NAMESPACE)  # the second scheduler's lease lives there
    env = Cluster(cp=control_plane, api=api, schedext=schedext, namespace=namespace)
    request.node.e2e_cluster = env  # conftest prints the logs of a failed test
    try:
        schedext.start()
        control_plane.start_scheduler(scheduler_yaml(schedext), extra_args=scheduler_args)
        yield env
    finally:
        control_plane.stop_scheduler()
        schedext.stop()
        _reset(api)


def mtls_schedext_container() -> dict[str, Any]:
    deployment = next(
        doc
        for doc in yaml.safe_load_all(MTLS_MANIFEST.read_text())
        if doc["kind"] == "Deployment" and doc["metadata"]["name"] == "schedext"
    )
    container: dict[str, Any] = deployment["spec"]["template"]["spec"]["containers"][0]
    return container


def mtls_container_args(pki: Pki, port: int, metrics_port: int, views_port: int) -> list[str]:
    """The schedext container's args in deploy-mtls.yaml, with these ports and files."""
    container = mtls_schedext_container()
    mount = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}["tls"]
    files = {
        f"{mount}/tls.crt": pki.server[0],
        f"{mount}/tls.key": pki.server[1],
        f"{mount}/ca.crt": pki.ca_cert,
    }
    args = []
    for arg in container["args"]:
        flag, equals, value = arg.partition("=")
        if not equals:
            args.append(flag)  # a switch such as --leader-elect
            continue
        ports = {"--port": port, "--metrics-port": metrics_port, "--views-port": views_port}
        value = str(ports[flag]) if flag in ports else str(files.pop(value, value))
        args.append(f"{flag}={value}")
    assert not files, f"deploy-mtls.yaml's schedext does not use {sorted(files)}"
    assert "--host=0.0.0.0" in args
    return args


def ensure_namespace(control_plane: ControlPlane, name: str) -> None:
    if not any(
        ns["metadata"]["name"] == name
        for ns in control_plane.api.apply_raw("GET", "/api/v1/namespaces")["items"]
    ):
        control_plane.api.create_namespace(name)


def embedded_scheduler_config(manifest: Path) -> dict[str, Any]:
    """The KubeSchedulerConfiguration in a manifest's ConfigMap."""
    for doc in yaml.safe_load_all(manifest.read_text()):
        if doc and doc["kind"] == "ConfigMap" and "scheduler-config.yaml" in doc["data"]:
            config: dict[str, Any] = yaml.safe_load(doc["data"]["scheduler-config.yaml"])
            return config
    raise AssertionError(f"{manifest.name} has no ConfigMap with scheduler-config.yaml")


# --- kube-scheduler configurations over mTLS ----------------------------------------------


def shipped_config_over_mtls(pki: Pki) -> Callable[[Schedext], str]:
    """manifests/scheduler-config.yaml, its extender reached over HTTPS with a client cert."""

    def render(schedext: Schedext) -> str:
        # The harness's placeholder is not YAML until quoted (it stays quoted when dumped).
        text = scheduler_config(schedext.url).replace(KUBECONFIG, f'"{KUBECONFIG}"')
        config = yaml.safe_load(text)
        extender = config["extenders"][0]
        assert extender["urlPrefix"].startswith("https://127.0.0.1:")
        extender["enableHTTPS"] = True
        extender["tlsConfig"] = {
            "certFile": str(pki.client[0]),
            "keyFile": str(pki.client[1]),
            "caFile": str(pki.ca_cert),
        }
        return yaml.safe_dump(config)

    return render


def mtls_manifest_config(pki: Pki) -> Callable[[Schedext], str]:
    """The ConfigMap of deploy-mtls.yaml, as is but for the addresses and file paths: the
    Service's port on loopback, the mounted Secret's files, the test kubeconfig."""

    def render(schedext: Schedext) -> str:
        config = embedded_scheduler_config(MTLS_MANIFEST)
        config["clientConnection"]["kubeconfig"] = KUBECONFIG
        extender = config["extenders"][0]
        assert extender["urlPrefix"] == f"https://{SERVICE_NAME}:8443"
        extender["urlPrefix"] = schedext.url
        tls = extender["tlsConfig"]
        # serverName stays: schedext's certificate must be valid for the Service's name.
        assert tls["serverName"] == SERVICE_NAME
        tls.update(certFile=str(pki.client[0]), keyFile=str(pki.client[1]), caFile=str(pki.ca_cert))
        return yaml.safe_dump(config)

    return render


@pytest.mark.parametrize("source", ["scheduler-config.yaml", "deploy-mtls.yaml"])
def test_kube_scheduler_binds_gpu_pods_through_schedext_over_mtls(
    control_plane: ControlPlane,
    pki: Pki,
    tmp_path: Path,
    request: pytest.FixtureRequest,
    source: str,
) -> None:
    # The shipped configuration serves the default profile; deploy-mtls.yaml's, the second
    # scheduler's.
    shipped = source == "scheduler-config.yaml"
    scheduler_name = None if shipped else "schedext-scheduler"
    render = (shipped_config_over_mtls if shipped else mtls_manifest_config)(pki)
    schedext = TlsSchedext(control_plane.kubeconfig, tmp_path / "schedext.log", pki)
    with running_cluster(control_plane, request, schedext, render) as cluster:
        cluster.node("cpu-1")
        cluster.node("h100-1", gpus=8, model=H100, memory_mib=81559, groups=NVLINK)
        manifest = pod_manifest(
            "trainer",
            requests={"cpu": "100m", GPU: "2"},
            limits={GPU: "2"},
            annotations={"schedext.io/gpu-model": "H100"},
            scheduler_name=scheduler_name,
        )
        cluster.api.create_pod(cluster.namespace, manifest)
        assert cluster.wait_bound("trainer", timeout=60) == "h100-1"
        ids = cluster.gpu_ids("trainer")
        assert len(ids) == 2
        assert any(set(ids) <= set(group) for group in NVLINK)  # within one NVLink group
        assert schedext.bind_count() == 1  # schedext bound it, over the mTLS connection


# --- the schedext ServiceAccount is all schedext needs ------------------------------------

RBAC = ROOT / "manifests" / "rbac.yaml"
OWN_POD = "schedext-6f7d9c8b5-k2x9p"  # as a Deployment names its pods
SYSTEM_LEASE = f"/apis/coordination.k8s.io/v1/namespaces/{SYSTEM_NAMESPACE}/leases/schedext"
RACK = "topology.kubernetes.io/rack"


def explain(schedext: TlsSchedext, pod: str, *tls: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "app.cli", "explain", pod, "--url", schedext.url, *tls],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_schedext_needs_nothing_but_its_service_account_in_mtls_mode(
    control_plane: ControlPlane, pki: Pki, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """schedext as deploy-mtls.yaml runs it (its args, POD_NAME/POD_NAMESPACE of a real pod
    in schedext-system) with a token of the `schedext` ServiceAccount and the RBAC of
    rbac.yaml only: it syncs, takes the Lease, labels its pod, binds GPU, gang and
    sticky-address pods, writes statuses, claims and Events, and is refused nothing."""
    api = control_plane.api
    ensure_namespace(control_plane, SYSTEM_NAMESPACE)
    kube = Kube(control_plane)
    try:
        for obj in documents(RBAC):
            kube.apply(obj, dry_run=False)
    finally:
        kube.close()
    identity = service_account_kubeconfig(control_plane, "schedext", tmp_path / "sa.kubeconfig")
    with contextlib.suppress(HarnessApiError):
        api.apply_raw("DELETE", SYSTEM_LEASE)  # left by an earlier run, its holder long gone
    api.delete_pod(SYSTEM_NAMESPACE, OWN_POD)
    api.create_pod(SYSTEM_NAMESPACE, stand_in_pod(OWN_POD))
    env = {
        "POD_NAMESPACE": SYSTEM_NAMESPACE,
        "POD_NAME": OWN_POD,
        "SCHEDEXT_LEADER__IDENTITY": "schedext-e2e",
    }
    schedext = TlsSchedext(identity, tmp_path / "schedext.log", pki, env=env)
    try:
        with running_cluster(
            control_plane, request, schedext, shipped_config_over_mtls(pki)
        ) as cluster:
            # Ready: synced, with the Lease of its namespace, and its pod labelled.
            assert api.apply_raw("GET", SYSTEM_LEASE)["spec"]["holderIdentity"] == "schedext-e2e"
            eventually(
                lambda: pod_labels(api, SYSTEM_NAMESPACE, OWN_POD).get(ROLE_LABEL) == LEADER,
                message="schedext did not label its pod",
            )
            cluster.node("h100-1", gpus=8, model=H100, memory_mib=81559, groups=NVLINK,
                         labels={RACK: "a"})  # fmt: skip
            cluster.pod("trainer", gpus=2)
            cluster.pod_group("solo", min_member=1)
            cluster.pod("solo-0", gpus=1, labels={GROUP_LABEL: "solo"})
            cluster.ip_pool("rack-a", cidr="10.20.1.0/24", rack="a")
            uid = cluster.statefulset("kv", replicas=1)
            cluster.ip_pod("kv-0", pool="rack-a", policy="sticky", statefulset=("kv", uid))
            for name in ("trainer", "solo-0", "kv-0"):
                assert cluster.wait_bound(name, timeout=60) == "h100-1"
            assert len(cluster.gpu_ids("trainer")) == 2
            address, pool_name = cluster.address("kv-0")
            assert (address.rsplit(".", 1)[0], pool_name) == ("10.20.1", "rack-a")
            assert f"sts/{cluster.namespace}/kv/0" in cluster.ip_claims()

            def claimed_event() -> bool:
                return any(
                    e["reason"] == "IPClaimed" and e.get("reportingComponent") == "schedext"
                    for e in cluster.events("kv-0")
                )

            eventually(claimed_event, message="no IPClaimed event for kv-0")
            eventually(
                lambda: cluster.get_pod_group("solo").get("status", {}).get("phase") == "Scheduled",
                message="PodGroup status not written",
            )
            pool = f"{SCHEDEXT}/ippools/rack-a"
            eventually(
                lambda: api.apply_raw("GET", pool).get("status", {}).get("allocated") == 1,
                message="IPPool status not written",
            )

            # `schedext explain` reaches it over mTLS with a client certificate, and only so.
            ca, cert, key = str(pki.ca_cert), str(pki.client[0]), str(pki.client[1])
            explained = explain(schedext, f"{cluster.namespace}/trainer", "--cacert", ca,
                                "--cert", cert, "--key", key)  # fmt: skip
            assert explained.returncode == 0, explained.stderr
            first_line = explained.stdout.splitlines()[0]
            assert first_line == f"pod {cluster.namespace}/trainer (bound on h100-1)"
            refused = explain(schedext, f"{cluster.namespace}/trainer", "--cacert", ca)
            assert refused.returncode == 2
            assert "cannot reach" in refused.stderr
            # Through a port-forward the URL's host is 127.0.0.1; the certificate is checked
            # for the Service's name, as kube-scheduler's tlsConfig.serverName does.
            tls = ("--cacert", ca, "--cert", cert, "--key", key)
            named = explain(schedext, f"{cluster.namespace}/trainer", *tls,
                            "--server-name", SERVICE_NAME)  # fmt: skip
            assert named.returncode == 0, named.stderr
            misnamed = explain(schedext, f"{cluster.namespace}/trainer", *tls,
                               "--server-name", "schedext.elsewhere.svc")  # fmt: skip
            assert misnamed.returncode == 2
            assert "CERTIFICATE_VERIFY_FAILED" in misnamed.stderr

            # Prometheus' port: plain HTTP, no certificate, metrics only.
            metrics = httpx.get(f"http://127.0.0.1:{schedext.metrics_port}/metrics", timeout=10)
            binds = re.search(rf"^{BIND_COUNT} (\S+)$", metrics.text, re.M)
            assert binds is not None
            assert float(binds.group(1)) == schedext.bind_count() >= 3
            inventory = httpx.get(f"http://127.0.0.1:{schedext.metrics_port}/inventory")
            assert inventory.status_code == 404
            # The views port: plain HTTP, no certificate, the read-only views only.
            views = f"http://127.0.0.1:{schedext.views_port}"
            explained = httpx.get(f"{views}/explain/{cluster.namespace}/trainer", timeout=10)
            assert explained.json() == schedext.get(f"/explain/{cluster.namespace}/trainer")
            uid = cluster.get_pod("trainer")["metadata"]["uid"]
            body = {"PodName": "trainer", "PodNamespace": cluster.namespace, "PodUID": uid,
                    "Node": "h100-1"}  # fmt: skip
            assert httpx.post(f"{views}/bind", json=body, timeout=10).status_code == 404

            log = schedext.tail(100_000)
            assert "forbidden" not in log.lower(), log
        # Stopped (SIGTERM): the lease released, the label removed, with the same rights.
        assert not pod_labels(api, SYSTEM_NAMESPACE, OWN_POD).get(ROLE_LABEL)
        assert not api.apply_raw("GET", SYSTEM_LEASE)["spec"].get("holderIdentity")
    finally:
        api.delete_pod(SYSTEM_NAMESPACE, OWN_POD)


# --- what a caller without the right certificate gets -------------------------------------


@pytest.fixture
def tls_schedext(control_plane: ControlPlane, pki: Pki, tmp_path: Path) -> Iterator[TlsSchedext]:
    schedext = TlsSchedext(control_plane.kubeconfig, tmp_path / "schedext.log", pki)
    schedext.start()
    try:
        yield schedext
    finally:
        schedext.stop()


def raw_bind(port: int, context: ssl.SSLContext) -> bytes:
    """POST /bind over a bare TLS socket (the handshake is in ``wrap_socket``); the first
    bytes of the answer."""
    body = (FIXTURES / "bind_request.json").read_bytes()
    head = f"POST /bind HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {len(body)}\r\n\r\n"
    with (
        socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
    ):
        tls.sendall(head.encode() + body)
        return tls.recv(64)


@pytest.mark.parametrize("who", ["no certificate", "another CA's certificate"])
def test_a_bind_without_a_valid_client_certificate_fails_in_the_tls_handshake(
    tls_schedext: TlsSchedext, pki: Pki, who: str
) -> None:
    def context(version: ssl.TLSVersion) -> ssl.SSLContext:
        context = pki.context(None if who == "no certificate" else pki.stranger)
        context.maximum_version = version
        return context

    bind = (FIXTURES / "bind_request.json").read_bytes()

    # httpx (what any HTTP client sees): a transport error, never an HTTP response.
    with pytest.raises(httpx.TransportError):
        httpx.post(
            f"{tls_schedext.url}/bind",
            content=bind,
            verify=context(ssl.TLSVersion.MAXIMUM_SUPPORTED),
            timeout=10,
        )

    # TLS 1.2: the client's handshake ends only after the server has accepted its certificate,
    # so it is the handshake itself that fails.
    with pytest.raises(ssl.SSLError):
        raw_bind(tls_schedext.port, context(ssl.TLSVersion.TLSv1_2))

    # TLS 1.3 (what Go and Python negotiate): the client's half of the handshake ends before
    # the server has checked the certificate; the server then drops the connection, and not
    # one byte of HTTP comes back.
    try:
        answer = raw_bind(tls_schedext.port, context(ssl.TLSVersion.TLSv1_3))
    except (ssl.SSLError, ConnectionError):
        answer = b""
    assert answer == b""

    # The request never reached the application; the same one with the right certificate
    # does, over either version (and is answered: that pod is unknown to this cluster).
    assert tls_schedext.bind_count() == 0
    for version in (ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3):
        good = pki.context(pki.client)
        good.maximum_version = version
        assert raw_bind(tls_schedext.port, good).startswith(b"HTTP/1.1 200 ")
    answer = httpx.post(f"{tls_schedext.url}/bind", content=bind, verify=tls_schedext.context)
    assert answer.status_code == 200
    assert answer.json()["Error"]
    assert tls_schedext.bind_count() == 3


def test_the_probes_of_the_mtls_deployment_pass_against_schedext_over_mtls(
    tls_schedext: TlsSchedext, pki: Pki
) -> None:
    """deploy-mtls.yaml's exec probes, run as written (only paths and port replaced): they
    present the pod's own certificate, so they pass where the kubelet's HTTP probes could not."""
    container = mtls_schedext_container()
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    replacements = {
        f"{mounts['tls']}/tls.crt": str(pki.server[0]),
        f"{mounts['tls']}/tls.key": str(pki.server[1]),
        "127.0.0.1:8443": f"127.0.0.1:{tls_schedext.port}",
    }
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        command = container[probe]["exec"]["command"]
        assert command[0] == "python"
        script = command[2]
        for old, new in replacements.items():
            assert old in script, f"{probe}: {old} not in {script}"
            script = script.replace(old, new)
        result = subprocess.run(
            [sys.executable, command[1], script],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert result.returncode == 0, f"{probe} failed: {shlex.join(command)}\n{result.stderr}"


# --- listening beyond loopback -------------------------------------------------------------


def serve(*args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "app.cli", "serve", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


@contextlib.contextmanager
def serving(*args: str) -> Iterator[subprocess.Popen[bytes]]:
    process = serve(*args)
    try:
        yield process
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=15)
        if process.stdout is not None:
            process.stdout.close()


@pytest.mark.parametrize(
    "args",
    [
        pytest.param(["--host", "0.0.0.0"], id="plain HTTP"),
        pytest.param(["--host", "::"], id="plain HTTP on IPv6"),
        pytest.param(["--host", "10.0.0.7"], id="plain HTTP on one address"),
        pytest.param(["--host", ""], id="plain HTTP everywhere"),
        pytest.param(["--host", "0.0.0.0", "--tls"], id="HTTPS without client certificates"),
    ],
)
def test_schedext_refuses_to_serve_bind_beyond_loopback_without_mtls(
    pki: Pki, args: list[str]
) -> None:
    if args[-1] == "--tls":
        args = [*args[:-1], "--tls-cert-file", str(pki.server[0])]
        args += ["--tls-key-file", str(pki.server[1])]
    result = subprocess.run(
        [sys.executable, "-m", "app.cli", "serve", "--port", str(free_port()), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2, result.stdout + result.stderr
    assert "refusing to listen on" in result.stderr
    assert "--insecure-allow-remote" in result.stderr


@pytest.mark.parametrize("mode", ["mtls", "insecure-allow-remote", "loopback"])
def test_schedext_serves_beyond_loopback_with_mtls_or_an_explicit_opt_out(
    pki: Pki, mode: str
) -> None:
    port = free_port()
    args = {
        "mtls": [
            "--host", "0.0.0.0",
            "--tls-cert-file", str(pki.server[0]), "--tls-key-file", str(pki.server[1]),
            "--tls-client-ca-file", str(pki.ca_cert),
        ],
        "insecure-allow-remote": ["--host", "0.0.0.0", "--insecure-allow-remote"],
        "loopback": ["--host", "127.0.0.1"],
    }[mode]  # fmt: skip
    scheme = "https" if mode == "mtls" else "http"
    context = pki.context(pki.client)
    with serving("--port", str(port), *args) as process:

        def ready() -> bool:
            if process.poll() is not None:
                output = process.stdout.read().decode() if process.stdout else ""
                raise AssertionError(f"schedext exited with {process.returncode}:\n{output}")
            url = f"{scheme}://127.0.0.1:{port}/readyz"
            return httpx.get(url, verify=context, timeout=2).status_code == 200

        wait_for(ready, timeout=60, message=f"schedext ({mode}) not ready")
