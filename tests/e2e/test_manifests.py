"""The deployment manifests against the real control plane:

* every object under manifests/ (CRDs, RBAC, both deployment modes, examples) is accepted by
  kube-apiserver: server-side apply as a dry run, strict field validation, and no warning
  (Pod Security "restricted" in schedext-system, deprecated APIs);
* the KubeSchedulerConfigurations inside the ConfigMaps keep the extender settings of
  manifests/scheduler-config.yaml, and agree with the Deployments around them; so do those
  the Helm chart renders in each mode (test_chart compares the rest of the chart with these
  files);
* mTLS mode's two replicas: the Service selects the leader's pod label, the readiness probe
  is one a standby passes (or rolling updates would never complete), the downward API and
  RBAC let a replica label its own pod; the Prometheus annotations name the metrics port; the
  Service's views port is where kubectl schedext looks, and the viewer role opens only it
  (the chart's renderings too);
* sidecar mode as shipped: kube-scheduler with the ConfigMap of deploy-sidecar.yaml, schedext
  beside it, both with nothing but the pod's ServiceAccount token and the RBAC of rbac.yaml,
  place every example (GPU pod, gang, sticky-address StatefulSet, team quota), and neither
  is refused anything by the API server.

manifests/scheduler-config.yaml is not an API object (kube-scheduler reads it from a file):
the other e2e tests run kube-scheduler with it, and it is compared with the ConfigMaps here.
The Prometheus Operator's objects (manifests/monitoring/: PrometheusRule, PodMonitors) are
left out on purpose: this API server has no monitoring.coreos.com CRDs, and
tests/quality/test_monitoring.py checks them against the metrics schedext exports instead.
Nor are the kustomization.yaml files: test_kustomizations renders them.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from app.kube.role import LEADER, ROLE_LABEL
from app.plugin.access import VIEWER_ROLE, Target
from testbed.controlplane import ControlPlane
from testbed.kubeapply import (
    SYSTEM_NAMESPACE,
    Kube,
    documents,
    kube_with_namespaces,
    service_account_kubeconfig,
)
from tests.e2e.conftest import GROUP_LABEL, ROOT, SCHEDULER_CONFIG, Cluster, Schedext, eventually
from tests.e2e.rendering import helm_template
from tests.e2e.test_mtls import ensure_namespace, running_cluster
from tests.e2e.test_scheduling import H100

MANIFESTS = ROOT / "manifests"
SIDECAR = MANIFESTS / "sidecar" / "deploy-sidecar.yaml"
MTLS = MANIFESTS / "mtls" / "deploy-mtls.yaml"
EXAMPLES = MANIFESTS / "examples"
RACK = "topology.kubernetes.io/rack"
KUSTOMIZATION = "kustomization.yaml"


def api_object_files() -> list[Path]:
    """The YAML files under manifests/, recursively, that hold API objects: not
    scheduler-config.yaml (see above), nor the kustomization.yaml files (kustomize's own
    input; test_kustomizations renders them)."""
    return [
        path
        for path in sorted(MANIFESTS.rglob("*.yaml"))
        if path != SCHEDULER_CONFIG and path.name != KUSTOMIZATION
    ]


# Kinds of an operator the test cluster does not run (see above).
OPERATOR_GROUPS = ("monitoring.coreos.com/",)


def api_objects() -> list[Any]:
    """One pytest param per YAML document under manifests/, recursively."""
    params = []
    for path in api_object_files():
        relative = path.relative_to(MANIFESTS).as_posix()
        for index, doc in enumerate(documents(path)):
            if doc["apiVersion"].startswith(OPERATOR_GROUPS):
                continue
            name = f"{relative}:{doc['kind']}/{doc['metadata']['name']}"
            params.append(pytest.param(path, index, id=name))
    return params


@pytest.fixture(scope="module")
def kube(control_plane: ControlPlane) -> Iterator[Kube]:
    # Every Namespace under manifests/: the node agent's has its own, schedext-node.
    namespaces = [d for p in api_object_files() for d in documents(p) if d["kind"] == "Namespace"]
    with kube_with_namespaces(control_plane, namespaces) as client:
        yield client


@pytest.mark.parametrize(("path", "index"), api_objects())
def test_every_manifest_is_accepted_by_the_api_server(kube: Kube, path: Path, index: int) -> None:
    obj = documents(path)[index]
    result, warnings = kube.apply(obj, dry_run=True)
    assert (result["kind"], result["metadata"]["name"]) == (obj["kind"], obj["metadata"]["name"])
    assert not warnings, f"the API server warns about {path.name}: {warnings}"


# --- the KubeSchedulerConfigurations in the ConfigMaps --------------------------------------


# Where the objects of a test come from: a file under manifests/, or the chart rendered in one
# mode with its default values otherwise ("chart:sidecar", "chart:mtls").
Source = Path | str
SOURCES = [SIDECAR, MTLS, "chart:sidecar", "chart:mtls"]


def source_id(source: Source) -> str:
    return source if isinstance(source, str) else source.relative_to(MANIFESTS).as_posix()


def objects(source: Source) -> list[dict[str, Any]]:
    if isinstance(source, Path):
        return documents(source)
    return helm_template("--set", f"mode={source.removeprefix('chart:')}")


def rbac_of(source: Source) -> list[dict[str, Any]]:
    """The RBAC that goes with a source: rbac.yaml beside a manifest, the chart's own."""
    return documents(MANIFESTS / "rbac.yaml") if isinstance(source, Path) else objects(source)


