"""Headless Chromium (Debian's ``chromium`` package) driven from the command line: the DOM
after the page's script ran, and screenshots. No node, npm or driver protocol needed (what
must type, click or time the page goes through :mod:`tests.ui.devtools` instead)."""

from __future__ import annotations

import os
import shutil
import signal
import struct
import subprocess
import tempfile
import zlib
from dataclasses import dataclass
from pathlib import Path

import pytest

__all__ = ["BASE_FLAGS", "Png", "chromium", "dump_dom", "fresh_profile", "read_png", "screenshot"]

TIMEOUT_S = 60
# Virtual time runs as fast as the page lets it and waits for pending fetches, so this budget
# covers the first draw and two refreshes without any real waiting.
VIRTUAL_TIME_BUDGET_MS = 5000

BASE_FLAGS = (
    "--headless",
    "--no-sandbox",  # the tests may run as root, where the sandbox refuses to start
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
    "--force-device-scale-factor=1",
)
_FLAGS = (*BASE_FLAGS, f"--virtual-time-budget={VIRTUAL_TIME_BUDGET_MS}")


def chromium() -> str:
    binary = shutil.which("chromium")
    if binary is None:
        pytest.fail(
            "the ui tests need headless Chromium, and `chromium` is not on PATH. "
            "scripts/test installs it; by hand (Debian/Ubuntu): "
            "apt-get install -y --no-install-recommends chromium",
            pytrace=False,
        )
    return binary


def fresh_profile(workdir: Path) -> tuple[Path, dict[str, str]]:
    """A new profile directory under ``workdir``, and the environment that keeps Chromium
    inside it."""
    profile = Path(tempfile.mkdtemp(prefix="chromium-profile-", dir=workdir))
    # HOME and XDG dirs point into the profile so that nothing lands in the real home.
    env = {**os.environ, "HOME": str(profile), "XDG_CONFIG_HOME": str(profile / ".config")}
    env["XDG_CACHE_HOME"] = str(profile / ".cache")
    return profile, env


def _run(workdir: Path, *args: str) -> bytes:
    """Run Chromium with a fresh profile under ``workdir``; its stdout, or a failed test."""
    profile, env = fresh_profile(workdir)
    command = [chromium(), *_FLAGS, f"--user-data-dir={profile}", *args]
    # Its own session, so that a timeout ends the renderer and helper processes too.
    with subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        start_new_session=True,
    ) as process:
        try:
            stdout, stderr = process.communicate(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
            pytest.fail(f"chromium did not finish within {TIMEOUT_S} s: {command}")
    assert process.returncode == 0, (
        f"chromium exited with {process.returncode}:\n{stderr.decode(errors='replace')[-4000:]}"
    )
    return stdout


def dump_dom(url: str, workdir: Path) -> str:
    """The serialized DOM once the page's script has drawn it."""
    return _run(workdir, "--dump-dom", url).decode()


def screenshot(url: str, path: Path, *, width: int, height: int) -> bytes:
    _run(path.parent, f"--screenshot={path}", f"--window-size={width},{height}", url)
    assert path.is_file(), f"chromium wrote no screenshot to {path}"
    return path.read_bytes()


@dataclass(frozen=True)
class Png:
    width: int
    height: int
    # The decompressed image data: per row one filter-type byte, then the filtered pixels.
    scanlines: bytes


def read_png(data: bytes) -> Png:
    """Check the signature, walk the chunks (verifying each CRC) and inflate the image data."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG file"
    pos = 8
    header: tuple[int, ...] | None = None
    idat = bytearray()
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind = data[pos + 4 : pos + 8]
        body = data[pos + 8 : pos + 8 + length]
        (crc,) = struct.unpack(">I", data[pos + 8 + length : pos + 12 + length])
        assert zlib.crc32(kind + body) == crc, f"bad CRC in the {kind!r} chunk"
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        elif kind == b"IEND":
            break
        pos += 12 + length
    assert header is not None, "no IHDR chunk"
    width, height, bit_depth, colour_type, _, _, interlace = header
    assert bit_depth == 8, f"unexpected bit depth {bit_depth}"
    assert interlace == 0, "unexpected interlaced PNG"
    channels = {0: 1, 2: 3, 4: 2, 6: 4}[colour_type]
    scanlines = zlib.decompress(bytes(idat))
    assert len(scanlines) == height * (1 + width * channels), "image data does not fill the image"
    return Png(width=width, height=height, scanlines=scanlines)
