"""Where the API server is and how to authenticate: a kubeconfig file, read with the official
client's loader (exec plugins, client certificates, embedded data all work), or in-cluster
credentials, read here from the pod's service-account directory; either way turned into what
the API client needs (a server URL, an SSL context, a token)."""

from __future__ import annotations

import os
import ssl
import time
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "SERVICE_ACCOUNT_DIR",
    "TOKEN_REREAD_S",
    "ClusterConfig",
    "in_cluster_available",
    "load_cluster_config",
]

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
# The kubelet rotates projected tokens well before they expire (at 80% of their lifetime,
# an hour at least): re-reading the file once a minute always sends a valid one.
TOKEN_REREAD_S = 60.0


def in_cluster_available(service_account_dir: Path = SERVICE_ACCOUNT_DIR) -> bool:
    return "KUBERNETES_SERVICE_HOST" in os.environ and (service_account_dir / "token").exists()


@dataclass
class ClusterConfig:
    server: str
    ssl_context: ssl.SSLContext | bool
    token: str | None = None
    # In-cluster tokens are rotated by the kubelet: re-read the file now and then.
    token_file: Path | None = None
    _token_read_at: float | None = field(default=None, repr=False)

    def authorization(self) -> str | None:
        if self.token_file is not None and (
            self._token_read_at is None or time.monotonic() - self._token_read_at > TOKEN_REREAD_S
        ):
            try:
                self.token = _read_token(self.token_file)
                self._token_read_at = time.monotonic()
            except (OSError, ValueError):
                pass  # mid-rotation or briefly unreadable: keep the last token, retry next call
        return f"Bearer {self.token}" if self.token else None

    def __repr__(self) -> str:  # never print credentials
        return f"ClusterConfig(server={self.server!r})"


def load_cluster_config(
    kubeconfig: Path | None, *, service_account_dir: Path = SERVICE_ACCOUNT_DIR
) -> ClusterConfig:
    """From ``kubeconfig`` when given, else in-cluster credentials. Raises ValueError."""
    if kubeconfig is None:
        return _in_cluster(service_account_dir)
    from kubernetes import client, config  # noqa: PLC0415 (slow import, only for live mode)

    configuration = client.Configuration()
    try:
        # the official client's loaders are untyped
        config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=str(kubeconfig), client_configuration=configuration
        )
    except (config.ConfigException, OSError) as error:
        raise ValueError(f"cannot load cluster credentials: {error}") from None
    # The client stores the token under "authorization" or, in newer releases, "BearerToken",
    # with its scheme in front ("Bearer x"; its in-cluster loader writes "bearer x").
    keys = configuration.api_key or {}
    token = _without_scheme(str(keys.get("BearerToken") or keys.get("authorization") or ""))
    context: ssl.SSLContext | bool
    if configuration.verify_ssl:
        context = ssl.create_default_context(cafile=configuration.ssl_ca_cert or None)
    else:
        context = False
    if configuration.cert_file and configuration.key_file:
        if context is False:
            context = ssl.create_default_context()
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        assert isinstance(context, ssl.SSLContext)
        context.load_cert_chain(configuration.cert_file, configuration.key_file)
    return ClusterConfig(
        server=configuration.host.rstrip("/"), ssl_context=context, token=token or None
    )


def _in_cluster(directory: Path) -> ClusterConfig:
    """What client-go's rest.InClusterConfig reads: the Service address from the environment,
    the token and the cluster CA from the service-account directory."""
    host = os.environ.get("KUBERNETES_SERVICE_HOST", "")
    port = os.environ.get("KUBERNETES_SERVICE_PORT", "")
    if not host or not port:
        raise ValueError(
            "cannot load cluster credentials: KUBERNETES_SERVICE_HOST and "
            "KUBERNETES_SERVICE_PORT must be set (in a pod, or pass --kubeconfig)"
        )
    token_file, ca_file = directory / "token", directory / "ca.crt"
    try:
        token = _read_token(token_file)
        if not ca_file.read_bytes().strip():
            raise ValueError(f"{ca_file} is empty")
        context = ssl.create_default_context(cafile=str(ca_file))
    except (OSError, ValueError, ssl.SSLError) as error:
        raise ValueError(f"cannot load cluster credentials: {error}") from None
    address = f"[{host}]" if ":" in host or "%" in host else host
    return ClusterConfig(
        server=f"https://{address}:{port}",
        ssl_context=context,
        token=token,
        token_file=token_file,
        _token_read_at=time.monotonic(),
    )


def _read_token(path: Path) -> str:
    token = path.read_text().strip()
    if not token:
        raise ValueError(f"{path} is empty")
    return token


def _without_scheme(value: str) -> str:
    """The bare token: surrounding space and a leading "Bearer " (any case) removed."""
    value = value.strip()
    scheme, _, rest = value.partition(" ")
    return rest.strip() if scheme.lower() == "bearer" and rest else value
