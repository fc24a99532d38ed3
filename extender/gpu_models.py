"""GPU models by id: the ``model`` column holds small interned ids, and a pod's model hint
becomes a mask over them (:meth:`GpuModels.mask`)."""

from __future__ import annotations

import numpy as np

from extender.columns import BoolArray

__all__ = ["GpuModels"]

_MASKS_MAX = 256  # bounds the cache of hint masks: pods write the hints


class GpuModels:
    def __init__(self) -> None:
        self._ids: dict[str, int] = {"": 0}
        self._names: list[str] = [""]
        # Model ids are never reused (the column keeps them), but whether a hint names a
        # product exactly depends on the nodes there now: count the nodes per model id.
        self._nodes: list[int] = [0]
        self._present = 0  # bumped when a model gains its first or loses its last node
        self._masks: dict[str | None, tuple[int, BoolArray]] = {}

    def name(self, model_id: int) -> str:
        return self._names[model_id]

    def id(self, model: str | None) -> int:
        """The model's id (0: none), interned on first sight."""
        if not model:
            return 0
        model_id = self._ids.get(model)
        if model_id is None:
            model_id = self._ids[model] = len(self._names)
            self._names.append(model)
            self._nodes.append(0)
        return model_id

    def count(self, model: str | None, delta: int) -> None:
        """A node with ``model`` came (+1) or went (-1)."""
        model_id = self.id(model)
        before = self._nodes[model_id]
        self._nodes[model_id] = before + delta
        if model_id and (before == 0) != (before + delta == 0):
            self._present += 1

    def mask(self, pattern: str | None) -> BoolArray:
        """Which model ids satisfy a pod's GPU model hint: the exact product name when a node
        in the inventory now has it, otherwise every model containing the hint, ignoring case
        ("h100")."""
        stamp = self._present
        cached = self._masks.get(pattern)
        if cached is not None and cached[0] == stamp and len(cached[1]) == len(self._names):
            return cached[1]
        mask = np.zeros(len(self._names), dtype=np.bool_)
        exact = self._ids.get(pattern) if pattern is not None else None
        if pattern is None:
            mask[:] = True
        elif exact is not None and self._nodes[exact] > 0:
            mask[exact] = True
        else:
            folded = pattern.casefold()
            for model_id, name in enumerate(self._names):
                mask[model_id] = bool(name) and folded in name.casefold()
        mask.flags.writeable = False
        if len(self._masks) >= _MASKS_MAX:
            self._masks.clear()
        self._masks[pattern] = (stamp, mask)
        return mask
