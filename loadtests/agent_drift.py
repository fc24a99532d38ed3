"""What reconciliation with the kubelet costs the node agent: ``schedext agent`` on the replayed
8-GPU NVLink node (tests/fixtures/nvml/hgx-8-nvlink.json) against a real kube-apiserver, a
stand-in kubelet (registration) and a stand-in PodResources socket that lists the node's pods,
each holding the GPU schedext gave it (no drift); run with reconciliation off, then on at each
``--reconcile-s``, for ``--duration`` seconds each.

Per run it prints the agent's resident memory (VmRSS, and its peak VmHWM) and CPU seconds
(user + system, /proc), the PodResources reads, and the Node patches it sent (all of them, and
the drift annotation's). Then one drift episode on the last run: a pod nobody placed appears
in the kubelet's list and goes again; the patches that cost are the drift's write rate.

    .venv/bin/python -m loadtests.agent_drift --duration 120 --reconcile-s 30,1
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from extender.devices.drift import KubeletDevices
from testbed.controlplane import ControlPlane, find_binaries
from testbed.kubelet import KubeletThread
from testbed.manifests import pod_manifest
from testbed.pod_resources import PodResourcesThread
from testbed.processes import free_port
from testbed.waiting import wait_for

ROOT = Path(__file__).resolve().parents[1]
RECORDING = ROOT / "tests" / "fixtures" / "nvml" / "hgx-8-nvlink.json"
NODE = "gpu-node"
NAMESPACE = "default"
GPU = "nvidia.com/gpu"


def uuid(index: int) -> str:
    return f"GPU-5e1ec7ed-0000-4000-8000-{index:012d}"


def usage(pid: int) -> dict[str, float]:
    status = Path(f"/proc/{pid}/status").read_text().splitlines()
    kib = {line.split(":")[0]: int(line.split()[1]) for line in status if line.startswith("Vm")}
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return {"rss_mib": kib["VmRSS"] / 1024, "peak_rss_mib": kib["VmHWM"] / 1024, "cpu_s": cpu}


def metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return 0.0


def cluster(cp: ControlPlane, pods: int) -> list[KubeletDevices]:
    """The node, and ``pods`` one-GPU pods bound to it as schedext and the agent left them;
    the kubelet's list of the same."""
    cp.api.create_node(NODE, cpu="64", memory="512Gi", gpus=8, labels={}, annotations={},
                       taints=None)  # fmt: skip
    listed = []
    for i in range(pods):
        name = f"p{i}"
        manifest = pod_manifest(name, requests={GPU: "1"}, limits={GPU: "1"})
        manifest["spec"]["nodeName"] = NODE
        manifest["metadata"]["annotations"] = {
            "schedext.io/gpu-ids": str(i),
            "schedext.io/gpu-uuids": uuid(i),
            "schedext.io/gpu-allocated": uuid(i),
        }
        cp.api.create_pod(NAMESPACE, manifest)
        listed.append(KubeletDevices(NAMESPACE, name, "main", GPU, (uuid(i),)))
    return listed


@contextmanager
def agent(
    cp: ControlPlane, directory: Path, socket: Path, *flags: str
) -> Iterator[tuple[int, str]]:
    port = free_port()
    command = [
        sys.executable, "-m", "app.cli", "agent", "--node-name", NODE,
        "--kubeconfig", str(cp.kubeconfig), "--device-plugin-dir", str(directory),
        "--nvml-replay", str(RECORDING), "--probe-host", "127.0.0.1", "--probe-port", str(port),
        "--pod-resources-socket", str(socket), "--log-level", "warning", *flags,
    ]  # fmt: skip
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # noqa: S603
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: _ready(url), timeout=60, message="the agent is not ready")
        yield process.pid, url
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(20)


def _ready(url: str) -> bool:
    try:
        return httpx.get(f"{url}/readyz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def run(
    cp: ControlPlane, work: Path, listed: list[KubeletDevices], args: argparse.Namespace
) -> None:
    kubelet = KubeletThread(work)
    pod_resources = PodResourcesThread(work / "pod-resources.sock")
    pod_resources.set(listed)
    runs = [("off", ("--no-reconcile",))] + [
        (f"on, every {s:g} s", ("--reconcile-s", f"{s:g}")) for s in args.reconcile_s
    ]
    try:
        for label, flags in runs:
            with agent(cp, work, pod_resources.kubelet.socket, *flags) as (pid, url):
                start = usage(pid)
                time.sleep(args.duration)
                end = usage(pid)
                text = httpx.get(f"{url}/metrics", timeout=5).text
                print(json.dumps({
                    "reconcile": label,
                    "seconds": args.duration,
                    "rss_mib": round(end["rss_mib"], 1),
                    "peak_rss_mib": round(end["peak_rss_mib"], 1),
                    "cpu_s": round(end["cpu_s"] - start["cpu_s"], 2),
                    "cpu_percent": round(100 * (end["cpu_s"] - start["cpu_s"]) / args.duration, 3),
                    "podresources_reads": metric(text, "schedext_agent_podresources_reads_total"),
                    "node_writes": metric(text, "schedext_agent_node_writes"),
                    "drift_writes": metric(text, "schedext_agent_drift_writes"),
                }), flush=True)  # fmt: skip
                if label == runs[-1][0]:
                    episode(pod_resources, listed, url, args)
    finally:
        pod_resources.stop()
        kubelet.stop()


def episode(
    pod_resources: PodResourcesThread,
    listed: list[KubeletDevices],
    url: str,
    args: argparse.Namespace,
) -> None:
    """A pod nobody placed holds a GPU, then goes: the drift writes that cost."""
    before = metric(httpx.get(f"{url}/metrics", timeout=5).text, "schedext_agent_drift_writes")
    ghost = KubeletDevices(NAMESPACE, "ghost", "main", GPU, (uuid(7),))
    pod_resources.set([*listed, ghost])
    time.sleep(3 * max(args.reconcile_s[-1], 1.0))
    pod_resources.set(listed)
    time.sleep(3 * max(args.reconcile_s[-1], 1.0))
    after = metric(httpx.get(f"{url}/metrics", timeout=5).text, "schedext_agent_drift_writes")
    print(json.dumps({"episode": "a GPU in use by an unknown pod, then gone",
                      "drift_writes": after - before}), flush=True)  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=120.0, help="seconds per run")
    parser.add_argument(
        "--reconcile-s",
        type=lambda text: [float(x) for x in text.split(",")],
        default=[30.0, 1.0],
        help="PodResources read intervals to run, comma-separated (30,1)",
    )
    parser.add_argument("--pods", type=int, default=7, help="one-GPU pods on the node (7)")
    args = parser.parse_args()
    # Stopped from outside: the control plane and the agent are still stopped on the way out.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    work = Path(tempfile.mkdtemp(prefix="drift-"))  # short: unix socket paths
    with ControlPlane(bin_dir=find_binaries()) as cp:
        run(cp, work, cluster(cp, args.pods), args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
