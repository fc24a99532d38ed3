"""Cluster credentials: in-cluster (a fake service-account directory and the Service
environment a pod gets) and kubeconfig, down to the Authorization header actually sent."""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path

import httpx
import pytest
import yaml

from app.kube import config as kube_config
from app.kube.api import KubeApi
from app.kube.config import ClusterConfig, in_cluster_available, load_cluster_config
from testbed.pki import CertAuthority
from tests.handler_transport import HandlerTransport


class Clock:
    """time.monotonic as a test sets it: just after boot, then moved on by hand."""

    def __init__(self) -> None:
        self.now = 5.0  # a node booted seconds ago: monotonic time is small

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(kube_config.time, "monotonic", fake)
    return fake


@pytest.fixture
def service_account(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    directory = tmp_path / "serviceaccount"
    ca = CertAuthority.create(tmp_path / "pki", "fake-cluster-ca")
    directory.mkdir()
    (directory / "token").write_text("tok-1\n")
    (directory / "ca.crt").write_bytes(ca.cert_path.read_bytes())
    (directory / "namespace").write_text("kube-system")
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "6443")
    return directory


def sent_authorization(config: ClusterConfig) -> tuple[str, str | None]:
    """The URL and Authorization header of one real request through KubeApi."""
    seen: list[httpx.Request] = []

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={"kind": "NodeList", "items": []})

    async def one_request() -> None:
        api = KubeApi(config, transport=HandlerTransport(handle))
        try:
            await api.get("/api/v1/nodes")
        finally:
            await api.close()

    asyncio.run(one_request())
    return str(seen[0].url), seen[0].headers.get("Authorization")


def test_in_cluster_credentials_send_the_token_once_prefixed_right_after_boot(
    service_account: Path, clock: Clock
) -> None:
    config = load_cluster_config(None, service_account_dir=service_account)
    assert config.server == "https://10.0.0.1:6443"
    url, authorization = sent_authorization(config)
    assert url == "https://10.0.0.1:6443/api/v1/nodes"
    assert authorization == "Bearer tok-1"


def test_in_cluster_ssl_context_trusts_the_cluster_ca_and_checks_the_host(
    service_account: Path, clock: Clock
) -> None:
    config = load_cluster_config(None, service_account_dir=service_account)
    context = config.ssl_context
    assert isinstance(context, ssl.SSLContext)
    assert context.verify_mode is ssl.CERT_REQUIRED
    assert context.check_hostname
    subjects = [dict(part[0] for part in cert["subject"]) for cert in context.get_ca_certs()]
    assert {"commonName": "fake-cluster-ca"} in subjects


def test_a_rotated_token_is_sent_once_the_file_is_re_read(
    service_account: Path, clock: Clock
) -> None:
    config = load_cluster_config(None, service_account_dir=service_account)
    assert config.authorization() == "Bearer tok-1"
    (service_account / "token").write_text("tok-2")
    clock.now += kube_config.TOKEN_REREAD_S / 2
    assert config.authorization() == "Bearer tok-1"  # not re-read on every request
    clock.now += kube_config.TOKEN_REREAD_S
    assert sent_authorization(config)[1] == "Bearer tok-2"


def test_a_token_file_missing_mid_rotation_keeps_the_last_token(
    service_account: Path, clock: Clock
) -> None:
    config = load_cluster_config(None, service_account_dir=service_account)
    (service_account / "token").unlink()
    clock.now += 2 * kube_config.TOKEN_REREAD_S
    assert config.authorization() == "Bearer tok-1"
    (service_account / "token").write_text("tok-3\n")
    assert config.authorization() == "Bearer tok-3"  # retried on the next request


def test_an_ipv6_service_host_is_bracketed(
    service_account: Path, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "fd00::1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "8443")
    config = load_cluster_config(None, service_account_dir=service_account)
    assert config.server == "https://[fd00::1]:8443"


@pytest.mark.parametrize(
    ("breakage", "message"),
    [
        ("no host", "KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT must be set"),
        ("empty port", "KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT must be set"),
        ("no token", "token"),
        ("empty token", "token is empty"),
        ("no ca", "ca.crt"),
        ("empty ca", "ca.crt is empty"),
    ],
)
def test_incomplete_in_cluster_credentials_are_refused_with_the_reason(
    service_account: Path, monkeypatch: pytest.MonkeyPatch, breakage: str, message: str
) -> None:
    match breakage:
        case "no host":
            monkeypatch.delenv("KUBERNETES_SERVICE_HOST")
        case "empty port":
            monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "")
        case "no token":
            (service_account / "token").unlink()
        case "empty token":
            (service_account / "token").write_text("\n")
        case "no ca":
            (service_account / "ca.crt").unlink()
        case "empty ca":
            (service_account / "ca.crt").write_text("")
    with pytest.raises(ValueError, match="cannot load cluster credentials") as raised:
        load_cluster_config(None, service_account_dir=service_account)
    assert message in str(raised.value)
    assert "tok-1" not in str(raised.value)