def scheduler_config_of(source: Source) -> dict[str, Any]:
    """The KubeSchedulerConfiguration in a source's ConfigMap."""
    (config,) = (
        yaml.safe_load(doc["data"]["scheduler-config.yaml"])
        for doc in objects(source)
        if doc["kind"] == "ConfigMap" and "scheduler-config.yaml" in doc["data"]
    )
    assert isinstance(config, dict)
    return config


def deployment_of(source: Source, container: str) -> dict[str, Any]:
    """The Deployment in ``source`` that runs ``container``."""
    for doc in objects(source):
        if doc["kind"] == "Deployment":
            spec: dict[str, Any] = doc["spec"]["template"]["spec"]
            names = [c["name"] for c in spec.get("containers", []) + spec.get("initContainers", [])]
            if container in names:
                return doc
    raise AssertionError(f"no Deployment in {source_id(source)} runs {container}")


def deployment_spec(source: Source, container: str) -> dict[str, Any]:
    """The pod spec of the Deployment in ``source`` that runs ``container``."""
    spec: dict[str, Any] = deployment_of(source, container)["spec"]["template"]["spec"]
    return spec


def container_of(spec: dict[str, Any], name: str) -> dict[str, Any]:
    containers = spec.get("containers", []) + spec.get("initContainers", [])
    found: dict[str, Any] = next(c for c in containers if c["name"] == name)
    return found


def flags(args: list[str]) -> dict[str, str]:
    """``--flag=value`` and ``--flag value`` alike; a switch (``--leader-elect``) maps to ""."""
    parsed: dict[str, str] = {}
    pending = None
    for arg in args:
        if pending is not None and not arg.startswith("--"):
            parsed[pending], pending = arg, None
            continue
        if pending is not None:
            parsed[pending] = ""  # a switch, followed by the next flag
        pending = None
        if "=" in arg:
            flag, _, value = arg.partition("=")
            parsed[flag] = value
        else:
            pending = arg
    if pending is not None:
        parsed[pending] = ""
    return parsed


# What may differ from manifests/scheduler-config.yaml: how the extender is reached.
TRANSPORT = {"urlPrefix", "enableHTTPS", "tlsConfig"}


