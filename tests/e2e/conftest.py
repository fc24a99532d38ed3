"""End-to-end fixtures: one real control plane per session (etcd, kube-apiserver built from Go
modules), and per test a fresh schedext process watching it plus a real, unmodified
kube-scheduler configured with ``manifests/scheduler-config.yaml`` (only the extender URL and
the kubeconfig path are templated)."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
import yaml

from testbed.controlplane import ControlPlane, find_binaries
from testbed.kubeapi import ApiError as HarnessApiError
from testbed.kubeapi import KubeApi
from testbed.manifests import pod_manifest, statefulset_manifest
from testbed.processes import free_port
from testbed.proxy import LaggingProxy
from testbed.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
SCHEDULER_CONFIG = ROOT / "manifests" / "scheduler-config.yaml"
GPU = "nvidia.com/gpu"
GPU_IDS = "schedext.io/gpu-ids"
GROUP_LABEL = "scheduling.x-k8s.io/pod-group"
PRIORITIES = {"lowest": 5, "low": 10, "high": 1000}
PODGROUPS = "/apis/scheduling.x-k8s.io/v1alpha1"
SCHEDEXT = "/apis/schedext.io/v1alpha1"
_namespaces = itertools.count(1)


class Schedext:
    """``schedext serve --kubeconfig`` as a real process on a fixed loopback port."""

    def __init__(
        self,
        kubeconfig: Path,
        log_path: Path,
        *extra_args: str,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.env = {**os.environ, **(env or {})}
        self.kubeconfig = kubeconfig
        self.log_path = log_path
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.extra_args = extra_args
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, *, wait_ready: bool = True) -> None:
        with self.log_path.open("ab") as log:
            command = [
                sys.executable,
                "-m",
                "app.cli",
                "serve",
                "--kubeconfig",
                str(self.kubeconfig),
            ]
            self.process = subprocess.Popen(
                [*command, "--port", str(self.port), *self.extra_args],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=self.env,
            )
        if wait_ready:
            self.wait_ready()

    def wait_ready(self, timeout: float = 60) -> None:
        try:
            wait_for(self._ready, timeout=timeout, message="schedext not ready")
        except AssertionError as error:
            raise AssertionError(f"{error}\nschedext log:\n{self.tail()}") from None

    def _ready(self) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:
            raise AssertionError(f"schedext exited with {self.process.returncode}:\n{self.tail()}")
        try:
            return httpx.get(f"{self.url}/readyz", timeout=2).status_code == 200
        except httpx.TransportError:
            return False

    def stop(self, *, kill: bool = False) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGKILL if kill else signal.SIGTERM)
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=15)

    def get(self, path: str) -> Any:
        return httpx.get(f"{self.url}{path}", timeout=10).json()

    def tail(self, lines: int = 80) -> str:
        if not self.log_path.exists():
            return "(no log)"
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])


FULL_MODE_ENV = {"SCHEDEXT_POLICY__SHORTLIST": "0"}


def scheduler_config(url: str, *, node_cache_capable: bool = True, full_mode: bool = False) -> str:
    """The shipped manifest with only the addresses replaced (and the modes, when asked:
    full mode registers prioritizeVerb, as the manifest's comment says)."""
    text = SCHEDULER_CONFIG.read_text()
    templated = text.replace("http://127.0.0.1:8888", url).replace(
        "/etc/kubernetes/scheduler.conf", "{{KUBECONFIG}}"
    )
    assert templated.count(url) == 1, "manifest layout changed: extender URL not found once"
    assert "{{KUBECONFIG}}" in templated, "manifest layout changed: kubeconfig path not found"
    if not node_cache_capable:
        templated = templated.replace("nodeCacheCapable: true", "nodeCacheCapable: false")
    if full_mode:
        verb = "    filterVerb: filter\n"
        assert templated.count(verb) == 1, "manifest layout changed: filterVerb not found once"
        assert "prioritizeVerb" not in templated.replace("#   prioritizeVerb", "")
        templated = templated.replace(verb, verb + "    prioritizeVerb: prioritize\n")
    return templated


@dataclass
class Cluster:
    """One test's view: the API, a namespace of its own, schedext and kube-scheduler."""

    cp: ControlPlane
    api: KubeApi
    schedext: Schedext
    namespace: str
    node_cache_capable: bool = True
    created_pods: list[str] = field(default_factory=list)

    def start_scheduler(self, *, node_cache_capable: bool = True, full_mode: bool = False) -> None:
        self.node_cache_capable = node_cache_capable
        self.cp.start_scheduler(
            scheduler_config(
                self.schedext.url, node_cache_capable=node_cache_capable, full_mode=full_mode
            )
        )

    def use_full_mode(self) -> None:
        """schedext with policy.shortlist 0 and kube-scheduler with prioritizeVerb: every
        feasible node answered and scored, the mode before shortlists."""
        self.cp.stop_scheduler()
        self.schedext.stop()
        self.schedext = Schedext(
            self.cp.kubeconfig,
            self.schedext.log_path,
            env={**self.schedext.env, **FULL_MODE_ENV},
        )
        self.schedext.start()
        self.start_scheduler(node_cache_capable=self.node_cache_capable, full_mode=True)

    def node(
        self,
        name: str,
        *,
        gpus: int = 0,
        model: str | None = None,
        memory_mib: int | None = None,
        groups: list[list[int]] | None = None,
        cpu: str = "32",
        labels: Mapping[str, str] | None = None,
        taints: list[dict[str, str]] | None = None,
    ) -> None:
        node_labels = dict(labels or {})
        if model:
            node_labels["nvidia.com/gpu.product"] = model
        if memory_mib:
            node_labels["nvidia.com/gpu.memory"] = str(memory_mib)
        annotations = {}
        if groups:
            annotations["schedext.io/gpu-topology"] = json.dumps({"groups": groups})
        self.api.create_node(
            name,
            cpu=cpu,
            memory="256Gi",
            gpus=gpus,
            labels=node_labels,
            annotations=annotations,
            taints=taints,
        )

    def pod(
        self,
        name: str,
        *,
        gpus: int = 0,
        cpu: str = "100m",
        labels: Mapping[str, str] | None = None,
        annotations: Mapping[str, str] | None = None,
        managed: bool = False,
        priority_class: str | None = None,
        node_selector: Mapping[str, str] | None = None,
        node: str | None = None,
    ) -> None:
        """A pod; ``node`` creates it already bound there (a pod that was running before)."""
        requests = {"cpu": cpu, "memory": "64Mi"}
        limits: dict[str, str] = {}
        if gpus:
            requests[GPU] = limits[GPU] = str(gpus)
        if managed:
            requests["schedext.io/managed"] = limits["schedext.io/managed"] = "1"
        manifest = pod_manifest(
            name,
            requests=requests,
            limits=limits or None,
            labels=labels,
            annotations=annotations,
            node_selector=node_selector,
            priority_class=priority_class,
        )
        if node is not None:
            manifest["spec"]["nodeName"] = node
        self.api.create_pod(self.namespace, manifest)
        self.created_pods.append(name)

    def pod_group(
        self,
        name: str,
        *,
        min_member: int,
        timeout_s: int | None = None,
        annotations: Mapping[str, str] | None = None,
    ) -> None:
        spec: dict[str, Any] = {"minMember": min_member}
        if timeout_s is not None:
            spec["scheduleTimeoutSeconds"] = timeout_s
        metadata: dict[str, Any] = {"name": name, "namespace": self.namespace}
        if annotations:
            metadata["annotations"] = dict(annotations)
        body = {
            "apiVersion": "scheduling.x-k8s.io/v1alpha1",
            "kind": "PodGroup",
            "metadata": metadata,
            "spec": spec,
        }
        self.api.apply_raw("POST", f"{PODGROUPS}/namespaces/{self.namespace}/podgroups", body)

    def ip_pool(
        self,
        name: str,
        *,
        cidr: str | None = None,
        ranges: list[tuple[str, str]] | None = None,
        rack: str | None = None,
        gateway: str | None = None,
    ) -> None:
        spec: dict[str, Any] = {}
        if cidr:
            spec["cidr"] = cidr
        if ranges:
            spec["ranges"] = [{"start": a, "end": b} for a, b in ranges]
        if gateway:
            spec["gateway"] = gateway
        if rack:
            spec["nodeSelector"] = {"topology.kubernetes.io/rack": rack}
        body = {
            "apiVersion": "schedext.io/v1alpha1",
            "kind": "IPPool",
            "metadata": {"name": name},
            "spec": spec,
        }
        self.api.apply_raw("POST", f"{SCHEDEXT}/ippools", body)

    def ip_claims(self) -> dict[str, dict[str, Any]]:
        return {
            c["spec"]["owner"]: c
            for c in self.api.apply_raw("GET", f"{SCHEDEXT}/ipclaims")["items"]
        }

    def statefulset(self, name: str, *, replicas: int) -> str:
        """A StatefulSet object (no controller runs here: tests create its pods); its UID."""
        body = statefulset_manifest(name, replicas=replicas, namespace=self.namespace)
        path = f"/apis/apps/v1/namespaces/{self.namespace}/statefulsets"
        return str(self.api.apply_raw("POST", path, body)["metadata"]["uid"])

    def scale_statefulset(self, name: str, replicas: int) -> None:
        path = f"/apis/apps/v1/namespaces/{self.namespace}/statefulsets/{name}"
        sts = self.api.apply_raw("GET", path)
        sts["spec"]["replicas"] = replicas
        self.api.apply_raw("PUT", path, sts)

    def ip_pod(self, name: str, *, ip: str | None = None, pool: str | None = None,
               policy: str | None = None, statefulset: tuple[str, str] | None = None,
               gpus: int = 0, cpu: str = "100m", priority_class: str | None = None,
               node: str | None = None, labels: Mapping[str, str] | None = None,
               ) -> None:  # fmt: skip
        """A pod asking for an address; ``statefulset`` is (name, uid) of its owner."""
        annotations = {}
        if ip:
            annotations["schedext.io/ip"] = ip
        if pool:
            annotations["schedext.io/ip-pool"] = pool
        if policy:
            annotations["schedext.io/ip-policy"] = policy
        requests = {"cpu": cpu, "memory": "64Mi", "schedext.io/ip": "1"}
        limits = {"schedext.io/ip": "1"}
        if gpus:
            requests[GPU] = limits[GPU] = str(gpus)
        manifest = pod_manifest(
            name,
            requests=requests,
            limits=limits,
            labels=labels,
            annotations=annotations,
            priority_class=priority_class,
        )
        if node is not None:
            manifest["spec"]["nodeName"] = node
        if statefulset:
            sts_name, sts_uid = statefulset
            manifest["metadata"]["labels"] = {"app": sts_name}
            manifest["metadata"]["ownerReferences"] = [
                {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": sts_name, "uid": sts_uid,
                 "controller": True, "blockOwnerDeletion": True}
            ]  # fmt: skip
        self.api.create_pod(self.namespace, manifest)

    def address(self, name: str) -> tuple[str, str]:
        annotations = self.get_pod(name)["metadata"].get("annotations") or {}
        return annotations.get("schedext.io/ip", ""), annotations.get("schedext.io/ip-pool", "")

    def get_pod_group(self, name: str) -> dict[str, Any]:
        return self.api.apply_raw(
            "GET", f"{PODGROUPS}/namespaces/{self.namespace}/podgroups/{name}"
        )

    def metric(self, name: str, **labels: str) -> float:
        """A counter or gauge from schedext's /metrics (0 when absent)."""
        text = httpx.get(f"{self.schedext.url}/metrics", timeout=10).text
        wanted = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
        key = f"{name}{{{wanted}}}" if labels else name
        for line in text.splitlines():
            if line.startswith(key + " "):
                return float(line.split()[-1])
        return 0.0

    def get_pod(self, name: str) -> dict[str, Any]:
        return self.api.get_pod(self.namespace, name)

    def wait_bound(self, name: str, timeout: float = 60) -> str:
        return self.api.wait_pod_bound(self.namespace, name, timeout=timeout)

    def gpu_ids(self, name: str) -> list[int]:
        value = (self.get_pod(name)["metadata"].get("annotations") or {}).get(GPU_IDS, "")
        return [int(i) for i in value.split(",") if i]

    def bound_pods(self) -> dict[str, str]:
        pods = self.api.list_pods(self.namespace)
        return {
            p["metadata"]["name"]: p["spec"]["nodeName"] for p in pods if p["spec"].get("nodeName")
        }

    def events(self, name: str) -> list[dict[str, Any]]:
        return self.api.events_for(self.namespace, name)

    def scheduler_caught_up(self) -> None:
        """Wait until kube-scheduler's cache holds every node and every bound pod the API
        server has. Its informers and schedext's run apart: a pod created before kube-scheduler
        has seen the pods already running would be judged against an emptier cluster than
        schedext sees (preemption on the wrong node, or minutes in the unschedulable queue)."""

        def counts() -> tuple[int, int]:
            nodes = len(self.api.apply_raw("GET", "/api/v1/nodes")["items"])
            bound = self.api.apply_raw(
                "GET", "/api/v1/pods", params={"fieldSelector": "spec.nodeName!="}
            )["items"]
            return nodes, len(bound)

        def cached() -> tuple[int, int]:
            # kube-scheduler refreshes this gauge once a second from its cache.
            sizes = {
                line.split('"')[1]: int(float(line.split()[-1]))
                for line in self.cp.scheduler_metrics().splitlines()
                if line.startswith("scheduler_cache_size{")
            }
            return sizes.get("nodes", 0), sizes.get("pods", 0)

        def caught_up() -> bool:
            nodes, pods = counts()
            have_nodes, have_pods = cached()
            return have_nodes >= nodes and have_pods >= pods

        eventually(caught_up, message="kube-scheduler's cache lags the API server")


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    with ControlPlane(bin_dir=find_binaries(), work_dir=tmp_path_factory.mktemp("cp")) as cp:
        install_crds(cp.api)
        for name, value in PRIORITIES.items():
            body = {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                    "metadata": {"name": name}, "value": value}  # fmt: skip
            cp.api.apply_raw("POST", "/apis/scheduling.k8s.io/v1/priorityclasses", body)
        yield cp


def install_crds(api: KubeApi) -> None:
    """The project's CRDs, from manifests/crds, accepted by the real API server."""
    path = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
    for manifest in sorted((ROOT / "manifests" / "crds").glob("*.yaml")):
        crd = yaml.safe_load(manifest.read_text())
        api.apply_raw("POST", path, crd)
        name = crd["metadata"]["name"]

        def established(name: str = name) -> bool:
            status = api.apply_raw("GET", f"{path}/{name}").get("status") or {}
            conditions = status.get("conditions") or []
            return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)

        wait_for(established, timeout=30, message=f"CRD {name} not established")
        # Established is not yet servable: wait until its storage answers a list.
        spec = crd["spec"]
        collection = (
            f"/apis/{spec['group']}/{spec['versions'][0]['name']}/{spec['names']['plural']}"
        )
        wait_for(
            lambda collection=collection: api.apply_raw("GET", collection),
            timeout=30,
            message=f"{collection} not servable",
            retry_on=(httpx.TransportError, HarnessApiError),
        )


