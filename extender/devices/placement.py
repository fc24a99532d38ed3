"""Which GPUs of one node to take for ``count`` of them, by NVLink group: the one rule both
halves use, schedext's bind for the GPUs it writes on the pod (``policy.choose_gpus``) and the
node agent for the pods schedext did not bind (``allocation.own_pick``), so that a pod lands
on the same GPUs whichever half chose them."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["pick_gpus"]


def pick_gpus(
    free: Sequence[int], groups: Sequence[Sequence[int]], count: int
) -> tuple[int, ...] | None:
    """Inside the smallest group that can hold them all (best fit keeps larger groups whole for
    larger pods), else spanning as few groups as possible, taking the fullest groups first;
    lowest indices first within a group. ``free`` in the order ties should break (ascending).
    No groups: one group of all free GPUs; free GPUs outside every group are groups of one.
    None when fewer than ``count`` are free."""
    if count <= 0:
        return ()
    if len(free) < count:
        return None
    free_set = set(free)
    fitted = [[i for i in group if i in free_set] for group in groups] or [list(free)]
    grouped = {i for group in fitted for i in group}
    fitted += [[i] for i in free if i not in grouped]  # GPUs outside any published group
    fitted = [g for g in fitted if g]
    fitting = [g for g in fitted if len(g) >= count]
    if fitting:
        best = min(fitting, key=lambda g: (len(g), g[0]))
        return tuple(best[:count])
    chosen: list[int] = []
    for group in sorted(fitted, key=lambda g: (-len(g), g[0])):
        chosen.extend(group[: count - len(chosen)])
        if len(chosen) == count:
            break
    return tuple(sorted(chosen))