@pytest.mark.parametrize("source", SOURCES, ids=source_id)
def test_configmap_scheduler_configs_keep_the_shipped_extender_settings(source: Source) -> None:
    shipped = yaml.safe_load(SCHEDULER_CONFIG.read_text())
    config = scheduler_config_of(source)
    assert config["kind"] == shipped["kind"] == "KubeSchedulerConfiguration"
    assert config["apiVersion"] == shipped["apiVersion"]
    assert config["percentageOfNodesToScore"] == shipped["percentageOfNodesToScore"]
    (extender,) = config["extenders"]
    (reference,) = shipped["extenders"]
    mine = {k: v for k, v in extender.items() if k not in TRANSPORT}
    theirs = {k: v for k, v in reference.items() if k not in TRANSPORT}
    assert mine == theirs
    # A second scheduler of its own, with a lease that its RBAC lets it hold, and the pod's
    # ServiceAccount as its credentials.
    assert config["profiles"] == [{"schedulerName": "schedext-scheduler"}]
    election = config["leaderElection"]
    assert election["leaderElect"] is True
    assert (election["resourceNamespace"], election["resourceName"]) == (
        SYSTEM_NAMESPACE,
        "schedext-scheduler",
    )
    roles = [d for d in rbac_of(source) if d["kind"] == "Role"]
    rules = [rule for role in roles for rule in role["rules"]]
    lease_names = {name for rule in rules for name in rule.get("resourceNames", [])}
    assert election["resourceName"] in lease_names
    assert config["clientConnection"]["kubeconfig"] == ""
    # The config file is where kube-scheduler is told to read it.
    spec = deployment_spec(source, "kube-scheduler")
    scheduler = container_of(spec, "kube-scheduler")
    mount = next(m for m in scheduler["volumeMounts"] if m["name"] == "config")
    volume = next(v for v in spec["volumes"] if v["name"] == "config")
    configmap = next(
        d
        for d in objects(source)
        if d["kind"] == "ConfigMap" and "scheduler-config.yaml" in d["data"]
    )
    assert volume["configMap"]["name"] == configmap["metadata"]["name"]
    config_file = f"{mount['mountPath']}/scheduler-config.yaml"
    assert f"--config={config_file}" in scheduler["command"]


@pytest.mark.parametrize("source", [SIDECAR, "chart:sidecar"], ids=source_id)
def test_the_sidecar_extender_url_is_schedext_on_loopback_in_the_same_pod(source: Source) -> None:
    (extender,) = scheduler_config_of(source)["extenders"]
    spec = deployment_spec(source, "schedext")
    schedext = flags(container_of(spec, "schedext")["args"])
    assert schedext["--host"] == "127.0.0.1"
    assert extender["urlPrefix"] == f"http://127.0.0.1:{schedext['--port']}"
    assert extender["enableHTTPS"] is False
    assert container_of(spec, "schedext").get("restartPolicy") == "Always"  # a native sidecar


@pytest.mark.parametrize("source", [MTLS, "chart:mtls"], ids=source_id)
def test_the_mtls_extender_url_is_the_service_and_its_certificates_are_mounted(
    source: Source,
) -> None:
    (extender,) = scheduler_config_of(source)["extenders"]
    service = next(d for d in objects(source) if d["kind"] == "Service")
    port = next(p for p in service["spec"]["ports"] if p["name"] == "https")
    host = f"{service['metadata']['name']}.{service['metadata']['namespace']}.svc"
    assert extender["urlPrefix"] == f"https://{host}:{port['port']}"
    assert extender["enableHTTPS"] is True
    assert extender["tlsConfig"]["serverName"] == host
    # The Service reaches the schedext container's HTTPS port, which requires client certs.
    schedext_spec = deployment_spec(source, "schedext")
    schedext = container_of(schedext_spec, "schedext")
    named_ports = {p["name"]: p["containerPort"] for p in schedext["ports"]}
    assert named_ports[port["targetPort"]] == int(flags(schedext["args"])["--port"])
    assert {"--tls-cert-file", "--tls-key-file", "--tls-client-ca-file"} <= set(
        flags(schedext["args"])
    )
    # kube-scheduler's client certificate files are in its mounted Secret.
    spec = deployment_spec(source, "kube-scheduler")
    scheduler = container_of(spec, "kube-scheduler")
    mounts = {m["name"]: m["mountPath"] for m in scheduler["volumeMounts"]}
    for key in ("certFile", "keyFile", "caFile"):
        assert extender["tlsConfig"][key].startswith(mounts["client-tls"] + "/")
    volume = next(v for v in spec["volumes"] if v["name"] == "client-tls")
    assert volume["secret"]["secretName"] == "schedext-scheduler-client-tls"


