"""What a pod asks, in words, from the ``request`` of ``GET /explain``'s answer: only what it
asks (no "0 GPUs", no "ip None"), and never a Python value's repr. The share a pod asks is
its own line (:func:`app.plugin.tables.explanation_text`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["asks_text"]

JSON = Mapping[str, Any]

_GIB, _MIB = 1 << 30, 1 << 20
# Said elsewhere (the share line) or with another key (gpuIds with the GPUs).
_ELSEWHERE = frozenset({"shares", "shareMemoryMiB", "shareCores", "gpuIds", "gpuModel"})


def asks_text(request: JSON) -> str:
    """``needs 2 A100 GPUs (GPUs 0, 1), 2 CPUs, 8 GiB of memory, priority 100000``, ``needs
    a share of one GPU``;
    ``needs nothing schedext counts`` when it asks none of it."""
    shares = request.get("shares") or 0  # its own line says how much of each
    parts = [_gpus(request), f"a share of {'one GPU' if shares == 1 else f'{shares} GPUs'}"]
    parts = parts if shares else parts[:1]
    for key, value in request.items():
        if key in _ELSEWHERE or key == "gpus" or value in (None, 0, "", [], {}):
            continue
        words = _WORDS.get(key)
        parts.append(words(value) if words is not None else f"{key} {_plain(value)}")
    said = [part for part in parts if part]
    return "needs " + (", ".join(said) if said else "nothing schedext counts")


def _gpus(request: JSON) -> str:
    """Whole GPUs (of a model, on which once placed); a model alone for a share's GPUs."""
    count, model = request.get("gpus") or 0, request.get("gpuModel")
    ids = request.get("gpuIds") or []
    if not count:
        return f"GPU model {model}" if model else ""
    text = f"{count} {model + ' ' if model else ''}GPU{'s' if count != 1 else ''}"
    if ids and not request.get("shares"):  # a share's GPUs are on its own line
        text += f" (GPU{'s' if len(ids) != 1 else ''} {', '.join(map(str, ids))})"
    return text


def _cpu(milli: int) -> str:
    if milli % 1000:
        return f"{milli}m CPU"
    return f"{milli // 1000} CPU{'s' if milli != 1000 else ''}"


def _memory(size: int) -> str:
    if size % _GIB == 0:
        return f"{size // _GIB} GiB of memory"
    if size % _MIB == 0:
        return f"{size // _MIB} MiB of memory"
    return f"{size} bytes of memory"


def _mig(devices: JSON) -> str:
    return ", ".join(
        f"{count} MIG {profile} device{'s' if count != 1 else ''}"
        for profile, count in devices.items()
    )


def _ip(ip: Any) -> str:
    """A placed pod's address, or what a pending one asks: an address, or one of its pools."""
    if not isinstance(ip, Mapping):
        return f"address {ip}"
    pools = list(ip.get("pools") or ())
    if ip.get("address"):
        text = f"address {ip['address']}"
    elif pools:
        text = f"an address from pool{'s' if len(pools) != 1 else ''} {', '.join(pools)}"
    else:
        text = "an address"
    extras = [
        f"policy {ip['policy']}" if ip.get("policy") else "",
        f"identity {ip['identity']}" if ip.get("identity") else "",
    ]
    extras = [extra for extra in extras if extra]
    return text + (f" ({', '.join(extras)})" if extras else "")


def _plain(value: Any) -> str:
    if isinstance(value, list | tuple):
        return ", ".join(map(str, value))
    if isinstance(value, Mapping):
        return ", ".join(f"{k} {v}" for k, v in value.items())
    return str(value)


_WORDS: dict[str, Callable[[Any], str]] = {
    "cpuMilli": _cpu,
    "memoryBytes": _memory,
    "mig": _mig,
    "ip": _ip,
    "priority": lambda value: f"priority {value}",
    "workload": lambda value: f"workload {value}",
    "group": lambda value: f"in gang {value}",
    "gpuMemoryMiB": lambda value: f"GPUs of at least {value} MiB",
}
