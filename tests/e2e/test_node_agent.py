"""The node agent against the real kube-apiserver, kube-scheduler and schedext: ``schedext
agent`` as a real process, its NVML replayed from the 8-GPU NVLink recording, its device
plugin on a real unix socket, and the test playing the kubelet (registration, Allocate,
ListAndWatch).

What it shows: the agent publishes the node's NVLink groups, UUIDs and health; schedext binds
pods inside one group and names their UUIDs; the agent gives each container exactly those
UUIDs, also after a restart between bind and Allocate, and never twice; a GPU turned
unhealthy (an XID in the replay) reaches ListAndWatch and schedext's inventory.

For shares: the agent writes share memory and cores on the Node's status, where kube-
scheduler's NodeResourcesFit reads them; its second plugin serves the share handle; a share
schedext placed gets its GPU and limits, and a share nobody placed is refused."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
import yaml

from extender.devices.containers import parse_grants
from extender.devices.drift import KubeletDevices
from testbed.builders import with_containers
from testbed.controlplane import ControlPlane
from testbed.kubeapi import ApiError as HarnessApiError
from testbed.kubeapi import KubeApi as HarnessKubeApi
from testbed.kubeapply import Kube, documents
from testbed.kubelet import KubeletClient, KubeletThread
from testbed.manifests import pod_manifest
from testbed.pod_resources import PodResourcesThread
from testbed.processes import free_port
from tests.device_manager import Container, DeviceManager
from tests.e2e.conftest import ROOT, Cluster, eventually, scheduler_config
from tests.fake_mps import FakeMps

H100 = "NVIDIA-H100-80GB-HBM3"
RECORDING = ROOT / "tests" / "fixtures" / "nvml" / "hgx-8-nvlink.json"
TOPOLOGY = "schedext.io/gpu-topology"
NODE = "gpu-node"


class AgentProcess:
    def __init__(self, cluster: Cluster, directory: Path, recording: Path, log: Path) -> None:
        self.cluster, self.directory, self.recording, self.log = cluster, directory, recording, log
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, *extra: str, env: Mapping[str, str] | None = None) -> None:
        command = [
            sys.executable, "-m", "app.cli", "agent",
            "--node-name", NODE,
            "--kubeconfig", str(self.cluster.cp.kubeconfig),
            "--device-plugin-dir", str(self.directory),
            "--nvml-replay", str(self.recording),
            "--probe-host", "127.0.0.1",
            "--probe-port", str(free_port()),
            "--poll-s", "0.5",
            *extra,
        ]  # fmt: skip
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env
            )

    def usage(self) -> str:
        """Resident memory and CPU seconds so far (Linux /proc), for the issue's figures."""
        assert self.process is not None
        status = Path(f"/proc/{self.process.pid}/status").read_text()
        rss = next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS"))
        fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        return f"agent RSS {int(rss) / 1024:.1f} MiB, CPU {cpu:.2f} s"

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(10)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()


