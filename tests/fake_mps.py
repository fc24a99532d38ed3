"""A stand-in ``nvidia-cuda-mps-control`` for tests, as an executable put on ``PATH``: with
``-f`` it records how it was started (its GPU and directories, its PID) and listens on its
pipe directory's ``control`` socket until a client sends ``quit``; without, it is that client,
sending what it reads on stdin, as the real control program does."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

from app.agent.mps import MpsLayout

WAIT_S = 10.0

FAKE = """#!{python}
import json, os, socket, sys

record = os.environ["FAKE_MPS_RECORD"]
control = os.path.join(os.environ["CUDA_MPS_PIPE_DIRECTORY"], "control")


def note(entry):
    with open(record, "a") as out:
        out.write(json.dumps(entry) + "\\n")


if sys.argv[1:] == ["-f"] and os.environ.get("FAKE_MPS_FAIL"):
    sys.exit(3)  # as a daemon that cannot start (no GPU, a bad directory)
if sys.argv[1:] == ["-f"]:
    keys = ("CUDA_VISIBLE_DEVICES", "CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY")
    if os.path.exists(control):
        os.unlink(control)
    server = socket.socket(socket.AF_UNIX)
    server.bind(control)
    server.listen()
    note({{"started": os.environ["CUDA_VISIBLE_DEVICES"], "pid": os.getpid(),
           "env": {{k: os.environ[k] for k in keys}}}})
    while True:
        connection, _ = server.accept()
        if connection.recv(64).strip() == b"quit":
            note({{"quit": os.environ["CUDA_VISIBLE_DEVICES"]}})
            os.unlink(control)
            sys.exit(0)
else:
    client = socket.socket(socket.AF_UNIX)
    client.connect(control)
    client.sendall(sys.stdin.read().encode())
"""


class FakeMps:
    """The stand-in under ``root/bin``, recording to ``root/record.jsonl``; ``env`` is the
    environment to run the agent's side with (its ``PATH`` finds the stand-in first)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.record = root / "record.jsonl"
        bin_dir = root / "bin"
        bin_dir.mkdir()
        script = bin_dir / "nvidia-cuda-mps-control"
        script.write_text(FAKE.format(python=sys.executable))
        script.chmod(0o755)
        self.env = {
            **os.environ,
            "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
            "FAKE_MPS_RECORD": str(self.record),
        }
        self.layout = MpsLayout(root / "mps")

    def entries(self) -> list[dict[str, Any]]:
        if not self.record.exists():
            return []
        return [json.loads(line) for line in self.record.read_text().splitlines()]

    def started(self) -> list[dict[str, Any]]:
        return [e for e in self.entries() if "started" in e]

    async def until(self, predicate: Any) -> None:
        async with asyncio.timeout(WAIT_S):
            while not predicate():
                await asyncio.sleep(0.01)
