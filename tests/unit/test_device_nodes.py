"""The device nodes a container is given (extender.devices.device_nodes): a GPU's by its
minor number, and a MIG device's capability nodes from the driver's mig-minors, read from
the file an H200's driver wrote."""

from __future__ import annotations

import pytest

from extender.devices.device_nodes import mig_capability_nodes, parse_mig_minors
from extender.devices.gpus import Gpu, MigSlice
from tests.nvml_builders import MIG_MINORS

MINORS = parse_mig_minors(MIG_MINORS.read_text())


def test_the_recorded_mig_minors_read_whole() -> None:
    assert (MINORS["config"], MINORS["monitor"]) == (1, 2)
    assert (MINORS["gpu0/gi0/access"], MINORS["gpu0/gi0/ci0/access"]) == (3, 4)
    assert MINORS["gpu1/gi3/ci0/access"] == 166
    assert len(MINORS) == 272  # config, monitor, and 135 capabilities of each of 2 GPUs


@pytest.mark.parametrize(
    ("gpu", "mig", "expected"),
    [
        (
            Gpu(0, "GPU-a", minor=1),
            MigSlice("1g.10gb", "MIG-a", 3, 0),
            ("nvidia-cap165", "nvidia-cap166"),
        ),
        (
            Gpu(1, "GPU-b", minor=0),
            MigSlice("1g.10gb", "MIG-b", 3, 0),
            ("nvidia-cap30", "nvidia-cap31"),
        ),
        (Gpu(0, "GPU-a"), MigSlice("1g.10gb", "MIG-a", 3, 0), ()),  # minor unknown
        (Gpu(0, "GPU-a", minor=1), MigSlice("1g.10gb", "MIG-a"), ()),  # ids unknown
        (Gpu(0, "GPU-a", minor=9), MigSlice("1g.10gb", "MIG-a", 3, 0), ()),  # not listed
    ],
    ids=["by the GPU's minor", "another GPU", "no minor", "no instance ids", "not listed"],
)
def test_a_mig_device_s_capability_nodes(
    gpu: Gpu, mig: MigSlice, expected: tuple[str, ...]
) -> None:
    nodes = mig_capability_nodes(gpu, mig, MINORS)
    assert nodes == tuple(f"nvidia-caps/{name}" for name in expected)


def test_lines_that_do_not_read_are_skipped() -> None:
    assert parse_mig_minors("gpu0/gi1/access 12\ngarbage\ngpu0/gi1/ci0/access x\n\n") == {
        "gpu0/gi1/access": 12
    }
