"""A stand-in Kubernetes API server for schedext's informers and binder, for benchmarks that
load schedext the way a throughput run does without a control plane.

It serves a generated cluster (a kubectl List: its nodes and bound pods) to list+watch, and
answers Bindings: each ``POST .../pods/NAME/binding`` is answered 201, then the pod watches
get the events kube-apiserver would send for a scheduled pod: MODIFIED with the pod bound (its
``spec.nodeName`` and the Binding's annotations, which confirm schedext's reservation), and
with ``--events-per-bind 2`` (the default) ADDED for a pod created meanwhile. The pods are made
from a template (the benchmark's pod) renamed ``load-pod-N`` with uid ``load-uid-N``: the
first ``--lead`` of them are pending in the first list, and each Binding creates the next.
The custom resources schedext watches when they exist (PodGroups, IPPools, IPClaims) are
missing here, as in a cluster without their CRDs; StatefulSets are an empty list. Dynamic
Resource Allocation (``resource.k8s.io``) is missing too, unless ``--dra``: then
``resource.k8s.io/v1`` serves the cluster's ResourceSlices, ResourceClaims and DeviceClasses
(none is an empty list) to list+watch, as kube-apiserver v1.36 does by default, and
DeviceTaintRules (v1beta2, behind a gate) stay missing.

Events schedext records are answered 201 and counted. Plain HTTP on 127.0.0.1, any token
accepted. ``GET /standin/stats`` answers what was served (Bindings, pod watch events, Events
recorded, requests for what it does not serve, and with ``--dra`` the lists of each DRA
collection).

    python -m loadtests.standin --cluster cluster.json --template pod.json --port 8001
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import http.client
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import orjson
import uvloop
from aiohttp import web

__all__ = ["LOAD_POD", "StandIn", "load_pod"]

JSON = dict[str, Any]
LOAD_POD = "load-pod-{}"
LOAD_UID = "load-uid-{}"
# CRDs not installed here, and no Dynamic Resource Allocation (resource.k8s.io) served.
_MISSING = ("/apis/scheduling.x-k8s.io/", "/apis/schedext.io/", "/apis/resource.k8s.io/")
DRA_V1 = "resource.k8s.io/v1"
# With --dra: the collections of resource.k8s.io/v1 served, and the kind of their items.
DRA_KINDS = {
    "resourceslices": "ResourceSlice",
    "resourceclaims": "ResourceClaim",
    "deviceclasses": "DeviceClass",
}
_STATUS = orjson.dumps({"kind": "Status", "apiVersion": "v1", "status": "Success", "code": 201})


def load_pod(template: JSON, index: int, *, node: str = "") -> JSON:
    """The benchmark's pod as ``load-pod-<index>``, pending (bound to ``node``, if given).
    Shares all but its metadata and spec's top level with ``template``: copying the whole of
    it for every event would cost the stand-in more than serving it."""
    spec = {k: v for k, v in template["spec"].items() if k != "nodeName"}
    if node:
        spec["nodeName"] = node
    meta = {
        **template["metadata"],
        "name": LOAD_POD.format(index),
        "uid": LOAD_UID.format(index),
    }
    status = {"phase": "Pending", "qosClass": "Burstable"}
    return {**template, "metadata": meta, "spec": spec, "status": status}


class _Cluster:
    """The objects served and the pod watches' subscribers."""

    def __init__(
        self, cluster: JSON, template: JSON, *, lead: int, events_per_bind: int, delay_s: float
    ) -> None:
        self.template, self.events_per_bind, self.delay_s = template, events_per_bind, delay_s
        self.version = 1000
        self.nodes = [i for i in cluster["items"] if i.get("kind") == "Node"]
        bound = [i for i in cluster["items"] if i.get("kind") == "Pod"]
        self.dra = {
            plural: [i for i in cluster["items"] if i.get("kind") == kind]
            for plural, kind in DRA_KINDS.items()
        }
        self.pods = bound + [load_pod(template, i) for i in range(lead)]
        self.created = lead
        self.watchers: set[asyncio.Queue[bytes]] = set()
        self.stats: dict[str, Any] = {
            "bindings": 0,
            "events": 0,
            "unexpected": [],
            "lists": {},
            "recorded": 0,
        }

    def listing(self, kind: str, items: list[JSON], api_version: str = "v1") -> bytes:
        meta = {"resourceVersion": str(self.version)}
        return orjson.dumps(
            {"kind": kind, "apiVersion": api_version, "metadata": meta, "items": items}
        )

    def bound(self, binding: JSON, namespace: str, name: str) -> None:
        """The events of a pod bound (and, with two per bind, of one created)."""
        meta = binding.get("metadata") or {}
        pod = load_pod(self.template, 0, node=(binding.get("target") or {}).get("name", ""))
        pod_meta = pod["metadata"]
        pod_meta.update(name=name, namespace=namespace, uid=meta.get("uid", ""))
        pod_meta["annotations"] = {**pod_meta["annotations"], **(meta.get("annotations") or {})}
        self._publish("MODIFIED", pod)
        if self.events_per_bind >= 2:
            self._publish("ADDED", load_pod(self.template, self.created))
            self.created += 1
        self.stats["bindings"] += 1

    def _publish(self, kind: str, pod: JSON) -> None:
        self.version += 1
        pod["metadata"]["resourceVersion"] = str(self.version)
        line = orjson.dumps({"type": kind, "object": pod}) + b"\n"
        for queue in self.watchers:
            queue.put_nowait(line)
        self.stats["events"] += 1


