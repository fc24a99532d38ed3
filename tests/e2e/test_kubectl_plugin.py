"""``kubectl schedext`` against the real kube-apiserver: each subcommand reads schedext's views
through the API server's service proxy (no port-forward), with the person's kubeconfig, the
shipped Service and, for an identity that has nothing else, exactly the shipped
``schedext-viewer`` ClusterRole.

How the API server reaches the schedext process here: there is no kubelet and no endpoints
controller, so the test writes what they would. A stand-in Pod in schedext-system whose
status carries the machine's own non-loopback address (the service proxy only goes to an
endpoint address that a Pod of the Service's namespace has, and the Endpoints API refuses
loopback addresses, by design), and the Endpoints of the shipped Service: that address, and
the port of schedext's ``--views-port``. That listener serves the read-only views on every
address; the verbs stay on loopback, as in the manifests. A machine with no such address
skips these tests, saying so.

The service proxy of kube-apiserver v1.36 reads the Service's v1 Endpoints object (which the
endpoints controller writes in a cluster), hence Endpoints and not an EndpointSlice.
"""

from __future__ import annotations

import fcntl
import ipaddress
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from app.plugin import tables
from app.plugin.access import VIEWS_PORT
from testbed.controlplane import ControlPlane
from testbed.kubeapi import ApiError as HarnessApiError
from testbed.kubeapply import (
    SYSTEM_NAMESPACE,
    Kube,
    documents,
    service_account_kubeconfig,
    stand_in_pod,
)
from testbed.processes import free_port
from tests.e2e.conftest import GROUP_LABEL, PODGROUPS, Cluster, Schedext, eventually
from tests.e2e.test_manifests import MANIFESTS, SIDECAR
from tests.e2e.test_mtls import ensure_namespace
from tests.e2e.test_scheduling import H100

PLUGIN = Path(sys.executable).parent / "kubectl-schedext"
STAND_IN = "schedext-views-e2e"
ENDPOINTS = f"/api/v1/namespaces/{SYSTEM_NAMESPACE}/endpoints"
SIOCGIFADDR = 0x8915  # Linux: an interface's IPv4 address


def machine_address() -> str | None:
    """The machine's first IPv4 address that is not loopback or link-local: one the API server
    may proxy to, on which a wildcard listener answers."""
    for _, name in socket.if_nameindex():
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            try:
                request = struct.pack("256s", name.encode()[:15])
                answer = fcntl.ioctl(sock.fileno(), SIOCGIFADDR, request)
            except OSError:  # no IPv4 address on this interface
                continue
        address = ipaddress.ip_address(answer[20:24])
        if not (address.is_loopback or address.is_link_local or address.is_unspecified):
            return str(address)
    return None


