"""The parts of API objects that schedext reads, as decoding schemas for msgspec.

A listed pod is about 5 KB of JSON, and half of it is ``managedFields``; add env, probes,
volumes, conditions and container statuses, and schedext uses perhaps a tenth of it. Decoding
against these schemas skips every other field inside the C decoder, instead of building
Python objects for it and then dropping them: at 100,000 pods that is most of the decoding
time and of the garbage. The result is still plain dicts and lists, the same values
:mod:`extender` reads from a fully decoded object (a unit test holds the two to the same
answers). The API server writes canonical field names, so no case folding is needed here.

Values we do read are typed ``Any``: a surprising value is then the core's to judge, as it
would be fully decoded. A document that does not fit the schema's structure at all (a list
where an object belongs) is decoded in full instead, never dropped.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, TypedDict

import msgspec
import orjson

from app.kube import list_pages

__all__ = ["NODE_DECODERS", "POD_DECODERS", "Decoders"]

log = logging.getLogger("schedext.watch")

Decode = Callable[[bytes], Any]


class _Meta(TypedDict, total=False):
    name: Any
    namespace: Any
    uid: Any
    resourceVersion: Any
    labels: Any
    annotations: Any
    ownerReferences: Any


class _Status(TypedDict, total=False):
    """A ``Status`` (watch ERROR events) shares the event's object with the resource."""

    code: Any
    reason: Any
    message: Any


# ---------------------------------------------------------------- pods


class _Container(TypedDict, total=False):
    name: Any
    resources: Any
    restartPolicy: Any


class _Nothing(TypedDict, total=False):
    """An object whose presence is all that is read: its fields are skipped."""


# Only whether a pod states a preference is read (extender.requests: a longer shortlist), so
# of its affinity only the preferred terms are kept, and of them only that they are objects.
# The required terms (node selectors, label selectors) were most of what a pod's affinity
# decoded to: 2 of a benchmark pod's 12 µs of decoding, and a quarter of freeing it.
class _Preferences(TypedDict, total=False):
    preferredDuringSchedulingIgnoredDuringExecution: list[_Nothing]


class _Affinity(TypedDict, total=False):
    nodeAffinity: _Preferences
    podAffinity: _Preferences
    podAntiAffinity: _Preferences


class _Spread(TypedDict, total=False):
    whenUnsatisfiable: Any


class _PodSpec(TypedDict, total=False):
    nodeName: Any
    priority: Any
    preemptionPolicy: Any
    # null in a BOOKMARK event, whose object is an empty pod but for its resourceVersion.
    containers: list[_Container] | None
    initContainers: list[_Container] | None
    overhead: Any
    resources: Any
    # Soft preferences: a pod stating them gets a longer shortlist (extender.shortlist).
    affinity: _Affinity | None
    topologySpreadConstraints: list[_Spread] | None
    # DRA: the claims it names (extender.dra.pod_claims).
    resourceClaims: Any


class _PodStatus(TypedDict, total=False):
    phase: Any
    # DRA: the claims generated from its templates, and the one that serves an extended
    # resource (KEP-5004).
    resourceClaimStatuses: Any
    extendedResourceClaimStatus: Any


class _Pod(_Status, total=False):
    metadata: _Meta
    spec: _PodSpec
    status: _PodStatus | str  # a Status (a watch ERROR event) says "Failure" here


# ---------------------------------------------------------------- nodes


class _NodeStatus(TypedDict, total=False):
    allocatable: Any
    capacity: Any


class _Node(_Status, total=False):
    metadata: _Meta
    status: _NodeStatus | str  # a Status (a watch ERROR event) says "Failure" here


# ---------------------------------------------------------------- envelopes

# "continue" is a Python keyword, hence the functional syntax.
_PageMeta = TypedDict("_PageMeta", {"resourceVersion": Any, "continue": Any}, total=False)


class _PodPage(TypedDict, total=False):
    metadata: _PageMeta
    items: list[_Pod]


class _PodEvent(TypedDict, total=False):
    type: Any
    object: _Pod


class _NodePage(TypedDict, total=False):
    metadata: _PageMeta
    items: list[_Node]


class _NodeEvent(TypedDict, total=False):
    type: Any
    object: _Node


class Decoders:
    """Decoders for one resource's list pages and watch events: bytes in, plain JSON values
    out; ``ValueError`` for bytes that are not JSON.

    ``protobuf``: a decoder of the resource's list pages in protobuf (app/kube/list_pages.py),
    into the same values; lists then ask for protobuf first (:attr:`accept`), and a page is
    decoded as what it is. If a protobuf page cannot be decoded, lists ask for JSON from then
    on: one warning, and the list is retried, instead of failing on every retry."""

    def __init__(
        self, name: str, page: type[Any], event: type[Any], *, protobuf: Decode | None = None
    ) -> None:
        self._name = name
        self._json_page: Decode = self._with_fallback(msgspec.json.Decoder(page).decode)
        self.event: Decode = self._with_fallback(msgspec.json.Decoder(event).decode)
        self._protobuf = protobuf

    @property
    def accept(self) -> str:
        """The Accept header of a list request."""
        return list_pages.ACCEPT if self._protobuf is not None else "application/json"

    def list(self, data: bytes) -> Any:
        if not list_pages.is_protobuf(data):
            return self._json_page(data)
        if self._protobuf is None:
            raise ValueError("a protobuf answer, though the list asked for JSON")
        try:
            return self._protobuf(data)
        except ValueError as error:
            self._protobuf = None
            log.warning(
                "%s: a protobuf list page did not decode (%s); listing JSON", self._name, error
            )
            raise

    def _with_fallback(self, decode: Decode) -> Decode:
        def decode_or_full(data: bytes) -> Any:
            try:
                return decode(data)
            except msgspec.ValidationError as error:
                log.warning("%s: unexpected shape (%s); decoding in full", self._name, error)
                return orjson.loads(data)
            except msgspec.DecodeError as error:
                raise ValueError(f"not JSON: {error}") from None

        return decode_or_full


POD_DECODERS = Decoders("pods", _PodPage, _PodEvent, protobuf=list_pages.pod_page)
NODE_DECODERS = Decoders("nodes", _NodePage, _NodeEvent, protobuf=list_pages.node_page)
