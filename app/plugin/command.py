"""``kubectl-schedext``: the console script kubectl runs for ``kubectl schedext ...``.

Each subcommand reads one of schedext's read-only views through the API server
(app.plugin.access) and prints it as a table (app.plugin.tables), or as JSON with ``-o json``.

Exit codes: 0 done; 1 schedext or the API server could not answer (the message says why);
2 a usage error, or a kubeconfig that is no YAML mapping (the message names its line); 130
interrupted; 141 stdout closed early (``| head``): quietly, as kubectl and other Unix tools
end on SIGPIPE, so that ``set -o pipefail`` scripts see the same."""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from app import __version__
from app.kube.config import KubeconfigError
from app.plugin import tables
from app.plugin.access import (
    DEFAULT_NAMESPACE,
    DEFAULT_SERVICE,
    VIEWS_PORT,
    AccessError,
    NotFoundError,
    Target,
    Views,
)
from app.stdio.pipes import reader_gone

__all__ = ["main"]

PROG = "kubectl schedext"
INTERRUPTED = 130  # 128 + SIGINT
# A namespace is a DNS label, a pod name a DNS subdomain.
_NAMESPACE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_POD = re.compile(r"[a-z0-9]([-.a-z0-9]{0,251}[a-z0-9])?")


class _UsageError(Exception):
    pass


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command is None:
        _parser().print_help()
        return 2
    try:
        text = _run(args)
    except (_UsageError, KubeconfigError) as error:  # KubeconfigError: file, line, problem
        print(f"{PROG if isinstance(error, _UsageError) else 'error'}: {error}", file=sys.stderr)
        return 2
    except (AccessError, ValueError) as error:  # ValueError: no usable kubeconfig
        print(f"error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return INTERRUPTED
    except Exception as error:  # noqa: BLE001 (a person gets a sentence, never a traceback)
        print(f"error: unexpected {type(error).__name__}: {error}", file=sys.stderr)
        return 1
    return _emit(text)


def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    reach = common.add_argument_group("reaching the cluster and schedext")
    reach.add_argument("--kubeconfig", type=Path, help="the kubeconfig (default: as kubectl)")
    reach.add_argument("--context", help="the kubeconfig context (default: the current one)")
    reach.add_argument(
        "-n",
        "--namespace",
        help="the pods' namespace (default: the context's); gangs and quotas: only this one "
        "(default: every namespace)",
    )
    reach.add_argument(
        "--schedext-namespace",
        default=DEFAULT_NAMESPACE,
        help="where schedext's Service is (default %(default)s)",
    )
    reach.add_argument(
        "--service", default=DEFAULT_SERVICE, help="schedext's Service (default %(default)s)"
    )
    reach.add_argument(
        "--request-timeout",
        default="30s",
        help="how long to wait for the answer: 30, 30s, 1m (default %(default)s)",
    )
    common.add_argument(
        "-o", "--output", choices=["table", "json"], default="table", help="(default: table)"
    )

    parser = argparse.ArgumentParser(
        prog=PROG,
        description="What schedext, the GPU scheduler extender, knows: why a pod waits, GPU "
        "occupancy per node, gangs and team quotas. Read through the API server's service "
        "proxy with your kubeconfig (RBAC: the ClusterRole schedext-viewer).",
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    commands = parser.add_subparsers(dest="command")
    explain = commands.add_parser(
        "explain",
        parents=[common],
        help="why a pod is pending, or where it went",
        description="Per node, whether the pod fits and why not; the gang or quota that "
        "holds it back.",
    )
    explain.add_argument("pod", help="NAME (in -n's namespace) or NAMESPACE/NAME")
    commands.add_parser(
        "nodes",
        parents=[common],
        help="GPU, share and address occupancy per node",
        description="Per GPU node: GPUs free and in use, each device's state, the shares and "
        "pool addresses it holds; then the address pools.",
    )
    commands.add_parser(
        "gangs",
        parents=[common],
        help="pod groups: members placed of minMember, waiting, held GPUs, timed out",
        description="Per PodGroup: its phase, members placed of minMember, those waiting at "
        "the bind barrier, the GPUs held for it when it waited too long for room (HOLD: how "
        "many, where, for how long still), and how its last wait ended when it did not "
        "complete.",
    )
    commands.add_parser(
        "quotas",
        parents=[common],
        help="team quotas: min, used and max per resource",
        description="Per ElasticQuota that applies: min, used and max per resource, and "
        "whether the team borrows beyond its min.",
    )
    return parser


def _seconds(value: str) -> float:
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(s|m)?", value.strip())
    if match is None or float(match.group(1)) <= 0:
        raise _UsageError(f"--request-timeout {value!r}: give seconds, e.g. 30, 30s or 1m")
    return float(match.group(1)) * (60 if match.group(2) == "m" else 1)


def _run(args: argparse.Namespace) -> str:
    timeout = _seconds(args.request_timeout)
    for flag, value, pattern in (
        ("-n", args.namespace, _NAMESPACE),
        ("--schedext-namespace", args.schedext_namespace, _NAMESPACE),
        ("--service", args.service, _NAMESPACE),  # a Service's name is a DNS label
    ):
        if value is not None and not pattern.fullmatch(value):
            raise _UsageError(f"{flag} {value!r} is not a Kubernetes name")
    pod = _pod(args) if args.command == "explain" else None

    # Imported here: `kubectl schedext --help` needs neither the Kubernetes client's loader
    # nor aiohttp.
    from app.kube.api import KubeApi  # noqa: PLC0415
    from app.kube.config import load_user_config  # noqa: PLC0415

    user = load_user_config(args.kubeconfig, context=args.context)
    target = Target(namespace=args.schedext_namespace, service=args.service, port=VIEWS_PORT)

    async def answer() -> str:
        api = KubeApi(user.cluster, timeout=timeout)
        try:
            views = Views(api, target, timeout=timeout)
            if pod is not None:
                namespace, name = pod if pod[0] else (user.namespace, pod[1])
                return await _explain(views, namespace, name, args.output)
            return _render(args, await views.get("/inventory"))
        finally:
            await api.close()

    return asyncio.run(answer())


def _pod(args: argparse.Namespace) -> tuple[str, str]:
    """(namespace, name); the namespace "" when the context's applies."""
    namespace, _, name = args.pod.rpartition("/")
    if namespace and args.namespace and namespace != args.namespace:
        raise _UsageError(f"the pod {args.pod} is not in -n {args.namespace}")
    namespace = namespace or args.namespace or ""
    if namespace and not _NAMESPACE.fullmatch(namespace):
        raise _UsageError(f"{namespace!r} is not a namespace name")
    if not _POD.fullmatch(name):
        raise _UsageError(f"{name!r} is not a pod name")
    return namespace, name


async def _explain(views: Views, namespace: str, name: str, output: str) -> str:
    try:
        answer = await views.get(f"/explain/{namespace}/{name}")
    except NotFoundError as error:
        exists = await views.pod_exists(namespace, name)
        if exists is False:
            raise NotFoundError(f'pod "{name}" not found in namespace {namespace}') from None
        if exists:
            raise NotFoundError(
                f"{error}: the pod exists, but schedext has not been asked to place it (is its "
                "schedulerName schedext's, and does it request a resource schedext manages?)"
            ) from None
        raise
    return _json(answer) if output == "json" else tables.explanation_text(answer)


def _render(args: argparse.Namespace, inventory: dict[str, Any]) -> str:
    if args.command == "nodes":
        if args.output == "json":
            return _json({"nodes": inventory["nodes"], "pools": inventory.get("pools", [])})
        return tables.nodes_table(inventory)
    if args.command == "gangs":
        gangs = tables.gangs_of(inventory, args.namespace)
        return _json({"gangs": gangs}) if args.output == "json" else tables.gangs_table(gangs)
    quotas = tables.quotas_of(inventory, args.namespace)
    return _json(quotas) if args.output == "json" else tables.quotas_table(quotas)


def _json(value: Any) -> str:
    return json.dumps(value, indent=2)


def _emit(text: str) -> int:
    """Print ``text``; a reader that went away (``| head``) ends it quietly."""
    try:
        sys.stdout.write(text + "\n")
        sys.stdout.flush()
    except BrokenPipeError:
        return reader_gone()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
