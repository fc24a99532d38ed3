"""CPU per Kubernetes API call of schedext's client, beside aiohttp alone (the floor).

Every scheduled pod costs schedext one Binding POST and two pod watch events, so the client's
own cost is paid per pod. This starts a stand-in API server in a child process (aiohttp, plain
HTTP on 127.0.0.1: it answers Bindings and streams pod watch events) and measures, in this
process, CPU time per operation for KubeApi (app/kube/api.py) and for the same requests made
with aiohttp's client directly, in alternating repetitions. It prints medians and the ratio.

    python -m loadtests.apiclient --requests 3000 --events 20000 --reps 5
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import uvloop
from aiohttp import web

from app.kube.api import KubeApi
from app.kube.config import ClusterConfig
from loadtests import payloads

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

Measure = Callable[[str, int], Coroutine[Any, Any, float]]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=3000, help="Binding POSTs per rep")
    parser.add_argument("--events", type=int, default=20000, help="watch events per rep")
    parser.add_argument("--reps", type=int, default=5, help="alternating repetitions")
    parser.add_argument("--json", type=Path, help="also write the figures as JSON here")
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)  # the child process
    args = parser.parse_args(argv)
    if args.serve is not None:
        _serve(args.serve)
        return 0
    port = _free_port()
    command = [sys.executable, "-m", "loadtests.apiclient", "--serve", str(port)]
    server = subprocess.Popen(command)  # noqa: S603 (this module, this interpreter)
    try:
        _wait_for(port)
        results = _measure_all(f"http://127.0.0.1:{port}", args.requests, args.events, args.reps)
    finally:
        server.terminate()
        server.wait(timeout=10)
    _print(results)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


def _measure_all(url: str, requests: int, events: int, reps: int) -> list[dict[str, Any]]:
    cases: dict[str, tuple[int, Measure, Measure]] = {
        "binding POST": (requests, _kube_posts, _raw_posts),
        "watch event": (events, _kube_events, _raw_events),
    }
    rows = []
    for operation, (count, kube, raw) in cases.items():
        samples: dict[str, list[float]] = {"kubeapi": [], "aiohttp": []}
        for _ in range(reps):
            samples["kubeapi"].append(uvloop.run(kube(url, count)))
            samples["aiohttp"].append(uvloop.run(raw(url, count)))
        kube_us = statistics.median(samples["kubeapi"]) * 1e6
        raw_us = statistics.median(samples["aiohttp"]) * 1e6
        rows.append(
            {
                "operation": operation,
                "count": count,
                "reps": reps,
                "kubeapi_us": kube_us,
                "aiohttp_us": raw_us,
                "ratio": kube_us / raw_us,
            }
        )
    return rows


def _api(url: str) -> KubeApi:
    return KubeApi(ClusterConfig(server=url, ssl_context=False, token=TOKEN))


async def _cpu_per_call(call: Callable[[], Awaitable[object]], count: int) -> float:
    for _ in range(WARMUP):
        await call()
    started = time.process_time()
    for _ in range(count):
        await call()
    return (time.process_time() - started) / count


async def _kube_posts(url: str, count: int) -> float:
    api = _api(url)
    try:
        return await _cpu_per_call(lambda: api.post(BINDING_PATH, BINDING), count)
    finally:
        await api.close()


async def _raw_posts(url: str, count: int) -> float:
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    async with aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar()) as session:

        async def post() -> object:
            async with session.post(
                url + BINDING_PATH, data=orjson.dumps(BINDING), headers=headers
            ) as response:
                return orjson.loads(await response.read())

        return await _cpu_per_call(post, count)


async def _kube_events(url: str, count: int) -> float:
    api = _api(url)
    try:
        params = {"watch": "1", "count": str(count)}
        started = time.process_time()
        seen = 0
        async with api.stream_lines(WATCH_PATH, params, read_timeout=30) as lines:
            async for _ in lines:
                seen += 1
        return _per_event(started, seen, count)
    finally:
        await api.close()


async def _raw_events(url: str, count: int) -> float:
    async with aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar()) as session:
        params = {"watch": "1", "count": str(count)}
        started = time.process_time()
        seen = 0
        async with session.get(url + WATCH_PATH, params=params) as response:
            buffer = b""
            while chunk := await response.content.readany():
                *complete, buffer = (buffer + chunk).split(b"\n")
                seen += len(complete)
        return _per_event(started, seen, count)


def _per_event(started: float, seen: int, count: int) -> float:
    if seen != count:
        raise RuntimeError(f"the watch delivered {seen} of {count} events")
    return (time.process_time() - started) / count


def _serve(port: int) -> None:
    pod = payloads.make_pod("bench-pod", gpus=2, model="H100", uid="bench-pod-uid")
    event = orjson.dumps({"type": "MODIFIED", "object": pod}) + b"\n"

    async def binding(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(body=STATUS, status=201, content_type="application/json")

    async def watch(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        response.content_type = "application/json"
        await response.prepare(request)
        for _ in range(int(request.query["count"])):
            await response.write(event)  # one event per write, as the API server sends them
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_post(BINDING_PATH, binding)
    app.router.add_get(WATCH_PATH, watch)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


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


def _print(rows: list[dict[str, Any]]) -> None:
    print(f"{'operation':<14}{'count':>8}{'KubeApi µs':>12}{'aiohttp µs':>12}{'ratio':>8}")
    for row in rows:
        print(
            f"{row['operation']:<14}{row['count']:>8}{row['kubeapi_us']:>12.0f}"
            f"{row['aiohttp_us']:>12.0f}{row['ratio']:>8.2f}"
        )
    print("CPU per operation in this process (the client), medians of the repetitions")


if __name__ == "__main__":
    sys.exit(main())
