"""ElasticQuotas from the watch into the core, and the operator told of the ones that do not
apply.

The core refuses a quota that cannot apply as written (``QuotaError``: min over max, a
negative quantity, a resource schedext does not count) and keeps a second quota of a
namespace shadowed by the oldest. Either way the quota is skipped and the rest keeps
working; here the operator learns of it: one log line and one Warning event on the
ElasticQuota itself (``kubectl describe elasticquota``), once per version of the object, not
on every relist or resync.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from app.kube.events import EventRecorder, QuotaEvent
from extender.quotas import QuotaError
from extender.scheduler import Scheduler

__all__ = ["INVALID", "SHADOWED", "QuotaSink"]

log = logging.getLogger("schedext.quotas")

JSON = dict[str, Any]

INVALID = "InvalidQuota"
SHADOWED = "ShadowedQuota"


@dataclass(frozen=True, slots=True)
class _Seen:
    uid: str
    version: str


def _meta(obj: JSON) -> tuple[str, _Seen]:
    meta = obj.get("metadata") or {}
    key = f"{meta.get('namespace') or 'default'}/{meta.get('name', '')}"
    return key, _Seen(str(meta.get("uid", "")), str(meta.get("resourceVersion", "")))


class QuotaSink:
    """The watch's sink for ElasticQuotas (``app.kube.watch.Sink``)."""

    def __init__(self, scheduler: Scheduler, events: EventRecorder) -> None:
        self._scheduler = scheduler
        self._events = events
        self._seen: dict[str, _Seen] = {}  # every quota object, by namespace/name
        # What was reported, by namespace/name: (version, reason, why), so that a problem is
        # reported again only when the object or the problem changes.
        self._reported: dict[str, tuple[_Seen, str, str]] = {}

    # ------------------------------------------------------------- the Sink

    def relist(self) -> _QuotaRelist:
        return _QuotaRelist(self)

    def upsert(self, obj: JSON) -> None:
        key, seen = _meta(obj)
        self._seen[key] = seen
        try:
            self._scheduler.upsert_quota(obj)
        except QuotaError as error:
            self._report(key, INVALID, str(error))
        else:
            if self._is(key, INVALID):  # fixed: a later breakage is news again
                del self._reported[key]
        self._check_shadowed()

    def delete(self, obj: JSON) -> None:
        key, _ = _meta(obj)
        self._scheduler.delete_quota(obj)
        self._seen.pop(key, None)
        self._reported.pop(key, None)
        self._check_shadowed()

    # ------------------------------------------------------------- internals

    def _replace(self, objs: list[JSON]) -> None:
        self._seen = dict(_meta(obj) for obj in objs)
        relist = self._scheduler.quota_relist()
        refused: dict[str, str] = {}
        for obj in objs:  # one at a time, so that each refusal is tied to its object
            for error in relist.add([obj]):
                refused[_meta(obj)[0]] = str(error)
        relist.commit()
        # Forget the objects gone, and the refusals that no longer hold (a shadowed quota's
        # report stays: _check_shadowed settles it).
        self._reported = {
            k: v
            for k, v in self._reported.items()
            if k in self._seen and (v[1] != INVALID or k in refused)
        }
        for key, why in refused.items():
            self._report(key, INVALID, why)
        self._check_shadowed()

    def _is(self, key: str, reason: str) -> bool:
        reported = self._reported.get(key)
        return reported is not None and reported[1] == reason

    def _check_shadowed(self) -> None:
        shadowed = {s.quota.key: s for s in self._scheduler.shadowed_quotas()}
        for key in [k for k in self._reported if self._is(k, SHADOWED) and k not in shadowed]:
            del self._reported[key]
        for key, entry in shadowed.items():
            why = (
                f"ElasticQuota {key} does not apply: {entry.by.key} is older and applies to "
                f"namespace {entry.quota.namespace} (one quota per namespace; delete one)"
            )
            self._report(key, SHADOWED, why)

    def _report(self, key: str, reason: str, why: str) -> None:
        seen = self._seen.get(key, _Seen("", ""))
        if self._reported.get(key) == (seen, reason, why):
            return
        self._reported[key] = (seen, reason, why)
        log.warning("%s skipped: %s", key, why, extra={"elasticquota": key, "reason": reason})
        self._events.record(QuotaEvent(key, reason, why, uid=seen.uid))


class _QuotaRelist:
    """A relist: collects the pages, then hands them to the core at once."""

    def __init__(self, sink: QuotaSink) -> None:
        self._sink = sink
        self._objs: list[JSON] = []

    def add(self, items: Iterable[JSON]) -> None:
        self._objs.extend(items)

    def commit(self) -> None:
        self._sink._replace(self._objs)