def test_in_cluster_is_available_only_with_the_service_environment_and_a_token(
    service_account: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert in_cluster_available(service_account)
    assert not in_cluster_available(service_account.parent / "elsewhere")
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST")
    assert not in_cluster_available(service_account)


def test_kubeconfig_token_is_sent_once_prefixed(tmp_path: Path) -> None:
    ca = CertAuthority.create(tmp_path / "pki", "kubeconfig-ca")
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {
                        "name": "c",
                        "cluster": {
                            "server": "https://127.0.0.1:6443/",
                            "certificate-authority": str(ca.cert_path),
                        },
                    }
                ],
                "users": [{"name": "u", "user": {"token": "kc-token"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    config = load_cluster_config(kubeconfig)
    assert config.server == "https://127.0.0.1:6443"
    assert sent_authorization(config) == ("https://127.0.0.1:6443/api/v1/nodes", "Bearer kc-token")
    assert "kc-token" not in repr(config)


@pytest.mark.parametrize(
    ("stored", "token"),
    [
        ("Bearer abc", "abc"),
        ("bearer abc", "abc"),  # what the official client's in-cluster loader stores
        ("BEARER  abc ", "abc"),
        ("abc", "abc"),
        ("", ""),
    ],
)
def test_the_scheme_the_client_library_stores_is_removed_in_any_case(
    stored: str, token: str
) -> None:
    assert kube_config._without_scheme(stored) == token


# --- a person's credentials, found as kubectl finds them (kubectl schedext) ----------------


def write_kubeconfig(path: Path, ca: Path, *contexts: tuple[str, str | None], current: str) -> Path:
    """A kubeconfig with one cluster and user, and ``contexts`` as (name, namespace)."""
    context_list = []
    for name, namespace in contexts:
        context = {"cluster": "c", "user": "u", **({"namespace": namespace} if namespace else {})}
        context_list.append({"name": name, "context": context})
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {"name": "c", "cluster": {"server": "https://127.0.0.1:6443",
                                              "certificate-authority": str(ca)}}
                ],
                "users": [{"name": "u", "user": {"token": "person-token"}}],
                "contexts": context_list,
                "current-context": current,
            }
        )
    )  # fmt: skip
    return path


@pytest.fixture
def ca(tmp_path: Path) -> Path:
    return CertAuthority.create(tmp_path / "pki", "person-ca").cert_path


def test_the_current_context_gives_the_namespace_and_kubeconfig_is_a_list(
    tmp_path: Path, ca: Path
) -> None:
    config = write_kubeconfig(tmp_path / "b", ca, ("dev", "team-a"), ("ops", None), current="dev")
    environ = {"KUBECONFIG": f"{tmp_path / 'missing'}:{config}"}
    user = kube_config.load_user_config(None, environ=environ, home=tmp_path)
    assert (user.namespace, user.source) == ("team-a", str(config))
    assert user.cluster.server == "https://127.0.0.1:6443"
    assert user.cluster.authorization() == "Bearer person-token"
    chosen = kube_config.load_user_config(None, context="ops", environ=environ, home=tmp_path)
    assert chosen.namespace == "default"  # a context without one


def test_without_kubeconfig_in_the_environment_home_is_read(tmp_path: Path, ca: Path) -> None:
    (tmp_path / ".kube").mkdir()
    write_kubeconfig(tmp_path / ".kube" / "config", ca, ("dev", "team-b"), current="dev")
    user = kube_config.load_user_config(None, environ={}, home=tmp_path)
    assert user.namespace == "team-b"


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("no kubeconfig anywhere", "no kubeconfig: {home}/.kube/config does not exist (set "
         "KUBECONFIG or pass --kubeconfig)"),
        ("--kubeconfig names a missing file", "the kubeconfig {home}/nope does not exist"),
        ("--context names a missing context", "no context 'prod' in the kubeconfig "
         "{home}/config (it has: dev)"),
    ],
)  # fmt: skip
def test_a_person_is_told_what_is_missing(
    tmp_path: Path, ca: Path, case: str, message: str
) -> None:
    given, context = None, None
    if case == "--kubeconfig names a missing file":
        given = tmp_path / "nope"
    if case == "--context names a missing context":
        given = write_kubeconfig(tmp_path / "config", ca, ("dev", None), current="dev")
        context = "prod"
    with pytest.raises(ValueError, match="kubeconfig") as raised:
        kube_config.load_user_config(
            given,
            context=context,
            environ={},
            home=tmp_path,
            service_account_dir=tmp_path / "no-service-account",
        )
    assert str(raised.value) == message.format(home=tmp_path)


def test_in_a_pod_without_kubeconfig_the_service_account_and_its_namespace_apply(
    service_account: Path, tmp_path: Path
) -> None:
    user = kube_config.load_user_config(
        None, environ={}, home=tmp_path, service_account_dir=service_account
    )
    assert (user.namespace, user.source) == ("kube-system", "in-cluster")
    assert user.cluster.server == "https://10.0.0.1:6443"
