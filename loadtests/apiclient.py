"""CPU per Kubernetes API call of schedext's client, beside aiohttp alone.

Every scheduled pod costs schedext one Binding POST and two pod watch events, so the client's
own cost is paid per pod. This starts a stand-in API server in a child process (aiohttp on
127.0.0.1, plain HTTP or with ``--tls`` HTTPS: it answers Bindings and streams pod watch
events) and measures, in this process, CPU time per operation for KubeApi (app/kube/api.py)
and for the same requests made with aiohttp's client directly, in alternating repetitions. It
prints medians and the ratio.

Watch events come as fast as the server writes them, many to a read; with ``--event-gap-ms``
the server waits between them, so that each arrives in a read of its own, as a few hundred
events a second do in a cluster: then the cost per read (TLS, the parser, the wake-ups) is
what counts. The watch row then also shows a bare protocol that only counts the lines, the
floor of any client on this event loop.

    python -m loadtests.apiclient --requests 3000 --events 20000 --reps 5
    python -m loadtests.apiclient --tls --event-gap-ms 1 --events 3000 --reps 5
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import uvloop
from aiohttp import web

from app.kube.api import KubeApi
from app.kube.config import ClusterConfig
from loadtests import payloads
from testbed.pki import CertAuthority

TOKEN = "bench-token"  # noqa: S105 (the stand-in server checks nothing)
BINDING_PATH = "/api/v1/namespaces/bench/pods/bench-pod/binding"
WATCH_PATH = "/api/v1/pods"
BINDING = {
    "apiVersion": "v1",
    "kind": "Binding",
    "metadata": {
        "name": "bench-pod",
        "namespace": "bench",
        "uid": "bench-pod-uid",
        "annotations": {"schedext.io/gpu-ids": "0,1"},
    },
    "target": {"apiVersion": "v1", "kind": "Node", "name": "gpu-node-0001"},
}
STATUS = orjson.dumps({"kind": "Status", "apiVersion": "v1", "status": "Success", "code": 201})
WARMUP = 200


@dataclass(frozen=True)
class Target:
    """Where the stand-in listens, and how a client trusts it."""

    url: str
    tls: ssl.SSLContext | None  # None: plain HTTP
    gap_ms: float  # the server's wait between two watch events

    def config(self) -> ClusterConfig:
        return ClusterConfig(server=self.url, ssl_context=self.tls or False, token=TOKEN)


Measure = Callable[[Target, int], Coroutine[Any, Any, float]]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=3000, help="Binding POSTs per rep")
    parser.add_argument("--events", type=int, default=20000, help="watch events per rep")
    parser.add_argument("--reps", type=int, default=5, help="alternating repetitions")
    parser.add_argument("--tls", action="store_true", help="HTTPS, as a real API server")
    parser.add_argument(
        "--event-gap-ms",
        type=float,
        default=0.0,
        help="the server waits this long between watch events (default 0: back to back)",
    )
    parser.add_argument("--json", type=Path, help="also write the figures as JSON here")
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)  # the child process
    parser.add_argument("--pki", type=Path, help=argparse.SUPPRESS)  # the child's TLS files
    args = parser.parse_args(argv)
    if args.serve is not None:
        _serve(args.serve, args.pki)
        return 0
    with tempfile.TemporaryDirectory(prefix="apiclient-") as scratch:
        pki, client_tls = _pki(Path(scratch)) if args.tls else (None, None)
        port = _free_port()
        command = [sys.executable, "-m", "loadtests.apiclient", "--serve", str(port)]
        command += ["--pki", str(pki)] if pki else []
        server = subprocess.Popen(command)  # noqa: S603 (this module, this interpreter)
        try:
            _wait_for(port)
            scheme = "https" if args.tls else "http"
            target = Target(f"{scheme}://127.0.0.1:{port}", client_tls, args.event_gap_ms)
            results = _measure_all(target, args.requests, args.events, args.reps)
        finally:
            server.terminate()
            server.wait(timeout=10)
    _print(results, target)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


def _pki(directory: Path) -> tuple[Path, ssl.SSLContext]:
    ca = CertAuthority.create(directory, "apiclient-ca")
    cert, key = ca.issue_cert("kube-apiserver", sans=["127.0.0.1"])
    (directory / "server.crt").write_bytes(cert.read_bytes())
    (directory / "server.key").write_bytes(key.read_bytes())
    return directory, ssl.create_default_context(cafile=str(ca.cert_path))


def _measure_all(target: Target, requests: int, events: int, reps: int) -> list[dict[str, Any]]:
    cases: dict[str, tuple[int, dict[str, Measure]]] = {
        "binding POST": (requests, {"kubeapi": _kube_posts, "aiohttp": _raw_posts}),
        "watch event": (
            events,
            {"kubeapi": _kube_events, "aiohttp": _raw_events, "bare": _bare_events},
        ),
    }
    rows = []
    for operation, (count, clients) in cases.items():
        samples: dict[str, list[float]] = {name: [] for name in clients}
        for _ in range(reps):
            for name, measure in clients.items():
                samples[name].append(uvloop.run(measure(target, count)))
        row: dict[str, Any] = {"operation": operation, "count": count, "reps": reps}
        for name, values in samples.items():
            row[f"{name}_us"] = statistics.median(values) * 1e6
        row["ratio"] = row["kubeapi_us"] / row["aiohttp_us"]
        rows.append(row)
    return rows


async def _cpu_per_call(call: Callable[[], Awaitable[object]], count: int) -> float:
    for _ in range(WARMUP):
        await call()
    started = time.process_time()
    for _ in range(count):
        await call()
    return (time.process_time() - started) / count


async def _kube_posts(target: Target, count: int) -> float:
    api = KubeApi(target.config())
    try:
        return await _cpu_per_call(lambda: api.post(BINDING_PATH, BINDING), count)
    finally:
        await api.close()


def _session(target: Target) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(ssl=target.tls or False),
        cookie_jar=aiohttp.DummyCookieJar(),
    )


async def _raw_posts(target: Target, count: int) -> float:
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    async with _session(target) as session:

        async def post() -> object:
            async with session.post(
                target.url + BINDING_PATH, data=orjson.dumps(BINDING), headers=headers
            ) as response:
                return orjson.loads(await response.read())

        return await _cpu_per_call(post, count)


def _watch_query(target: Target, count: int) -> dict[str, str]:
    return {"watch": "1", "count": str(count), "gap_ms": str(target.gap_ms)}


async def _kube_events(target: Target, count: int) -> float:
    api = KubeApi(target.config())
    seen = 0

    def count_line(_: bytes) -> None:
        nonlocal seen
        seen += 1

    try:
        started = time.process_time()
        params = _watch_query(target, count)
        await api.watch_lines(WATCH_PATH, params, read_timeout=30, on_line=count_line)
        return _per_event(started, seen, count)
    finally:
        await api.close()


async def _raw_events(target: Target, count: int) -> float:
    async with _session(target) as session:
        started = time.process_time()
        seen = 0
        params = _watch_query(target, count)
        async with session.get(target.url + WATCH_PATH, params=params) as response:
            buffer = b""
            while chunk := await response.content.readany():
                *complete, buffer = (buffer + chunk).split(b"\n")
                seen += len(complete)
        return _per_event(started, seen, count)


class _Counter(asyncio.Protocol):
    """The floor: a connection that only counts line breaks (headers' included)."""

    def __init__(self, closed: asyncio.Future[int]) -> None:
        self.closed, self.breaks = closed, 0

    def data_received(self, data: bytes) -> None:
        self.breaks += data.count(b"\n")

    def connection_lost(self, _: Exception | None) -> None:
        self.closed.set_result(self.breaks)


async def _bare_events(target: Target, count: int) -> float:
    loop = asyncio.get_running_loop()
    closed: asyncio.Future[int] = loop.create_future()
    query = "&".join(f"{k}={v}" for k, v in _watch_query(target, count).items())
    started = time.process_time()
    transport, _ = await loop.create_connection(
        lambda: _Counter(closed),
        "127.0.0.1",
        int(target.url.rsplit(":", 1)[1]),
        ssl=target.tls,
        server_hostname="127.0.0.1" if target.tls else None,
    )
    head = f"GET {WATCH_PATH}?{query} HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n"
    transport.write(head.encode())
    breaks = await closed
    # Every event is a line, and so is each chunk's size line and break: at least 2 a line.
    if breaks < 2 * count:
        raise RuntimeError(f"the watch delivered {breaks} line breaks for {count} events")
    return (time.process_time() - started) / count


def _per_event(started: float, seen: int, count: int) -> float:
    if seen != count:
        raise RuntimeError(f"the watch delivered {seen} of {count} events")
    return (time.process_time() - started) / count


def _serve(port: int, pki: Path | None) -> None:
    pod = payloads.make_pod("bench-pod", gpus=2, model="H100", uid="bench-pod-uid")
    event = orjson.dumps({"type": "MODIFIED", "object": pod}) + b"\n"

    async def binding(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(body=STATUS, status=201, content_type="application/json")

    async def watch(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        response.content_type = "application/json"
        await response.prepare(request)
        gap_s = float(request.query.get("gap_ms", "0")) / 1000
        for _ in range(int(request.query["count"])):
            await response.write(event)  # one event per write, as the API server sends them
            if gap_s:
                await asyncio.sleep(gap_s)
        await response.write_eof()
        return response

    tls = None
    if pki is not None:
        tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        tls.load_cert_chain(pki / "server.crt", pki / "server.key")
    app = web.Application()
    app.router.add_post(BINDING_PATH, binding)
    app.router.add_get(WATCH_PATH, watch)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None, ssl_context=tls)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _wait_for(port: int, limit_s: float = 15.0) -> None:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"the stand-in API server did not listen on {port} within {limit_s:g}s")


def _print(rows: list[dict[str, Any]], target: Target) -> None:
    print(f"{'operation':<14}{'count':>8}{'KubeApi µs':>12}{'aiohttp µs':>12}{'ratio':>8}  bare µs")
    for row in rows:
        bare = f"{row['bare_us']:>9.0f}" if "bare_us" in row else ""
        print(
            f"{row['operation']:<14}{row['count']:>8}{row['kubeapi_us']:>12.0f}"
            f"{row['aiohttp_us']:>12.0f}{row['ratio']:>8.2f}{bare}"
        )
    wire = "HTTPS" if target.tls else "plain HTTP"
    print(
        f"CPU per operation in this process (the client), medians of the repetitions; {wire}, "
        f"{target.gap_ms:g} ms between watch events"
    )


if __name__ == "__main__":
    sys.exit(main())
