"""What one resource kind answers, so that filter, prioritize and bind never ask "which kind?".

A pod's GPU demand comes in kinds: whole GPUs, a share of some GPUs, MIG devices. Each kind
is one module of this package that implements :class:`Kind`, and one entry of
:data:`extender.kinds.KINDS`. The verbs loop over the kinds a pod asks for; what is common to
every GPU pod (a GPU node, its model and memory, CPU) stays with the verb.

The members, in the order a pod meets them:

- ``asks``: whether the pod asks for this kind at all (most pods ask one kind, or none);
- ``via_dra``: whether DRA may serve the kind's resource on nodes it owns (KEP-5004: a
  DeviceClass's ``extendedResourceName``); its conditions then fail nowhere DRA owns for a
  pod whose resource a class serves (:attr:`PodRequest.gpus_via_dra`), DRA judges there;
- ``spec_key`` / ``spec_conditions``: what the nodes' specs alone refuse (the node has too
  few GPUs of this kind at all), computed on whole columns and cached per ``spec_key`` until
  a node changes;
- ``held_conditions``: what the pods on the nodes take from it now (too few free);
- ``messages``: the filter's sentences for the reasons this kind raises, named by the pod's
  need so that kube-scheduler can aggregate them;
- ``score_gate``: the nodes prioritize must score 0, because the pod does not fit there now;
- ``choose``: the devices bind gives the pod on a node;
- ``annotations``: what bind writes on the pod for this kind beside the devices it chose;
- ``victims_check``: for preemption on one node, whether evicting a set of pods leaves the
  pod what it asks of this kind (prepared once per node: the search asks it many times);
- ``freed``: what evicting one pod frees in this kind's unit, for the preemptor that asks
  it (the search prefers the set that frees the least for nothing);
- ``freed_by_departure``, ``freed_by_node``, ``waits``, ``departure_frees``, ``node_frees``:
  which of its reasons a pod leaving a node, or a change of the node, may lift; the keys a
  pod filter turned away for them waits under (a GPU model, a MIG profile; the kind's name
  is the wait's kind and the metric's label); and what a pod leaving, or a node changing,
  frees of it (:mod:`extender.wakeups`);
- ``size``, ``pack_shape`` and ``unit``: in a gang's whole-group fit, what a member takes of
  this kind (the search's cache key), what of the kind decides which nodes it may use beside
  its count, and the member reduced to one unit (its eligible nodes are those that could give
  it one, were it free);
- ``describe`` and ``detail``: what explain shows of the pod's demand, and of a node that
  turned it away for one of this kind's reasons (None: the filter's message says it all).

The IP address a pod may ask for is not a kind: it comes from a cluster-wide pool, not from a
node's columns, and its claim outlives the pod (see :mod:`extender.addressing`, on the floor
below).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from types import MappingProxyType
from typing import NamedTuple, Protocol, TypeVar

import numpy as np
import numpy.typing as npt

from extender.config import SharePlacement
from extender.inventory import IdArray, Inventory
from extender.model import Demand, Holding, NodeSpec, PodRequest, Reason
from extender.node_state import NodeView

__all__ = [
    "BoolArray",
    "Column",
    "Conditions",
    "GpuModelWaits",
    "Kind",
    "Placed",
    "VictimsCheck",
    "frozen",
    "gpu_models",
    "gpu_node_frees",
]

BoolArray = npt.NDArray[np.bool_]
# Each (failed, reason): the nodes where ``reason`` applies. A node's verdict is the first
# reason in the ranking that applies, so the order of conditions does not matter.
Conditions = list[tuple[BoolArray, Reason]]
_T = TypeVar("_T", bound=np.generic)
K = TypeVar("K", bound=Hashable)


class Column(Protocol):
    """The filter's view of an inventory column: the whole column, or the candidate nodes'
    rows of it (whichever the filter found cheaper for this call)."""

    def __call__(self, column: npt.NDArray[_T], /) -> npt.NDArray[_T]: ...


# Whether evicting these pods from the node leaves the pod what it asks of one kind.
VictimsCheck = Callable[[Sequence[Holding]], bool]


class Placed(NamedTuple):
    """The devices bind gives a pod on one node: GPU indices (whole, or those its shares are
    on) and MIG devices by UUID (None: it asks none)."""

    gpu_ids: tuple[int, ...] = ()
    mig_uuids: tuple[str, ...] | None = None


class Kind(Protocol[K]):
    """One resource kind (see the module docstring)."""

    @property
    def name(self) -> str: ...

    @property
    def via_dra(self) -> bool: ...

    def asks(self, demand: Demand) -> bool: ...

    def spec_key(self, request: PodRequest) -> K: ...

    def spec_conditions(self, inventory: Inventory, key: K) -> Conditions: ...

    def held_conditions(
        self, inventory: Inventory, request: PodRequest, col: Column
    ) -> Conditions: ...

    def messages(self, request: PodRequest) -> Mapping[Reason, str]: ...

    def score_gate(self, inventory: Inventory, request: PodRequest, ids: IdArray) -> BoolArray: ...

    def choose(
        self, view: NodeView, request: PodRequest, placement: SharePlacement
    ) -> Placed | None: ...

    def annotations(self, holding: Holding) -> dict[str, str]: ...

    def victims_check(self, view: NodeView, request: PodRequest) -> VictimsCheck: ...

    def freed(self, view: NodeView, victim: Holding) -> int: ...

    @property
    def freed_by_departure(self) -> frozenset[Reason]: ...

    @property
    def freed_by_node(self) -> frozenset[Reason]: ...

    def waits(self, inventory: Inventory, request: PodRequest) -> set[str]: ...

    def departure_frees(self, holding: Holding, spec: NodeSpec) -> list[tuple[str, int]]: ...

    def node_frees(self, old: NodeSpec | None, new: NodeSpec) -> set[str] | None: ...

    def size(self, demand: Demand) -> Hashable: ...

    def pack_shape(self, request: PodRequest) -> tuple[object, ...]: ...

    def unit(self, request: PodRequest) -> PodRequest: ...

    def describe(self, demand: Demand) -> dict[str, object]: ...

    def detail(self, view: NodeView, request: PodRequest, reason: Reason) -> str | None: ...


def frozen(messages: dict[Reason, str]) -> Mapping[Reason, str]:
    """A kind's messages as a read-only mapping: they are cached and shared between calls."""
    return MappingProxyType(messages)


