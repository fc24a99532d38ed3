"""The ``schedext`` command as a user runs it: a real process on a free loopback port."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import httpx

from testbed.builders import make_node
from tests.api.conftest import fixture, write_snapshot

SCHEDEXT = [sys.executable, "-m", "app.cli"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Served:
    url: str
    process: subprocess.Popen[bytes]
    output: IO[bytes]

    def stop(self) -> str:
        """Stop the process and return everything it logged."""
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)
        self.output.seek(0)
        return self.output.read().decode()


@contextmanager
def schedext_serve(*args: str) -> Iterator[Served]:
    port = free_port()
    with tempfile.TemporaryFile() as output:
        process = subprocess.Popen(
            [*SCHEDEXT, "serve", "--port", str(port), *args],
            stdout=output,
            stderr=subprocess.STDOUT,
        )
        served = Served(f"http://127.0.0.1:{port}", process, output)
        try:
            _wait_ready(served)
            yield served
        finally:
            served.stop()


def _wait_ready(served: Served) -> None:
    deadline = time.monotonic() + 30
    while True:
        if served.process.poll() is not None:
            raise AssertionError(f"schedext exited: {served.stop()}")
        try:
            if httpx.get(f"{served.url}/readyz", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"schedext serve not ready within 30 s: {served.stop()}")
        time.sleep(0.1)


def json_lines(logs: str) -> list[dict[str, Any]]:
    """Every line the process logged, each of which must be one JSON object."""
    lines = [json.loads(line) for line in logs.splitlines() if line.strip()]
    assert lines, "nothing was logged"
    assert all(isinstance(line, dict) for line in lines)
    return lines


def test_serve_without_a_cluster_answers_the_fixture_filter_from_the_demo_inventory() -> None:
    with schedext_serve() as served:
        answer = httpx.post(
            f"{served.url}/filter", json=fixture("filter_request_nodecache_true.json")
        ).json()
        logs = served.stop()
    # shortlist mode, the default: the best node alone, and no rejected one listed
    assert answer["NodeNames"] == ["gpu-node-a"]
    assert answer["FailedNodes"] == answer["FailedAndUnresolvableNodes"] == {}
    assert any("embedded demo inventory" in line["message"] for line in json_lines(logs))


def test_filter_and_bind_decisions_are_json_lines_with_the_pod_and_the_decision() -> None:
    with schedext_serve("--log-level", "debug") as served:
        httpx.post(f"{served.url}/filter", json=fixture("filter_request_nodecache_true.json"))
        bound = httpx.post(f"{served.url}/bind", json=fixture("bind_request.json")).json()
        refused = httpx.post(f"{served.url}/bind", json=fixture("bind_request.json")).json()
        logs = json_lines(served.stop())
    assert bound == {"Error": ""}
    assert refused["Error"]  # already bound
    decisions = [line for line in logs if "decision" in line]
    filtered, bind_ok, bind_refused = decisions
    assert filtered["message"] == "filtered"
    assert filtered["level"] == "debug"  # a pod that fits somewhere: debug; nowhere: info
    assert (filtered["pod"], filtered["decision"], filtered["feasible"]) == (
        "ml/trainer-0",
        "feasible",
        1,
    )
    assert filtered["rejected"] == {"gpu_free": 1, "gpu_model": 1}  # counts by reason
    assert bind_ok["logger"] == "schedext.verbs"
    assert (bind_ok["pod"], bind_ok["node"], bind_ok["decision"]) == (
        "ml/trainer-0",
        "gpu-node-a",
        "bound",
    )
    assert len(bind_ok["gpus"]) == 2
    assert (bind_refused["pod"], bind_refused["decision"]) == ("ml/trainer-0", "refused")
    assert bind_refused["reason"] == refused["Error"]


def test_the_metrics_port_serves_metrics_and_healthz_and_nothing_else() -> None:
    metrics_port = free_port()
    with schedext_serve("--metrics-port", str(metrics_port)) as served:
        httpx.post(f"{served.url}/filter", json=fixture("filter_request_nodecache_true.json"))
        base = f"http://127.0.0.1:{metrics_port}"
        metrics = httpx.get(f"{base}/metrics")
        health = httpx.get(f"{base}/healthz")
        missing = [httpx.get(f"{base}/{path}").status_code for path in ("readyz", "inventory")]
        bind = httpx.post(f"{base}/bind", json=fixture("bind_request.json"))
        filter_on_metrics = httpx.post(f"{base}/filter", json={})
        logs = json_lines(served.stop())
    assert metrics.status_code == 200
    assert metrics.headers["content-type"].startswith("text/plain; version=0.0.4")
    assert 'schedext_request_duration_seconds_count{verb="filter"} 1.0' in metrics.text
    assert (health.status_code, health.text) == (200, "ok")
    assert missing == [404, 404]
    assert (bind.status_code, filter_on_metrics.status_code) == (404, 404)
    (listener,) = [line for line in logs if line["message"] == "metrics listener"]
    assert listener["port"] == metrics_port
    # Every address (a wildcard bind), not only loopback.
    assert set(listener["addresses"]) <= {"0.0.0.0", "::"}
    assert listener["addresses"]


def test_the_metrics_port_refuses_a_post_and_cuts_off_a_silent_client() -> None:
    metrics_port = free_port()
    with schedext_serve("--metrics-port", str(metrics_port)) as served:
        posted = httpx.post(f"http://127.0.0.1:{metrics_port}/metrics", content=b"x")
        with socket.create_connection(("127.0.0.1", metrics_port), timeout=10) as raw:
            raw.sendall(b"GET /metrics HTTP/1.1\r\n")  # and never the end of the headers
            assert raw.recv(1024) == b""  # closed after the 5 s head timeout, no answer
        assert httpx.get(f"{served.url}/readyz").status_code == 200  # the main port is fine
    assert (posted.status_code, posted.headers["allow"]) == (405, "GET, HEAD")


def test_the_views_port_answers_the_read_only_views_as_the_main_port_and_nothing_else() -> None:
    views_port, metrics_port = free_port(), free_port()
    args = ("--views-port", str(views_port), "--metrics-port", str(metrics_port))
    with schedext_serve(*args) as served:
        base = f"http://127.0.0.1:{views_port}"
        pairs = {
            path: (httpx.get(f"{served.url}{path}"), httpx.get(f"{base}{path}"))
            for path in ("/inventory", "/explain/ml/llm-train-0", "/explain/ml/nobody")
        }
        health = httpx.get(f"{base}/healthz")
        odd = [httpx.get(f"{base}{path}") for path in ("/explain/ML/x", "/explain/a/b/c")]
        # Nothing that changes anything, and none of the main port's other pages.
        missing = [httpx.get(f"{base}/{path}").status_code for path in ("readyz", "metrics", "ui")]
        bind = httpx.post(f"{base}/bind", json=fixture("bind_request.json"))
        filtered = httpx.post(f"{base}/filter", json=fixture("filter_request_nodecache_true.json"))
        posted = httpx.post(f"{base}/inventory", content=b"{}")
        metrics_views = httpx.get(f"http://127.0.0.1:{metrics_port}/inventory")
        logs = json_lines(served.stop())
    for path, (main, views) in pairs.items():
        assert (views.status_code, views.json()) == (main.status_code, main.json()), path
        assert views.headers["content-type"] == "application/json"
    assert pairs["/explain/ml/llm-train-0"][1].json()["node"] == "h100-node-1"
    assert pairs["/explain/ml/nobody"][1].status_code == 404
    assert (health.status_code, health.text) == (200, "ok")
    assert [(r.status_code, r.json()["Error"]) for r in odd] == [
        (400, "not a pod: give /explain/NAMESPACE/NAME, Kubernetes names")
    ] * 2
    assert missing == [404, 404, 404]
    assert (bind.status_code, filtered.status_code) == (404, 404)
    assert bind.text == "this port serves only /inventory, /explain/NAMESPACE/NAME and /healthz\n"
    assert (posted.status_code, posted.headers["allow"]) == (405, "GET, HEAD")
    assert metrics_views.status_code == 404  # the views are not on the metrics port
    (listener,) = [line for line in logs if line["message"] == "views listener"]
    assert listener["port"] == views_port
    assert set(listener["addresses"]) <= {"0.0.0.0", "::"}
    assert listener["addresses"]


def test_the_views_port_must_be_a_port_of_its_own() -> None:
    taken = subprocess.run(
        [*SCHEDEXT, "serve", "--metrics-port", "9090", "--views-port", "9090"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert taken.returncode == 2
    assert "server.views_port (9090) must differ from server.port and server.metrics_port" in (
        taken.stderr
    )


def test_explain_tls_options_need_an_https_url_and_a_certificate_for_a_key(
    tmp_path: Path,
) -> None:
    def explain(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*SCHEDEXT, "explain", "ml/trainer-0", *args],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )

    plain = explain("--url", "http://127.0.0.1:1", "--cacert", str(tmp_path / "ca.crt"))
    assert (plain.returncode, plain.stderr.strip()) == (
        2,
        "schedext explain: --cacert needs an https:// --url",
    )
    named = explain("--url", "http://127.0.0.1:1", "--server-name", "schedext.example")
    assert (named.returncode, named.stderr.strip()) == (
        2,
        "schedext explain: --server-name needs an https:// --url",
    )
    key_only = explain("--url", "https://127.0.0.1:1", "--key", str(tmp_path / "tls.key"))
    assert (key_only.returncode, key_only.stderr.strip()) == (
        2,
        "schedext explain: --key needs --cert",
    )
    missing = explain("--url", "https://127.0.0.1:1", "--cacert", str(tmp_path / "nope.crt"))
    assert missing.returncode == 2
    assert "cannot use the TLS files" in missing.stderr
    assert "Traceback" not in plain.stderr + named.stderr + key_only.stderr + missing.stderr


def test_serve_loads_a_snapshot_file(tmp_path: Path) -> None:
    snapshot = write_snapshot(tmp_path / "cluster.json", [make_node("only-node", gpus=2)])
    with schedext_serve("--snapshot", str(snapshot)) as served:
        answer = httpx.post(
            f"{served.url}/filter",
            json={"Pod": fixture("pod.json"), "NodeNames": ["only-node", "gpu-node-a"]},
        ).json()
    assert answer["NodeNames"] == []
    assert "GPU model is not A100" in answer["FailedAndUnresolvableNodes"]["only-node"]
    assert "node not in inventory" in answer["FailedAndUnresolvableNodes"]["gpu-node-a"]


def test_serve_loads_kubectl_yaml(tmp_path: Path) -> None:
    snapshot = tmp_path / "cluster.yaml"
    snapshot.write_text(
        "apiVersion: v1\nkind: List\nitems:\n"
        "- kind: Node\n  metadata: {name: yaml-node}\n"
        "  status: {allocatable: {cpu: '8', memory: 32Gi, nvidia.com/gpu: '4'}}\n"
    )
    with schedext_serve("--snapshot", str(snapshot)) as served:
        inventory = httpx.get(f"{served.url}/inventory").json()
    assert [(n["name"], n["freeGpus"]) for n in inventory["nodes"]] == [("yaml-node", 4)]


def test_serve_reports_an_unreadable_snapshot_clearly(tmp_path: Path) -> None:
    missing = subprocess.run(
        [*SCHEDEXT, "serve", "--snapshot", str(tmp_path / "nope.json")],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert missing.returncode == 2
    assert "cannot read snapshot" in missing.stderr
    (tmp_path / "empty.json").write_text('{"kind": "List", "items": []}')
    empty = subprocess.run(
        [*SCHEDEXT, "serve", "--snapshot", str(tmp_path / "empty.json")],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert empty.returncode == 2
    assert "contains no Node objects" in empty.stderr
    assert "Traceback" not in missing.stderr + empty.stderr


def test_serve_refuses_invalid_settings(tmp_path: Path) -> None:
    result = subprocess.run(
        [*SCHEDEXT, "serve", "--port", "99999"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 2
    # The key, the rule in words, the value and where it came from; no pydantic dump.
    assert result.stderr == (
        "schedext: invalid settings: server.port: must be between 0 and 65535 "
        "(got 99999, from --port)\n"
    )
