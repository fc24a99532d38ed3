"""Start-up as the operator reads it: "listening" with the real address once the port is bound,
"inventory synced" once it is, nothing of the kind when the port is taken; and the views
(/inventory, explain) say "not synced" until the inventory is, rather than an empty answer."""

from __future__ import annotations

import re
import socket
import subprocess
import tempfile
import time
from typing import Any

import httpx

from tests.api.conftest import Serve
from tests.api.test_cli import SCHEDEXT, json_lines
from tests.api.test_health import UnsyncedSource


def _logged_until(output: Any, process: subprocess.Popen[bytes], message: str) -> list[Any]:
    """The lines logged until one says ``message`` (within 30 s)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        output.seek(0)
        text = output.read().decode()
        lines = json_lines(text) if text.strip() else []
        if any(line.get("message") == message for line in lines):
            return lines
        assert process.poll() is None, f"schedext exited: {text}"
        time.sleep(0.1)
    raise AssertionError(f"no {message!r} line within 30 s")


def test_port_0_logs_the_port_the_system_picked_once_it_is_bound() -> None:
    with tempfile.TemporaryFile() as output:
        process = subprocess.Popen(
            [*SCHEDEXT, "serve", "--port", "0"], stdout=output, stderr=subprocess.STDOUT
        )
        try:
            lines = _logged_until(output, process, "listening")
            listening = [line for line in lines if line["message"] == "listening"]
            assert len(listening) == 1
            url = listening[0]["url"]
            assert url.startswith("http://127.0.0.1:")
            assert not url.endswith(":0")
            assert httpx.get(f"{url}/readyz", timeout=5).status_code == 200
        finally:
            process.terminate()
            process.wait(timeout=10)
    messages = [line["message"] for line in lines]
    # the demo's inventory is synced (its source says so) before the port is bound
    assert messages.index("inventory synced") < messages.index("listening")
    assert not [m for m in messages if "ready to serve" in m]


def test_a_port_in_use_gives_one_error_and_no_ready_or_listening_line() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [*SCHEDEXT, "serve", "--port", str(port)],
            capture_output=True,
            timeout=60,
            check=False,
        )
    assert done.returncode != 0
    lines = json_lines(done.stdout.decode() + done.stderr.decode())
    errors = [line for line in lines if line["level"] == "error"]
    assert len(errors) == 1, errors
    assert "address already in use" in errors[0]["message"]
    assert str(port) in errors[0]["message"]
    said = [line["message"] for line in lines]
    assert not [m for m in said if re.search(r"\bready\b|\blistening\b", m)], said


def test_before_sync_inventory_and_explain_say_not_synced(serve: Serve) -> None:
    with serve(source=UnsyncedSource()).client() as client:
        inventory = client.get("/inventory")
        explained = client.get("/explain/ml/trainer-0")
    for answer in (inventory, explained):
        assert answer.status_code == 503
        assert answer.headers["content-type"] == "application/json"
        assert answer.json()["Error"].startswith("inventory not synced: pods not listed yet")
    assert "unknown" not in explained.json()["Error"]
