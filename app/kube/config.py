"""Where the API server is and how to authenticate: a kubeconfig file, read with the official
client's loader (exec plugins, client certificates, embedded data all work), or in-cluster
credentials, read here from the pod's service-account directory; either way turned into what
the API client needs (a server URL, an SSL context, a token).

:func:`load_user_config` finds them as kubectl does, for a command a person runs
(``kubectl schedext``): ``--kubeconfig``, else ``$KUBECONFIG`` (a list of files, merged),
else ``~/.kube/config``, else in-cluster; a context by name or the current one, and the
namespace it names."""

from __future__ import annotations

import os
import ssl
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from app.stdio.yaml_files import YamlFileError, read_yaml_mapping

__all__ = [
    "SERVICE_ACCOUNT_DIR",
    "TOKEN_REREAD_S",
    "ClusterConfig",
    "KubeconfigError",
    "UserConfig",
    "in_cluster_available",
    "load_cluster_config",
    "load_user_config",
]

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
# The kubelet rotates projected tokens well before they expire (at 80% of their lifetime,
# an hour at least): re-reading the file once a minute always sends a valid one.
TOKEN_REREAD_S = 60.0


class KubeconfigError(ValueError):
    """A kubeconfig that is no YAML mapping: the file, the line and the problem."""


def _readable(files: str) -> None:
    """Each kubeconfig of ``files`` (os.pathsep-joined) is a YAML mapping, else
    KubeconfigError: the official loader would raise a parser's or a TypeError's traceback."""
    for name in files.split(os.pathsep):
        try:
            read_yaml_mapping(Path(name), "kubeconfig", example="`clusters:`")
        except YamlFileError as error:
            raise KubeconfigError(f"cannot read the kubeconfig {error}") from None


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


@dataclass(frozen=True)
class UserConfig:
    """A person's credentials, and the namespace their context names (as kubectl's -n)."""

    cluster: ClusterConfig
    namespace: str
    source: str  # where they came from, for messages: the kubeconfig file(s) or "in-cluster"


def load_cluster_config(
    kubeconfig: Path | None, *, service_account_dir: Path = SERVICE_ACCOUNT_DIR
) -> ClusterConfig:
    """From ``kubeconfig`` when given, else in-cluster credentials. Raises ValueError."""
    if kubeconfig is None:
        return _in_cluster(service_account_dir)
    _readable(str(kubeconfig))
    return _from_kubeconfig(str(kubeconfig), context=None, persist=True)


def load_user_config(
    kubeconfig: Path | None,
    *,
    context: str | None = None,
    environ: Mapping[str, str] = os.environ,
    home: Path | None = None,
    service_account_dir: Path = SERVICE_ACCOUNT_DIR,
) -> UserConfig:
    """The credentials kubectl would use (see the module docstring). Raises ValueError with
    what to do when there are none, or when they cannot be read."""
    if kubeconfig is not None:
        if not kubeconfig.is_file():
            raise ValueError(f"the kubeconfig {kubeconfig} does not exist")
        files = [str(kubeconfig)]
    else:
        listed = environ.get("KUBECONFIG", "")
        candidates = listed.split(os.pathsep) if listed else [str(_home(home) / ".kube/config")]
        files = [str(Path(f).expanduser()) for f in candidates if f]
        files = [f for f in files if Path(f).is_file()]
    if files:
        joined = os.pathsep.join(files)
        _readable(joined)
        namespace = _context_namespace(joined, context)  # first: it names a missing context
        # Never write refreshed tokens back into a person's kubeconfig.
        cluster = _from_kubeconfig(joined, context=context, persist=False)
        return UserConfig(cluster, namespace, joined)
    if context is None and in_cluster_available(service_account_dir):
        namespace_file = service_account_dir / "namespace"
        try:
            namespace = namespace_file.read_text().strip() or "default"
        except OSError:
            namespace = "default"
        return UserConfig(_in_cluster(service_account_dir), namespace, "in-cluster")
    where = environ.get("KUBECONFIG") or str(_home(home) / ".kube/config")
    raise ValueError(f"no kubeconfig: {where} does not exist (set KUBECONFIG or pass --kubeconfig)")


def _home(home: Path | None) -> Path:
    return home if home is not None else Path.home()


def _context_namespace(files: str, context: str | None) -> str:
    """The namespace the context names; "default" when it names none."""
    from kubernetes import config  # noqa: PLC0415

    try:
        contexts, current = config.list_kube_config_contexts(files)  # type: ignore[no-untyped-call]
    except (config.ConfigException, OSError) as error:
        raise ValueError(f"cannot read the kubeconfig {files}: {error}") from None
    chosen = (
        current
        if context is None
        else next((c for c in contexts if c.get("name") == context), None)
    )
    if chosen is None:
        names = ", ".join(sorted(str(c.get("name")) for c in contexts)) or "none"
        raise ValueError(f"no context {context!r} in the kubeconfig {files} (it has: {names})")
    namespace = (chosen.get("context") or {}).get("namespace")
    return str(namespace) if namespace else "default"


def _from_kubeconfig(files: str, *, context: str | None, persist: bool) -> ClusterConfig:
    """``files``: one kubeconfig, or several joined by os.pathsep (merged as kubectl does)."""
    from kubernetes import client, config  # noqa: PLC0415 (slow import, only for live mode)

    configuration = client.Configuration()
    try:
        # the official client's loaders are untyped
        config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=files,
            context=context,
            client_configuration=configuration,
            persist_config=persist,
        )
    except (config.ConfigException, OSError) as error:
        raise ValueError(f"cannot load cluster credentials: {error}") from None
    # The client stores the token under "authorization" or, in newer releases, "BearerToken",
    # with its scheme in front ("Bearer x"; its in-cluster loader writes "bearer x").
    keys = configuration.api_key or {}
    token = _without_scheme(str(keys.get("BearerToken") or keys.get("authorization") or ""))
    tls: ssl.SSLContext | bool
    if configuration.verify_ssl:
        tls = ssl.create_default_context(cafile=configuration.ssl_ca_cert or None)
    else:
        tls = False
    if configuration.cert_file and configuration.key_file:
        if tls is False:
            tls = ssl.create_default_context()
            tls.check_hostname = False
            tls.verify_mode = ssl.CERT_NONE
        assert isinstance(tls, ssl.SSLContext)
        tls.load_cert_chain(configuration.cert_file, configuration.key_file)
    return ClusterConfig(
        server=configuration.host.rstrip("/"), ssl_context=tls, token=token or None
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