def _app(cluster: _Cluster, *, dra: bool = False) -> web.Application:
    async def nodes(request: web.Request) -> web.StreamResponse:
        if "watch" in request.query:
            return await _quiet_watch(request)
        return web.Response(body=cluster.listing("NodeList", cluster.nodes))

    async def pods(request: web.Request) -> web.StreamResponse:
        if "watch" not in request.query:
            return web.Response(body=cluster.listing("PodList", cluster.pods))
        response = await _stream(request)
        queue: asyncio.Queue[bytes] = asyncio.Queue()
        cluster.watchers.add(queue)
        try:
            while True:
                # one event per write, as kube-apiserver sends them
                await response.write(await queue.get())
        finally:
            cluster.watchers.discard(queue)

    async def statefulsets(request: web.Request) -> web.StreamResponse:
        if "watch" in request.query:
            return await _quiet_watch(request)
        return web.Response(body=cluster.listing("StatefulSetList", []))

    async def binding(request: web.Request) -> web.Response:
        body = orjson.loads(await request.read())
        if cluster.delay_s > 0:
            await asyncio.sleep(cluster.delay_s)  # kube-apiserver writing it to etcd
        cluster.bound(body, request.match_info["namespace"], request.match_info["name"])
        return web.Response(body=_STATUS, status=201, content_type="application/json")

    def dra_collection(plural: str) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        kind = f"{DRA_KINDS[plural]}List"

        async def collection(request: web.Request) -> web.StreamResponse:
            if "watch" in request.query:
                return await _quiet_watch(request)
            lists = cluster.stats["lists"]
            lists[plural] = lists.get(plural, 0) + 1
            return web.Response(body=cluster.listing(kind, cluster.dra[plural], DRA_V1))

        return collection

    async def record(request: web.Request) -> web.Response:
        """An Event schedext records (a Warning on a node, a pod's FailedScheduling): taken
        as kube-apiserver takes it, and counted."""
        await request.read()
        cluster.stats["recorded"] += 1
        return web.Response(body=_STATUS, status=201, content_type="application/json")

    async def stats(_request: web.Request) -> web.Response:
        return web.Response(body=orjson.dumps(cluster.stats), content_type="application/json")

    async def other(request: web.Request) -> web.Response:
        if not request.path.startswith(_MISSING):
            cluster.stats["unexpected"].append(f"{request.method} {request.path}")
        status = {"kind": "Status", "status": "Failure", "reason": "NotFound", "code": 404}
        return web.Response(body=orjson.dumps(status), status=404, content_type="application/json")

    app = web.Application()
    app.router.add_get("/api/v1/nodes", nodes)
    app.router.add_get("/api/v1/pods", pods)
    app.router.add_get("/apis/apps/v1/statefulsets", statefulsets)
    if dra:
        for plural in DRA_KINDS:
            app.router.add_get(f"/apis/{DRA_V1}/{plural}", dra_collection(plural))
    app.router.add_post("/api/v1/namespaces/{namespace}/pods/{name}/binding", binding)
    app.router.add_post("/api/v1/namespaces/{namespace}/events", record)
    app.router.add_get("/standin/stats", stats)
    app.router.add_route("*", "/{tail:.*}", other)
    return app


