"""Fakes for the Kubernetes I/O tests: a canned API server behind a HandlerTransport (no
patching), and a sink that records what the watch loop delivers."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson

from app.kube.api import KubeApi
from app.kube.config import ClusterConfig
from tests.handler_transport import HandlerTransport

JSON = dict[str, Any]


def node(name: str, version: str = "1") -> JSON:
    return {"metadata": {"name": name, "resourceVersion": version}}


def event(kind: str, obj: JSON) -> bytes:
    return orjson.dumps({"type": kind, "object": obj}) + b"\n"


def gone() -> bytes:
    status = {
        "kind": "Status",
        "code": 410,
        "reason": "Expired",
        "message": "too old resource version",
    }
    return event("ERROR", status)


class BrokenStream(httpx.AsyncByteStream):
    """Sends some bytes, then the connection breaks."""

    def __init__(self, chunks: Iterable[bytes]) -> None:
        self._chunks = list(chunks)

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for chunk in self._chunks:
            yield chunk
        raise httpx.ReadError("connection reset by peer")


@dataclass
class FakeApiServer:
    """Answers requests from queues of canned responses, and records the requests."""

    lists: list[httpx.Response] = field(default_factory=list)
    watches: list[httpx.Response] = field(default_factory=list)
    requests: list[httpx.Request] = field(default_factory=list)
    other: Callable[[httpx.Request], httpx.Response] | None = None

    def handle(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        if request.method == "GET" and request.url.params.get("watch") == "1":
            return self.watches.pop(0)
        if request.method == "GET" and "limit" in request.url.params:
            return self.lists.pop(0)
        assert self.other is not None, f"unexpected request {request.method} {request.url}"
        return self.other(request)

    def api(self) -> KubeApi:
        config = ClusterConfig(server="https://api.test", ssl_context=False, token="t0ken")
        return KubeApi(config, transport=HandlerTransport(self.handle))

    def watch_params(self) -> list[dict[str, str]]:
        return [dict(r.url.params) for r in self.requests if r.url.params.get("watch") == "1"]


def page(items: list[JSON], version: str, token: str = "") -> httpx.Response:
    metadata = {"resourceVersion": version}
    if token:
        metadata["continue"] = token
    return httpx.Response(200, json={"metadata": metadata, "items": items})


@dataclass
class RecordingSink:
    """State by name, plus a journal of what happened."""

    state: dict[str, JSON] = field(default_factory=dict)
    journal: list[str] = field(default_factory=list)

    def relist(self) -> _Relist:
        return _Relist(self)

    def upsert(self, obj: JSON) -> bool:
        """False, as the service's sinks answer, for an object the same as the one kept but
        for its resourceVersion."""
        name = obj["metadata"]["name"]
        kept = self.state.get(name)
        self.state[name] = obj
        self.journal.append(f"upsert {name}")
        return kept is None or _unversioned(kept) != _unversioned(obj)

    def delete(self, obj: JSON) -> None:
        self.state.pop(obj["metadata"]["name"], None)
        self.journal.append(f"delete {obj['metadata']['name']}")


def _unversioned(obj: JSON) -> JSON:
    return {**obj, "metadata": {**obj["metadata"], "resourceVersion": None}}


@dataclass
class _Relist:
    sink: RecordingSink
    items: list[JSON] = field(default_factory=list)

    def add(self, items: Iterable[JSON]) -> None:
        self.items.extend(items)
        self.sink.journal.append(f"page {len(self.items)}")

    def commit(self) -> None:
        self.sink.state = {i["metadata"]["name"]: i for i in self.items}
        self.sink.journal.append("commit")
