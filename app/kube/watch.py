"""List+watch, in kopf's shape: a tested :func:`watch_once` inside a tiny
:func:`watch_forever`.

``watch_once``: list (page by page, replacing the sink's state when the last page is in),
report "listed", then watch from the list's resourceVersion with bookmarks. A watch that ends
or breaks is resumed from the last resourceVersion seen; it returns when the API server says
that version is gone (410), so that the caller relists. Other errors propagate.

``watch_forever``: calls ``watch_once`` until cancelled, backing off (capped, with jitter)
after errors. Its ``sleep`` is the test seam.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

from app.kube.api import KubeApi
from app.kube.errors import ApiError, ApiGoneError, ApiNotFoundError, ApiTransientError
from app.kube.shapes import Decoders

__all__ = [
    "Backoff",
    "Relist",
    "Resource",
    "Sink",
    "WatchHooks",
    "watch_forever",
    "watch_once",
]

log = logging.getLogger("schedext.watch")

JSON = dict[str, Any]
Sleep = Callable[[float], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class Resource:
    name: str  # for logs and metrics: "nodes", "pods"
    path: str  # collection path: "/api/v1/nodes"
    field_selector: str = ""
    page_size: int = 500
    # The API server ends a watch after this; we then resume from the last version seen.
    watch_timeout_s: int = 300
    # A custom resource whose CRD may not be installed: a 404 counts as an empty list (so
    # readiness does not wait for it), and the list is retried now and then.
    optional: bool = False
    missing_retry_s: float = 30.0
    missing_hint: str = "is its CRD installed?"  # what the log line asks of a 404
    # Decoders that keep only the fields schedext reads (app/kube/shapes.py); None decodes
    # everything (small, rare objects).
    decoders: Decoders | None = None
    # Items handed to the sink at a time while listing: between batches the event loop runs,
    # so the next page's request goes out and its answer arrives while this page is decoded.
    list_batch: int = 50

    @property
    def accept(self) -> str:
        """What a list request accepts: protobuf first where the decoders read it."""
        return self.decoders.accept if self.decoders else "application/json"

    def decode_page(self, data: bytes) -> Any:
        return self.decoders.list(data) if self.decoders else orjson.loads(data)

    def decode_event(self, data: bytes) -> Any:
        return self.decoders.event(data) if self.decoders else orjson.loads(data)

    def params(self, **extra: str) -> dict[str, str]:
        params = dict(extra)
        if self.field_selector:
            params["fieldSelector"] = self.field_selector
        return params


class Relist(Protocol):
    def add(self, items: Iterable[JSON]) -> None: ...

    def commit(self) -> None:
        """All pages are in: replace the state with them."""


class Sink(Protocol):
    """Where events go (the one writer path of the inventory). ``upsert`` may answer False
    for an object that changed nothing the sink keeps (a pod's status update, a node's
    heartbeat): such an event frees nothing, and :attr:`WatchHooks.on_change` is not called
    for it. Any other answer counts as a change."""

    @property
    def relist(self) -> Callable[[], Relist]: ...

    @property
    def upsert(self) -> Callable[[JSON], object]: ...

    @property
    def delete(self) -> Callable[[JSON], object]: ...


class Backoff:
    """Capped exponential backoff with full jitter; reset after progress."""

    def __init__(
        self, *, initial: float = 0.5, cap: float = 30.0, rng: random.Random | None = None
    ) -> None:
        self.initial, self.cap = initial, cap
        self._attempt = 0
        self._rng = rng or random.Random()  # noqa: S311 (jitter, not secrecy)

    def next_delay(self) -> float:
        ceiling = min(self.cap, self.initial * 2**self._attempt)
        self._attempt += 1
        return self._rng.uniform(ceiling / 2, ceiling)

    def reset(self) -> None:
        self._attempt = 0


def _nothing(*_: object) -> None:
    return None


@dataclass(frozen=True, slots=True)
class WatchHooks:
    """What the caller wants to hear: the first full list, every event or bookmark (progress,
    for staleness metrics), every event that changed what the sink keeps (after its
    ``on_event``: what may have freed room for a waiting pod), and every restart with its
    cause ("gone", "broken", "error")."""

    on_listed: Callable[[], None] = _nothing
    on_event: Callable[[], None] = _nothing
    on_change: Callable[[], None] = _nothing
    on_restart: Callable[[str], None] = _nothing


async def watch_once(
    api: KubeApi,
    resource: Resource,
    sink: Sink,
    *,
    hooks: WatchHooks = WatchHooks(),
    sleep: Sleep = asyncio.sleep,
    backoff: Backoff | None = None,
) -> None:
    """List, then watch until the API server says our resourceVersion is gone (returns)."""
    try:
        version = await _list(api, resource, sink)
    except ApiNotFoundError:
        if not resource.optional:
            raise
        log.warning(
            "%s: no such resource (%s); treating as empty, retrying in %gs",
            resource.name,
            resource.missing_hint,
            resource.missing_retry_s,
        )
        sink.relist().commit()
        hooks.on_listed()
        await sleep(resource.missing_retry_s)
        return
    cursor = _Cursor(version)
    hooks.on_listed()
    hooks.on_event()
    backoff = backoff or Backoff()

    def progress() -> None:
        backoff.reset()
        hooks.on_event()

    while True:
        try:
            await _watch(
                api, resource, sink, cursor, on_progress=progress, on_change=hooks.on_change
            )
        except ApiGoneError:
            log.info("watch of %s: version %s is gone, relisting", resource.name, cursor.version)
            hooks.on_restart("gone")
            return
        except ApiTransientError as error:
            hooks.on_restart("broken")
            # The connection broke (API server restarting, network): resume from the last
            # version we saw; the API server replays what we missed, or answers 410.
            delay = backoff.next_delay()
            log.warning("watch of %s broke (%s); resuming in %.1fs", resource.name, error, delay)
            await sleep(delay)


async def watch_forever(
    api: KubeApi,
    resource: Resource,
    sink: Sink,
    *,
    hooks: WatchHooks = WatchHooks(),
    sleep: Sleep = asyncio.sleep,
    backoff: Backoff | None = None,
) -> None:
    backoff = backoff or Backoff()
    while True:
        try:
            await watch_once(api, resource, sink, hooks=hooks, sleep=sleep, backoff=backoff)
        except ApiError as error:
            hooks.on_restart("error")
            delay = backoff.next_delay()
            log.warning(
                "list+watch of %s failed (%s); retrying in %.1fs", resource.name, error, delay
            )
            await sleep(delay)


async def _list(api: KubeApi, resource: Resource, sink: Sink) -> str:
    """All pages, fed to one relist; returns the list's resourceVersion.

    The next page is requested before this one's items go to the sink, so that the API
    server prepares it while we decode (at 100,000 pods the two take about as long)."""
    relist = sink.relist()
    version = ""
    fetch = asyncio.create_task(_page(api, resource, ""))
    try:
        while True:
            page = await fetch
            metadata = page.get("metadata") or {}
            version = version or str(metadata.get("resourceVersion", ""))
            token = str(metadata.get("continue") or "")
            if token:
                fetch = asyncio.create_task(_page(api, resource, token))
            items = [item for item in page.get("items") or [] if isinstance(item, dict)]
            del page
            for start in range(0, len(items), resource.list_batch):
                relist.add(items[start : start + resource.list_batch])
                await asyncio.sleep(0)
            if not token:
                break
    finally:
        if not fetch.done():
            fetch.cancel()  # the sink failed while the next page was on its way
        elif not fetch.cancelled():
            fetch.exception()  # mark a prefetch's failure as seen: ours is what propagates
    relist.commit()
    log.info("listed %s at resourceVersion %s", resource.name, version)
    return version


async def _page(api: KubeApi, resource: Resource, token: str) -> JSON:
    params = resource.params(limit=str(resource.page_size))
    if token:
        params["continue"] = token
    data = await api.get_bytes(resource.path, params, accept=resource.accept)
    try:
        page = resource.decode_page(data)
    except ValueError as error:
        raise ApiError(f"list of {resource.name}: {error}", status=200) from None
    if not isinstance(page, dict):
        raise ApiError(f"list of {resource.name}: answer is not an object", status=200)
    return page


@dataclass(slots=True)
class _Cursor:
    """The last resourceVersion applied: where a broken watch resumes."""

    version: str


async def _watch(
    api: KubeApi,
    resource: Resource,
    sink: Sink,
    cursor: _Cursor,
    *,
    on_progress: Callable[[], None],
    on_change: Callable[[], None],
) -> None:
    """One watch request, until the server ends it; ``cursor`` follows every event applied."""
    params = resource.params(
        watch="1",
        resourceVersion=cursor.version,
        allowWatchBookmarks="true",
        timeoutSeconds=str(resource.watch_timeout_s),
    )

    def apply(line: bytes) -> None:
        try:
            event = resource.decode_event(line)
        except ValueError:
            raise ApiTransientError(f"watch of {resource.name}: undecodable event") from None
        kind = event.get("type") if isinstance(event, dict) else None
        obj = event.get("object") if isinstance(event, dict) else None
        if not isinstance(obj, dict):
            return
        if kind == "ERROR":
            _raise_status(resource, obj)
        new_version = str((obj.get("metadata") or {}).get("resourceVersion", ""))
        if kind in ("ADDED", "MODIFIED"):
            changed = sink.upsert(obj) is not False
        elif kind == "DELETED":
            sink.delete(obj)
            changed = True
        elif kind == "BOOKMARK":
            changed = False
        else:
            log.debug("watch of %s: ignoring event type %r", resource.name, kind)
            return
        cursor.version = new_version or cursor.version
        on_progress()
        if changed:
            on_change()

    # Each line is applied where the stream hands it over, not in this task: no wake-up of
    # it per event (app/kube/watch_stream.py).
    await api.watch_lines(
        resource.path, params, read_timeout=resource.watch_timeout_s + 30, on_line=apply
    )


def _raise_status(resource: Resource, status: JSON) -> None:
    code = status.get("code")
    message = f"watch of {resource.name}: {status.get('message', status)}"
    if code == 410:
        raise ApiGoneError(message, status=410, reason=str(status.get("reason", "")))
    if isinstance(code, int) and (code >= 500 or code == 429):
        raise ApiTransientError(message, status=code)
    raise ApiError(message, status=code if isinstance(code, int) else 0)
