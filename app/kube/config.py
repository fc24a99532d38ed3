"""Where the API server is and how to authenticate: a kubeconfig file or in-cluster
credentials, read with the official client's loaders (exec plugins, client certificates,
embedded data all work) and turned into what httpx needs."""

from __future__ import annotations

import os
import ssl
import time
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["ClusterConfig", "in_cluster_available", "load_cluster_config"]

_SERVICE_ACCOUNT_TOKEN = Path("/var/run/secrets/kubernetes.io/serviceaccount/token")


def in_cluster_available() -> bool:
    return "KUBERNETES_SERVICE_HOST" in os.environ and _SERVICE_ACCOUNT_TOKEN.exists()


@dataclass
class ClusterConfig:
    server: str
    ssl_context: ssl.SSLContext | bool
    token: str | None = None
    # In-cluster tokens are rotated by the kubelet: re-read the file now and then.
    token_file: Path | None = None
    _token_read_at: float = field(default=0.0, repr=False)

    def authorization(self) -> str | None:
        if self.token_file is not None and time.monotonic() - self._token_read_at > 60:
            self.token = self.token_file.read_text().strip()
            self._token_read_at = time.monotonic()
        return f"Bearer {self.token}" if self.token else None

    def __repr__(self) -> str:  # never print credentials
        return f"ClusterConfig(server={self.server!r})"


def load_cluster_config(kubeconfig: Path | None) -> ClusterConfig:
    """From ``kubeconfig`` when given, else in-cluster credentials. Raises ValueError."""
    from kubernetes import client, config  # noqa: PLC0415 (slow import, only for live mode)

    configuration = client.Configuration()
    try:
        if kubeconfig is not None:
            # the official client's loaders are untyped
            config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=str(kubeconfig), client_configuration=configuration
            )
        else:
            config.load_incluster_config(  # type: ignore[no-untyped-call]
                client_configuration=configuration
            )
    except (config.ConfigException, OSError) as error:
        raise ValueError(f"cannot load cluster credentials: {error}") from None
    # The client stores the token under "authorization" or, in newer releases, "BearerToken".
    keys = configuration.api_key or {}
    bearer = str(keys.get("BearerToken") or keys.get("authorization") or "")
    token = bearer.removeprefix("Bearer ").strip() or None
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
        server=configuration.host.rstrip("/"),
        ssl_context=context,
        token=token,
        token_file=_SERVICE_ACCOUNT_TOKEN if kubeconfig is None else None,
    )
