"""The soak's cluster: the end-to-end harness's real control plane, two schedext replicas
under leader election, and the proxies that both route to them and break things.

* etcd, kube-apiserver and kube-scheduler are the harness's (``testbed.controlplane``), with the
  project's CRDs and the soak's PriorityClasses, namespaces, nodes and address pools.
* Two ``schedext serve`` replicas elect a leader through a Lease, each told its own Pod
  object (``POD_NAME``), and the leader labels its pod, as in mTLS mode (deploy-mtls.yaml).
  kube-scheduler reaches them through a :class:`ReadyProxy` that does what that mode's
  Service does: a new connection goes to the replica whose pod carries the leader label and
  whose ``/readyz/synced`` passes.
* Both replicas reach the API server through one :class:`LaggingProxy`: the faults cut their
  connections (watches included) and slow the API's answers there.

:meth:`Rig.inject` performs one fault (``loadtests.soak.faults``) and returns once it is done:
a killed replica is started again a moment later, as the kubelet restarts a container.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import random
import signal
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from app.kube.role import LEADER, ROLE_LABEL
from extender import names
from loadtests import kubeload
from loadtests.kubeload import SchedextProcess, status_kib
from loadtests.soak.faults import FaultKind
from loadtests.soak.workload import HIGH, LOW, NAMESPACES
from testbed.controlplane import ControlPlane, find_binaries
from testbed.kubeapi import ApiError, KubeApi
from testbed.kubeapply import stand_in_pod
from testbed.proxy import LaggingProxy, ReadyProxy
from testbed.waiting import wait_for

__all__ = ["Layout", "Replica", "Rig"]

SYSTEM = "soak-system"  # the replicas' Pod objects and the Lease
H100 = "NVIDIA-H100-80GB-HBM3"
DEVICE_MIB = 81_920
SHARES_PER_GPU = 32
RESTART_DELAY_S = 1.0  # between a replica's death and its next start (the kubelet's)
# Short leases so that a failover takes seconds; the settings' own check holds (a stepping-
# down leader's last bind ends before the next may start: renew 1.5 + bind 2 < lease 5).
LEADER_ENV = {
    "SCHEDEXT_LEADER__ENABLED": "true",
    "SCHEDEXT_LEADER__NAMESPACE": SYSTEM,
    "SCHEDEXT_LEADER__LEASE_DURATION_S": "5",
    "SCHEDEXT_LEADER__RENEW_DEADLINE_S": "1.5",
    "SCHEDEXT_LEADER__RETRY_PERIOD_S": "0.5",
    "SCHEDEXT_BIND__API_DEADLINE_S": "2",
    "SCHEDEXT_IP__CLAIM_RELEASE_INTERVAL_S": "1",
}
PODGROUPS = "/apis/scheduling.x-k8s.io/v1alpha1"
SCHEDEXT = "/apis/schedext.io/v1alpha1"


@dataclass(frozen=True)
class Layout:
    """The soak's nodes and pools: GPU nodes of 8 H100s (two NVLink groups of 4) in two
    racks, share nodes of 4 H100s that advertise shares as the node agent does, and one
    address pool per rack."""

    gpu_nodes: int = 12
    share_nodes: int = 2
    pool_size: int = 24

    @property
    def whole_gpus(self) -> int:
        return 8 * self.gpu_nodes + 4 * self.share_nodes


@dataclass
class Replica:
    name: str
    process: SchedextProcess
    starts: int = 0
    held: bool = False  # a fault stops and starts it: not to be restarted meanwhile
    gone: float = 0.0  # watches it listed again after 410 Gone, over all its starts
    _gone_seen: float = 0.0  # the current start's counter when last read
    # (monotonic time it was synced, RSS then in KiB) for each start, and its last sample.
    rss: list[tuple[float, int, int]] = field(default_factory=list)  # (synced at, first, last)

    @property
    def pod(self) -> str:
        return f"schedext-{self.name}"

    @property
    def url(self) -> str:
        return self.process.url

    @property
    def alive(self) -> bool:
        process = self.process.process
        return process is not None and process.poll() is None

    def answers(self, path: str) -> int:
        """The status ``path`` answers now (0: no answer)."""
        try:
            return httpx.get(f"{self.url}{path}", timeout=2).status_code
        except httpx.HTTPError:
            return 0


class Rig:
    """Start with ``with Rig(work_dir, layout, plant=...) as rig:``; everything stops on the
    way out, whatever happened."""

    def __init__(self, work_dir: Path, layout: Layout, *, seed: int, plant: bool = False) -> None:
        self.work_dir = work_dir
        self.layout = layout
        self.plant = plant
        self._rng = random.Random(f"rig-{seed}")
        self._stack = contextlib.ExitStack()
        self.cp: ControlPlane | None = None
        self.api_proxy: LaggingProxy | None = None
        self.front: ReadyProxy | None = None
        self.replicas: list[Replica] = []
        self._front_api: KubeApi | None = None
        self._config = ""
        self._lock = threading.Lock()  # a replica's process is replaced under it
        self._starter = ThreadPoolExecutor(max_workers=1, thread_name_prefix="soak-starter")
        self.scheduler_held = False  # a fault restarts kube-scheduler: not to be started meanwhile

    # --- lifecycle ------------------------------------------------------------------------

    def __enter__(self) -> Rig:
        try:
            self._start()
        except BaseException:
            self._stack.close()
            raise
        return self

    def __exit__(self, *_: object) -> None:
        self._stack.close()

    def _start(self) -> None:
        self._stack.callback(self._starter.shutdown)  # last: after the replicas stopped
        cp = self._stack.enter_context(ControlPlane(find_binaries(), self.work_dir / "cp"))
        self.cp = cp
        kubeload.install_crds(cp)
        api = cp.api
        for name, value in ((LOW, 10), (HIGH, 1000)):
            body = {
                "apiVersion": "scheduling.k8s.io/v1",
                "kind": "PriorityClass",
                "metadata": {"name": name},
                "value": value,
            }
            api.apply_raw("POST", "/apis/scheduling.k8s.io/v1/priorityclasses", body)
        for namespace in (*NAMESPACES, SYSTEM):
            api.create_namespace(namespace)
        self._nodes(api)
        server = urlsplit(cp.server)
        self.api_proxy = self._stack.enter_context(
            LaggingProxy((server.hostname or "127.0.0.1", server.port or 443), lag_s=0.0)
        )
        kubeconfig = self._proxied_kubeconfig(cp, self.api_proxy.port)
        for name in ("first", "second"):
            env = {
                **LEADER_ENV,
                "SCHEDEXT_LEADER__IDENTITY": name,
                "POD_NAME": f"schedext-{name}",
                "POD_NAMESPACE": SYSTEM,
            }
            process = PlantedProcess if self.plant else SchedextProcess
            replica = Replica(name, process(kubeconfig, self.work_dir / f"{name}.log", env=env))
            api.create_pod(SYSTEM, stand_in_pod(replica.pod))
            self.replicas.append(replica)
            self._stack.callback(self._stop_replica, replica)
        for replica in self.replicas:
            self._start_replica(replica)
        wait_for(lambda: self.leader() is not None, timeout=120, message="no leader")
        self._front_api = KubeApi(cp.server, cp.token, cp.ca_cert)
        self._stack.callback(self._front_api.close)
        backends = [("127.0.0.1", r.process.port) for r in self.replicas]
        self.front = self._stack.enter_context(ReadyProxy(backends, endpoint=self._endpoint))
        self._config = kubeload.scheduler_config(f"http://127.0.0.1:{self.front.port}")
        cp.start_scheduler(self._config)
        self._stack.callback(cp.stop_scheduler)

    def _nodes(self, api: KubeApi) -> None:
        groups = json.dumps({"groups": [[0, 1, 2, 3], [4, 5, 6, 7]]})
        labels = {names.GPU_PRODUCT_LABEL: H100, names.GPU_MEMORY_LABEL: str(DEVICE_MIB)}
        racks = ("rack-a", "rack-b")
        for i in range(self.layout.gpu_nodes):
            in_rack = {names.RACK_LABEL: racks[i % 2]}
            api.create_node(
                f"gpu-{i:02d}",
                cpu="64",
                memory="512Gi",
                pods="250",
                gpus=8,
                labels={**labels, **in_rack},
                annotations={names.GPU_TOPOLOGY: groups},
            )
        for i in range(self.layout.share_nodes):
            shares = {
                names.SHARE_MEMORY_RESOURCE: str(4 * DEVICE_MIB),
                names.SHARE_CORES_RESOURCE: "400",
                names.SHARE_COUNT_RESOURCE: str(4 * SHARES_PER_GPU),
            }
            in_rack = {names.RACK_LABEL: racks[i % 2]}
            api.create_node(
                f"share-{i}",
                cpu="64",
                memory="512Gi",
                pods="250",
                gpus=4,
                labels={**labels, **in_rack},
                extended=shares,
            )
        for index, rack in enumerate(racks):
            first, last = 1, self.layout.pool_size
            body = {
                "apiVersion": "schedext.io/v1alpha1",
                "kind": "IPPool",
                "metadata": {"name": f"pool-{rack[-1]}"},
                "spec": {
                    "ranges": [
                        {"start": f"10.{index + 10}.0.{first}", "end": f"10.{index + 10}.0.{last}"}
                    ],
                    "nodeSelector": {names.RACK_LABEL: rack},
                },
            }
            api.apply_raw("POST", f"{SCHEDEXT}/ippools", body)

    @staticmethod
    def _proxied_kubeconfig(cp: ControlPlane, port: int) -> Path:
        config = json.loads(cp.kubeconfig.read_text())
        config["clusters"][0]["cluster"]["server"] = f"https://127.0.0.1:{port}"
        path = cp.work_dir / "proxied.kubeconfig"
        path.write_text(json.dumps(config))
        path.chmod(0o600)
        return path

    def _endpoint(self, backend: tuple[str, int]) -> bool:
        """The mTLS Service's view of a replica: its pod carries the leader label (the
        selector) and its readiness probe (/readyz/synced) passes."""
        replica = next(r for r in self.replicas if r.process.port == backend[1])
        assert self._front_api is not None
        try:
            pod = self._front_api.get_pod(SYSTEM, replica.pod)
        except (ApiError, httpx.HTTPError):
            return False
        labelled = (pod["metadata"].get("labels") or {}).get(ROLE_LABEL) == LEADER
        return labelled and replica.answers("/readyz/synced") == 200

    # --- replicas -------------------------------------------------------------------------

    def _start_replica(self, replica: Replica) -> None:
        # Always from the starter's one thread: a replica is forked with PDEATHSIG, which
        # kills it when the thread that forked it ends, and the fault and watch threads end
        # before the run does (they did, and took both replicas with them).
        with self._lock:
            self._starter.submit(replica.process.start).result()
            replica.starts += 1

    def _stop_replica(self, replica: Replica, *, sig: signal.Signals = signal.SIGTERM) -> None:
        with self._lock:
            process = replica.process
            if sig is signal.SIGKILL and process.process is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.process.pid, signal.SIGKILL)
            process.stop(grace=30.0)

    def leader(self) -> Replica | None:
        """The replica that answers the verbs now (its /readyz passes), if one does."""
        for replica in self.replicas:
            if replica.alive and replica.answers("/readyz") == 200:
                return replica
        return None

    def sample(self) -> None:
        """Record each live, synced replica's RSS (the first sample of each start, and the
        last), and the watches it listed again after 410 Gone (its counter starts at 0 with
        each start: a smaller reading is a new start's)."""
        for replica in self.replicas:
            gone = self.metric_sum(replica, "schedext_watch_restarts_total", cause="gone")
            if gone < replica._gone_seen:
                replica._gone_seen = 0.0
            replica.gone += gone - replica._gone_seen
            replica._gone_seen = gone
            process = replica.process.process
            if process is None or process.poll() is not None:
                continue
            with contextlib.suppress(OSError, KeyError, ValueError):
                kib = status_kib(process.pid, "VmRSS")
                if len(replica.rss) < replica.starts:
                    if replica.answers("/readyz/synced") == 200:
                        replica.rss.append((time.monotonic(), kib, kib))
                else:
                    at, first, _ = replica.rss[-1]
                    replica.rss[-1] = (at, first, kib)

    # --- faults ---------------------------------------------------------------------------

    def inject(self, kind: FaultKind) -> str:
        """Perform one fault; what was done, in words."""
        faults: dict[FaultKind, Callable[[], str]] = {
            FaultKind.KILL_LEADER: lambda: self._stop_leader(signal.SIGKILL),
            FaultKind.TERM_LEADER: lambda: self._stop_leader(signal.SIGTERM),
            FaultKind.APISERVER: self._restart_apiserver,
            FaultKind.COMPACTION: self._compact_and_crash,
            FaultKind.WATCH_CUT: lambda: f"{self._api_proxy.cut() // 2} connections cut",
            FaultKind.SLOW_API: self._slow_api,
            FaultKind.SCHEDULER: self._restart_scheduler,
        }
        return faults[kind]()

    @property
    def _control_plane(self) -> ControlPlane:
        if self.cp is None:
            raise RuntimeError("the rig is not started")
        return self.cp

    @property
    def _api_proxy(self) -> LaggingProxy:
        if self.api_proxy is None:
            raise RuntimeError("the rig is not started")
        return self.api_proxy

    def _stop_leader(self, sig: signal.Signals) -> str:
        leader = self.leader()
        if leader is None:
            return "no leader to stop"
        leader.held = True
        try:
            begun = time.monotonic()
            self._stop_replica(leader, sig=sig)
            stopped = time.monotonic() - begun
            time.sleep(RESTART_DELAY_S)  # the kubelet's pause before the next container
            self._start_replica(leader)
        finally:
            leader.held = False
        return f"{sig.name} to {leader.name} (gone in {stopped:.1f} s), started again"

    def _restart_apiserver(self) -> str:
        self._control_plane.restart_apiserver()
        return "kube-apiserver restarted"

    def _compact_and_crash(self) -> str:
        """etcd's history compacted away up to now, then kube-apiserver killed and started:
        its watch cache starts again at the compacted revision, so every watch resumes from
        a version that is gone (410 Gone) and every client lists again. (A compaction alone
        is hidden by the watch cache, which keeps serving resumed watches from memory.)"""
        revision = self._compact()
        self._control_plane.restart_apiserver(kill=True)
        return f"etcd compacted at revision {revision}, kube-apiserver killed and started"

    def _slow_api(self) -> str:
        lag = round(self._rng.uniform(0.3, 1.5), 2)
        hold = round(self._rng.uniform(5.0, 12.0), 1)
        self._api_proxy.lag_s = lag
        try:
            time.sleep(hold)  # the fault is this stretch of slowness
        finally:
            self._api_proxy.lag_s = 0.0
        return f"{lag} s added to every answer for {hold} s"

    def _restart_scheduler(self) -> str:
        self.scheduler_held = True
        try:
            self._control_plane.stop_scheduler()
            self._control_plane.start_scheduler(self._config)
        finally:
            self.scheduler_held = False
        return "kube-scheduler restarted"

    def _compact(self) -> int:
        """Compact etcd's history up to its current revision (physically, so that it is gone
        at once): a watch resumed from before it can only be answered 410 Gone."""
        url = self._control_plane.etcd_url
        key = base64.b64encode(b"/").decode()
        header = httpx.post(f"{url}/v3/kv/range", json={"key": key}, timeout=10).json()
        revision = int(header["header"]["revision"])
        answer = httpx.post(
            f"{url}/v3/kv/compaction", json={"revision": revision, "physical": True}, timeout=30
        )
        answer.raise_for_status()
        return revision

    def restart_dead(self) -> int:
        """Start again any replica found dead that no fault is stopping (it crashed on its
        own: worth a look); how many."""
        restarted = 0
        for replica in self.replicas:
            with self._lock:
                if replica.held or replica.alive:
                    continue
            process = replica.process.process
            code = process.returncode if process is not None else None
            last = replica.process.tail(3).replace("\n", " | ")[-600:]
            print(
                f"  rig: schedext {replica.name} found dead (exit code {code}), started "
                f"again; its log ended: {last}",
                flush=True,
            )
            self._start_replica(replica)
            restarted += 1
        cp = self._control_plane
        if not self.scheduler_held and not cp.scheduler_running:
            print("  rig: kube-scheduler found dead, started again", flush=True)
            cp.start_scheduler(self._config)  # kube-scheduler exits when it loses its lease
            restarted += 1
        return restarted

    # --- reading --------------------------------------------------------------------------

    def inventory(self, replica: Replica) -> dict[str, Any] | None:
        try:
            answer = httpx.get(f"{replica.url}/inventory", timeout=10)
        except httpx.HTTPError:
            return None
        return answer.json() if answer.status_code == 200 else None

    def metric_sum(self, replica: Replica, name: str, **labels: str) -> float:
        """The sum of a metric's samples with these labels on one replica (0 if absent)."""
        try:
            text = httpx.get(f"{replica.url}/metrics", timeout=10).text
        except httpx.HTTPError:
            return 0.0
        total = 0.0
        for line in text.splitlines():
            if not line.startswith(name + "{") and not line.startswith(name + " "):
                continue
            if all(f'{k}="{v}"' in line for k, v in labels.items()):
                total += float(line.rsplit(" ", 1)[1])
        return total

    def logs(self) -> Iterator[tuple[str, Path]]:
        for replica in self.replicas:
            yield replica.name, replica.process.log_path
        assert self.cp is not None
        yield "control plane", self.cp.work_dir / "logs"


class PlantedProcess(SchedextProcess):
    """A replica with one guard taken out, for the test that shows the checker catching a
    double allocation: ``loadtests.soak.planted`` reads no pod's ``schedext.io/gpu-ids``,
    so schedext forgets which GPUs its bound pods hold."""

    def command(self) -> list[str]:
        command = super().command()
        index = command.index("app.cli")
        return [*command[:index], "loadtests.soak.planted", *command[index + 1 :]]
