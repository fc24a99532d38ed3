"""The kubelet's device manager, as far as a device plugin sees it, for tests: the sequence of
``GetPreferredAllocation`` and ``Allocate`` calls a real kubelet v1.36 makes while it admits
a pod (``pkg/kubelet/cm/devicemanager/manager.go``: ``Allocate``, ``devicesToAllocate``,
``allocateContainerResources``), and the books it keeps.

Per resource, for each container that asks for it (init containers first, each list in spec
order), the kubelet:

1. takes from the pod's reusable devices first, in sorted order: those of the regular init
   containers admitted before it;
2. for the rest, asks the plugin's ``GetPreferredAllocation`` with the free devices plus those
   taken in 1 (``available``), those taken in 1 (``must_include``) and the container's whole
   count (``size``), and takes the free ones of its answer, then tops up with free devices in
   sorted order;
3. calls ``Allocate`` with the devices taken, and books them to the container;
4. adds a regular init container's devices to the reusable ones, and removes a sidecar's or an
   app container's.

The transport is the caller's (:class:`Plugin`): the pure core for unit tests, gRPC for the
api and e2e tiers. A device ID is what the plugin lists (a GPU UUID, a share handle's slot, a
MIG UUID); the plugin's answer names what the container really gets.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

__all__ = ["Container", "DeviceManager", "Plugin"]


@dataclass(frozen=True)
class Container:
    """A container as the kubelet admits it: ``role`` "init", "sidecar" or "app"."""

    name: str
    count: int
    role: str = "app"


class Plugin(Protocol):
    def preferred(self, available: Sequence[str], must: Sequence[str], size: int) -> list[str]:
        """GetPreferredAllocation of one container."""
        ...

    def allocate(self, ids: Sequence[str]) -> tuple[str, ...]:
        """Allocate of one container: what it gets (NVIDIA_VISIBLE_DEVICES)."""
        ...


@dataclass
class DeviceManager:
    """One resource's books on one node: the healthy device IDs, and per pod and container
    the IDs the kubelet allocated (what it believes each holds)."""

    healthy: Sequence[str]
    plugin: Plugin
    books: dict[tuple[str, str], tuple[str, ...]] = field(default_factory=dict)

    def in_use(self) -> set[str]:
        return {i for ids in self.books.values() for i in ids}

    def admit(
        self, pod: str, containers: Iterable[Container], *, after: int | None = None
    ) -> dict[str, tuple[str, ...]]:
        """Admit the pod's containers in order (or only its first ``after``, to stop half
        way, as an agent restart test does, then call :meth:`admit` again for the rest): what
        each container got from the plugin."""
        answers: dict[str, tuple[str, ...]] = {}
        reusable: set[str] = set()
        for position, container in enumerate(containers):
            key = (pod, container.name)
            if key not in self.books and (after is None or position < after):
                ids = self._take(pod, container, reusable)
                answers[container.name] = self.plugin.allocate(ids)
                self.books[key] = ids
            held = set(self.books.get(key, ()))
            if container.role == "init":
                reusable |= held
            else:
                reusable -= held
        return answers

    def _take(self, pod: str, container: Container, reusable: set[str]) -> tuple[str, ...]:
        taken = sorted(reusable)[: container.count]
        needed = container.count - len(taken)
        if needed <= 0:
            return tuple(taken)
        free = sorted(set(self.healthy) - self.in_use())
        hint = self.plugin.preferred(sorted({*free, *taken}), list(taken), container.count)
        for device in [d for d in hint if d in free] + free:
            if needed and device not in taken:
                taken.append(device)
                needed -= 1
        if needed:
            raise AssertionError(f"the kubelet finds too few free devices for {pod}")
        return tuple(taken)
