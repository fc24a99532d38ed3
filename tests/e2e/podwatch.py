"""A namespace's pods as a watch on the API server shows them, with when each change
arrived: for tests that measure how long something took (from a pod's deletion to another's
placement) and wait on what the watch shows rather than poll.

Typical use::

    with PodWatch(cluster.cp, cluster.namespace) as watch:
        cluster.api.delete_pod(cluster.namespace, "holder")
        gone = watch.wait(lambda: watch.deleted_at("holder"), timeout=10, message="not deleted")
        placed = watch.wait(lambda: watch.bound_at("waiter"), timeout=5, message="not placed")
        delay = placed - gone
"""

from __future__ import annotations

import contextlib
import json
import ssl
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import httpx

from testbed.controlplane import ControlPlane

T = TypeVar("T")

__all__ = ["PodWatch"]


class PodWatch:
    """Lists the namespace's pods, then watches them from the list's resourceVersion in a
    thread. Per pod name, the monotonic time the watch first showed it bound (``spec.nodeName``
    set), turned away (the ``PodScheduled`` condition False with reason ``Unschedulable``) and
    deleted; :meth:`wait` blocks on a condition over them until a deadline."""

    def __init__(self, cp: ControlPlane, namespace: str) -> None:
        self._path = f"/api/v1/namespaces/{namespace}/pods"
        self._client = httpx.Client(
            base_url=cp.server,
            verify=ssl.create_default_context(cafile=str(cp.ca_cert)),
            headers={"Authorization": f"Bearer {cp.token}", "Accept": "application/json"},
            timeout=httpx.Timeout(10.0, read=None),
        )
        self._changed = threading.Condition()
        self._bound: dict[str, float] = {}
        self._unschedulable: dict[str, float] = {}
        self._deleted: dict[str, float] = {}
        self._failure: BaseException | None = None
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="pod-watch", daemon=True)

    def __enter__(self) -> PodWatch:
        listed = self._client.get(self._path)
        listed.raise_for_status()
        body = listed.json()
        for pod in body.get("items", []):
            self._saw("ADDED", pod, time.monotonic())
        self._version = str(body["metadata"]["resourceVersion"])
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stopping = True
        self._client.close()  # ends the stream the thread reads
        self._thread.join(timeout=5)

    def bound_at(self, name: str) -> float | None:
        with self._changed:
            return self._bound.get(name)

    def unschedulable_at(self, name: str) -> float | None:
        with self._changed:
            return self._unschedulable.get(name)

    def deleted_at(self, name: str) -> float | None:
        with self._changed:
            return self._deleted.get(name)

    def wait(self, predicate: Callable[[], T | None], *, timeout: float, message: str) -> T:
        """``predicate``'s first truthy value, looked at again on each watch event; raises
        AssertionError with ``message`` once ``timeout`` seconds pass without one."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                value = predicate()
                if value:
                    return value
                if self._failure is not None:
                    raise AssertionError(f"{message}: the watch failed: {self._failure!r}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"{message} (waited {timeout:g}s)")
                self._changed.wait(left)

    def _run(self) -> None:
        params = {"watch": "1", "resourceVersion": self._version, "timeoutSeconds": "1800"}
        try:
            with self._client.stream("GET", self._path, params=params) as stream:
                stream.raise_for_status()
                for line in stream.iter_lines():
                    if not line:
                        continue
                    event = json.loads(line)
                    if event.get("type") == "ERROR":
                        raise RuntimeError(f"watch error: {event.get('object')}")
                    with self._changed:
                        self._saw(event["type"], event["object"], time.monotonic())
                        self._changed.notify_all()
            raise RuntimeError("the watch ended")
        except Exception as error:  # noqa: BLE001 - reported to the waiters, not lost
            with self._changed:
                if not self._stopping:
                    self._failure = error
                self._changed.notify_all()
        finally:
            with contextlib.suppress(Exception):
                self._client.close()

    def _saw(self, kind: str, pod: dict[str, Any], at: float) -> None:
        name = pod["metadata"]["name"]
        if kind == "DELETED":
            self._deleted.setdefault(name, at)
            return
        if pod.get("spec", {}).get("nodeName"):
            self._bound.setdefault(name, at)
        for condition in pod.get("status", {}).get("conditions") or []:
            if (condition.get("type"), condition.get("status"), condition.get("reason")) == (
                "PodScheduled",
                "False",
                "Unschedulable",
            ):
                self._unschedulable.setdefault(name, at)
