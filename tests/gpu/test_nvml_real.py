"""The reader against a real driver: the replay tests' answers come from a recording, this
checks the live binding agrees with what the reader expects of it. Skipped where NVML cannot
start (no NVIDIA driver), so the tier runs everywhere.

With ``SCHEDEXT_GPU_REPORT=FILE`` set, what was read is written to FILE as JSON (driver,
GPUs, groups, use), to report what a machine showed.
"""

from __future__ import annotations

import json
import os
import queue
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path

import pytest

from app.agent.discovery import read_node, sample_use
from app.agent.nvml import NvmlError
from app.agent.pynvml_backend import PynvmlBackend
from app.agent.xid_watch import GpuFault, XidWatch
from extender.devices.links import nvlink_groups

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def nvml() -> Iterator[PynvmlBackend]:
    try:
        backend = PynvmlBackend()
    except NvmlError as error:
        pytest.skip(f"no NVIDIA driver here: {error}")
    try:
        yield backend
    finally:
        backend.close()


def test_the_node_reads_sanely_and_is_reported(nvml: PynvmlBackend) -> None:
    driver, gpus = read_node(nvml)
    use = sample_use(nvml)
    assert driver
    assert len(gpus) >= 1
    assert [g.index for g in gpus] == list(range(len(gpus)))
    for gpu in gpus:
        assert gpu.uuid.startswith("GPU-"), gpu
        assert gpu.memory_mib > 0, gpu
        assert gpu.model, gpu
        assert gpu.pci_bus_id, gpu
        assert gpu.health.healthy or gpu.health.reason, gpu
    assert {u.index for u in use} <= {g.index for g in gpus}
    for sample in use:
        assert 0 <= sample.utilisation <= 100, sample
        assert 0 <= sample.memory_used_mib <= gpus[sample.index].memory_mib, sample
    groups = nvlink_groups(gpus)
    report = os.environ.get("SCHEDEXT_GPU_REPORT")
    if report:
        Path(report).write_text(
            json.dumps(
                {
                    "driver": driver,
                    "gpus": [asdict(g) for g in gpus],
                    "groups": [list(g) for g in groups],
                    "use": [asdict(u) for u in use],
                },
                indent=1,
            )
        )


def test_the_xid_watch_starts_and_stops_on_the_real_driver(nvml: PynvmlBackend) -> None:
    faults: queue.Queue[GpuFault] = queue.Queue()
    watch = XidWatch(nvml, range(nvml.device_count()), faults.put, wait_ms=200)
    watch.start()
    assert watch.watching(10.0)
    assert watch.alive
    assert watch.stop(timeout_s=5.0)
    # A healthy machine raises no XID in these milliseconds; if one did, it is a real fault.
    assert faults.empty(), list(faults.queue)
