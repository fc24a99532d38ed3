"""The agent's NVML reader, replayed from a real H100's recorded answers and from nodes
built on the same shapes (app.agent.discovery, app.agent.replay, app.agent.xid_watch)."""

from __future__ import annotations

import json
import os
import queue
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pynvml
import pytest

from app.agent import replay
from app.agent.discovery import LOST, read_node, sample_use
from app.agent.nvml import ERROR_GPU_IS_LOST, ERROR_UNKNOWN, NvmlError
from app.agent.pynvml_backend import PynvmlBackend
from app.agent.record import Recorder, record_node
from app.agent.replay import ReplayBackend
from app.agent.xid_watch import GpuFault, XidWatch
from extender.devices.gpus import HEALTHY, GpuHealth, GpuUse
from extender.devices.links import nvlink_groups
from tests.nvml_builders import (
    H100_SINGLE,
    H200_SINGLE,
    HGX_8_MINORS,
    HGX_8_NVLINK,
    HGX_MINORS,
    GpuSpec,
    bus_id,
    dumps,
    hgx_8_minors,
    hgx_8_nvlink,
    recording,
)

pytestmark = pytest.mark.unit

BOUND_S = 5.0  # how long a test waits for what must happen (it happens in milliseconds)


def h100() -> ReplayBackend:
    return ReplayBackend(H100_SINGLE)


def hgx() -> ReplayBackend:
    return ReplayBackend(HGX_8_NVLINK)


def write_atomically(path: Path, document: dict[str, Any]) -> None:
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(document))
    os.replace(temporary, path)


# ------------------------------------------------------------------------------ reading


def test_the_recorded_h100_reads_as_what_nvidia_smi_showed() -> None:
    driver, gpus = read_node(h100())
    assert driver == "580.159.04"
    assert len(gpus) == 1
    gpu = gpus[0]
    assert gpu.index == 0
    assert gpu.uuid == "GPU-6bd689b3-ef68-3720-5cdc-ad233808e299"
    assert gpu.model == "NVIDIA H100 80GB HBM3"
    assert gpu.memory_mib == 81559  # 85,520,809,984 bytes
    assert gpu.pci_bus_id == "00000000:00:06.0"
    assert gpu.numa_node is None  # "Not Supported" on that VM
    assert gpu.mig_enabled is False
    assert gpu.health == HEALTHY  # Not Supported retired pages and NVLink are no fault
    assert gpu.nvlink_peers == ()
    assert nvlink_groups(gpus) == ()


