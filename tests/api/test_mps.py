"""The agent's MPS daemons as real subprocesses: a stand-in ``nvidia-cuda-mps-control`` (put on
``PATH`` here) records how it was started and listens on its pipe directory's ``control``
socket until ``nvidia-cuda-mps-control`` sends it ``quit``, as the real daemon does. The real
one needs a GPU: tests/gpu/test_mps_real.py."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.agent.mps import MpsDaemons, MpsError, MpsLayout, SubprocessMps
from extender.devices.gpus import Gpu, GpuHealth

WAIT_S = 10.0
SICK = GpuHealth(healthy=False, reason="XID 79: GPU fell off the bus")

FAKE = """#!{python}
import json, os, socket, sys

record = os.environ["FAKE_MPS_RECORD"]
control = os.path.join(os.environ["CUDA_MPS_PIPE_DIRECTORY"], "control")


def note(entry):
    with open(record, "a") as out:
        out.write(json.dumps(entry) + "\\n")


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


def uuid(index: int) -> str:
    return f"GPU-{index:08d}-0000-0000-0000-000000000000"


def node_gpus() -> list[Gpu]:
    # 0 and 3 take shares; 1 is sick, 2 is in MIG mode.
    return [
        Gpu(index=i, uuid=uuid(i), health=SICK if i == 1 else GpuHealth(), mig_enabled=i == 2)
        for i in range(4)
    ]


class Fake:
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


@pytest.fixture
def fake() -> Iterator[Fake]:
    # Short: the control socket's path must fit in 108 bytes.
    root = Path(tempfile.mkdtemp(prefix="mps-"))
    yield Fake(root)
    shutil.rmtree(root, ignore_errors=True)


def daemons(fake: Fake, gpus: list[Gpu], **timing: float) -> tuple[SubprocessMps, MpsDaemons]:
    control = SubprocessMps(fake.layout, env=fake.env, stop_grace_s=2.0)
    return control, MpsDaemons(control, lambda: gpus, **{"check_s": 0.02, **timing})


def test_one_daemon_per_sharable_gpu_with_its_own_pipes_until_quit(fake: Fake) -> None:
    async def scenario() -> None:
        control, supervisor = daemons(fake, node_gpus())
        await supervisor.check()
        await fake.until(lambda: len(fake.started()) == 2)
        by_gpu = {e["started"]: e for e in fake.started()}
        assert sorted(by_gpu) == [uuid(0), uuid(3)]
        for gpu, entry in by_gpu.items():
            assert entry["env"] == {
                "CUDA_VISIBLE_DEVICES": gpu,
                "CUDA_MPS_PIPE_DIRECTORY": str(fake.layout.pipe(gpu)),
                "CUDA_MPS_LOG_DIRECTORY": str(fake.layout.log(gpu)),
            }
            assert control.running(gpu)
        assert not control.running(uuid(1))
        task = asyncio.create_task(supervisor.run())
        await asyncio.sleep(0)  # running: its checks start nothing more (tests/unit/test_mps)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert sorted(e["quit"] for e in fake.entries() if "quit" in e) == [uuid(0), uuid(3)]
        assert not control.running(uuid(0))
        assert not control.running(uuid(3))

    asyncio.run(asyncio.wait_for(scenario(), 30))


def test_a_daemon_that_dies_is_started_again(fake: Fake) -> None:
    gpus = node_gpus()[:1]

    async def scenario() -> None:
        control, supervisor = daemons(fake, gpus, retry_first_s=0.05)
        task = asyncio.create_task(supervisor.run())
        try:
            await fake.until(lambda: len(fake.started()) == 1)
            os.kill(fake.started()[0]["pid"], signal.SIGKILL)  # our own child, by its id
            await fake.until(lambda: len(fake.started()) == 2)
            assert fake.started()[1]["pid"] != fake.started()[0]["pid"]
            await fake.until(lambda: control.running(uuid(0)))
            assert supervisor.starts == 2
        finally:
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

    asyncio.run(asyncio.wait_for(scenario(), 30))


def test_a_missing_binary_is_a_clear_error(fake: Fake) -> None:
    control = SubprocessMps(fake.layout, env={**fake.env, "PATH": str(fake.root / "empty")})

    async def scenario() -> None:
        with pytest.raises(MpsError, match="nvidia-cuda-mps-control is not on PATH"):
            await control.start(uuid(0))

    asyncio.run(scenario())
    assert not control.running(uuid(0))
