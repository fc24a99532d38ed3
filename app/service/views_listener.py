"""``--views-port``: the read-only views (``GET /inventory``, ``GET /explain/NAMESPACE/NAME``,
``GET /healthz``) on a plain-HTTP listener of their own, on every address, so that the API
server's service proxy can reach them (``kubectl schedext``, app.plugin) while the verbs stay
on loopback or behind mTLS.

What the views show: node names and their GPUs (model, memory, UUIDs, health, which pod holds
each), pod names and namespaces, the pools' addresses and holders, gangs and team quotas.
No Secret, token, certificate, environment or pod spec beyond what schedext decides with
(docs/deploy.md weighs who may read them). Nothing here changes the inventory: each answer
reads it, on the event loop thread, as the main listener's routes do, and is the same body
(app.service.routes.inventory.document, app.service.routes.explain.answer). See
app.service.plain_listener for what the listener refuses (bodies, other methods, slow or
oversized heads).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable

import orjson

from app.service.assembly import Service
from app.service.plain_listener import Answer, PlainListener
from app.service.routes import explain, inventory

__all__ = ["ViewsListener"]

_JSON = "application/json"
# /inventory is built at most this often for this port, however often it is asked: building
# it walks every node on the event loop the verbs share, and anyone who reaches the pod's
# address reaches this port. A second of staleness means nothing to a person at kubectl.
INVENTORY_REUSE_S = 1.0
# A namespace is a DNS label, a pod name a DNS subdomain: anything else names no pod.
_EXPLAIN = re.compile(
    rb"/explain/([a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?)/([a-z0-9](?:[-.a-z0-9]{0,251}[a-z0-9])?)"
)


class ViewsListener(PlainListener):
    kind = "views"
    paths = ("/inventory", "/explain/NAMESPACE/NAME", "/healthz")

    def __init__(
        self,
        service: Service,
        *,
        port: int,
        host: str | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(
            port=port, host=host, max_header_bytes=service.settings.server.max_header_bytes
        )
        self._service = service
        self._clock = clock
        self._inventory: tuple[float, bytes] | None = None  # (built at, body)

    def route(self, path: bytes) -> Callable[[], Answer] | None:
        if path == b"/healthz":
            return lambda: (200, b"ok", "text/plain")
        if path == b"/inventory":
            return self._inventory_answer
        if path.startswith(b"/explain/"):
            match = _EXPLAIN.fullmatch(path)
            if match is None:
                error = {"Error": "not a pod: give /explain/NAMESPACE/NAME, Kubernetes names"}
                return lambda: (400, orjson.dumps(error), _JSON)
            namespace, name = (part.decode() for part in match.groups())
            return lambda: self._explain(namespace, name)
        return None

    def _inventory_answer(self) -> Answer:
        unsynced = self._service.not_synced()  # as the main port's /inventory says it
        if unsynced:
            return 503, orjson.dumps({"Error": unsynced}), _JSON
        return 200, self._inventory_body(), _JSON

    def _inventory_body(self) -> bytes:
        now = self._clock()
        if self._inventory is None or now - self._inventory[0] >= INVENTORY_REUSE_S:
            self._inventory = (now, orjson.dumps(inventory.document(self._service)))
        return self._inventory[1]

    def _explain(self, namespace: str, name: str) -> Answer:
        status, body = explain.answer(self._service, namespace, name)
        return status, orjson.dumps(body), _JSON
