"""The node agent against the real kube-apiserver, kube-scheduler and schedext: ``schedext
agent`` as a real process, its NVML replayed from the 8-GPU NVLink recording, its device
plugin on a real unix socket, and the test playing the kubelet (registration, Allocate,
ListAndWatch).

What it shows: the agent publishes the node's NVLink groups, UUIDs and health; schedext binds
pods inside one group and names their UUIDs; the agent gives each container exactly those
UUIDs, also after a restart between bind and Allocate, and never twice; a GPU turned
unhealthy (an XID in the replay) reaches ListAndWatch and schedext's inventory."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest

from tests.e2e.conftest import ROOT, Cluster, eventually
from tests.e2e.harness import free_port
from tests.kubelet import KubeletClient, KubeletThread

H100 = "NVIDIA-H100-80GB-HBM3"
RECORDING = ROOT / "tests" / "fixtures" / "nvml" / "hgx-8-nvlink.json"
TOPOLOGY = "schedext.io/gpu-topology"
NODE = "gpu-node"


class AgentProcess:
    def __init__(self, cluster: Cluster, directory: Path, recording: Path, log: Path) -> None:
        self.cluster, self.directory, self.recording, self.log = cluster, directory, recording, log
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        command = [
            sys.executable, "-m", "app.cli", "agent",
            "--node-name", NODE,
            "--kubeconfig", str(self.cluster.cp.kubeconfig),
            "--device-plugin-dir", str(self.directory),
            "--nvml-replay", str(self.recording),
            "--probe-host", "127.0.0.1",
            "--probe-port", str(free_port()),
            "--poll-s", "0.5",
        ]  # fmt: skip
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
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
        registration = kubelet.registered()
        assert (registration.resource_name, registration.version) == ("nvidia.com/gpu", "v1beta1")
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
                lambda pod=pod: (
                    annotations(cluster, pod).get("schedext.io/gpu-allocated")
                    == ",".join(chosen[pod])
                ),
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
        kubelet.registered(2)
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
