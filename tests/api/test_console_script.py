"""The installed ``schedext`` console script (what ``pip install`` puts next to the Python
interpreter), not ``python -m app.cli``: a real process on a free port."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from app import __version__
from tests.api.conftest import fixture
from tests.api.server import RunningServer

SCRIPT = Path(sys.executable).parent / "schedext"


def free_port(host: str) -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


@contextmanager
def script_serve(*args: str, host: str = "127.0.0.1") -> Iterator[str]:
    """``schedext serve`` on a free port of ``host``; yields its URL once /readyz says ok."""
    port = free_port(host)
    url = f"http://{host}:{port}"
    with tempfile.TemporaryFile() as output:
        process = subprocess.Popen(
            [str(SCRIPT), "serve", "--port", str(port), *args],
            stdout=output,
            stderr=subprocess.STDOUT,
        )

        def logged() -> str:
            output.seek(0)
            return output.read().decode(errors="replace")

        try:
            deadline = time.monotonic() + 30
            while True:
                if process.poll() is not None:
                    raise AssertionError(f"schedext exited with {process.returncode}: {logged()}")
                try:
                    if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if time.monotonic() > deadline:
                    raise AssertionError(f"schedext not ready on {url} within 30 s: {logged()}")
                time.sleep(0.1)
            yield url
        finally:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)


def test_the_console_script_is_installed_next_to_the_interpreter() -> None:
    assert SCRIPT.is_file(), f"{SCRIPT} is missing: is the project installed (pip install -e .)?"
    assert os.access(SCRIPT, os.X_OK)
    version = subprocess.run(
        [str(SCRIPT), "--version"], capture_output=True, text=True, timeout=30, check=True
    )
    assert version.stdout.strip() == f"schedext {__version__}"


def test_the_console_script_serves_the_fixture_filter_from_the_demo_inventory() -> None:
    with script_serve() as url:
        response = httpx.post(f"{url}/filter", json=fixture("filter_request_nodecache_true.json"))
    assert response.status_code == 200
    answer = response.json()
    assert answer["Error"] == ""
    assert answer["NodeNames"] == ["gpu-node-a"]  # shortlist mode: no rejected node listed
    assert answer["FailedNodes"] == answer["FailedAndUnresolvableNodes"] == {}


def test_host_chooses_the_address_the_console_script_listens_on() -> None:
    # 127.0.0.2 is loopback too (127.0.0.0/8): allowed without client certificates.
    with script_serve("--host", "127.0.0.2", host="127.0.0.2") as url:
        port = int(url.rsplit(":", 1)[1])
        assert httpx.get(f"{url}/readyz", timeout=5).text == "ok"
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=5)


def test_a_non_loopback_host_without_client_certificates_is_refused() -> None:
    result = subprocess.run(
        [str(SCRIPT), "serve", "--host", "0.0.0.0", "--port", str(free_port("127.0.0.1"))],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 2
    refusal = "refusing to listen on '0.0.0.0' (server.host) without client certificates"
    assert refusal in result.stderr
    assert "Traceback" not in result.stderr


def run_into_closed_pipe(*args: str) -> subprocess.CompletedProcess[str]:
    """The console script writing into a pipe whose reader is gone, as in ``schedext explain
    ns/pod | head`` once head has its lines: the reader closes before the script writes."""
    reader, writer = os.pipe()
    os.close(reader)
    try:
        return subprocess.run(
            [str(SCRIPT), *args],
            stdout=writer,
            stderr=subprocess.PIPE,
            text=True,
            timeout=30,
            check=False,
        )
    finally:
        os.close(writer)


@pytest.mark.parametrize("output", ["text", "json"])
def test_explain_into_a_pipe_closed_early_exits_quietly_as_unix_tools_do(
    demo: RunningServer, output: str
) -> None:
    flags = ["--json"] if output == "json" else []
    result = run_into_closed_pipe("explain", "ml/llm-train-0", "--url", demo.url, *flags)
    assert (result.returncode, result.stderr) == (141, "")  # 128 + SIGPIPE, no traceback
