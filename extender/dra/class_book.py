"""The DeviceClasses the claims ledger keeps, and the two things asked of them: which class
serves an extended resource (KEP-5004), and whether a class's devices are GPUs.

A book of its own because the verbs ask it on every call of a GPU pod (does a class serve
``nvidia.com/gpu``?), so that answer is kept until a class changes, apart from the ledger's
per-node books.
"""

from __future__ import annotations

from collections.abc import Iterator

from extender.dra.classes import DeviceClass

__all__ = ["ClassBook"]


class ClassBook:
    def __init__(self, gpu_drivers: frozenset[str]) -> None:
        self._gpu_drivers = gpu_drivers
        self._classes: dict[str, DeviceClass] = {}
        self._serving: dict[str, bool] = {}  # extended resource -> a GPU class serves it

    def __len__(self) -> int:
        return len(self._classes)

    def __contains__(self, name: object) -> bool:
        return name in self._classes

    def __iter__(self) -> Iterator[DeviceClass]:
        return iter(list(self._classes.values()))

    def put(self, device_class: DeviceClass) -> None:
        self._classes[device_class.name] = device_class
        self._serving.clear()

    def remove(self, name: str) -> None:
        self._classes.pop(name, None)
        self._serving.clear()

    def serving(self, resource: str) -> DeviceClass | None:
        """The class that serves extended resource ``resource`` (``nvidia.com/gpu``): the
        newest of those naming it, the name sorted first among equals."""
        serving = sorted(
            (c for c in self._classes.values() if resource in c.serves and not c.problem),
            key=lambda c: c.name,
        )
        return max(serving, key=lambda c: c.created, default=None)

    def serves_gpus(self, resource: str) -> bool:
        """Whether a class of a GPU driver serves ``resource``: kept until the classes
        change."""
        served = self._serving.get(resource)
        if served is None:
            found = self.serving(resource)
            served = self._serving[resource] = found is not None and self.gpu_class(found.name)
        return served

    def gpu_class(self, name: str) -> bool:
        """Whether class ``name`` selects a GPU driver (or is named after one: NVIDIA's driver
        names its class after itself)."""
        if name in self._gpu_drivers:
            return True
        device_class = self._classes.get(name)
        return device_class is not None and not self._gpu_drivers.isdisjoint(device_class.drivers)
