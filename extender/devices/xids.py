"""Which XID errors make a GPU unfit to hand out, and how to say why.

NVIDIA's driver reports faults as numbered XID events. NVIDIA's own device plugin
(k8s-device-plugin, ``internal/rm/health.go``) treats every XID as critical except a few
application errors, which a faulty program causes and which leave the GPU healthy; we follow
the same rule, so that a GPU is withdrawn here exactly when NVIDIA's plugin would withdraw it.
An XID this table does not name is still critical: new hardware brings new XIDs, and a
GPU wrongly kept in service costs more than one wrongly withdrawn until someone looks.
"""

from __future__ import annotations

from collections.abc import Mapping

from extender.devices.gpus import GpuHealth

__all__ = ["APPLICATION_XIDS", "xid_health", "xid_text"]

# Caused by the program running on the GPU, not by the GPU (k8s-device-plugin's default
# ignore list).
APPLICATION_XIDS: frozenset[int] = frozenset({13, 31, 43, 45, 68, 109})

# Short texts after NVIDIA's XID catalogue, for the reasons shown in filter results and
# events; only XIDs whose meaning is well established.
_TEXTS: Mapping[int, str] = {
    13: "graphics engine exception",
    31: "GPU memory page fault",
    32: "invalid or corrupted push buffer stream",
    38: "driver firmware error",
    43: "GPU stopped processing",
    45: "preemptive cleanup after earlier errors",
    48: "double-bit ECC error",
    61: "internal micro-controller breakpoint or warning",
    62: "internal micro-controller halt",
    63: "row remapping or page retirement event",
    64: "row remapping or page retirement failure",
    68: "video processor exception",
    69: "graphics engine class error",
    74: "NVLink error",
    79: "GPU fell off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
    109: "context switch timeout",
    119: "GSP RPC timeout",
    120: "GSP error",
}


def xid_text(xid: int) -> str:
    """``"XID 79: GPU fell off the bus"``, or ``"XID 150"`` for an XID without a text here."""
    text = _TEXTS.get(xid)
    return f"XID {xid}: {text}" if text else f"XID {xid}"


def xid_health(xid: int) -> GpuHealth | None:
    """The GPU's health after this XID, or None when the XID is an application error that
    leaves the GPU fit for the next pod."""
    if xid in APPLICATION_XIDS:
        return None
    return GpuHealth(healthy=False, reason=xid_text(xid))
