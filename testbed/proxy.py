"""Loopback TCP proxies, between schedext and what it talks to, for the faults the e2e tests
and the soak put there.

:class:`ReadyProxy` forwards each new connection to the first backend that is an endpoint:
what a Kubernetes Service does for kube-scheduler in front of several schedext replicas. By
default a backend is an endpoint when its ``/readyz`` answers 200; the caller can decide
otherwise (for a Service with a selector: the backend's pod carries the selected label, and its
readiness check passes).

:class:`LaggingProxy` hands its client everything the server sends a set time late (TLS
passes through untouched): a client of the API server behind it sees every watch event after
the rest of the cluster has, as a busy process does. The lag can be changed while it runs (a
slowed API for a while), and :meth:`LaggingProxy.cut` breaks every connection it holds (cut
watches), as the soak's faults do (``loadtests.soak``)."""

from __future__ import annotations

import contextlib
import queue
import socket
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Self

import httpx

__all__ = ["LaggingProxy", "ReadyProxy"]

Backend = tuple[str, int]


def _ready(backend: Backend) -> bool:
    host, port = backend
    return httpx.get(f"http://{host}:{port}/readyz", timeout=1).status_code == 200


class _Proxy(ABC):
    """A listener on a free loopback port whose connections ``_accept`` serves on a thread;
    leaving the ``with`` block closes the listener and every connection it made."""

    def __init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stopped.set()
        self._listener.close()
        self.cut()
        self._thread.join(timeout=5)

    def cut(self) -> int:
        """Break every connection made so far (the listener stays open); how many sockets
        were closed. Their clients see the connection reset, as when a network path drops."""
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                sock.close()
        return len(sockets)

    @abstractmethod
    def _accept(self) -> None:
        """Serve the listener's connections until stopped (each proxy its own way)."""


class ReadyProxy(_Proxy):
    def __init__(
        self, backends: list[Backend], *, endpoint: Callable[[Backend], bool] = _ready
    ) -> None:
        self.backends = backends
        self._endpoint = endpoint
        super().__init__()

    def _ready_backend(self) -> Backend | None:
        for backend in self.backends:
            try:
                if self._endpoint(backend):
                    return backend
            except httpx.HTTPError:
                continue
        return None

    def _accept(self) -> None:
        while not self._stopped.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            backend = self._ready_backend()
            if backend is None:
                client.close()  # like a Service without ready endpoints: the caller retries
                continue
            try:
                upstream = socket.create_connection(backend, timeout=5)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._sockets += [client, upstream]
            for source, target in ((client, upstream), (upstream, client)):
                threading.Thread(target=_pump, args=(source, target), daemon=True).start()


def _pump(source: socket.socket, target: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while data := source.recv(65536):
            target.sendall(data)
    for sock in (source, target):
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)


class LaggingProxy(_Proxy):
    """Forwards to ``backend``; what comes back reaches the client ``lag_s`` seconds late,
    in order. What the client sends goes through at once. ``lag_s`` may be changed at any
    time: each piece read from then on waits the new lag (0: none)."""

    def __init__(self, backend: Backend, *, lag_s: float) -> None:
        self.backend = backend
        self.lag_s = lag_s
        super().__init__()

    def _accept(self) -> None:
        while not self._stopped.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.backend, timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            with self._lock:
                self._sockets += [client, upstream]
            late: queue.Queue[tuple[float, bytes]] = queue.Queue()
            threading.Thread(target=_pump, args=(client, upstream), daemon=True).start()
            threading.Thread(target=self._hold, args=(upstream, late), daemon=True).start()
            threading.Thread(target=_release, args=(late, client), daemon=True).start()

    def _hold(self, source: socket.socket, late: queue.Queue[tuple[float, bytes]]) -> None:
        """Read what the server sends, each piece stamped with when it may go on (b"": the
        end). Pieces stay in order when the lag shrinks: none goes before the one ahead."""
        due = 0.0
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                due = max(due, time.monotonic() + self.lag_s)
                late.put((due, data))
        late.put((max(due, time.monotonic() + self.lag_s), b""))


def _release(late: queue.Queue[tuple[float, bytes]], target: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while True:
            due, data = late.get()
            if (wait := due - time.monotonic()) > 0:
                time.sleep(wait)  # the lag itself: this piece may not arrive before ``due``
            if not data:
                break
            target.sendall(data)
    with contextlib.suppress(OSError):
        target.shutdown(socket.SHUT_RDWR)