@dataclass
class Proxied:
    """The cluster with schedext's views behind the shipped Service, and the plugin to run."""

    cluster: Cluster
    kube: Kube
    address: str
    port: int
    home: Path

    def run(self, *args: str, kubeconfig: Path | None = None) -> subprocess.CompletedProcess[str]:
        """The installed console script, as kubectl runs it: only the kubeconfig given."""
        env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
        env["HOME"] = str(self.home)
        config = kubeconfig or self.cluster.cp.kubeconfig
        return subprocess.run(
            [str(PLUGIN), *args, "--kubeconfig", str(config)],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
            check=False,
        )

    def endpoints(self, *, port: int | None = None, ready: bool = True) -> None:
        """The Service's Endpoints, as the endpoints controller writes them: the stand-in pod
        at the machine's address and ``port`` (schedext's views port by default), or no
        subset at all while no pod is ready."""
        target = {"kind": "Pod", "namespace": SYSTEM_NAMESPACE, "name": STAND_IN}
        subsets = [
            {"addresses": [{"ip": self.address, "targetRef": target}],
             "ports": [{"name": VIEWS_PORT, "port": port or self.port, "protocol": "TCP"}]}
        ] if ready else []  # fmt: skip
        body: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Endpoints",
            "metadata": {"name": "schedext", "namespace": SYSTEM_NAMESPACE},
            "subsets": subsets,
        }
        api = self.cluster.api
        try:
            current = api.apply_raw("GET", f"{ENDPOINTS}/schedext")
        except HarnessApiError as error:
            if error.status != 404:
                raise
            api.apply_raw("POST", ENDPOINTS, body)
            return
        body["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
        api.apply_raw("PUT", f"{ENDPOINTS}/schedext", body)

    def view(self, path: str) -> Any:
        """What schedext answers on its own main port, to compare with."""
        return self.cluster.schedext.get(path)


def _delete(cluster: Cluster, path: str) -> None:
    try:
        cluster.api.apply_raw("DELETE", path)
    except HarnessApiError as error:
        if error.status != 404:
            raise


@pytest.fixture
def proxied(cluster: Cluster, control_plane: ControlPlane, tmp_path: Path) -> Iterator[Proxied]:
    address = machine_address()
    if address is None:
        pytest.skip(
            "this machine has no non-loopback IPv4 address, and kube-apiserver's service "
            "proxy goes to no loopback address"
        )
    # schedext with its views port, as the manifests run it; kube-scheduler asks this one.
    cluster.cp.stop_scheduler()
    cluster.schedext.stop()
    port = free_port()
    cluster.schedext = Schedext(
        control_plane.kubeconfig, tmp_path / "views-schedext.log", "--views-port", str(port)
    )
    cluster.schedext.start()
    cluster.start_scheduler()

    ensure_namespace(control_plane, SYSTEM_NAMESPACE)
    kube = Kube(control_plane)
    (service,) = [d for d in documents(SIDECAR) if d["kind"] == "Service"]
    kube.apply(service, dry_run=False)
    pod = stand_in_pod(STAND_IN, labels={"app.kubernetes.io/name": "schedext-scheduler"})
    kube.apply(pod, dry_run=False, namespace=SYSTEM_NAMESPACE)
    status = {"status": {"phase": "Running", "podIP": address, "podIPs": [{"ip": address}]}}
    control_plane.api.apply_raw(
        "PATCH",
        f"/api/v1/namespaces/{SYSTEM_NAMESPACE}/pods/{STAND_IN}/status",
        status,
        content_type="application/merge-patch+json",
    )
    home = tmp_path / "home"
    home.mkdir()
    proxied = Proxied(cluster, kube, address, port, home)
    proxied.endpoints()
    try:
        yield proxied
    finally:
        system = f"/api/v1/namespaces/{SYSTEM_NAMESPACE}"
        _delete(cluster, f"{ENDPOINTS}/schedext")
        _delete(cluster, f"{system}/services/schedext")
        _delete(cluster, f"{system}/pods/{STAND_IN}")
        kube.close()


def populate(cluster: Cluster) -> str:
    """Nodes, a bound pod, a pending one held back by its team's quota, a gang short of a
    member; returns the namespace."""
    ns = cluster.namespace
    cluster.node("gpu-a", gpus=4, model=H100, groups=[[0, 1], [2, 3]])
    cluster.node("gpu-b", gpus=4, model=H100)
    cluster.node("cpu-1")
    quota = {"apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "ElasticQuota",
             "metadata": {"name": "team", "namespace": ns},
             "spec": {"min": {"nvidia.com/gpu": "4"}, "max": {"nvidia.com/gpu": "6"}}}  # fmt: skip
    cluster.api.apply_raw("POST", f"{PODGROUPS}/namespaces/{ns}/elasticquotas", quota)
    cluster.pod("trainer", gpus=2)
    cluster.wait_bound("trainer", timeout=60)
    cluster.pod("too-big", gpus=8)
    cluster.pod_group("train", min_member=3)
    for name in ("train-0", "train-1"):
        cluster.pod(name, gpus=1, labels={GROUP_LABEL: "train"})

    def seen() -> bool:  # filter has run for the pending ones
        answer = cluster.schedext.get(f"/explain/{ns}/too-big")
        return bool(answer.get("state") == "pending" and answer.get("quota"))

    eventually(seen, timeout=60, message="schedext has not filtered too-big")
    return ns


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    return result.stdout


def failed(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    assert result.stdout == ""
    return result.stderr


def test_explain_says_why_a_pod_waits_and_where_one_went(proxied: Proxied) -> None:
    ns = populate(proxied.cluster)
    answer = proxied.view(f"/explain/{ns}/too-big")
    # What `schedext explain` prints, through the API server this time.
    text = ok(proxied.run("explain", "too-big", "-n", ns))
    assert text == tables.explanation_text(answer) + "\n"
    lines = text.splitlines()
    assert lines[0] == f"pod {ns}/too-big (pending)"
    assert f"held back by quota {ns}/team (max): over by 4 nvidia.com/gpu" in lines
    assert lines[-1] == "0 of 3 nodes fit"
    assert json.loads(ok(proxied.run("explain", f"{ns}/too-big", "-o", "json"))) == answer
    node = proxied.cluster.get_pod("trainer")["spec"]["nodeName"]
    bound = ok(proxied.run("explain", "trainer", "-n", ns)).splitlines()
    assert bound[0] == f"pod {ns}/trainer (bound on {node})"
    ghost = failed(proxied.run("explain", "ghost", "-n", ns))
    assert ghost == f'error: pod "ghost" not found in namespace {ns}\n'


def test_nodes_shows_each_gpu_node_its_devices_and_the_totals(proxied: Proxied) -> None:
    populate(proxied.cluster)
    node = proxied.cluster.get_pod("trainer")["spec"]["nodeName"]
    lines = ok(proxied.run("nodes")).splitlines()
    assert lines[0].split()[:7] == ["NODE", "MODEL", "GPUS", "FREE", "DEVICES", "OWNER", "DRA"]
    rows = {line.split()[0]: line.split() for line in lines[1:3]}
    assert set(rows) == {"gpu-a", "gpu-b"}
    assert rows[node][1:4] == [H100, "4", "2"]
    assert rows[node][4] in {"UU|..", "UU..", "..|UU", "..UU"}  # one NVLink group on gpu-a
    other = "gpu-b" if node == "gpu-a" else "gpu-a"
    assert rows[other][2:4] == ["4", "4"]
    # No DRA driver publishes slices here: the device plugin's GPUs, no DRA devices.
    assert [rows[name][5:7] for name in ("gpu-a", "gpu-b")] == [["device-plugin", "-"]] * 2
    assert lines[3] == (
        "GPUs: 2 of 8 in use (25%), 0 shared, 0 unhealthy; 1 node without GPUs not listed"
    )
    inventory = proxied.view("/inventory")
    shown = json.loads(ok(proxied.run("nodes", "-o", "json")))
    assert shown == {"nodes": inventory["nodes"], "pools": inventory["pools"]}


def test_gangs_and_quotas_show_members_placed_and_what_each_team_uses(proxied: Proxied) -> None:
    ns = populate(proxied.cluster)
    gangs = ok(proxied.run("gangs")).splitlines()
    assert gangs[0].split()[:4] == ["NAMESPACE", "GROUP", "PHASE", "PLACED/MIN"]
    assert gangs[1].split() == [ns, "train", "Pending", "0/3", "2", "0", "0", "-", "-", "-"]
    assert ok(proxied.run("gangs", "-n", "elsewhere")) == "no gangs\n"
    quotas = ok(proxied.run("quotas", "-n", ns)).splitlines()
    assert quotas[1].split() == [ns, "team", "nvidia.com/gpu", "4", "2", "6", "no"]
    inventory = proxied.view("/inventory")
    assert json.loads(ok(proxied.run("gangs", "-o", "json"))) == {"gangs": inventory["gangs"]}
    assert json.loads(ok(proxied.run("quotas", "-o", "json"))) == {
        "quotas": inventory["quotas"],
        "shadowedQuotas": inventory["shadowedQuotas"],
    }


def test_schedext_unreachable_is_a_clear_error(proxied: Proxied) -> None:
    # The Service has endpoints, but no ready one (what the controller writes then).
    proxied.endpoints(ready=False)
    none_ready = failed(proxied.run("nodes"))
    assert none_ready.startswith(
        "error: schedext is unreachable: the Service schedext-system/schedext has no ready "
        "endpoint with the port 'views'."
    )
    # An endpoint where nothing listens.
    proxied.endpoints(port=free_port())
    refused = failed(proxied.run("gangs"))
    assert refused.startswith(
        "error: schedext is unreachable through the Service schedext-system/schedext:"
    )
    assert "connection refused" in refused
    # No such Service.
    elsewhere = failed(proxied.run("quotas", "--schedext-namespace", "default"))
    assert elsewhere.startswith("error: there is no Service default/schedext")


def test_rbac_without_the_service_proxy_says_which_permission_is_missing(
    proxied: Proxied, control_plane: ControlPlane, tmp_path: Path
) -> None:
    account = {"apiVersion": "v1", "kind": "ServiceAccount",
               "metadata": {"name": "e2e-nobody", "namespace": SYSTEM_NAMESPACE}}  # fmt: skip
    proxied.kube.apply(account, dry_run=False)
    nobody = service_account_kubeconfig(control_plane, "e2e-nobody", tmp_path / "nobody")
    refused = failed(proxied.run("nodes", kubeconfig=nobody))
    first, second = refused.splitlines()
    assert first == (
        'error: services "http:schedext:views" is forbidden: User '
        '"system:serviceaccount:schedext-system:e2e-nobody" cannot get resource '
        '"services/proxy" in API group "" in the namespace "schedext-system"'
    )
    assert second.startswith(
        "kubectl schedext needs get on services/proxy, resource name 'http:schedext:views', "
        "in the namespace schedext-system: ask for the ClusterRole schedext-viewer"
    )


def test_the_shipped_viewer_role_is_all_the_plugin_needs(
    proxied: Proxied, control_plane: ControlPlane, tmp_path: Path
) -> None:
    ns = populate(proxied.cluster)
    (role,) = documents(MANIFESTS / "viewer-rbac.yaml")
    account = {"apiVersion": "v1", "kind": "ServiceAccount",
               "metadata": {"name": "e2e-viewer", "namespace": SYSTEM_NAMESPACE}}  # fmt: skip
    binding = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
               "metadata": {"name": "e2e-viewer", "namespace": SYSTEM_NAMESPACE},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                           "name": role["metadata"]["name"]},
               "subjects": [{"kind": "ServiceAccount", "name": "e2e-viewer",
                             "namespace": SYSTEM_NAMESPACE}]}  # fmt: skip
    for obj in (role, account, binding):
        proxied.kube.apply(obj, dry_run=False)
    viewer = service_account_kubeconfig(control_plane, "e2e-viewer", tmp_path / "viewer")
    try:
        admin = ok(proxied.run("nodes"))

        def same_as_admin() -> bool:  # RBAC's cache takes the new binding in a moment
            return proxied.run("nodes", kubeconfig=viewer).stdout == admin

        eventually(same_as_admin, timeout=30, message="the viewer cannot read the views")
        explained = ok(proxied.run("explain", f"{ns}/too-big", kubeconfig=viewer))
        assert explained.startswith(f"pod {ns}/too-big (pending)")
        assert ok(proxied.run("quotas", kubeconfig=viewer)).splitlines()[1].split()[0] == ns
        # Without get on pods, a pod schedext does not know is said in schedext's words.
        ghost = failed(proxied.run("explain", f"{ns}/ghost", kubeconfig=viewer))
        assert ghost == (
            f"error: pod {ns}/ghost is unknown to schedext: not pending here, not bound\n"
        )
    finally:
        rbac = "/apis/rbac.authorization.k8s.io/v1"
        _delete(proxied.cluster, f"{rbac}/namespaces/{SYSTEM_NAMESPACE}/rolebindings/e2e-viewer")
        _delete(proxied.cluster, f"{rbac}/clusterroles/{role['metadata']['name']}")


def test_a_reader_that_goes_away_ends_the_plugin_quietly(proxied: Proxied) -> None:
    """``kubectl schedext nodes | head -0``: the pipe is closed before the table is written."""
    populate(proxied.cluster)
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    process = subprocess.Popen(
        [str(PLUGIN), "nodes", "--kubeconfig", str(proxied.cluster.cp.kubeconfig)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    assert process.stdout is not None
    process.stdout.close()  # the reader is gone before anything is written
    _, stderr = process.communicate(timeout=60)
    assert (process.returncode, stderr) == (141, b"")


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not on PATH")
def test_kubectl_runs_the_installed_plugin(proxied: Proxied) -> None:
    populate(proxied.cluster)
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    env["PATH"] = f"{PLUGIN.parent}{os.pathsep}{env.get('PATH', '')}"
    env["HOME"] = str(proxied.home)
    result = subprocess.run(
        ["kubectl", "schedext", "gangs", "--kubeconfig", str(proxied.cluster.cp.kubeconfig)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[1].split()[1:4] == ["train", "Pending", "0/3"]
