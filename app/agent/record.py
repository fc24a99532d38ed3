"""Record what this node's NVML answers, for replay tests and ``--nvml-replay``.

Run on a GPU node (inside the agent's image, with the nvidia runtime)::

    python -m app.agent.record > node.json

It asks, through the real binding, every question the agent's reader asks and the ones it
asks only on some nodes (every link's far end, NVLink P2P between every pair, one XID wait),
and writes each answer or error in the format :mod:`app.agent.replay` reads, each entry with
its ``"device"`` (and ``"peer"``). Recording through the same interface the agent uses means
a recording holds exactly the answers a replay needs, in the shapes the replay expects.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Callable
from functools import partial
from typing import Any, TypeVar

from app.agent.discovery import read_node, sample_use
from app.agent.nvml import (
    EVENT_TYPE_XID_CRITICAL,
    MEMORY_ERROR_UNCORRECTED,
    NVLINK_LINKS,
    P2P_CAPS_NVLINK,
    VOLATILE_ECC,
    Memory,
    Nvml,
    NvmlError,
)
from app.agent.pynvml_backend import PynvmlBackend  # the driver loads only in main()
from app.agent.replay import (
    COUNT,
    DRIVER,
    ECC,
    MEMORY,
    MIG,
    MIG_CI,
    MIG_COUNT,
    MIG_GI,
    MIG_NAME,
    MIG_UUID,
    MINOR,
    NAME,
    NUMA,
    NVLINK_REMOTE,
    NVLINK_STATE,
    P2P,
    PCI,
    REGISTER,
    RETIRED,
    UTILISATION,
    UUID,
    WAIT,
    XID,
)

__all__ = ["Recorder", "main", "record_node"]

T = TypeVar("T")
_WAIT_MS = 100


class Recorder:
    """An :class:`~app.agent.nvml.Nvml` that asks another and keeps every answer."""

    def __init__(self, nvml: Nvml) -> None:
        self._nvml = nvml
        self.calls: list[dict[str, Any]] = []

    def document(self) -> dict[str, Any]:
        return {"calls": self.calls}

    def _keep(
        self,
        call: str,
        ask: Callable[[], T],
        *,
        device: int | None = None,
        args: tuple[Any, ...] = (),
        peer: int | None = None,
        shape: Callable[[T], Any] = lambda answer: answer,
    ) -> T:
        entry: dict[str, Any] = {"call": call, "args": list(args)}
        if device is not None:
            entry["device"] = device
        if peer is not None:
            entry["peer"] = peer
        try:
            answer = ask()
        except NvmlError as error:
            self.calls.append({**entry, "error": error.message, "code": error.code})
            raise
        self.calls.append({**entry, "ok": shape(answer)})
        return answer

    def driver_version(self) -> str:
        return self._keep(DRIVER, self._nvml.driver_version)

    def device_count(self) -> int:
        return self._keep(COUNT, self._nvml.device_count)

    def name(self, index: int) -> str:
        return self._keep(NAME, lambda: self._nvml.name(index), device=index)

    def uuid(self, index: int) -> str:
        return self._keep(UUID, lambda: self._nvml.uuid(index), device=index)

    def memory(self, index: int) -> Memory:
        return self._keep(
            MEMORY,
            lambda: self._nvml.memory(index),
            device=index,
            shape=lambda m: {"total": m.total, "free": m.total - m.used, "used": m.used},
        )

    def pci_bus_id(self, index: int) -> str:
        return self._keep(
            PCI, lambda: self._nvml.pci_bus_id(index), device=index, shape=lambda b: {"busId": b}
        )

    def numa_node(self, index: int) -> int:
        return self._keep(NUMA, lambda: self._nvml.numa_node(index), device=index)

    def minor_number(self, index: int) -> int:
        return self._keep(MINOR, lambda: self._nvml.minor_number(index), device=index)

    def mig_mode(self, index: int) -> tuple[int, int]:
        return self._keep(MIG, lambda: self._nvml.mig_mode(index), device=index, shape=list)

    def mig_device_count(self, index: int) -> int:
        return self._keep(MIG_COUNT, lambda: self._nvml.mig_device_count(index), device=index)

    def mig_uuid(self, index: int, mig: int) -> str:
        return self._keep(
            MIG_UUID, lambda: self._nvml.mig_uuid(index, mig), device=index, args=(mig,)
        )

    def mig_name(self, index: int, mig: int) -> str:
        return self._keep(
            MIG_NAME, lambda: self._nvml.mig_name(index, mig), device=index, args=(mig,)
        )

    def mig_gpu_instance_id(self, index: int, mig: int) -> int:
        return self._keep(
            MIG_GI, lambda: self._nvml.mig_gpu_instance_id(index, mig), device=index, args=(mig,)
        )

    def mig_compute_instance_id(self, index: int, mig: int) -> int:
        return self._keep(
            MIG_CI,
            lambda: self._nvml.mig_compute_instance_id(index, mig),
            device=index,
            args=(mig,),
        )

    def utilisation(self, index: int) -> int:
        return self._keep(
            UTILISATION,
            lambda: self._nvml.utilisation(index),
            device=index,
            shape=lambda gpu: {"gpu": gpu},
        )

    def ecc_uncorrected(self, index: int) -> int:
        args = (MEMORY_ERROR_UNCORRECTED, VOLATILE_ECC)
        return self._keep(ECC, lambda: self._nvml.ecc_uncorrected(index), device=index, args=args)

    def retired_pages_pending(self, index: int) -> int:
        return self._keep(RETIRED, lambda: self._nvml.retired_pages_pending(index), device=index)

    def nvlink_state(self, index: int, link: int) -> int:
        return self._keep(
            NVLINK_STATE, lambda: self._nvml.nvlink_state(index, link), device=index, args=(link,)
        )

    def nvlink_remote_bus_id(self, index: int, link: int) -> str:
        return self._keep(
            NVLINK_REMOTE,
            lambda: self._nvml.nvlink_remote_bus_id(index, link),
            device=index,
            args=(link,),
            shape=lambda b: {"busId": b},
        )

    def p2p_nvlink_status(self, index: int, peer: int) -> int:
        return self._keep(
            P2P,
            lambda: self._nvml.p2p_nvlink_status(index, peer),
            device=index,
            args=(P2P_CAPS_NVLINK,),
            peer=peer,
        )

    def xid_open(self) -> None:
        self._nvml.xid_open()

    def xid_register(self, index: int) -> None:
        self._keep(
            REGISTER,
            lambda: self._nvml.xid_register(index),
            device=index,
            args=(EVENT_TYPE_XID_CRITICAL,),
        )

    def xid_wait(self, timeout_ms: int) -> tuple[int, int]:
        try:
            index, xid = self._nvml.xid_wait(timeout_ms)
        except NvmlError as error:
            self.calls.append(
                {"call": WAIT, "args": [timeout_ms], "error": error.message, "code": error.code}
            )
            raise
        # A real event during the recording: replayed as one queued event.
        self.calls.append({"call": XID, "device": index, "ok": xid})
        return index, xid

    def xid_close(self) -> None:
        self._nvml.xid_close()

    def close(self) -> None:
        self._nvml.close()


def record_node(nvml: Nvml) -> None:
    """Ask ``nvml`` everything a replay of this node may be asked; failures are answers
    too, kept by a :class:`Recorder` and otherwise ignored here."""
    _quietly(lambda: read_node(nvml))
    _quietly(lambda: sample_use(nvml))
    count = nvml.device_count()
    for index in range(count):
        for link in range(NVLINK_LINKS):
            _quietly(partial(nvml.nvlink_state, index, link))
            _quietly(partial(nvml.nvlink_remote_bus_id, index, link))
        for peer in range(count):
            if peer != index:
                _quietly(partial(nvml.p2p_nvlink_status, index, peer))
    nvml.xid_open()
    try:
        for index in range(count):
            _quietly(partial(nvml.xid_register, index))
        _quietly(lambda: nvml.xid_wait(_WAIT_MS))
    finally:
        nvml.xid_close()


def _quietly(ask: Callable[[], object]) -> None:
    with contextlib.suppress(NvmlError):
        ask()


def main() -> int:
    try:
        backend = PynvmlBackend()
    except NvmlError as error:
        sys.stderr.write(f"{error}\n")
        return 1
    recorder = Recorder(backend)
    try:
        record_node(recorder)
    finally:
        backend.close()
    sys.stdout.write(json.dumps(recorder.document(), indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
