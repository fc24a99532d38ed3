"""A stream of small GPU pods that keeps a cluster busy, as many short jobs do: for the tests
and the load test of gangs starved by them (``tests/e2e/test_gang_holds.py``,
``loadtests.starvation``).

A thread keeps ``backlog`` pods of ``gpus`` GPUs (no gang, the default priority) pending at
all times, so that every GPU that frees is wanted at once, and "finishes" each pod
``lifetime_s`` after it saw it bound: there is no kubelet, so finishing is deleting it. It
records where and when (monotonic seconds) each pod was bound, for the caller's figures and
assertions. It polls the API server every ``tick_s``; it stops when told, after ``max_s``,
or after ``max_pods`` pods: never runs on by itself.
"""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from testbed.kubeapi import ApiError, KubeApi
from testbed.manifests import pod_manifest

__all__ = ["Placement", "SmallPodStream"]

STREAM_LABEL = "schedext-test/stream"


@dataclass(frozen=True, slots=True)
class Placement:
    """A pod bound on ``node`` after ``after`` and by ``at`` (monotonic seconds): the list
    before the one that showed it bound began at ``after``, and did not show it bound."""

    pod: str
    node: str
    after: float
    at: float


class SmallPodStream:
    """See the module docstring. Use as a context manager; :attr:`failure` is what ended the
    thread early, if anything (re-raised by :meth:`stop`)."""

    def __init__(
        self,
        server: str,
        token: str,
        ca_cert: Path,
        namespace: str,
        *,
        backlog: int = 8,
        lifetime_s: tuple[float, float] = (3.0, 5.0),
        gpus: int = 1,
        prefix: str = "small",
        tick_s: float = 0.2,
        max_s: float = 600.0,
        max_pods: int = 20_000,
        seed: int = 32,
    ) -> None:
        self._api = KubeApi(server, token, ca_cert)
        self.namespace = namespace
        self.backlog, self.lifetime_s, self.gpus = backlog, lifetime_s, gpus
        self.prefix, self.tick_s, self.max_s, self.max_pods = prefix, tick_s, max_s, max_pods
        self._rng = random.Random(seed)  # noqa: S311 (lifetimes, not secrets)
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="small-pod-stream", daemon=True)
        self._created = 0
        self._ends: dict[str, float] = {}  # bound pods not deleted yet: when they finish
        self._placements: list[Placement] = []
        self._seen: set[str] = set()  # every pod seen bound (at most max_pods)
        self._listed = 0.0  # when the last list began
        self.failure: BaseException | None = None

    # ------------------------------------------------------------------ control

    def __enter__(self) -> SmallPodStream:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop(raise_failure=False)

    def stop(self, *, raise_failure: bool = True) -> None:
        self._stopping.set()
        self._thread.join(timeout=30)
        self._api.close()
        if raise_failure and self.failure is not None:
            raise AssertionError(f"the small-pod stream failed: {self.failure!r}")

    # ------------------------------------------------------------------ figures

    @property
    def running(self) -> int:
        """Pods of the stream bound and not finished yet (GPUs they hold: times ``gpus``)."""
        with self._lock:
            return len(self._ends)

    def placements(
        self, since: float = 0.0, until: float = float("inf"), *, nodes: set[str] | None = None
    ) -> list[Placement]:
        """The pods certainly bound within [since, until] (monotonic), on ``nodes`` if given."""
        with self._lock:
            return [
                p
                for p in self._placements
                if since <= p.after and p.at <= until and (nodes is None or p.node in nodes)
            ]

    # ------------------------------------------------------------------ the thread

    def _run(self) -> None:
        deadline = time.monotonic() + self.max_s
        try:
            while not self._stopping.is_set() and time.monotonic() < deadline:
                self._tick()
                self._stopping.wait(self.tick_s)
        except BaseException as error:  # noqa: BLE001 (kept for the caller)
            self.failure = error

    def _tick(self) -> None:
        selector = f"{STREAM_LABEL}={self.prefix}"
        began = time.monotonic()
        pods = self._api.list_pods(self.namespace, label_selector=selector)
        now, after, self._listed = time.monotonic(), self._listed, began
        pending = 0
        for pod in pods:
            name = pod["metadata"]["name"]
            node = pod["spec"].get("nodeName")
            if pod["metadata"].get("deletionTimestamp"):
                continue
            if not node:
                pending += 1
                continue
            with self._lock:
                if name not in self._seen:  # a pod listed again after its deletion: not anew
                    self._seen.add(name)
                    self._ends[name] = now + self._rng.uniform(*self.lifetime_s)
                    self._placements.append(Placement(name, node, after, now))
        with self._lock:
            done = [name for name, end in self._ends.items() if end <= now]
        for name in done:
            self._api.delete_pod(self.namespace, name)
            with self._lock:
                del self._ends[name]
        for _ in range(max(0, self.backlog - pending)):
            if self._created >= self.max_pods:
                break
            self._create()

    def _create(self) -> None:
        name = f"{self.prefix}-{self._created}"
        self._created += 1
        gpu = {"nvidia.com/gpu": str(self.gpus)}
        manifest: dict[str, Any] = pod_manifest(
            name,
            requests={"cpu": "100m", "memory": "64Mi", **gpu},
            limits=gpu,
            labels={STREAM_LABEL: self.prefix},
        )
        try:
            self._api.create_pod(self.namespace, manifest)
        except ApiError as error:
            if error.status != 409:  # already there (a retried create)
                raise