# --- mTLS mode: two replicas, the Service reaches the leader, rollouts complete ------------


@pytest.mark.parametrize("source", [MTLS, "chart:mtls"], ids=source_id)
def test_the_mtls_service_selects_the_leaders_pod_and_both_replicas_can_be_ready(
    source: Source,
) -> None:
    """/readyz is true on the leader only, so it cannot be the readinessProbe of a Deployment
    of two replicas: the standby would never be Ready and a rolling update (maxUnavailable 0)
    would never complete. The pods' readiness asks /readyz/synced; the Service selects the
    label that the leader sets on its own pod."""
    deployment = deployment_of(source, "schedext")
    service = next(d for d in objects(source) if d["kind"] == "Service")
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    selector = deployment["spec"]["selector"]["matchLabels"]
    assert service["spec"]["selector"] == {**selector, ROLE_LABEL: LEADER}
    assert ROLE_LABEL not in deployment["spec"]["template"]["metadata"]["labels"]
    spec = deployment["spec"]["template"]["spec"]
    schedext = container_of(spec, "schedext")
    assert "--leader-elect" in flags(schedext["args"])
    readiness = schedext["readinessProbe"]["exec"]["command"][2]
    assert "/readyz/synced'" in readiness
    for probe in ("startupProbe", "livenessProbe"):
        assert "/healthz'" in schedext[probe]["exec"]["command"][2]
    # The downward API names the pod to label, and the Lease's namespace.
    env = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in schedext["env"]}
    assert env == {"POD_NAMESPACE": "metadata.namespace", "POD_NAME": "metadata.name"}
    # Its RBAC lets the pod's ServiceAccount read and patch pods in its own namespace (its
    # own label).
    rbac = rbac_of(source)
    account = spec["serviceAccountName"]
    roles = {d["metadata"]["name"]: d for d in rbac if d["kind"] == "Role"}
    rules = [
        rule
        for binding in rbac
        if binding["kind"] == "RoleBinding"
        and binding["metadata"]["namespace"] == SYSTEM_NAMESPACE
        and {"kind": "ServiceAccount", "name": account, "namespace": SYSTEM_NAMESPACE}
        in binding["subjects"]
        for rule in roles[binding["roleRef"]["name"]]["rules"]
    ]
    pod_rules = [r for r in rules if "pods" in r["resources"]]
    assert [sorted(r["verbs"]) for r in pod_rules] == [["get", "patch"]]
    # Cluster-wide, only the extender's own ClusterRole may patch pods: for the one
    # annotation that sends gang members back to kube-scheduler (schedext.io/requeued-at).
    patching = [
        role["metadata"]["name"]
        for role in rbac
        if role["kind"] == "ClusterRole"
        for rule in role["rules"]
        if "pods" in rule["resources"] and "patch" in rule["verbs"]
    ]
    assert patching == ["schedext"]


@pytest.mark.parametrize("source", SOURCES, ids=source_id)
def test_prometheus_annotations_point_at_the_metrics_only_port(source: Source) -> None:
    deployment = deployment_of(source, "schedext")
    annotations = {
        name: value
        for name, value in deployment["spec"]["template"]["metadata"]["annotations"].items()
        if name.startswith("prometheus.io/")  # the chart's also carry config checksums
    }
    schedext = container_of(deployment["spec"]["template"]["spec"], "schedext")
    port = flags(schedext["args"])["--metrics-port"]
    assert annotations == {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": port,
        "prometheus.io/path": "/metrics",
    }
    assert {"name": "metrics", "containerPort": int(port), "protocol": "TCP"} in schedext["ports"]


