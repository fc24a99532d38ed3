"""The fence: the DeviceTaintRules schedext publishes so that DRA never hands out a GPU that
schedext's bind gave a pod (``dra.fence``, on nodes whose GPUs both the device plugin and DRA
offer).

One rule per device, ``NoSchedule``, keyed ``schedext.io/fenced`` (:class:`FenceRule`): its
name follows from the node and the device alone (:func:`fence_name`), so publishing it twice
is harmless and any replica finds the same name. What to publish and what to take back is a
diff between the rules wanted now and the fence rules the ledger sees (:func:`fence_diff`):
level-based, so a missed write is repaired by the next pass.

Which GPUs are held is the core's to say (:mod:`extender.fencing`, from the holdings); this
module knows only devices and rules, so that a bind's plan can carry the rules it needs.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final, NamedTuple

from extender.dra.slices import DeviceRef, DeviceTaint
from extender.dra.taint_rules import MANAGED_BY, TaintRule

__all__ = [
    "FENCE_EFFECT",
    "FENCE_KEY",
    "FENCE_PREFIX",
    "HELD",
    "MANAGED_BY",
    "FenceDiff",
    "FenceRule",
    "fence_diff",
    "fence_name",
    "is_fence",
]

FENCE_KEY: Final = "schedext.io/fenced"
FENCE_EFFECT: Final = "NoSchedule"  # DRA's allocator skips the device; running pods stay
FENCE_PREFIX: Final = "schedext-fence-"
HELD: Final = "held"  # the taint's value when several pods hold the GPU (shares)
_MAX_NAME: Final = 253  # a DNS-1123 subdomain
_DIGEST: Final = 8
_NOT_LABEL: Final = re.compile(r"[^a-z0-9]+")


@dataclass(frozen=True, slots=True, order=True)
class FenceRule:
    """One rule to publish: it taints ``ref``, a device on ``node``, for the pod that holds it
    (``value``: its UID, or :data:`HELD` when several do)."""

    name: str
    node: str
    ref: DeviceRef
    value: str

    @property
    def taint(self) -> DeviceTaint:
        return DeviceTaint(FENCE_KEY, self.value, FENCE_EFFECT)

    def published_as(self, rule: TaintRule) -> bool:
        """Whether ``rule``, as the API server has it, is this rule (selector and taint)."""
        selector = (rule.selects, rule.driver, rule.pool, rule.device)
        return selector == (True, *self.ref) and rule.taint == self.taint


class FenceDiff(NamedTuple):
    """What a pass writes: rules to create, rules to rewrite (their device or holder changed)
    and the names of fence rules to delete (no GPU of theirs is held any more)."""

    create: tuple[FenceRule, ...] = ()
    update: tuple[FenceRule, ...] = ()
    delete: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.create or self.update or self.delete)


def fence_name(node: str, ref: DeviceRef) -> str:
    """``schedext-fence-<node>-<device>-<digest>``: a DNS-1123 name of at most 253
    characters. The readable part is lowercased, every run of other characters becomes "-",
    and it is cut to fit; the digest of node, driver, pool and device keeps two devices apart
    whatever the cut or the case."""
    whole = "\0".join((node, *ref)).encode()
    digest = hashlib.sha256(whole).hexdigest()[:_DIGEST]
    readable = _NOT_LABEL.sub("-", f"{node}-{ref.device}".lower()).strip("-")
    room = _MAX_NAME - len(FENCE_PREFIX) - _DIGEST - 1
    readable = readable[:room].rstrip("-")
    return f"{FENCE_PREFIX}{readable}-{digest}" if readable else f"{FENCE_PREFIX}{digest}"


def is_fence(rule: TaintRule) -> bool:
    """Whether ``rule`` is one of schedext's: labelled as schedext's, or named like one."""
    return rule.managed or rule.name.startswith(FENCE_PREFIX)


def fence_diff(wanted: Iterable[FenceRule], seen: Iterable[TaintRule]) -> FenceDiff:
    """The writes that make the fence rules the API server has (``seen``: every rule the
    ledger holds; those not schedext's are left alone) exactly ``wanted``. Sorted by name."""
    ours = {rule.name: rule for rule in seen if is_fence(rule)}
    wanted = sorted({rule.name: rule for rule in wanted}.values())
    names = {rule.name for rule in wanted}
    return FenceDiff(
        create=tuple(rule for rule in wanted if rule.name not in ours),
        update=tuple(
            rule for rule in wanted if rule.name in ours and not rule.published_as(ours[rule.name])
        ),
        delete=tuple(sorted(name for name in ours if name not in names)),
    )