@pytest.fixture
def plugin_dir() -> Iterator[Path]:
    # Short: a unix socket's path must fit in 108 bytes, which pytest's tmp_path may not.
    path = Path(tempfile.mkdtemp(prefix="dp-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def agent(cluster: Cluster, plugin_dir: Path, tmp_path: Path) -> Iterator[AgentProcess]:
    recording = tmp_path / "node.json"
    shutil.copy(RECORDING, recording)
    process = AgentProcess(cluster, plugin_dir, recording, tmp_path / "agent.log")
    try:
        yield process
    finally:
        process.stop()
        if process.log.exists():
            print(process.log.read_text()[-4000:])  # noqa: T201 (shown when the test fails)


def uuid(index: int) -> str:
    return f"GPU-5e1ec7ed-0000-4000-8000-{index:012d}"


def inventory_node(cluster: Cluster) -> dict[str, Any]:
    nodes = httpx.get(f"{cluster.schedext.url}/inventory", timeout=10).json()["nodes"]
    found: dict[str, Any] = next(n for n in nodes if n["name"] == NODE)
    return found


def annotations(cluster: Cluster, pod: str) -> dict[str, str]:
    found: dict[str, str] = cluster.get_pod(pod)["metadata"].get("annotations") or {}
    return found


def recorded(cluster: Cluster, pod: str) -> dict[str, tuple[str, ...]]:
    """The pod's allocation record, by container."""
    grants = parse_grants(annotations(cluster, pod).get("schedext.io/gpu-allocated"))
    return {g.container: g.uuids for g in grants}


def allocate_when_seen(client: KubeletClient, device_ids: list[str]) -> tuple[str, ...]:
    """Allocate, retried while the agent's pod watch has not seen the bound pod yet (the
    kubelet retries a failed admission the same way)."""

    def attempt() -> tuple[str, ...] | None:
        try:
            return client.allocate(device_ids)
        except grpc.RpcError as error:
            if "no pod" in (error.details() or ""):
                return None
            raise

    result: tuple[str, ...] = eventually(attempt, timeout=20, message="allocation refused")
    return result


def test_the_agent_gives_each_container_exactly_the_gpus_schedext_chose(
    cluster: Cluster, agent: AgentProcess, plugin_dir: Path
) -> None:
    cluster.node(NODE, gpus=8, model=H100, memory_mib=81559)
    kubelet = KubeletThread(plugin_dir)
    try:
        agent.start()
        kubelet.registered(2)  # whole GPUs, and the share handle (its own test is below)
        assert {(r.resource_name, r.version) for r in kubelet.kubelet.requests} == {
            ("nvidia.com/gpu", "v1beta1"),
            ("schedext.io/gpu-shares", "v1beta1"),
        }
        # The agent publishes the node; schedext's inventory takes it from its node watch.
        published = eventually(
            lambda: (cluster.api.get_node(NODE)["metadata"].get("annotations") or {}).get(TOPOLOGY),
            message="no topology published",
        )
        assert json.loads(published)["groups"] == [[0, 1, 2, 3], [4, 5, 6, 7]]
        eventually(
            lambda: inventory_node(cluster)["gpus"][7]["uuid"] == uuid(7),
            message="schedext did not take the agent's UUIDs",
        )

        # Two pods bound at once: each inside one NVLink group, disjoint, named by UUID.
        cluster.pod("a", gpus=2)
        cluster.pod("b", gpus=2)
        assert cluster.wait_bound("a") == cluster.wait_bound("b") == NODE
        chosen = {p: annotations(cluster, p)["schedext.io/gpu-uuids"].split(",") for p in "ab"}
        assert not set(chosen["a"]) & set(chosen["b"])
        for pod in "ab":
            ids = cluster.gpu_ids(pod)
            assert chosen[pod] == [uuid(i) for i in ids]
            assert ids[0] // 4 == ids[1] // 4  # one NVLink quad

        # The kubelet names other devices; each container gets its pod's own GPUs, in bind
        # order (same second: by name), and the allocation is recorded on the pod.
        client = KubeletClient(plugin_dir / "schedext-gpu.sock")
        first = allocate_when_seen(client, [uuid(6), uuid(7)])
        second = client.allocate([uuid(6), uuid(7)])
        assert [list(first), list(second)] == [chosen["a"], chosen["b"]]
        for pod in "ab":
            eventually(
                lambda pod=pod: recorded(cluster, pod) == {"main": tuple(chosen[pod])},
                message=f"allocation of {pod} not recorded",
            )
        client.close()

        # Restarted between bind and Allocate: the new agent reads the records back, gives
        # c its GPUs, and refuses to give anyone's GPUs a second time.
        agent.kill()
        cluster.pod("c", gpus=2)
        assert cluster.wait_bound("c") == NODE
        chosen["c"] = annotations(cluster, "c")["schedext.io/gpu-uuids"].split(",")
        agent.start()
        kubelet.registered(4)
        client = KubeletClient(plugin_dir / "schedext-gpu.sock")
        assert list(allocate_when_seen(client, chosen["a"])) == chosen["c"]
        with pytest.raises(grpc.RpcError) as refused:
            client.allocate(chosen["a"])
        assert refused.value.code() is grpc.StatusCode.FAILED_PRECONDITION

        # GPU 5 raises XID 79: ListAndWatch says so, and so does schedext's inventory.
        stream = client.devices()
        assert set(next(stream).values()) == {"Healthy"}
        started = time.monotonic()
        recording = json.loads(agent.recording.read_text())
        recording["calls"].append({"call": "xid", "device": 5, "ok": 79})
        staged = agent.recording.with_suffix(".tmp")
        staged.write_text(json.dumps(recording))
        staged.replace(agent.recording)
        health = next(stream)
        assert health[uuid(5)] == "Unhealthy"
        assert [i for i in range(8) if health[uuid(i)] == "Unhealthy"] == [5]
        unhealthy = eventually(
            lambda: inventory_node(cluster)["gpus"][5]["unhealthy"],
            message="schedext still offers GPU 5",
        )
        print(f"health change to schedext's inventory: {time.monotonic() - started:.2f} s")  # noqa: T201
        assert unhealthy.startswith("XID 79")
        print(agent.usage())  # noqa: T201
        client.close()
    finally:
        kubelet.stop()


# (name, [(container, role, GPUs)], what each container gets, as positions in the pod's
# chosen GPUs)
SHAPES = [
    ("init-app", [("setup", "init", 1), ("main", "app", 1)], {"setup": (0,), "main": (0,)}),
    ("two", [("a", "app", 1), ("b", "app", 1)], {"a": (0,), "b": (1,)}),
    ("sidecar", [("side", "sidecar", 1), ("main", "app", 1)], {"side": (0,), "main": (1,)}),
    (
        "big-init",
        [("setup", "init", 2), ("a", "app", 1), ("b", "app", 1)],
        {"setup": (0, 1), "a": (0,), "b": (1,)},
    ),
]


def test_every_pod_shape_gets_exactly_its_gpus_across_an_agent_restart(
    cluster: Cluster, agent: AgentProcess, plugin_dir: Path
) -> None:
    """The kubelet's own Allocate sequence (tests/device_manager.py) for pods schedext bound,
    the agent killed between two containers of each pod and started again: every container
    gets exactly its GPUs, no GPU is in two pods, and the records on the pods say so."""
    cluster.node(NODE, gpus=8, model=H100, memory_mib=81559)
    kubelet = KubeletThread(plugin_dir)
    registrations = 2
    try:
        agent.start()
        kubelet.registered(registrations)
        eventually(
            lambda: inventory_node(cluster)["gpus"][7]["uuid"] == uuid(7),
            message="schedext did not take the agent's UUIDs",
        )
        client = KubeletClient(plugin_dir / "schedext-gpu.sock")
        books = DeviceManager([uuid(i) for i in range(8)], client)
        for name, shape, expected in SHAPES:
            manifest = pod_manifest(name)
            with_containers(manifest, [(c, role, {"nvidia.com/gpu": n}) for c, role, n in shape])
            cluster.api.create_pod(cluster.namespace, manifest)
            assert cluster.wait_bound(name) == NODE
            chosen = annotations(cluster, name)["schedext.io/gpu-uuids"].split(",")
            containers = [Container(c, n, role) for c, role, n in shape]
            # The agent waits for its pod watch to show a pod it is asked for.
            answers = books.admit(name, containers, after=1)
            client.close()
            agent.kill()  # between two containers of the pod
            agent.start()
            registrations += 2
            kubelet.registered(registrations)
            client = KubeletClient(plugin_dir / "schedext-gpu.sock")
            books.plugin = client
            answers |= books.admit(name, containers)
            want = {c: tuple(chosen[i] for i in positions) for c, positions in expected.items()}
            assert answers == want, name
            assert {u for got in answers.values() for u in got} == set(chosen)
            assert recorded(cluster, name) == want
        # No GPU in two pods, in the kubelet's books as in what the agent answered.
        held = [(pod, u) for (pod, _), ids in books.books.items() for u in ids]
        owners: dict[str, set[str]] = {}
        for pod, u in held:
            owners.setdefault(u, set()).add(pod)
        assert all(len(pods) == 1 for pods in owners.values()), owners
        client.close()
        print(agent.usage())  # noqa: T201
    finally:
        kubelet.stop()


def test_the_drift_the_agent_publishes_reaches_schedexts_decisions(
    cluster: Cluster, agent: AgentProcess, plugin_dir: Path
) -> None:
    """The kubelet's PodResources (a stand-in on a unix socket) say a pod nobody placed holds
    GPU 7: the agent writes that on its Node, and schedext never offers GPU 7 again."""
    cluster.node(NODE, gpus=8, model=H100, memory_mib=81559)
    socket = plugin_dir / "pod-resources.sock"
    kubelet = PodResourcesThread(socket)
    try:
        kubelet.set([KubeletDevices("ml", "ghost", "main", "nvidia.com/gpu", (uuid(7),))])
        agent.start("--pod-resources-socket", str(socket), "--reconcile-s", "0.5")
        published = eventually(
            lambda: (cluster.api.get_node(NODE)["metadata"].get("annotations") or {}).get(
                "schedext.io/gpu-drift"
            ),
            message="no drift published",
        )
        (used,) = json.loads(published)["inUse"]
        assert (used["uuid"], used["pod"], used["cause"]) == (uuid(7), "ml/ghost", "unknown-pod")
        why = "GPU 7 in use by a container schedext did not place (kubelet: ml/ghost/main)"
        eventually(
            lambda: inventory_node(cluster)["gpus"][7]["inUse"] == why,
            message="schedext did not take the drift",
        )

        # All eight: kube-scheduler's own fit passes, schedext says which GPU and whose.
        cluster.pod("eight", gpus=8)

        def failed_scheduling() -> str:
            events = cluster.events("eight")
            messages = [e.get("message", "") for e in events if e["reason"] == "FailedScheduling"]
            return next((m for m in messages if "schedext" in m), "")

        message = eventually(failed_scheduling, timeout=60, message="no FailedScheduling")
        assert why in message
        # Seven fit, never on GPU 7.
        cluster.pod("seven", gpus=7)
        assert cluster.wait_bound("seven") == NODE
        assert cluster.gpu_ids("seven") == list(range(7))

        def warning() -> dict[str, Any] | None:
            events = cluster.api.apply_raw("GET", "/api/v1/namespaces/default/events")["items"]
            return next(
                (e for e in events if e["involvedObject"].get("name") == NODE
                 and e["reason"] == "GpuDrift"),
                None,
            )  # fmt: skip

        event = eventually(warning, message="no GpuDrift event on the node")
        assert (event["type"], event["message"]) == ("Warning", why)
        print(agent.usage())  # noqa: T201
    finally:
        kubelet.stop()


SHARE_MEMORY, SHARE_CORES, SHARE_COUNT = (
    "schedext.io/gpu-memory",
    "schedext.io/gpu-cores",
    "schedext.io/gpu-shares",
)


def assert_shares_managed(cluster: Cluster) -> None:
    """The shipped scheduler configuration sends share pods to schedext, and kube-scheduler
    counts the share resources the agent advertises (managedResources, not ignored)."""
    config = yaml.safe_load(scheduler_config(cluster.schedext.url).replace("{{KUBECONFIG}}", "x"))
    (extender,) = config["extenders"]
    managed = {m["name"]: m["ignoredByScheduler"] for m in extender["managedResources"]}
    assert {name: managed.get(name) for name in (SHARE_MEMORY, SHARE_CORES, SHARE_COUNT)} == (
        dict.fromkeys((SHARE_MEMORY, SHARE_CORES, SHARE_COUNT), False)
    )


def share_pod(cluster: Cluster, name: str, *, memory_mib: int, cores: int, node: str = "") -> None:
    asked = {SHARE_MEMORY: str(memory_mib), SHARE_CORES: str(cores), SHARE_COUNT: "1"}
    manifest = pod_manifest(name, requests={"cpu": "100m", **asked}, limits=asked)
    if node:
        manifest["spec"]["nodeName"] = node  # bound by someone else than schedext
    cluster.api.create_pod(cluster.namespace, manifest)


@pytest.fixture
def fake_mps() -> Iterator[FakeMps]:
    # Short: the stand-in's control socket path must fit in 108 bytes.
    root = Path(tempfile.mkdtemp(prefix="mps-"))
    yield FakeMps(root)
    shutil.rmtree(root, ignore_errors=True)


def test_the_agent_offers_shares_and_gives_each_the_gpu_schedext_chose(
    cluster: Cluster, agent: AgentProcess, plugin_dir: Path, fake_mps: FakeMps
) -> None:
    cluster.node(NODE, gpus=8, model=H100, memory_mib=81559)
    kubelet = KubeletThread(plugin_dir)
    try:
        # With MPS, through a stand-in nvidia-cuda-mps-control (there is no GPU here).
        agent.start("--mps", "--mps-dir", str(fake_mps.layout.base), env=fake_mps.env)
        kubelet.registered(2)
        # A daemon per GPU, up before the share plugin registered.
        assert sorted(e["started"] for e in fake_mps.started()) == [uuid(i) for i in range(8)]
        assert {r.resource_name: r.endpoint for r in kubelet.kubelet.requests} == {
            "nvidia.com/gpu": "schedext-gpu.sock",
            SHARE_COUNT: "schedext-gpu-shares.sock",
        }
        # Node-level share memory and cores, written by the agent on its Node's status.
        status = eventually(
            lambda: (s := cluster.api.get_node(NODE)["status"])["capacity"].get(SHARE_MEMORY) and s,
            message="no share capacity on the Node",
        )
        for field in ("capacity", "allocatable"):
            assert status[field][SHARE_MEMORY] == str(8 * 81559)
            assert status[field][SHARE_CORES] == "800"
            assert status[field]["nvidia.com/gpu"] == "8"  # the rest as it was

        # The handle: 32 IDs per GPU, which the kubelet would put in the Node's capacity.
        client = KubeletClient(plugin_dir / "schedext-gpu-shares.sock")
        listed = next(client.devices())
        assert len(listed) == 8 * 32
        assert set(listed.values()) == {"Healthy"}
        node = cluster.api.get_node(NODE)
        for field in ("capacity", "allocatable"):
            node["status"][field][SHARE_COUNT] = str(len(listed))
        cluster.api.apply_raw("PUT", f"/api/v1/nodes/{NODE}/status", node)

        # Placed by schedext (and fitted by kube-scheduler against the agent's capacity).
        assert_shares_managed(cluster)
        share_pod(cluster, "s1", memory_mib=10240, cores=30)
        assert cluster.wait_bound("s1") == NODE
        chosen = annotations(cluster, "s1")
        assert chosen["schedext.io/gpu-share-memory-mib"] == "10240"
        envs = eventually(
            lambda: _allocate_share(client, [f"{uuid(0)}::5"]), message="share refused"
        )
        assert envs == {
            "NVIDIA_VISIBLE_DEVICES": chosen["schedext.io/gpu-uuids"],
            "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=10240M",
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "30",
            "CUDA_MPS_PIPE_DIRECTORY": "/tmp/nvidia-mps",
        }
        eventually(
            lambda: recorded(cluster, "s1") == {"main": (chosen["schedext.io/gpu-uuids"],)},
            message="share allocation not recorded",
        )

        # A share in one container and none in the other: the share's container gets it.
        two = pod_manifest("s2")
        asked = {SHARE_MEMORY: "10240", SHARE_CORES: "10", SHARE_COUNT: "1"}
        with_containers(two, [("main", "app", {}), ("gpu", "app", asked)])
        cluster.api.create_pod(cluster.namespace, two)
        assert cluster.wait_bound("s2") == NODE
        picked = annotations(cluster, "s2")["schedext.io/gpu-uuids"]
        got = eventually(lambda: _allocate_share(client, [f"{picked}::9"]), message="refused")
        assert got["NVIDIA_VISIBLE_DEVICES"] == picked
        eventually(
            lambda: recorded(cluster, "s2") == {"gpu": (picked,)},
            message="the share's container not recorded",
        )

        # Bound without schedext: no GPU was chosen for it, and the agent guesses none.
        share_pod(cluster, "stray", memory_mib=1024, cores=10, node=NODE)
        refused = eventually(
            lambda: _share_refusal(client, [f"{uuid(1)}::0"]), message="stray share not refused"
        )
        assert refused.startswith(
            f"pod {cluster.namespace}/stray asks for a GPU share but schedext did not place it"
        )
        client.close()
        agent.stop()  # the agent's daemons are told to quit
        quits = sorted(e["quit"] for e in fake_mps.entries() if "quit" in e)
        assert quits == [uuid(i) for i in range(8)]
    finally:
        kubelet.stop()


def _allocate_share(client: KubeletClient, device_ids: list[str]) -> dict[str, str] | None:
    """The share's environment, or None while the agent has not seen the pod yet."""
    try:
        return client.allocate_envs(device_ids)
    except grpc.RpcError as error:
        if "no GPU share on this node awaits" in (error.details() or ""):
            return None
        raise


def _share_refusal(client: KubeletClient, device_ids: list[str]) -> str | None:
    try:
        client.allocate_envs(device_ids)
    except grpc.RpcError as error:
        details: str = error.details() or ""
        return None if "no GPU share on this node awaits" in details else details
    raise AssertionError("a share nobody placed was given a GPU")


def test_an_unreadable_topology_is_no_topology_with_a_warning_on_the_node(
    cluster: Cluster,
) -> None:
    future = json.dumps({"version": 9, "groups": [[0, 1]], "gpus": []})
    cluster.api.create_node(
        "odd", cpu="32", memory="256Gi", gpus=2, labels={}, annotations={TOPOLOGY: future},
        taints=None,
    )  # fmt: skip

    def warning() -> dict[str, Any] | None:
        events = cluster.api.apply_raw("GET", "/api/v1/namespaces/default/events")["items"]
        return next(
            (
                e
                for e in events
                if e["involvedObject"].get("name") == "odd"
                and e["reason"] == "GpuAnnotationUnreadable"
            ),
            None,
        )

    event = eventually(warning, message="no warning event on the node")
    assert event["type"] == "Warning"
    assert "version 9 is not supported" in event["message"]
    assert cluster.metric("schedext_node_annotations_unreadable", annotation=TOPOLOGY) == 1
    # The node stays usable, without topology.
    cluster.pod("p", gpus=2)
    assert cluster.wait_bound("p") == "odd"


def test_the_shipped_policy_lets_the_agent_patch_only_its_own_nodes_status(
    control_plane: ControlPlane,
) -> None:
    """manifests/agent.yaml's RBAC and ValidatingAdmissionPolicy, applied for real, with the
    token a pod of the agent on ``own`` gets (bound to the pod, naming its node)."""
    api, kube = control_plane.api, Kube(control_plane)
    namespace, stand_in = "schedext-node", "agent-stand-in"
    for doc in documents(ROOT / "manifests" / "agent.yaml"):
        if doc["kind"] != "DaemonSet":
            kube.apply(doc, dry_run=False)
    kube.close()
    for name in ("own", "other"):
        api.delete_node(name)
        api.create_node(name)
    api.delete_pod(namespace, stand_in)
    eventually(
        lambda: not any(p["metadata"]["name"] == stand_in for p in api.list_pods(namespace)),
        message="the previous stand-in pod is still there",
    )
    pod = pod_manifest(stand_in)
    pod["spec"].update(serviceAccountName="schedext-agent", nodeName="own")
    uid = api.create_pod(namespace, pod)["metadata"]["uid"]
    request = {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {
            "expirationSeconds": 3600,
            "boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": stand_in, "uid": uid},
        },
    }
    token = api.apply_raw(
        "POST", f"/api/v1/namespaces/{namespace}/serviceaccounts/schedext-agent/token", request
    )["status"]["token"]
    body = {"status": {"capacity": {SHARE_MEMORY: "652472"}}}
    merge = "application/merge-patch+json"
    with HarnessKubeApi(control_plane.server, token, control_plane.ca_cert) as agent_api:

        def patch(node: str, **params: str) -> HarnessApiError | None:
            try:
                agent_api.apply_raw(
                    "PATCH", f"/api/v1/nodes/{node}/status", body, content_type=merge, params=params
                )
            except HarnessApiError as error:
                return error
            return None

        # The API server loads a new policy within a moment: until then RBAC alone answers,
        # so it is waited for with dry runs (admitted as writes are, and never stored).
        eventually(lambda: patch("other", dryRun="All"), message="the policy is not in force")
        refused = patch("other")
        assert refused is not None
        assert "may change only its own Node" in refused.body
        assert patch("own") is None
    assert api.get_node("own")["status"]["capacity"][SHARE_MEMORY] == "652472"
    assert SHARE_MEMORY not in api.get_node("other")["status"]["capacity"]
    api.delete_pod(namespace, stand_in)