@pytest.mark.parametrize("source", SOURCES, ids=source_id)
def test_the_views_port_is_where_kubectl_schedext_looks_and_the_viewer_role_opens_only_it(
    source: Source,
) -> None:
    """The plugin's defaults (Service, namespace, port name) are what both modes install, with
    the files or the chart; the Service's views port leads to schedext's --views-port, and
    only there; schedext-viewer grants get on exactly that proxy name."""
    target = Target()  # kubectl schedext's defaults
    (service,) = (d for d in objects(source) if d["kind"] == "Service")
    assert (service["metadata"]["namespace"], service["metadata"]["name"]) == (
        target.namespace,
        target.service,
    )
    views = next(p for p in service["spec"]["ports"] if p["name"] == target.port)
    deployment = deployment_of(source, "schedext")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() - {ROLE_LABEL: LEADER}.items() <= labels.items()
    schedext = container_of(deployment["spec"]["template"]["spec"], "schedext")
    named_ports = {p["name"]: p["containerPort"] for p in schedext["ports"]}
    args = flags(schedext["args"])
    assert named_ports[views["targetPort"]] == int(args["--views-port"])
    assert args["--views-port"] not in (args["--port"], args["--metrics-port"])
    # The role of viewer-rbac.yaml beside a manifest, the chart's own.
    rbac = objects(MANIFESTS / "viewer-rbac.yaml" if isinstance(source, Path) else source)
    (role,) = (
        d for d in rbac if d["kind"] == "ClusterRole" and d["metadata"]["name"] == VIEWER_ROLE
    )
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["services/proxy"],
         "resourceNames": [target.proxy_name], "verbs": ["get"]}
    ]  # fmt: skip


# --- sidecar mode, with its RBAC only, places the examples ---------------------------------


def statefulset_pods(cluster: Cluster, sts: dict[str, Any]) -> list[str]:
    """Create the StatefulSet's pods as its controller would (there is no controller here)."""
    name = sts["metadata"]["name"]
    template = sts["spec"]["template"]
    owner = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "name": name,
        "uid": sts["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }
    names = []
    for ordinal in range(sts["spec"]["replicas"]):
        pod_name = f"{name}-{ordinal}"
        labels = {**template["metadata"]["labels"], "statefulset.kubernetes.io/pod-name": pod_name,
                  "apps.kubernetes.io/pod-index": str(ordinal)}  # fmt: skip
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": pod_name,
                "labels": labels,
                "annotations": template["metadata"].get("annotations", {}),
                "ownerReferences": [owner],
            },
            "spec": {**template["spec"], "hostname": pod_name,
                     "subdomain": sts["spec"]["serviceName"]},
        }  # fmt: skip
        cluster.api.create_pod(cluster.namespace, pod)
        names.append(pod_name)
    return names


def new_lines(before: str, after: str) -> str:
    return after[len(before) :] if after.startswith(before) else after


