"""Which XIDs withdraw a GPU, as NVIDIA's device plugin decides (extender.devices.xids)."""

from __future__ import annotations

import pytest

from extender.devices.gpus import GpuHealth
from extender.devices.xids import APPLICATION_XIDS, xid_health

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("xid", "health"),
    [
        # Application errors: the program's fault, the GPU fit for the next pod.
        (13, None),
        (31, None),
        (43, None),
        (45, None),
        (68, None),
        (109, None),
        # Hardware and driver faults.
        (48, GpuHealth(False, "XID 48: double-bit ECC error")),
        (63, GpuHealth(False, "XID 63: row remapping or page retirement event")),
        (64, GpuHealth(False, "XID 64: row remapping or page retirement failure")),
        (74, GpuHealth(False, "XID 74: NVLink error")),
        (79, GpuHealth(False, "XID 79: GPU fell off the bus")),
        (92, GpuHealth(False, "XID 92: high single-bit ECC error rate")),
        (94, GpuHealth(False, "XID 94: contained ECC error")),
        (95, GpuHealth(False, "XID 95: uncontained ECC error")),
        (119, GpuHealth(False, "XID 119: GSP RPC timeout")),
        (120, GpuHealth(False, "XID 120: GSP error")),
        # An XID without a text is still critical (new hardware, new XIDs).
        (150, GpuHealth(False, "XID 150")),
        (1, GpuHealth(False, "XID 1")),
    ],
)
def test_xid_health(xid: int, health: GpuHealth | None) -> None:
    assert xid_health(xid) == health


def test_the_ignored_xids_are_nvidias_default_list() -> None:
    assert frozenset({13, 31, 43, 45, 68, 109}) == APPLICATION_XIDS
