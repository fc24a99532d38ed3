"""What a pod's containers ask for, summed once per pod template rather than once per pod.

A pod's effective requests (:mod:`extender.resource_totals`) and the MIG resources it names
(:func:`extender.mig.resource_names`) are a third of decoding it, and one pod has them
decoded three times on its way through schedext: its pending event, filter, and its
Binding's event; a relist decodes every bound pod once more. They depend on four fields of
the spec alone (``containers``, ``initContainers``, ``resources``, ``overhead``), and the
pods of one Deployment, Job or gang share those fields byte for byte. So the sums are kept
in a small book keyed by those fields' JSON bytes (encoding them is a tenth of summing
them) and the counted resources.

Bounded: at most :data:`CAPACITY` templates, the oldest dropped first, and no template
whose fields encode to more than :data:`_MAX_KEY` bytes. A spec that does not encode
(not a dict, an integer beyond 64 bits) or whose sums are refused is summed every time,
and the refusal raised every time: only answers are kept. A pure function's cache: the
answer for a spec is the same with or without it.
"""

from __future__ import annotations

import orjson

from extender import fields, mig
from extender.fields import JSONObject
from extender.resource_totals import effective_requests

__all__ = ["CAPACITY", "asked"]

CAPACITY = 512  # distinct templates kept: a cluster runs far fewer GPU pod shapes
_MAX_KEY = 8192  # bytes of one template's fields: larger ones are summed every time
_FIELDS = ("containers", "initContainers", "resources", "overhead")

Asked = tuple[tuple[str, ...], dict[str, int]]

_book: dict[tuple[tuple[str, ...], bytes], Asked] = {}


def asked(spec: JSONObject, resources: tuple[str, ...]) -> Asked:
    """The MIG resources the pod names (sorted), and its effective request of each of
    ``resources`` and of them, in nano-units. Raises what
    :func:`~extender.resource_totals.effective_requests` raises."""
    key = _key(spec, resources)
    kept = _book.get(key) if key is not None else None
    if kept is None:
        mig_names = mig.resource_names(spec)
        kept = (mig_names, effective_requests(spec, resources + mig_names))
        if key is not None:
            if len(_book) >= CAPACITY:
                del _book[next(iter(_book))]  # the oldest template
            _book[key] = kept
    # A copy of the totals: the book's own must not change under a later pod.
    return kept[0], dict(kept[1])


def _key(spec: JSONObject, resources: tuple[str, ...]) -> tuple[tuple[str, ...], bytes] | None:
    try:
        encoded = orjson.dumps(tuple(fields.get(spec, name) for name in _FIELDS))
    except TypeError:  # orjson.JSONEncodeError: a Mapping that is not a dict, a huge integer
        return None
    return (resources, encoded) if len(encoded) <= _MAX_KEY else None


def forget_all() -> None:
    """Empty the book (tests that count decodes)."""
    _book.clear()