def _delete_all(api: KubeApi, collection: str) -> None:
    for obj in api.apply_raw("GET", collection)["items"]:
        api.apply_raw("DELETE", f"{collection}/{obj['metadata']['name']}")


def _reset(api: KubeApi) -> None:
    """Delete every test object and every node, and wait until the nodes are gone."""
    for namespace in api.apply_raw("GET", "/api/v1/namespaces")["items"]:
        ns = namespace["metadata"]["name"]
        if ns.startswith("e2e-"):
            for pod in api.list_pods(ns):
                api.delete_pod(ns, pod["metadata"]["name"])
            _delete_all(api, f"{PODGROUPS}/namespaces/{ns}/podgroups")
            _delete_all(api, f"{PODGROUPS}/namespaces/{ns}/elasticquotas")
            _delete_all(api, f"/apis/apps/v1/namespaces/{ns}/statefulsets")
    _delete_all(api, f"{SCHEDEXT}/ipclaims")
    _delete_all(api, f"{SCHEDEXT}/ippools")
    for node in api.apply_raw("GET", "/api/v1/nodes")["items"]:
        api.delete_node(node["metadata"]["name"])
    wait_for(
        lambda: not api.apply_raw("GET", "/api/v1/nodes")["items"], timeout=30, message="nodes left"
    )


