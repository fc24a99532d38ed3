"""When the node agent writes its live-use sample: at most once per ``interval_s``, and then
only when some GPU's utilisation or memory use moved by ``threshold`` percentage points or
more, or when the last write is ``refresh_s`` old (so that the extender, which ignores samples
older than its ``live_use_stale_s``, keeps a quiet node's sample fresh).

Each write is a Node PATCH. With the defaults (30 s, 10 points, 120 s), a cluster of 5,000
quiet nodes writes 5,000 / 120 = 42 patches a second, and a busy one at most 5,000 / 30 = 167
(docs: "The node agent")."""

from __future__ import annotations

from dataclasses import dataclass

from extender.devices.document import UseSample

__all__ = ["UseGate"]


@dataclass(slots=True)
class UseGate:
    interval_s: float = 30.0
    threshold: int = 10  # percentage points of utilisation or of memory
    refresh_s: float = 120.0
    memory_mib: tuple[int, ...] = ()  # each GPU's total, by index, for memory percent
    _last: UseSample | None = None
    _last_at: float = float("-inf")

    def due(self, sample: UseSample, now: float) -> bool:
        """Whether ``sample`` (taken at ``now``, monotonic seconds) should be written."""
        if now - self._last_at < self.interval_s:
            return False
        return (
            self._last is None
            or now - self._last_at >= self.refresh_s
            or self._moved(self._last, sample) >= self.threshold
        )

    def written(self, sample: UseSample, now: float) -> None:
        self._last, self._last_at = sample, now

    def _moved(self, old: UseSample, new: UseSample) -> int:
        before = {u.index: u for u in old.gpus}
        if set(before) != {u.index for u in new.gpus}:
            return self.threshold  # a GPU came or went (lost): always worth a write
        moved = 0
        for use in new.gpus:
            was = before[use.index]
            moved = max(moved, abs(use.utilisation - was.utilisation))
            total = self.memory_mib[use.index] if use.index < len(self.memory_mib) else 0
            if total > 0:
                delta = abs(use.memory_used_mib - was.memory_used_mib)
                moved = max(moved, round(100 * delta / total))
        return moved