def test_sidecar_mode_places_every_example_with_nothing_but_its_rbac(
    control_plane: ControlPlane, kube: Kube, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    # The identities and their RBAC, for real: rbac.yaml, and the sidecar's extra binding.
    ensure_namespace(control_plane, SYSTEM_NAMESPACE)
    rbac = documents(MANIFESTS / "rbac.yaml")
    rbac += [d for d in documents(SIDECAR) if d["kind"] == "ClusterRoleBinding"]
    for obj in rbac:
        kube.apply(obj, dry_run=False)
    identity = service_account_kubeconfig(
        control_plane, "schedext-scheduler", tmp_path / "sa.kubeconfig"
    )

    def sidecar_config(schedext: Schedext) -> str:
        config = scheduler_config_of(SIDECAR)
        config["clientConnection"]["kubeconfig"] = str(identity)
        (extender,) = config["extenders"]
        assert extender["urlPrefix"] == "http://127.0.0.1:8888"
        extender["urlPrefix"] = schedext.url  # the same, on a free port
        return yaml.safe_dump(config)

    scheduler_log = control_plane.logs_tail("kube-scheduler", 1_000_000)
    schedext = Schedext(identity, tmp_path / "schedext.log")
    # The delegated authentication and authorization of kube-scheduler's secure port, too,
    # with the pod's identity (the harness otherwise passes the admin kubeconfig).
    args = (f"--authentication-kubeconfig={identity}", f"--authorization-kubeconfig={identity}")
    with running_cluster(
        control_plane, request, schedext, sidecar_config, scheduler_args=args
    ) as cluster:
        for name in ("gpu-a1", "gpu-a2", "gpu-a3"):
            cluster.node(name, gpus=8, model=H100, memory_mib=81559,
                         groups=[[0, 1, 2, 3], [4, 5, 6, 7]], labels={RACK: "a"})  # fmt: skip
        created = {}
        for path in sorted(EXAMPLES.glob("*.yaml")):
            for obj in documents(path):
                stored, _ = kube.apply(obj, dry_run=False, namespace=cluster.namespace)
                created[obj["kind"], obj["metadata"]["name"]] = stored
        kv = statefulset_pods(cluster, created["StatefulSet", "kv"])

        # gpu-pod.yaml: two GPUs of one NVLink group, written into the pod.
        cluster.wait_bound("cuda-vectoradd", timeout=60)
        ids = cluster.gpu_ids("cuda-vectoradd")
        assert len(ids) == 2
        assert set(ids) <= {0, 1, 2, 3} or set(ids) <= {4, 5, 6, 7}

        # gang.yaml: all four, on distinct GPUs, and the PodGroup's status written back.
        trainers = [f"trainer-{i}" for i in range(4)]
        nodes = {name: cluster.wait_bound(name, timeout=90) for name in trainers}
        held = [(nodes[n], i) for n in trainers for i in cluster.gpu_ids(n)]
        held += [(cluster.get_pod("cuda-vectoradd")["spec"]["nodeName"], i) for i in ids]
        assert len(held) == len(set(held)) == 18
        assert {p["metadata"]["labels"][GROUP_LABEL] for p in map(cluster.get_pod, trainers)} == {
            "trainer"
        }

        def group_scheduled() -> bool:
            status = cluster.get_pod_group("trainer").get("status", {})
            return status.get("phase") == "Scheduled" and status.get("scheduled") == 4

        eventually(group_scheduled, timeout=30, message="PodGroup trainer not Scheduled/4")

        # sticky-ip-statefulset.yaml: one address each from rack a's pool, kept in claims,
        # counted in the pool's status.
        pool = created["IPPool", "rack-a"]["spec"]
        reserved = {ipaddress.ip_address(pool["gateway"])}
        reserved |= {a for cidr in pool["exclude"] for a in ipaddress.ip_network(cidr)}
        addresses = {}
        for name in kv:
            cluster.wait_bound(name, timeout=60)
            address, pool_name = cluster.address(name)
            assert pool_name == "rack-a"
            addresses[name] = ipaddress.ip_address(address)
        assert len(set(addresses.values())) == len(kv)
        assert all(a in ipaddress.ip_network(pool["cidr"]) for a in addresses.values())
        assert not reserved & set(addresses.values())
        owners = {f"sts/{cluster.namespace}/kv/{i}" for i in range(len(kv))}
        claims = eventually(lambda: owners <= set(cluster.ip_claims()), message="no IPClaims")
        assert claims

        def pool_counted() -> bool:
            status = cluster.api.apply_raw("GET", "/apis/schedext.io/v1alpha1/ippools/rack-a")
            return bool(status.get("status", {}).get("allocated") == len(kv))

        eventually(pool_counted, timeout=30, message="IPPool rack-a status not written")

        # team-quota.yaml: what the examples hold, written back into status.used.
        def quota_counted() -> bool:
            path = (
                "/apis/scheduling.x-k8s.io/v1alpha1/namespaces/"
                f"{cluster.namespace}/elasticquotas/team-quota"
            )
            used = cluster.api.apply_raw("GET", path).get("status", {}).get("used", {})
            return bool(used.get("nvidia.com/gpu") == str(len(held)))

        eventually(quota_counted, timeout=30, message="ElasticQuota status.used not written")

        # And nothing was refused on the way: not a list, watch, bind, claim or status write,
        # nor kube-scheduler's lease, events or delegated authentication.
        assert "forbidden" not in schedext.tail(100_000).lower()
        scheduler = new_lines(scheduler_log, control_plane.logs_tail("kube-scheduler", 1_000_000))
        lease = f'"Successfully acquired lease" lock="{SYSTEM_NAMESPACE}/schedext-scheduler"'
        assert lease in scheduler
        assert "forbidden" not in scheduler.lower(), scheduler