@pytest.fixture
def cluster(
    control_plane: ControlPlane, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[Cluster]:
    """A clean cluster, schedext watching it, and kube-scheduler using the shipped config.
    Component logs are printed when the test fails."""
    api = control_plane.api
    control_plane.stop_scheduler()
    _reset(api)
    namespace = f"e2e-{next(_namespaces)}"
    api.create_namespace(namespace)
    # Release vanished sticky claims quickly, so that tests need not wait 30 s.
    settings = request.node.get_closest_marker("schedext_env")  # more, for this test
    schedext = Schedext(
        control_plane.kubeconfig,
        tmp_path / "schedext.log",
        env={"SCHEDEXT_IP__CLAIM_RELEASE_INTERVAL_S": "1"} | (settings.args[0] if settings else {}),
    )
    schedext.start()
    env = Cluster(cp=control_plane, api=api, schedext=schedext, namespace=namespace)
    request.node.e2e_cluster = env
    mode = request.node.get_closest_marker("node_cache_capable")
    env.start_scheduler(node_cache_capable=mode.args[0] if mode else True)
    try:
        yield env
    finally:
        control_plane.stop_scheduler()
        env.schedext.stop()  # the one running now (use_full_mode replaces it)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    env: Cluster | None = getattr(item, "e2e_cluster", None)
    if report.failed and env is not None and call.when in ("call", "setup"):
        report.sections.append(("schedext log", env.schedext.tail(120)))
        report.sections.append(("control plane logs", env.cp.dump_logs(lines=60)))
    # A test on a control plane of its own, with no schedext (test_dra_harness).
    cp: ControlPlane | None = getattr(item, "e2e_control_plane", None)
    if report.failed and env is None and cp is not None and call.when in ("call", "setup"):
        report.sections.append(("control plane logs", cp.dump_logs(lines=60)))


def eventually(predicate: Any, *, timeout: float = 30, message: str = "condition not met") -> Any:
    return wait_for(predicate, timeout=timeout, interval=0.2, message=message)


WATCH_LAG_S = 1.0


@pytest.fixture
def lagging(cluster: Cluster, tmp_path: Path) -> Iterator[Cluster]:
    """The cluster with a schedext that hears from the API server a second late (its watch
    lags kube-scheduler's, as a busy schedext's does): the cluster fixture's schedext is
    replaced by one whose API server connections go through a :class:`LaggingProxy`."""
    cluster.cp.stop_scheduler()
    cluster.schedext.stop()
    server = urlsplit(cluster.cp.server)
    backend = (server.hostname or "127.0.0.1", server.port or 443)
    with LaggingProxy(backend, lag_s=WATCH_LAG_S) as proxy:
        config = json.loads(cluster.cp.kubeconfig.read_text())
        config["clusters"][0]["cluster"]["server"] = f"https://127.0.0.1:{proxy.port}"
        kubeconfig = tmp_path / "lagging.kubeconfig"
        kubeconfig.write_text(json.dumps(config))
        cluster.schedext = Schedext(kubeconfig, tmp_path / "lagging-schedext.log")
        cluster.schedext.start()
        cluster.cp.start_scheduler(scheduler_config(cluster.schedext.url))
        try:
            yield cluster
        finally:
            cluster.cp.stop_scheduler()
            cluster.schedext.stop()
