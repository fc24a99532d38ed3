"""``schedext`` command line, the front door of ``app``'s buildings: ``serve`` (the extender,
:mod:`app.service`), ``config`` (the settings ``serve`` would run with, each with its
source, or a check of a settings file), ``explain`` (asks a running one why a pod fits each
node, printed as the kubectl plugin prints it, :mod:`app.plugin.tables`), ``agent`` (the node
agent, :mod:`app.agent.command`). A command imports its building when it runs, so that neither
``--help`` nor the agent loads the service. The benchmarks are not commands of the package,
which does not ship them: they run from a source tree (``python -m loadtests.bench``)."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import ssl
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app import __version__
from app.agent.command import add_command as add_agent_command
from app.stdio import logs
from app.stdio.pipes import reader_gone

if TYPE_CHECKING:
    from app.service.assembly import Service
    from app.service.plain_listener import PlainListener
    from app.service.settings import Settings
    from app.stdio.settings_sources import Layers

__all__ = ["main"]

log = logging.getLogger("schedext")


def main(argv: Sequence[str] | None = None) -> int:
    """Run a command; its exit status. Output into a pipe its reader closed early (``schedext
    explain ns/pod | head``) ends the command quietly, with status 141."""
    try:
        try:
            return _command(argv)
        finally:
            # A closed pipe shows when buffered output is written: here, where it is caught,
            # rather than at the interpreter's exit, which prints a traceback.
            sys.stdout.flush()
    except BrokenPipeError:
        return reader_gone()


def _command(argv: Sequence[str] | None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    handler: Any = args.handler
    code: int = handler(args)
    return code


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="schedext",
        description="Kubernetes scheduler extender: GPU topology, IP pools and gangs.",
    )
    parser.add_argument("--version", action="version", version=f"schedext {__version__}")
    commands = parser.add_subparsers(dest="command")

    serve = commands.add_parser(
        "serve",
        help="run the extender",
        description=(
            "Serve the extender verbs. With no --snapshot, no --kubeconfig and no in-cluster "
            "environment, it serves an embedded demo inventory on 127.0.0.1:8888. The flags "
            "below are a few of the settings: most live in the YAML file of --config, or in "
            "environment variables SCHEDEXT_<GROUP>__<KEY> (SCHEDEXT_POLICY__GPU_SCORING=spread); "
            "every setting, its default and its variable are in docs/configuration.md, and "
            "`schedext config` prints what they add up to."
        ),
    )
    _settings_arguments(serve)
    serve.set_defaults(handler=_serve)

    config = commands.add_parser(
        "config",
        help="print the merged settings, each with its source; or check a settings file",
        description=(
            "Print the settings `schedext serve` would run with, given the same --config, "
            "flags and SCHEDEXT_* environment, as a YAML file: each key with where it came "
            "from (default, file, env or flag) as a trailing comment. With --check FILE, only "
            "check FILE and the environment: exit 0 when schedext would start with them, 2 "
            "with what is wrong otherwise. See docs/configuration.md."
        ),
    )
    config.add_argument(
        "--check",
        type=Path,
        metavar="FILE",
        help="check this settings file (and the environment, and the flags given) without "
        "printing or starting anything",
    )
    _settings_arguments(config)
    config.set_defaults(handler=_config)

    explain = commands.add_parser(
        "explain",
        help="why a pod fits, or does not fit, each node (asks a running schedext)",
    )
    explain.add_argument("pod", help="NAMESPACE/NAME, or NAME with -n")
    explain.add_argument("-n", "--namespace", help="the pod's namespace (with a NAME alone)")
    explain.add_argument(
        "--url",
        default="http://127.0.0.1:8888",
        help="schedext's address, http:// or https:// (default %(default)s)",
    )
    explain.add_argument(
        "--cacert", type=Path, help="https: verify schedext's certificate with this CA (PEM)"
    )
    explain.add_argument(
        "--cert", type=Path, help="https: present this client certificate (PEM; mTLS mode)"
    )
    explain.add_argument(
        "--key", type=Path, help="the private key of --cert (default: read from --cert)"
    )
    explain.add_argument(
        "--server-name",
        help="https: check schedext's certificate for this name instead of the URL's host, e.g. "
        "schedext.schedext-system.svc through kubectl port-forward (as kube-scheduler's "
        "tlsConfig.serverName)",
    )
    explain.add_argument("--json", action="store_true", help="print the raw JSON answer")
    explain.set_defaults(handler=_explain)
    add_agent_command(commands)
    return parser


# The flags of the settings `serve` takes on its command line: (dotted setting, flag).
_SETTING_FLAGS = (
    ("server.host", "--host"),
    ("server.port", "--port"),
    ("snapshot", "--snapshot"),
    ("kubeconfig", "--kubeconfig"),
    ("server.path_prefix", "--path-prefix"),
    ("log_level", "--log-level"),
    ("leader.enabled", "--leader-elect"),
    ("server.bench_endpoints", "--bench-endpoints"),
    ("server.tls_cert_file", "--tls-cert-file"),
    ("server.tls_key_file", "--tls-key-file"),
    ("server.tls_client_ca_file", "--tls-client-ca-file"),
    ("server.metrics_port", "--metrics-port"),
    ("server.views_port", "--views-port"),
    ("server.insecure_allow_remote", "--insecure-allow-remote"),
)


def _settings_arguments(parser: argparse.ArgumentParser) -> None:
    """The settings file and the settings that have a flag (serve, config)."""
    parser.add_argument("--host", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, help="port to listen on (default 8888)")
    parser.add_argument(
        "--snapshot", type=Path, help="nodes and pods from a kubectl JSON/YAML dump"
    )
    parser.add_argument("--kubeconfig", type=Path, help="watch the cluster of this kubeconfig")
    parser.add_argument(
        "--config",
        type=Path,
        help="YAML settings file (every key: docs/configuration.md; `schedext config` prints "
        "the merged settings)",
    )
    parser.add_argument("--path-prefix", help="also serve the verbs under this prefix")
    parser.add_argument(
        "--log-level",
        choices=["debug", "info", "warning", "error"],
        help="the least severe log lines written, as JSON on stderr (default info)",
    )
    parser.add_argument(
        "--leader-elect",
        action="store_true",
        help="with several replicas: only the holder of the Lease answers the verbs",
    )
    parser.add_argument(
        "--bench-endpoints", action="store_true", help="add the constant-answer benchmark endpoint"
    )
    parser.add_argument(
        "--tls-cert-file", type=Path, help="serve HTTPS with this certificate (PEM)"
    )
    parser.add_argument("--tls-key-file", type=Path, help="the private key of --tls-cert-file")
    parser.add_argument(
        "--tls-client-ca-file",
        type=Path,
        help="require client certificates signed by this CA (mTLS); the handshake fails otherwise",
    )
    parser.add_argument(
        "--metrics-port",
        type=int,
        help="also serve /metrics and /healthz (nothing else) over plain HTTP on every address, "
        "on this port, for Prometheus (off by default)",
    )
    parser.add_argument(
        "--views-port",
        type=int,
        help="also serve the read-only views /inventory, /explain/NAMESPACE/NAME and /healthz "
        "(nothing else) over plain HTTP on every address, on this port, for `kubectl schedext` "
        "through the API server's service proxy (off by default)",
    )
    parser.add_argument(
        "--insecure-allow-remote",
        action="store_true",
        help="allow a non-loopback --host without client certificates (anyone who can reach "
        "the port can bind pods)",
    )


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The settings given as flags, nested as the file nests them."""
    overrides: dict[str, Any] = {}
    for key, flag in _SETTING_FLAGS:
        value = getattr(args, flag.lstrip("-").replace("-", "_"))
        if value is None or value is False:  # a switch not given leaves the setting alone
            continue
        *groups, name = key.split(".")
        into = overrides
        for group in groups:
            into = into.setdefault(group, {})
        into[name] = value
    return overrides


