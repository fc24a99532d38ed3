"""The throughput benchmark's null extenders (loadtests/nullextender.py, loadtests/goextender)
over real HTTP, against a stand-in API server on loopback: the same checks for both, so that
the floor they measure is the protocol's and not a broken extender's."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx

from testbed.processes import free_port

TOKEN = "floor-token"  # the stand-in API server's, nothing else's
REFUSED_POD = "taken"  # the stand-in answers 409 for this pod's Binding


@dataclass
class Posted:
    path: str
    authorization: str
    content_type: str
    body: dict[str, Any]


@dataclass
class StandInApi:
    """Records every POST; answers 201, or 409 for the Binding of ``REFUSED_POD``."""

    url: str
    posted: list[Posted] = field(default_factory=list)


@contextmanager
def stand_in_api() -> Iterator[StandInApi]:
    api = StandInApi(url="")

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as kube-apiserver

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", "0"))
            api.posted.append(
                Posted(
                    path=self.path,
                    authorization=self.headers.get("Authorization", ""),
                    content_type=self.headers.get("Content-Type", ""),
                    body=json.loads(self.rfile.read(length)),
                )
            )
            refused = self.path.endswith(f"/pods/{REFUSED_POD}/binding")
            status = 409 if refused else 201
            answer = json.dumps({"kind": "Status", "code": status}).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *_: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    api.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield api
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


@contextmanager
def running(command: Sequence[str], api: StandInApi, workdir: Path) -> Iterator[httpx.Client]:
    """The extender ``command`` (given --port/--server/--token-file, Go's single-dash flags
    accept the double-dash form too) on a free port; a client once it answers /readyz."""
    token = workdir / "token"
    token.write_text(TOKEN)
    port = free_port()
    flags = ["--port", str(port), "--server", api.url, "--token-file", str(token)]
    log = (workdir / "extender.log").open("wb")
    process = subprocess.Popen(
        [*command, *flags], stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
    )
    client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10.0)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if client.get("/readyz").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                log.flush()
                raise AssertionError(
                    f"{command} did not answer: {(workdir / 'extender.log').read_text()}"
                )
            time.sleep(0.05)
        yield client
    finally:
        client.close()
        process.terminate()
        process.wait(10)
        log.close()


def check_decides_nothing(command: Sequence[str], workdir: Path) -> None:
    """Filter passes every node, prioritize scores none, bind writes one Binding and reports
    the API server's refusal; malformed arguments get an answer, not a crash."""
    names = [f"gpu-node-{i:04d}" for i in (7, 3, 11)]
    pod = {"metadata": {"name": "p", "namespace": "ns", "uid": "u-1"}}
    with stand_in_api() as api, running(command, api, workdir) as client:
        filtered = client.post("/filter", json={"Pod": pod, "Nodes": None, "NodeNames": names})
        assert filtered.status_code == 200
        result = filtered.json()
        assert result["NodeNames"] == names  # all of them, in kube-scheduler's order
        assert not result["FailedNodes"]
        assert not result["FailedAndUnresolvableNodes"]
        assert result["Error"] == ""

        scored = client.post("/prioritize", json={"Pod": pod, "NodeNames": names})
        assert scored.status_code == 200
        assert scored.json() == []

        bind = {"PodName": "p", "PodNamespace": "ns", "PodUID": "u-1", "Node": names[1]}
        bound = client.post("/bind", json=bind)
        assert bound.status_code == 200
        assert bound.json() == {"Error": ""}
        assert len(api.posted) == 1
        posted = api.posted[0]
        assert posted.path == "/api/v1/namespaces/ns/pods/p/binding"
        assert posted.authorization == f"Bearer {TOKEN}"
        assert posted.content_type == "application/json"
        assert posted.body["kind"] == "Binding"
        assert posted.body["metadata"]["uid"] == "u-1"
        assert posted.body["metadata"]["annotations"] == {"schedext.io/gpu-ids": "0"}
        assert posted.body["target"] == {"apiVersion": "v1", "kind": "Node", "name": names[1]}

        refused = client.post("/bind", json=bind | {"PodName": REFUSED_POD})
        assert refused.status_code == 200
        assert "409" in refused.json()["Error"]

        broken = client.post("/filter", content=b"{not json")
        assert broken.status_code == 200
        assert broken.json()["Error"]
        full_nodes = client.post("/filter", json={"Pod": pod, "Nodes": {"items": []}})
        assert "nodeCacheCapable" in full_nodes.json()["Error"]
        assert len(api.posted) == 2  # nothing else reached the API server


def check_shortlist(command: Sequence[str], workdir: Path) -> None:
    """With ``--shortlist 2``, filter passes the first two nodes it was given (one pod's
    call pattern under schedext's shortlist mode), and all of them when it is given fewer."""
    names = [f"gpu-node-{i:04d}" for i in (7, 3, 11)]
    pod = {"metadata": {"name": "p", "namespace": "ns", "uid": "u-1"}}
    with stand_in_api() as api, running([*command, "--shortlist", "2"], api, workdir) as client:
        for sent, kept in ((names, names[:2]), (names[:1], names[:1]), ([], [])):
            result = client.post("/filter", json={"Pod": pod, "Nodes": None, "NodeNames": sent})
            assert result.status_code == 200
            assert result.json()["NodeNames"] == kept
            assert result.json()["FailedNodes"] == {}