def test_the_hgx_node_reads_as_two_nvlink_quads_on_two_numa_nodes() -> None:
    _, gpus = read_node(hgx())
    assert [g.index for g in gpus] == list(range(8))
    assert len({g.uuid for g in gpus}) == 8
    assert len({g.pci_bus_id for g in gpus}) == 8
    assert [g.numa_node for g in gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert all(g.health == HEALTHY for g in gpus)
    assert nvlink_groups(gpus) == ((0, 1, 2, 3), (4, 5, 6, 7))


def test_the_committed_hgx_fixture_is_what_the_builder_builds() -> None:
    assert HGX_8_NVLINK.read_text() == dumps(hgx_8_nvlink())


def test_gpus_behind_nvswitches_are_grouped_by_nvlink_p2p() -> None:
    """Links to a switch name no GPU: the pairs are asked whether NVLink P2P works."""
    switch = "c0"
    buses = ("18", "2a", "3a", "5d")
    pairs = {0: {1}, 1: {0}, 2: {3}, 3: {2}}
    specs = [
        GpuSpec(bus=bus, numa=0, links=(switch,) * 4, p2p=frozenset(pairs[i]))
        for i, bus in enumerate(buses)
    ]
    _, gpus = read_node(ReplayBackend(calls=recording(specs)["calls"]))
    assert gpus[0].nvlink_peers == (bus_id("2a"),)
    assert nvlink_groups(gpus) == ((0, 1), (2, 3))


def test_a_lost_gpu_is_unhealthy_and_the_others_are_read() -> None:
    nvml = hgx()
    nvml.mark_lost(2)
    _, gpus = read_node(nvml)
    assert gpus[2].health == LOST == GpuHealth(False, "device lost")
    assert [g.index for g in gpus if g.health != HEALTHY] == [2]
    assert all(g.uuid for g in gpus if g.index != 2)


def test_a_gpu_lost_after_its_uuid_keeps_what_was_read() -> None:
    nvml = hgx()
    nvml.set_answer(replay.NUMA, device=1, error=(ERROR_GPU_IS_LOST, "GPU is lost"))
    _, gpus = read_node(nvml)
    assert gpus[1].health == LOST
    assert gpus[1].uuid == "GPU-5e1ec7ed-0000-4000-8000-000000000001"


@pytest.mark.parametrize(
    ("ecc", "pending", "health"),
    [
        (0, False, HEALTHY),
        (2, False, GpuHealth(False, "uncorrectable ECC errors: 2")),
        (0, True, GpuHealth(False, "retired pages pending")),
        (1, True, GpuHealth(False, "uncorrectable ECC errors: 1; retired pages pending")),
    ],
)
def test_ecc_errors_and_retired_pages_make_a_gpu_unhealthy(
    ecc: int, pending: bool, health: GpuHealth
) -> None:
    nvml = h100()
    nvml.set_ecc(0, ecc)
    nvml.set_retired_pages_pending(0, pending)
    assert read_node(nvml)[1][0].health == health


@pytest.mark.parametrize(
    "call", [replay.ECC, replay.RETIRED, replay.NUMA, replay.MIG, replay.NVLINK_STATE]
)
def test_an_optional_fact_nvml_cannot_give_is_unknown_not_a_fault(call: str) -> None:
    nvml = h100()
    args = {replay.ECC: (1, 0), replay.NVLINK_STATE: (0,)}.get(call, ())
    nvml.set_answer(call, device=0, args=args, error=(ERROR_UNKNOWN, "Unknown Error"))
    assert read_node(nvml)[1][0].health == HEALTHY


def test_a_uuid_that_cannot_be_read_fails_the_read_rather_than_publish_a_nameless_gpu() -> None:
    nvml = h100()
    nvml.set_answer(replay.UUID, device=0, error=(ERROR_UNKNOWN, "Unknown Error"))
    with pytest.raises(NvmlError) as raised:
        read_node(nvml)
    assert raised.value.code == ERROR_UNKNOWN


def test_a_call_missing_from_the_recording_says_so() -> None:
    nvml = h100()
    with pytest.raises(NvmlError, match="not in the recording"):
        nvml.uuid(1)


# ---------------------------------------------------------------------------------- use


def test_use_is_sampled_in_percent_and_mib() -> None:
    nvml = hgx()
    nvml.set_use(3, utilisation=37, memory_used_mib=20480)
    use = sample_use(nvml)
    assert use[3] == GpuUse(3, 37, 20480)
    assert use[0] == GpuUse(0, 0, 480)  # the recorded 503,316,480 bytes
    assert len(use) == 8


def test_a_lost_gpu_is_left_out_of_the_use_sample() -> None:
    nvml = hgx()
    nvml.mark_lost(5)
    assert [u.index for u in sample_use(nvml)] == [0, 1, 2, 3, 4, 6, 7]


def test_utilisation_not_reported_reads_as_zero_with_the_memory_used() -> None:
    nvml = h100()
    nvml.set_answer(replay.UTILISATION, device=0, error=(3, "Not Supported"))
    assert sample_use(nvml) == (GpuUse(0, 0, 480),)


# ----------------------------------------------------------------------- the file itself


def test_a_rewritten_recording_is_read_again(tmp_path: Path) -> None:
    path = tmp_path / "node.json"
    document = json.loads(H100_SINGLE.read_text())
    write_atomically(path, document)
    nvml = ReplayBackend(path)
    assert read_node(nvml)[1][0].health == HEALTHY
    ecc = {"call": replay.ECC, "device": 0, "args": [1, 0], "ok": 3}
    write_atomically(path, {"calls": [*document["calls"], ecc]})  # the later entry wins
    assert read_node(nvml)[1][0].health == GpuHealth(False, "uncorrectable ECC errors: 3")
    path.write_text(json.dumps({"calls": [*document["calls"], {"call": "lost", "device": 0}]}))
    assert read_node(nvml)[1][0].health == LOST  # rewritten in place, not renamed


def test_a_half_written_recording_is_ignored_until_it_parses(tmp_path: Path) -> None:
    path = tmp_path / "node.json"
    text = H100_SINGLE.read_text()
    path.write_text(text)
    nvml = ReplayBackend(path)
    path.write_text(text[: len(text) // 2])
    assert nvml.uuid(0) == "GPU-6bd689b3-ef68-3720-5cdc-ad233808e299"


def test_file_xids_are_a_log_each_delivered_once(tmp_path: Path) -> None:
    path = tmp_path / "node.json"
    calls = json.loads(H100_SINGLE.read_text())["calls"]
    first = {"call": "xid", "device": 0, "ok": 79}
    write_atomically(path, {"calls": [*calls, first]})
    nvml = ReplayBackend(path)
    nvml.xid_open()
    nvml.xid_register(0)
    assert nvml.xid_wait(10) == (0, 79)
    with pytest.raises(NvmlError) as raised:
        nvml.xid_wait(10)
    assert raised.value.code == 10  # the recorded timeout
    write_atomically(path, {"calls": [*calls, first, {"call": "xid", "device": 0, "ok": 48}]})
    assert nvml.xid_wait(1000) == (0, 48)


def test_the_recorder_writes_what_the_replay_reads() -> None:
    recorder = Recorder(hgx())
    record_node(recorder)
    replayed = ReplayBackend(calls=json.loads(json.dumps(recorder.document()))["calls"])
    assert read_node(replayed) == read_node(hgx())
    assert sample_use(replayed) == sample_use(hgx())


# ---------------------------------------------------------------------------- XID watch


class Faults:
    """The faults a watch reports, for a test to take one by one with a bound."""

    def __init__(self) -> None:
        self.queue: queue.Queue[GpuFault] = queue.Queue()

    def __call__(self, fault: GpuFault) -> None:
        self.queue.put(fault)

    def next(self) -> GpuFault:
        return self.queue.get(timeout=BOUND_S)


def watch(nvml: ReplayBackend, faults: Callable[[GpuFault], None], **kwargs: Any) -> XidWatch:
    count = nvml.device_count()
    xid_watch = XidWatch(nvml, range(count), faults, wait_ms=50, backoff_s=0.01, **kwargs)
    xid_watch.start()
    assert xid_watch.watching(BOUND_S)
    return xid_watch


def stop(xid_watch: XidWatch) -> float:
    began = time.monotonic()
    assert xid_watch.stop(timeout_s=BOUND_S)
    return time.monotonic() - began


def test_the_watch_reports_critical_xids_and_skips_application_ones() -> None:
    nvml, faults = hgx(), Faults()
    xid_watch = watch(nvml, faults)
    nvml.queue_xid(3, 13)  # a program's graphics exception: the GPU is fine
    nvml.queue_xid(3, 79)
    assert faults.next() == GpuFault(3, 79, GpuHealth(False, "XID 79: GPU fell off the bus"))
    assert stop(xid_watch) < 1.0  # within about one 50 ms wait
    assert not xid_watch.alive
    assert faults.queue.empty()


def test_a_gpu_lost_during_the_wait_is_reported_and_the_others_stay_watched() -> None:
    nvml, faults = hgx(), Faults()
    xid_watch = watch(nvml, faults)
    nvml.mark_lost(5)
    assert faults.next() == GpuFault(5, None, LOST)
    nvml.queue_xid(1, 74)
    assert faults.next() == GpuFault(1, 74, GpuHealth(False, "XID 74: NVLink error"))
    stop(xid_watch)
    assert faults.queue.empty()  # GPU 5 reported lost once


class FailingWaits(ReplayBackend):
    """Signals each event wait that failed otherwise than by a timeout."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.failed = threading.Event()

    def xid_wait(self, timeout_ms: int) -> tuple[int, int]:
        try:
            return super().xid_wait(timeout_ms)
        except NvmlError as error:
            if error.code != 10:
                self.failed.set()
            raise


def test_the_watch_outlives_nvml_errors_and_a_failing_callback() -> None:
    nvml, faults = FailingWaits(HGX_8_NVLINK), Faults()
    calls = 0

    def flaky(fault: GpuFault) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("the agent's callback broke")
        faults(fault)

    xid_watch = watch(nvml, flaky)
    nvml.set_answer(replay.WAIT, device=None, error=(ERROR_UNKNOWN, "Unknown Error"))
    assert nvml.failed.wait(BOUND_S)
    nvml.set_answer(replay.WAIT, device=None, error=(10, "Timeout"))
    nvml.queue_xid(0, 48)
    nvml.queue_xid(0, 94)
    assert faults.next() == GpuFault(0, 94, GpuHealth(False, "XID 94: contained ECC error"))
    assert calls == 2
    assert xid_watch.alive
    stop(xid_watch)


def test_the_watch_sees_xids_written_into_the_replayed_file(tmp_path: Path) -> None:
    path = tmp_path / "node.json"
    document = json.loads(HGX_8_NVLINK.read_text())
    write_atomically(path, document)
    nvml, faults = ReplayBackend(path), Faults()
    xid_watch = watch(nvml, faults)
    write_atomically(path, {"calls": [*document["calls"], {"call": "xid", "device": 6, "ok": 95}]})
    assert faults.next() == GpuFault(6, 95, GpuHealth(False, "XID 95: uncontained ECC error"))
    stop(xid_watch)


# ------------------------------------------------------------------------- real binding


def test_nvml_failing_to_start_says_what_to_check(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_driver() -> None:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_DRIVER_NOT_LOADED)

    monkeypatch.setattr(pynvml, "nvmlInit", no_driver)
    with pytest.raises(NvmlError) as raised:
        PynvmlBackend()
    assert raised.value.code == 9
    assert raised.value.message == (
        "NVML could not start: Driver Not Loaded; is the NVIDIA driver installed and the "
        "container run with the nvidia runtime?"
    )


def test_the_committed_minors_fixture_is_what_the_builder_builds() -> None:
    assert HGX_8_MINORS.read_text() == dumps(hgx_8_minors())


@pytest.mark.parametrize(
    ("fixture", "minors", "nodes"),
    [
        (HGX_8_NVLINK, list(range(8)), [f"nvidia{i}" for i in range(8)]),
        (HGX_8_MINORS, list(HGX_MINORS), [f"nvidia{m}" for m in HGX_MINORS]),
        (H200_SINGLE, [0], ["nvidia0"]),
    ],
    ids=["minors = indices", "minors != indices", "recorded H200"],
)
def test_each_gpu_reads_with_its_device_node_minor(
    fixture: Path, minors: list[int], nodes: list[str]
) -> None:
    _, gpus = read_node(ReplayBackend(fixture))
    assert [g.minor for g in gpus] == minors
    assert [g.device_node for g in gpus] == nodes


def test_a_minor_nvml_cannot_tell_falls_back_to_the_index() -> None:
    nvml = ReplayBackend(HGX_8_MINORS)
    nvml.set_answer(replay.MINOR, device=2, error=(3, "Not Supported"))
    _, gpus = read_node(nvml)
    assert (gpus[2].minor, gpus[2].device_node) == (None, "nvidia2")
    assert gpus[2].health.healthy  # an unknown minor is no fault of the GPU


def test_the_recorded_h200_reads_as_the_machine_it_was() -> None:
    driver, gpus = read_node(ReplayBackend(H200_SINGLE))
    (gpu,) = gpus
    assert (driver, gpu.model, gpu.memory_mib) == ("580.159.04", "NVIDIA H200", 143771)
    assert (gpu.numa_node, gpu.mig_enabled, gpu.health) == (None, False, HEALTHY)


def test_the_recorder_keeps_the_minors_the_replay_answers() -> None:
    recorder = Recorder(ReplayBackend(HGX_8_MINORS))
    record_node(recorder)
    replayed = ReplayBackend(calls=json.loads(json.dumps(recorder.document()))["calls"])
    assert [g.minor for g in read_node(replayed)[1]] == list(HGX_MINORS)
