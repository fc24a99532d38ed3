"""The README's first hour (issue 33): ``scripts/first-hour`` clones the committed tree and
runs the README's commands exactly as written (install, serve, the "Try it" calls with the
answers the README shows, /ui, ``schedext config``, ``kubectl schedext --help``). It fails
when the README's text and the behaviour part. It needs the package registry (the install)
and port 8888 free, as a newcomer's machine has them."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from tests.e2e.rendering import ROOT


def port_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def test_the_readme_commands_work_as_written_from_a_fresh_clone() -> None:
    if not port_free(8888):
        pytest.fail("port 8888, the README's, is taken: the first hour cannot run as written")
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "first-hour")],
        capture_output=True,
        text=True,
        timeout=1200,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "the README's commands work as written" in done.stdout