def _settings(
    args: argparse.Namespace, config_file: Path | None, prog: str
) -> tuple[Settings, Layers] | None:
    """The settings of ``args``, or None once what is wrong with them is printed."""
    from app.service.settings import SettingsError, read_settings  # noqa: PLC0415

    try:
        return read_settings(config_file, _overrides(args), flags=dict(_SETTING_FLAGS))
    except SettingsError as problem:
        for line in problem.lines:
            print(f"{prog}: invalid settings: {line}", file=sys.stderr)
        return None


def _serve(args: argparse.Namespace) -> int:
    from app.service.settings import REDACTED  # noqa: PLC0415
    from app.service.snapshot import SnapshotError  # noqa: PLC0415
    from app.stdio.settings_sources import fingerprint  # noqa: PLC0415

    loaded = _settings(args, args.config, "schedext")
    if loaded is None:
        return 2
    settings, layers = loaded
    logs.configure(settings.log_level)
    defaults, _ = _defaults()
    # What this replica runs with: compare the hash across replicas, and read the keys.
    log.info("settings", extra=fingerprint(settings, defaults, layers, redacted=REDACTED))
    try:
        return _run(settings)
    except SnapshotError as error:
        print(f"schedext: {error}", file=sys.stderr)
        return 2


def _defaults() -> tuple[Settings, Layers]:
    from app.service.settings import read_settings  # noqa: PLC0415

    return read_settings(environ={})


def _config(args: argparse.Namespace) -> int:
    from app.stdio.settings_sources import effective_yaml  # noqa: PLC0415

    if args.check is not None and args.config is not None:
        print("schedext config: give the file either to --check or to --config", file=sys.stderr)
        return 2
    checking = args.check is not None
    loaded = _settings(args, args.check if checking else args.config, "schedext config")
    if loaded is None:
        return 2
    settings, layers = loaded
    if checking:
        print(f"{args.check}: valid (with the environment and flags given)")
        return 0
    print(effective_yaml(settings, layers), end="")
    return 0


