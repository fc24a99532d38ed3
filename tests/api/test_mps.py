"""The agent's MPS daemons as real subprocesses of a stand-in ``nvidia-cuda-mps-control`` put
on ``PATH`` (tests/fake_mps.py). The real one needs a GPU: tests/gpu/test_mps_real.py."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.agent.mps import MpsDaemons, MpsError, SubprocessMps
from extender.devices.gpus import Gpu, GpuHealth
from tests.fake_mps import FakeMps

WAIT_S = 10.0
SICK = GpuHealth(healthy=False, reason="XID 79: GPU fell off the bus")


def uuid(index: int) -> str:
    return f"GPU-{index:08d}-0000-0000-0000-000000000000"


def node_gpus() -> list[Gpu]:
    # 0 and 3 take shares; 1 is sick, 2 is in MIG mode.
    return [
        Gpu(index=i, uuid=uuid(i), health=SICK if i == 1 else GpuHealth(), mig_enabled=i == 2)
        for i in range(4)
    ]


@pytest.fixture
def fake() -> Iterator[FakeMps]:
    # Short: the control socket's path must fit in 108 bytes.
    root = Path(tempfile.mkdtemp(prefix="mps-"))
    yield FakeMps(root)
    shutil.rmtree(root, ignore_errors=True)


def daemons(fake: FakeMps, gpus: list[Gpu], **timing: float) -> tuple[SubprocessMps, MpsDaemons]:
    control = SubprocessMps(fake.layout, env=fake.env, stop_grace_s=2.0)
    return control, MpsDaemons(control, lambda: gpus, **{"check_s": 0.02, **timing})


def test_one_daemon_per_sharable_gpu_with_its_own_pipes_until_quit(fake: FakeMps) -> None:
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


def test_a_daemon_that_dies_is_started_again(fake: FakeMps) -> None:
    gpus = node_gpus()[:1]

    async def scenario() -> None:
        control, supervisor = daemons(fake, gpus, retry_first_s=0.05)
        task = asyncio.create_task(supervisor.run())
        try:
            await fake.until(lambda: len(fake.started()) == 1)
            os.kill(fake.started()[0]["pid"], signal.SIGKILL)  # our own child, by its id
            await fake.until(lambda: len(fake.started()) == 2)
            assert fake.started()[1]["pid"] != fake.started()[0]["pid"]
            await fake.until(lambda: supervisor.starts == 2)  # once it listens
            assert control.running(uuid(0))
        finally:
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

    asyncio.run(asyncio.wait_for(scenario(), 30))


def test_a_missing_binary_is_a_clear_error(fake: FakeMps) -> None:
    control = SubprocessMps(fake.layout, env={**fake.env, "PATH": str(fake.root / "empty")})

    async def scenario() -> None:
        with pytest.raises(MpsError, match="nvidia-cuda-mps-control is not on PATH"):
            await control.start(uuid(0))

    asyncio.run(scenario())
    assert not control.running(uuid(0))


def test_a_daemon_that_ends_at_start_is_a_clear_error(fake: FakeMps) -> None:
    control = SubprocessMps(fake.layout, env={**fake.env, "FAKE_MPS_FAIL": "1"})

    async def scenario() -> None:
        with pytest.raises(MpsError, match="exited with code 3 at start") as failed:
            await control.start(uuid(0))
        assert str(fake.layout.log(uuid(0))) in str(failed.value)

    asyncio.run(scenario())