async def _stream(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse()
    response.content_type = "application/json"
    await response.prepare(request)
    return response


async def _quiet_watch(request: web.Request) -> web.StreamResponse:
    """A watch on which nothing happens, open until the client leaves."""
    response = await _stream(request)
    await asyncio.Event().wait()
    return response


async def _serve(cluster: _Cluster, port: int, *, dra: bool = False) -> None:
    runner = web.AppRunner(_app(cluster, dra=dra), access_log=None, handle_signals=True)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    await asyncio.Event().wait()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m loadtests.standin", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--cluster", type=Path, required=True, help="kubectl List JSON")
    parser.add_argument("--template", type=Path, required=True, help="the load pods' template")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--lead", type=int, default=8, help="load pods pending at the start")
    parser.add_argument("--events-per-bind", type=int, choices=(1, 2), default=2)
    parser.add_argument(
        "--binding-delay-ms",
        type=float,
        default=0.0,
        help="answer each Binding (and send its events) this long after it came",
    )
    parser.add_argument(
        "--dra",
        action="store_true",
        help="serve resource.k8s.io/v1: the cluster's ResourceSlices, ResourceClaims and "
        "DeviceClasses",
    )
    args = parser.parse_args(argv)
    cluster = _Cluster(
        orjson.loads(args.cluster.read_bytes()),
        orjson.loads(args.template.read_bytes()),
        lead=args.lead,
        events_per_bind=args.events_per_bind,
        delay_s=args.binding_delay_ms / 1000,
    )
    with contextlib.suppress(KeyboardInterrupt):
        uvloop.run(_serve(cluster, args.port, dra=args.dra))
    return 0


class StandIn:
    """The stand-in in a child process on a free loopback port, for a ``with`` block; writes
    the kubeconfig that points schedext at it."""

    def __init__(
        self,
        cluster: Path,
        template: Path,
        workdir: Path,
        *,
        name: str,
        delay_ms: float = 0.0,
        events_per_bind: int = 2,
        lead: int = 8,
        dra: bool = False,
    ) -> None:
        self.cluster, self.template, self.delay_ms = cluster, template, delay_ms
        self.events_per_bind, self.lead, self.dra = events_per_bind, lead, dra
        self.kubeconfig = workdir / f"{name}-kubeconfig.yaml"
        self.log = workdir / f"{name}-standin.log"
        self.port = _free_port()

    def __enter__(self) -> StandIn:
        command = [
            sys.executable, "-m", "loadtests.standin", "--cluster", str(self.cluster),
            "--template", str(self.template), "--port", str(self.port),
            "--binding-delay-ms", str(self.delay_ms),
            "--events-per-bind", str(self.events_per_bind), "--lead", str(self.lead),
            *(["--dra"] if self.dra else []),
        ]  # fmt: skip
        self._log = self.log.open("wb")
        # this module, this interpreter, arguments built here
        self.process = subprocess.Popen(  # noqa: S603
            command, cwd=Path(__file__).resolve().parents[1], stdout=self._log, stderr=self._log
        )
        try:
            self._wait(limit_s=30)
        except BaseException:
            self.__exit__()
            raise
        self.kubeconfig.write_text(_kubeconfig(self.port))
        return self

    def stats(self) -> JSON:
        with _closing(http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)) as conn:
            conn.request("GET", "/standin/stats")
            answer: JSON = orjson.loads(conn.getresponse().read())
            return answer

    def _wait(self, *, limit_s: float) -> None:
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the stand-in API server exited: {self._tail()}")
            try:
                self.stats()
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"the stand-in API server did not answer within {limit_s:g}s")

    def _tail(self) -> str:
        return self.log.read_text(errors="replace")[-2000:]

    def __exit__(self, *_: object) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self._log.close()


@contextlib.contextmanager
def _closing(conn: http.client.HTTPConnection) -> Iterator[http.client.HTTPConnection]:
    try:
        yield conn
    finally:
        conn.close()


def _kubeconfig(port: int) -> str:
    return f"""apiVersion: v1
kind: Config
clusters:
- name: standin
  cluster:
    server: http://127.0.0.1:{port}
users:
- name: bench
  user:
    token: bench-token
contexts:
- name: standin
  context:
    cluster: standin
    user: bench
current-context: standin
"""


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


if __name__ == "__main__":
    sys.exit(main())