def _run(settings: Settings) -> int:
    import uvicorn  # noqa: PLC0415 (keep `schedext --help` fast)

    from app.service.main import create_app, live_cluster_configured  # noqa: PLC0415
    from app.service.stopping import StoppingServer  # noqa: PLC0415
    from app.service.verb_protocol import protocol_for  # noqa: PLC0415

    try:
        app = create_app(settings)
    except ValueError as error:  # unreadable credentials; a cluster the fence cannot work on
        print(f"schedext: {error}", file=sys.stderr)
        return 2
    service = app.state.service
    if settings.snapshot is None and not live_cluster_configured(settings):
        log.info(
            "no cluster configured: serving the embedded demo inventory "
            "(pass --snapshot FILE or --kubeconfig PATH for real data)"
        )
    server = StoppingServer(
        uvicorn.Config(
            app,
            host=settings.server.host,
            port=settings.server.port,
            log_config=None,
            access_log=settings.server.access_log,
            workers=1,  # the inventory lives in this process; HA comes from leader election
            # uvicorn's httptools protocol, answering filter and prioritize in place
            http=protocol_for(service),
            loop="uvloop",
            server_header=False,
            # No proxy sits in front of schedext: X-Forwarded-* from a loopback peer must not
            # rewrite who the client is (and the middleware costs every call).
            proxy_headers=False,
            # HTTPS, and with a client CA, mTLS: see ServerSettings.
            **settings.server.uvicorn_tls(),
        ),
        service,
    )
    listeners = _plain_listeners(settings, service)
    if not listeners:
        server.run()
        return 0
    import uvloop  # noqa: PLC0415

    async def serve() -> int:
        started: list[PlainListener] = []
        try:
            for flag, listener in listeners:
                try:
                    await listener.start()
                except OSError as error:
                    print(f"schedext: cannot serve {flag}: {error}", file=sys.stderr)
                    return 2
                started.append(listener)
            await server.serve()
        finally:
            for listener in started:
                await listener.stop()
        return 0

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(serve())


def _plain_listeners(settings: Settings, service: Service) -> list[tuple[str, PlainListener]]:
    """The plain-HTTP listeners beside the verbs' (metrics, read-only views), by their flag."""
    from app.service.metrics_listener import MetricsListener  # noqa: PLC0415
    from app.service.views_listener import ViewsListener  # noqa: PLC0415

    server = settings.server
    listeners: list[tuple[str, PlainListener]] = []
    if server.metrics_port is not None:
        listener = MetricsListener(
            service.metrics.render,
            port=server.metrics_port,
            max_header_bytes=server.max_header_bytes,
        )
        listeners.append(("--metrics-port", listener))
    if server.views_port is not None:
        listeners.append(("--views-port", ViewsListener(service, port=server.views_port)))
    return listeners


def _explain(args: argparse.Namespace) -> int:
    import httpx  # noqa: PLC0415

    from app.plugin.pod_arg import pod_of  # noqa: PLC0415
    from app.plugin.tables import explanation_text  # noqa: PLC0415

    try:
        namespace, name = pod_of(args.pod, args.namespace)
    except ValueError as error:
        print(f"schedext explain: {error}", file=sys.stderr)
        return 2
    try:
        verify = _explain_tls(args)
    except ValueError as error:
        print(f"schedext explain: {error}", file=sys.stderr)
        return 2
    # The name sent in the TLS handshake and checked against the certificate.
    extensions = {"sni_hostname": args.server_name} if args.server_name else None
    try:
        with httpx.Client(verify=verify, timeout=30) as client:
            response = client.get(
                f"{args.url.rstrip('/')}/explain/{namespace}/{name}", extensions=extensions
            )
    except httpx.HTTPError as error:
        print(f"schedext explain: cannot reach {args.url}: {error}", file=sys.stderr)
        return 2
    answer = response.json()
    if response.status_code != 200:
        print(f"schedext explain: {answer.get('Error', response.text)}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(answer, indent=2))
        return 0
    print(explanation_text(answer))
    return 0


def _explain_tls(args: argparse.Namespace) -> ssl.SSLContext | bool:
    """The client side of schedext's TLS: the CA to verify it by (default: the system's) and,
    in mTLS mode, the client certificate to present."""
    https = args.url.startswith("https://")
    given = [
        flag.replace("_", "-")
        for flag in ("cacert", "cert", "key", "server_name")
        if getattr(args, flag) is not None
    ]
    if not https:
        if given:
            raise ValueError(f"--{given[0]} needs an https:// --url")
        return True
    if args.key is not None and args.cert is None:
        raise ValueError("--key needs --cert")
    try:
        context = ssl.create_default_context(
            cafile=str(args.cacert) if args.cacert is not None else None
        )
        if args.cert is not None:
            context.load_cert_chain(args.cert, args.key)
    except (OSError, ssl.SSLError) as error:
        raise ValueError(f"cannot use the TLS files: {error}") from None
    return context


if __name__ == "__main__":
    raise SystemExit(main())
