"""The share limits under a real MPS daemon: the agent's daemon for GPU 0, and two processes
with the environment the agent answers for two 10 GiB shares of it. Each allocates 8 GiB
(within its share: must succeed), then 20 GiB (beyond it: must fail with out-of-memory), at
the same time. Skipped without an NVIDIA driver, ``nvidia-cuda-mps-control`` or the CUDA
driver library.

The API tier runs the same code against a stand-in daemon (tests/api/test_mps.py); this is
the one place the limits are shown to bind."""

from __future__ import annotations

import asyncio
import ctypes
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.agent.discovery import read_node
from app.agent.mps import MPS_CONTROL, MpsLayout, SubprocessMps
from app.agent.nvml import NvmlError
from app.agent.pynvml_backend import PynvmlBackend
from extender.devices.allocation import NodePod
from extender.devices.share_allocation import ShareGrant, share_envs

pytestmark = pytest.mark.gpu

SHARE_MIB = 10 * 1024
GIB = 1 << 30

# One share's process: allocate within the share, then beyond it; report what happened. It
# speaks to the CUDA driver API (libcuda, shipped with the driver) through ctypes, so the
# check needs no CUDA toolkit or framework on the machine: cuMemAlloc commits device memory,
# and under an MPS memory limit it fails with CUDA_ERROR_OUT_OF_MEMORY (2).
CLIENT = """
import ctypes, json

cuda = ctypes.CDLL("libcuda.so.1")
cuda.cuMemAlloc_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t]
cuda.cuMemFree_v2.argtypes = [ctypes.c_uint64]
OUT_OF_MEMORY = 2


def check(result, what):
    if result != 0:
        raise SystemExit(f"{what} failed with CUresult {result}")


check(cuda.cuInit(0), "cuInit")
device = ctypes.c_int()
check(cuda.cuDeviceGet(ctypes.byref(device), 0), "cuDeviceGet")
context = ctypes.c_void_p()
check(cuda.cuDevicePrimaryCtxRetain(ctypes.byref(context), device), "cuDevicePrimaryCtxRetain")
check(cuda.cuCtxSetCurrent(context), "cuCtxSetCurrent")


def attempt(gib):
    block = ctypes.c_uint64()
    result = cuda.cuMemAlloc_v2(ctypes.byref(block), gib << 30)
    if result == OUT_OF_MEMORY:
        return "out of memory"
    check(result, f"cuMemAlloc({gib} GiB)")
    check(cuda.cuMemFree_v2(block), "cuMemFree")
    return "ok"


print(json.dumps({"8": attempt(8), "20": attempt(20)}))
"""


def _cuda_driver_loads() -> bool:
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True


@pytest.fixture(scope="module")
def gpu0() -> str:
    try:
        backend = PynvmlBackend()
    except NvmlError as error:
        pytest.skip(f"no NVIDIA driver here: {error}")
    try:
        _, gpus = read_node(backend)
    finally:
        backend.close()
    if shutil.which(MPS_CONTROL) is None:
        pytest.skip(f"{MPS_CONTROL} is not on PATH")
    if not _cuda_driver_loads():
        pytest.skip("the CUDA driver library (libcuda.so.1) does not load")
    if gpus[0].mig_enabled:
        pytest.skip("GPU 0 is in MIG mode")
    if gpus[0].memory_mib < 48 * 1024:
        # Two 20 GiB attempts must fit the GPU: out of memory then means the share's limit.
        pytest.skip(f"GPU 0 has {gpus[0].memory_mib} MiB: too little to tell a limit")
    return gpus[0].uuid


@pytest.fixture
def layout() -> Iterator[MpsLayout]:
    # Short: MPS's sockets live in the pipe directory, and a unix socket path is short.
    root = Path(tempfile.mkdtemp(prefix="mps-"))
    yield MpsLayout(root)
    shutil.rmtree(root, ignore_errors=True)


def test_two_shares_each_get_their_memory_and_no_more(gpu0: str, layout: MpsLayout) -> None:
    pod = NodePod(uid="u", namespace="ml", name="share", gpus=0, shares=1)
    grant = ShareGrant(pod, (gpu0,), SHARE_MIB, 0)
    # As a share's container sees it: its one GPU, and the pipes mounted (here, in place).
    env = {
        **share_envs(grant, pipe_directory=str(layout.pipe(gpu0))),
        "CUDA_VISIBLE_DEVICES": gpu0,
    }
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == f"0={SHARE_MIB}M"

    async def scenario() -> list[dict[str, str]]:
        control = SubprocessMps(layout)
        await control.start(gpu0)
        try:
            clients = [
                await asyncio.create_subprocess_exec(
                    sys.executable,
                    "-c",
                    CLIENT,
                    env={**os.environ, **env},
                    stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.PIPE,
                )
                for _ in range(2)
            ]
            outputs = [await asyncio.wait_for(c.communicate(), 300) for c in clients]
        finally:
            await control.stop(gpu0)
        results = []
        for client, (out, err) in zip(clients, outputs, strict=True):
            assert client.returncode == 0, err.decode()[-2000:]
            results.append(json.loads(out.decode().strip().splitlines()[-1]))
        return results

    results = asyncio.run(scenario())
    print(f"two {SHARE_MIB} MiB shares of {gpu0} under MPS: {results}")  # noqa: T201
    assert results == [{"8": "ok", "20": "out of memory"}] * 2
