"""The node agent and MIG: reading a GPU's MIG devices through NVML, replayed from the MIG
fixture (built on the recorded H100's call shapes), and publishing them."""

from __future__ import annotations

import json
from dataclasses import replace

from app.agent import replay
from app.agent.discovery import LOST, read_node, sample_use
from app.agent.nvml import ERROR_GPU_IS_LOST
from app.agent.record import Recorder, record_node
from app.agent.replay import ReplayBackend
from extender.devices import MigSlice, Topology, decode_topology, encode_topology
from tests.nvml_builders import H100_MIG, dumps, h100_mig, mig_uuid

P1, P2 = "1g.10gb", "2g.20gb"
M = [mig_uuid(0, i) for i in range(4)]  # the fixture's: 1g.10gb x3, 2g.20gb


def mig_replay() -> ReplayBackend:
    return ReplayBackend(H100_MIG)


# ------------------------------------------------------------------------------ reading


def test_the_fixture_is_what_the_builder_builds() -> None:
    assert H100_MIG.read_text() == dumps(h100_mig())


def test_a_gpu_in_mig_mode_reads_with_its_mig_devices_and_the_other_whole() -> None:
    _, gpus = read_node(mig_replay())
    sliced, whole = gpus
    assert sliced.mig_enabled
    # MIG device index m is GPU instance m + 1, compute instance 0 in the fixture.
    assert sliced.migs == (
        MigSlice(P1, M[0], 1, 0),
        MigSlice(P1, M[1], 2, 0),
        MigSlice(P1, M[2], 3, 0),
        MigSlice(P2, M[3], 4, 0),
    )
    # Device nodes by minor: the fixture's GPU 0 is /dev/nvidia1, GPU 1 /dev/nvidia0.
    assert (sliced.device_node, whole.device_node) == ("nvidia1", "nvidia0")
    assert sliced.health.healthy
    assert (whole.mig_enabled, whole.migs) == (False, ())
    # A GPU in MIG mode reports no utilisation: its sample is its memory in use alone.
    assert [u.utilisation for u in sample_use(mig_replay())] == [0, 0]


def test_a_mig_device_whose_name_or_uuid_cannot_be_read_is_left_out() -> None:
    nvml = mig_replay()
    nvml.set_answer(replay.MIG_NAME, device=0, args=[0], ok="NVIDIA H100 80GB HBM3")
    nvml.set_answer(replay.MIG_UUID, device=0, args=[3], error=(999, "Unknown Error"))
    _, gpus = read_node(nvml)
    assert gpus[0].migs == (MigSlice(P1, M[1], 2, 0), MigSlice(P1, M[2], 3, 0))
    assert gpus[0].health.healthy  # an unreadable MIG device is no fault of the GPU


def test_no_mig_device_count_reads_as_no_mig_devices() -> None:
    nvml = mig_replay()
    nvml.set_answer(replay.MIG_COUNT, device=0, error=(3, "Not Supported"))
    _, gpus = read_node(nvml)
    assert (gpus[0].mig_enabled, gpus[0].migs) == (True, ())


def test_a_gpu_lost_while_its_mig_devices_are_read_is_lost() -> None:
    nvml = mig_replay()
    nvml.set_answer(replay.MIG_UUID, device=0, args=[1], error=(ERROR_GPU_IS_LOST, "GPU is lost"))
    _, gpus = read_node(nvml)
    assert gpus[0].health == LOST
    assert gpus[0].migs == ()  # what was read before it went is not published as usable


def test_the_recorder_keeps_the_mig_calls_the_replay_answers() -> None:
    recorder = Recorder(mig_replay())
    record_node(recorder)
    replayed = ReplayBackend(calls=json.loads(json.dumps(recorder.document()))["calls"])
    assert read_node(replayed) == read_node(mig_replay())
    calls = {entry["call"] for entry in recorder.calls}
    assert {replay.MIG_COUNT, replay.MIG_UUID, replay.MIG_NAME} <= calls


def test_the_published_document_carries_the_mig_devices() -> None:
    _, gpus = read_node(mig_replay())
    document = encode_topology(Topology(gpus=gpus))
    read = decode_topology(document, 1)  # the node's one whole GPU: allocatable under mixed
    # Device node minors and instance ids stay on the node: only its plugins use them.
    assert read.gpus == tuple(
        replace(
            gpu,
            minor=None,
            migs=tuple(replace(m, gpu_instance=None, compute_instance=None) for m in gpu.migs),
        )
        for gpu in gpus
    )
    assert read.mig_gpus() == (0,)
