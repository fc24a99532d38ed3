"""``schedext`` command line, the front door of ``app``'s buildings: ``serve`` (the extender,
:mod:`app.service`), ``explain`` (asks a running one why a pod fits each node, printed as the
kubectl plugin prints it, :mod:`app.plugin.tables`), ``agent`` (the node agent,
:mod:`app.agent.command`). A command imports its building when it runs, so that neither
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

from pydantic import ValidationError

from app import __version__
from app.agent.command import add_command as add_agent_command
from app.stdio import logs
from app.stdio.pipes import reader_gone

if TYPE_CHECKING:
    from app.service.assembly import Service
    from app.service.plain_listener import PlainListener
    from app.service.settings import Settings

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
            "environment, it serves an embedded demo inventory on 127.0.0.1:8888."
        ),
    )
    serve.add_argument("--host", help="address to listen on (default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port to listen on (default 8888)")
    serve.add_argument("--snapshot", type=Path, help="nodes and pods from a kubectl JSON/YAML dump")
    serve.add_argument("--kubeconfig", type=Path, help="watch the cluster of this kubeconfig")
    serve.add_argument("--config", type=Path, help="YAML settings file (see docs/configuration.md)")
    serve.add_argument("--path-prefix", help="also serve the verbs under this prefix")
    serve.add_argument("--log-level", choices=["debug", "info", "warning", "error"])
    serve.add_argument(
        "--leader-elect",
        action="store_true",
        help="with several replicas: only the holder of the Lease answers the verbs",
    )
    serve.add_argument(
        "--bench-endpoints", action="store_true", help="add the constant-answer benchmark endpoint"
    )
    serve.add_argument("--tls-cert-file", type=Path, help="serve HTTPS with this certificate (PEM)")
    serve.add_argument("--tls-key-file", type=Path, help="the private key of --tls-cert-file")
    serve.add_argument(
        "--tls-client-ca-file",
        type=Path,
        help="require client certificates signed by this CA (mTLS); the handshake fails otherwise",
    )
    serve.add_argument(
        "--metrics-port",
        type=int,
        help="also serve /metrics and /healthz (nothing else) over plain HTTP on every address, "
        "on this port, for Prometheus (off by default)",
    )
    serve.add_argument(
        "--views-port",
        type=int,
        help="also serve the read-only views /inventory, /explain/NAMESPACE/NAME and /healthz "
        "(nothing else) over plain HTTP on every address, on this port, for `kubectl schedext` "
        "through the API server's service proxy (off by default)",
    )
    serve.add_argument(
        "--insecure-allow-remote",
        action="store_true",
        help="allow a non-loopback --host without client certificates (anyone who can reach "
        "the port can bind pods)",
    )
    serve.set_defaults(handler=_serve)

    explain = commands.add_parser(
        "explain",
        help="why a pod fits, or does not fit, each node (asks a running schedext)",
    )
    explain.add_argument("pod", help="NAMESPACE/NAME")
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


def _serve(args: argparse.Namespace) -> int:
    from app.service.settings import load_settings  # noqa: PLC0415
    from app.service.snapshot import SnapshotError  # noqa: PLC0415

    overrides: dict[str, Any] = {}
    server = {
        key: value
        for key, value in (
            ("host", args.host),
            ("port", args.port),
            ("path_prefix", args.path_prefix),
            ("bench_endpoints", args.bench_endpoints or None),
            ("tls_cert_file", args.tls_cert_file),
            ("tls_key_file", args.tls_key_file),
            ("tls_client_ca_file", args.tls_client_ca_file),
            ("insecure_allow_remote", args.insecure_allow_remote or None),
            ("metrics_port", args.metrics_port),
            ("views_port", args.views_port),
        )
        if value is not None
    }
    if server:
        overrides["server"] = server
    for key in ("snapshot", "kubeconfig", "log_level"):
        if getattr(args, key) is not None:
            overrides[key] = getattr(args, key)
    if args.leader_elect:
        overrides["leader"] = {"enabled": True}
    try:
        settings = load_settings(args.config, **overrides)
    except (ValidationError, FileNotFoundError) as error:
        print(f"schedext: invalid settings: {error}", file=sys.stderr)
        return 2
    logs.configure(settings.log_level)
    try:
        return _run(settings)
    except SnapshotError as error:
        print(f"schedext: {error}", file=sys.stderr)
        return 2


def _run(settings: Settings) -> int:
    import uvicorn  # noqa: PLC0415 (keep `schedext --help` fast)

    from app.service.main import create_app, live_cluster_configured  # noqa: PLC0415
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
    log.info(
        "listening",
        extra={
            "url": f"{'https' if settings.server.tls_cert_file else 'http'}://"
            f"{settings.server.host}:{settings.server.port}",
            "inventory": service.description,
        },
    )
    server = uvicorn.Server(
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
        )
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

    from app.plugin.tables import explanation_text  # noqa: PLC0415

    namespace, _, name = args.pod.partition("/")
    if not namespace or not name:
        print("schedext explain: give the pod as NAMESPACE/NAME", file=sys.stderr)
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