def gpu_models(inventory: Inventory, hint: str | None) -> set[str]:
    """The GPU models a pod with model ``hint`` may use ("": a node that names none)."""
    return {inventory.model_name(int(m)) for m in np.flatnonzero(inventory.model_mask(hint))}


def gpu_node_frees(old: NodeSpec | None, new: NodeSpec, keys: set[str]) -> set[str] | None:
    """What a node added or changed frees of a GPU kind: nothing on a node without GPUs;
    anything (None: every key) on a node that had none before; else ``keys``."""
    if not new.gpu_indices:
        return set()
    if old is None or not old.gpu_indices:
        return None
    return keys


class GpuModelWaits:
    """The waits of a kind that takes GPUs themselves (whole, or a share of them): under each
    GPU model the pod may use (an A100 freed wakes no one waiting for H100s), freed by any pod
    leaving a node of that model (a whole GPU gone gives room for shares, a share gone may
    leave its GPU whole) and by a node of that model added or changed."""

    def waits(self, inventory: Inventory, request: PodRequest) -> set[str]:
        return gpu_models(inventory, request.gpu_model)

    def departure_frees(self, holding: Holding, spec: NodeSpec) -> list[tuple[str, int]]:
        return [(spec.gpu_model or "", holding.devices)] if holding.devices else []

    def node_frees(self, old: NodeSpec | None, new: NodeSpec) -> set[str] | None:
        return gpu_node_frees(old, new, {m.gpu_model or "" for m in (old, new) if m})
