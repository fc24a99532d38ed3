"""The Helm chart charts/schedext, rendered by the pinned helm, against the real control plane:

* `helm lint --strict` passes in every variant below;
* in every variant (sidecar, sidecar with the node agent, mTLS with two replicas and the second
  scheduler, mTLS with the agent and without the scheduler, mTLS with one replica, mTLS with
  three replicas spread, sidecar with every pass-through value set, sidecar without the
  views, sidecar with the agent and the monitoring objects, or with MPS), every object
  `helm template` renders, CRDs included, is accepted by kube-apiserver: server-side apply
  as a dry run, strict field validation, no warning (Pod Security "restricted" in
  schedext-system). The Prometheus Operator's objects are left out of that: this API server
  has no monitoring.coreos.com CRDs;
* what it renders is what manifests/ holds, but for Helm's labels (the release's in the
  selectors too) and schedext's settings file: the RBAC rules word for word (derived, never
  wider; a mode gets only the identities it uses), the viewer role, the Deployments, the mTLS
  replicas' PodDisruptionBudget and anti-affinity, the Services and their views port, the
  KubeSchedulerConfigurations, the agent, and on request the PodMonitors and the
  PrometheusRule (whose alerts read only metrics schedext exports, and whose filter budget
  follows the extender's httpTimeout); turning the views, the viewer role or the monitoring
  objects on or off changes nothing else, and nor does the agent's devicePlugin but for its
  setting and, off auto, the plugin registry it no longer needs;
* the node agent mounts the MPS host paths only with agent.mps, and is refused, with the
  reason, below Kubernetes 1.30 (the rest of the chart runs on 1.29);
* replicas that take over from one another (mTLS mode's schedext, the scheduler's standbys)
  get a PodDisruptionBudget and a pod anti-affinity on the hostname, one pod neither; the
  anti-affinity, the budget and topology spread follow their values;
* every selector names the release: two releases in one namespace each select only their own
  pods;
* a typo or a wrong type in the values, schedext's settings included, fails `helm template`
  through values.schema.json, and so do the combinations the chart refuses;
* schedext's settings reach it as a file, and the scheduler configuration follows the two it
  must agree with (the extender's httpTimeout, full mode's prioritizeVerb);
* sidecar mode installed from the chart's rendering, for real: the objects applied to the API
  server, kube-scheduler run with the installed ConfigMap, schedext with the installed
  Deployment's args, env and settings file, both with nothing but the pod's ServiceAccount
  token, place GPU pods as the settings say, and nothing is refused.

test_manifests checks the chart's scheduler configurations, its mTLS Service and leader
label, and its Prometheus annotations with the same tests as the plain manifests.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from app.kube.role import LEADER, ROLE_LABEL
from app.service.settings import load_settings
from testbed.controlplane import ControlPlane
from testbed.kubeapi import ApiError as HarnessApiError
from testbed.kubeapply import (
    SYSTEM_NAMESPACE,
    Kube,
    documents,
    kube_with_namespaces,
    service_account_kubeconfig,
)
from testbed.manifests import pod_manifest
from testbed.processes import free_port
from tests.e2e.conftest import GPU, Schedext
from tests.e2e.rendering import (
    CHART,
    ROOT,
    Key,
    by_key,
    helm_template,
    key,
    parse,
    run_tool,
)
from tests.e2e.test_manifests import OPERATOR_GROUPS, container_of, flags, new_lines
from tests.e2e.test_mtls import running_cluster
from tests.e2e.test_scheduling import H100
from tests.quality.test_monitoring import (
    FILTER_BUDGET_ALERT,
    exported_names,
    filter_budget,
    rules,
    unknown_metrics,
)

MANIFESTS = ROOT / "manifests"
VIEWER_RBAC = MANIFESTS / "viewer-rbac.yaml"
PROMETHEUS_RULE = MANIFESTS / "monitoring" / "prometheusrule.yaml"
MONITORING_ON = "monitoring.podMonitors=true,monitoring.prometheusRule=true"
VIEWS_OFF = "views.port=null,views.viewerRole=false"
FENCE_ON = '{"dra": {"fence": true}}'
ZONE_SPREAD = (
    '[{"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone", '
    '"whenUnsatisfiable": "ScheduleAnyway"}]'
)
# The chart in each variant: `helm template` arguments, and the files of manifests/ it
# renders (besides schedext's settings file); None where the values change what the files fix.
VARIANTS: dict[str, tuple[tuple[str, ...], list[str] | None]] = {
    "sidecar": ((), ["rbac.yaml", "viewer-rbac.yaml", "sidecar/deploy-sidecar.yaml"]),
    "sidecar-with-agent": (
        ("--set", "agent.enabled=true"),
        ["rbac.yaml", "viewer-rbac.yaml", "sidecar/deploy-sidecar.yaml", "agent.yaml"],
    ),
    # Two replicas with leader election, and the second scheduler: deploy-mtls.yaml.
    "mtls": (("--set", "mode=mtls"), ["rbac.yaml", "viewer-rbac.yaml", "mtls/deploy-mtls.yaml"]),
    "mtls-with-agent-without-scheduler": (
        ("--set", "mode=mtls,scheduler.enabled=false,agent.enabled=true"),
        ["rbac.yaml", "viewer-rbac.yaml", "mtls/deploy-mtls.yaml", "agent.yaml"],
    ),
    # The Prometheus Operator's objects of manifests/monitoring/, the agent's PodMonitor too.
    "sidecar-with-agent-and-monitoring": (
        ("--set", f"agent.enabled=true,{MONITORING_ON}"),
        ["rbac.yaml", "viewer-rbac.yaml", "sidecar/deploy-sidecar.yaml", "agent.yaml",
         "monitoring/podmonitors.yaml", "monitoring/prometheusrule.yaml"],
    ),
    # The fence (dra.fence): its ClusterRole and the binding of the mode's extender identity.
    "sidecar-with-fence": (
        ("--set-json", f"schedext.config={FENCE_ON}"),
        ["rbac.yaml", "viewer-rbac.yaml", "sidecar/deploy-sidecar.yaml", "rbac-dra-fence.yaml"],
    ),
    "mtls-with-fence": (
        ("--set", "mode=mtls", "--set-json", f"schedext.config={FENCE_ON}"),
        ["rbac.yaml", "viewer-rbac.yaml", "mtls/deploy-mtls.yaml", "rbac-dra-fence.yaml"],
    ),
    # No views listener, hence no Service in sidecar mode, and no viewer role.
    "sidecar-without-views": (("--set", VIEWS_OFF), None),
    "mtls-one-replica": (
        ("--set", "mode=mtls,schedext.replicas=1,schedext.leaderElect=false"),
        None,
    ),
    # Three replicas of each, never two on one node, spread across zones as they allow; the
    # PodDisruptionBudgets of both.
    "mtls-spread": (
        (
            "--set", "mode=mtls,schedext.replicas=3,scheduler.replicas=2",
            "--set", "schedext.podAntiAffinity=required,schedext.pdb.minAvailable=2",
            "--set-json", f"schedext.topologySpreadConstraints={ZONE_SPREAD}",
            "--set-json", f"scheduler.topologySpreadConstraints={ZONE_SPREAD}",
        ),
        None,
    ),
    # The node agent with CUDA MPS, and the host paths that go with it.
    "sidecar-with-agent-and-mps": (("--set", "agent.enabled=true,agent.mps=true"), None),
    # Every pass-through value set, the metrics listener off.
    "sidecar-customised": (
        (
            "--set", "metrics.port=null,scheduler.verbosity=4",
            "--set-json", 'imagePullSecrets=[{"name": "regcred"}]',
            "--set-json", 'scheduler.podLabels={"team": "ml"}',
            "--set-json", 'scheduler.podAnnotations={"team.example.com/owner": "ml"}',
            "--set-json", 'scheduler.tolerations=[{"key": "k", "operator": "Exists"}]',
            "--set-json", 'scheduler.affinity={"nodeAffinity": {"requiredDuringScheduling'
            'IgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [{"key": '
            '"pool", "operator": "In", "values": ["system"]}]}]}}}',
            "--set-json", 'schedext.env=[{"name": "SCHEDEXT_LOG_LEVEL", "value": "debug"}]',
            "--set-json", 'schedext.config={"gang": {"default_timeout_s": 15}}',
        ),
        None,
    ),
}  # fmt: skip
RBAC_KINDS = {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}
# What Helm adds to every object's labels, beyond the manifests' two.
HELM_LABELS = {
    "app.kubernetes.io/instance",
    "app.kubernetes.io/managed-by",
    "app.kubernetes.io/version",
    "helm.sh/chart",
}
INSTANCE = "app.kubernetes.io/instance"  # the release, in every selector of the chart
SETTINGS = "schedext-config"  # the ConfigMap (and its volume) of schedext's settings file
SCHEDULER_OBJECTS = {"schedext-kube-scheduler", "schedext-kube-scheduler-config"}


def variant_args(variant: str) -> tuple[str, ...]:
    return VARIANTS[variant][0]


def find(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (found,) = (o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name)
    return found


@pytest.fixture(scope="module")
def kube_version(control_plane: ControlPlane) -> str:
    """The API server's version, as `helm install` would see it (.Capabilities.KubeVersion)."""
    version: str = control_plane.api.apply_raw("GET", "/version")["gitVersion"]
    return version


@pytest.fixture(scope="module")
def kube(control_plane: ControlPlane) -> Iterator[Kube]:
    # The release namespace, as the chart's README creates it.
    with kube_with_namespaces(control_plane, documents(MANIFESTS / "namespace.yaml")) as client:
        yield client


# --- helm lint, and the API server's word on every rendered object --------------------------


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_helm_lint_strict_passes(variant: str) -> None:
    result = run_tool(
        "helm", "lint", "--strict", str(CHART), "--namespace", SYSTEM_NAMESPACE,
        *variant_args(variant),
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "[WARNING]" not in result.stdout, result.stdout
    assert "[ERROR]" not in result.stdout, result.stdout


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_rendered_object_is_accepted_by_the_api_server(
    kube: Kube, kube_version: str, variant: str
) -> None:
    rendered = helm_template("--include-crds", *variant_args(variant), kube_version=kube_version)
    # A Namespace the chart renders (the agent's) exists before what goes into it.
    for namespace in (obj for obj in rendered if obj["kind"] == "Namespace"):
        kube.apply(namespace, dry_run=False)
    for obj in rendered:
        if obj["apiVersion"].startswith(OPERATOR_GROUPS):
            continue  # no CRDs for them here: see test_the_monitoring_objects_*
        result, warnings = kube.apply(obj, dry_run=True)
        assert key(result) == key(obj)
        assert not warnings, f"the API server warns about {key(obj)}: {warnings}"


def test_the_chart_crds_are_those_of_the_manifests() -> None:
    """Helm installs crds/ only where absent and never upgrades them: they are the files of
    manifests/crds, byte for byte, so both ways install the same CRDs."""
    chart = {path.name: path.read_bytes() for path in (CHART / "crds").glob("*.yaml")}
    plain = {path.name: path.read_bytes() for path in (MANIFESTS / "crds").glob("*.yaml")}
    assert chart == plain


def test_the_chart_prometheus_rule_is_a_copy_of_the_manifest() -> None:
    """Helm reads no file outside the chart: the alerts are kept twice, the same bytes, so a
    change to one without the other fails here."""
    assert (CHART / "files" / "prometheusrule.yaml").read_bytes() == PROMETHEUS_RULE.read_bytes()


# --- what the chart renders is what manifests/ holds -----------------------------------------


def without_instance(node: Any) -> Any:
    """``node`` without the release's label anywhere: manifests/ are one install, and select
    their pods without it (test_two_releases_* holds the chart's selectors to it)."""
    if isinstance(node, dict):
        return {k: without_instance(v) for k, v in node.items() if k != INSTANCE}
    if isinstance(node, list):
        return [without_instance(item) for item in node]
    return node


def comparable(obj: dict[str, Any]) -> dict[str, Any]:
    """An object without what may differ between the chart and manifests/: Helm's labels (the
    release's, app.kubernetes.io/instance, in selectors and pod labels too), the checksums that
    roll pods on a config change, schedext's settings file (--config and its mount),
    imagePullPolicy (set by the chart, IfNotPresent either way for a tagged image), the form
    of args (``--port 8888`` or ``--port=8888``), comments and layout of an embedded
    KubeSchedulerConfiguration."""
    obj = without_instance(obj)
    metadata = obj["metadata"]
    for label in HELM_LABELS:
        metadata.get("labels", {}).pop(label, None)
    data = obj.get("data", {})
    if obj["kind"] == "ConfigMap" and "scheduler-config.yaml" in data:
        data["scheduler-config.yaml"] = yaml.safe_load(data["scheduler-config.yaml"])
    if obj["kind"] in ("Deployment", "DaemonSet"):
        template = obj["spec"]["template"]
        annotations = template["metadata"].get("annotations", {})
        for name in [n for n in annotations if n.endswith("-checksum")]:
            del annotations[name]
        if not annotations:
            template["metadata"].pop("annotations", None)
        spec = template["spec"]
        spec["volumes"] = [v for v in spec.get("volumes", []) if v["name"] != SETTINGS]
        for container in spec.get("initContainers", []) + spec["containers"]:
            container.pop("imagePullPolicy", None)
            if "args" in container:
                container["args"] = flags(container["args"])
                container["args"].pop("--config", None)
            mounts = [m for m in container.get("volumeMounts", []) if m["name"] != SETTINGS]
            container.pop("volumeMounts", None)
            if mounts:
                container["volumeMounts"] = mounts
    return obj


@pytest.mark.parametrize("variant", sorted(v for v, (_, files) in VARIANTS.items() if files))
def test_the_chart_renders_the_objects_of_the_manifests(variant: str) -> None:
    args, files = VARIANTS[variant]
    assert files is not None
    rendered = by_key(helm_template(*args))
    plain = by_key([doc for name in files for doc in documents(MANIFESTS / name)])
    settings = next(k for k in rendered if k[1:] == ("ConfigMap", SYSTEM_NAMESPACE, SETTINGS))
    # Everything rendered is in manifests/, equal but for what comparable() drops. RBAC
    # included: the same rules, never wider.
    for name, obj in rendered.items():
        if name == settings:
            continue
        assert name in plain, f"the chart renders {name}, which manifests/ lacks"
        assert comparable(obj) == comparable(plain[name]), name
    # And every workload of the files, but the scheduler where it is turned off.
    workloads = {k for k, obj in plain.items() if obj["kind"] not in RBAC_KINDS}
    if "scheduler.enabled=false" in " ".join(args):
        workloads = {k for k in workloads if k[3] not in SCHEDULER_OBJECTS}
    assert workloads <= rendered.keys()
    assert not {k for k in rendered if k[3] in SCHEDULER_OBJECTS} - workloads


def rbac_names(objects: list[dict[str, Any]]) -> set[tuple[str, str]]:
    return {(obj["kind"], obj["metadata"]["name"]) for obj in objects if obj["kind"] in RBAC_KINDS}


def test_each_mode_gets_only_the_identities_it_uses() -> None:
    """Sidecar mode: one pod, one ServiceAccount (the scheduler's, bound to the extender's
    ClusterRole too); no `schedext` account and no role to label pods in the namespace. mTLS
    mode: all of rbac.yaml; without the scheduler, none of its grants. The viewer role in
    every mode."""
    plain = rbac_names(documents(MANIFESTS / "rbac.yaml") + documents(VIEWER_RBAC))
    extender_only = {
        ("ServiceAccount", "schedext"),
        ("ClusterRoleBinding", "schedext"),
        ("Role", "schedext-leader-election"),
        ("RoleBinding", "schedext-leader-election"),
    }
    sidecar_binding = {("ClusterRoleBinding", "schedext-scheduler:schedext")}
    assert rbac_names(helm_template()) == plain - extender_only | sidecar_binding
    assert rbac_names(helm_template("--set", "mode=mtls")) == plain
    without_scheduler = rbac_names(helm_template("--set", "mode=mtls,scheduler.enabled=false"))
    assert {name for _, name in without_scheduler} == {
        "schedext",
        "schedext-leader-election",
        "schedext-viewer",
    }
    # The fence's role only with the fence on, bound to the extender's identity of the mode.
    fence = {("ClusterRole", "schedext-dra-fence")}
    assert rbac_names(helm_template("--set-json", f"schedext.config={FENCE_ON}")) == (
        plain - extender_only | sidecar_binding | fence
        | {("ClusterRoleBinding", "schedext-scheduler:schedext-dra-fence")}
    )  # fmt: skip
    assert rbac_names(
        helm_template("--set", "mode=mtls", "--set-json", f"schedext.config={FENCE_ON}")
    ) == plain | fence | {("ClusterRoleBinding", "schedext-dra-fence")}


# --- the views, the viewer role, the monitoring objects: values that add, never change -------


def without_views(objects: dict[Key, dict[str, Any]]) -> dict[Key, dict[str, Any]]:
    """``objects`` as they should be without the views listener: no --views-port, no `views`
    container or Service port, and no Service left without a port."""
    stripped = {}
    for name, original in objects.items():
        obj = copy.deepcopy(original)
        if obj["kind"] == "Service":
            obj["spec"]["ports"] = [p for p in obj["spec"]["ports"] if p["name"] != "views"]
            if not obj["spec"]["ports"]:
                continue
        if obj["kind"] == "Deployment":
            spec = obj["spec"]["template"]["spec"]
            for container in spec.get("initContainers", []) + spec["containers"]:
                if "args" in container:
                    args = [a for a in container["args"] if not a.startswith("--views-port")]
                    container["args"] = args
                if "ports" in container:
                    ports = [p for p in container["ports"] if p["name"] != "views"]
                    container["ports"] = ports
        stripped[name] = obj
    return stripped


@pytest.mark.parametrize("mode", ["sidecar", "mtls"])
def test_views_off_removes_the_listener_and_its_service_port_and_nothing_else(mode: str) -> None:
    """views.port=null: sidecar mode renders no Service (views was its only port), mTLS mode's
    Service keeps https; the viewer role stays (its own value)."""
    on = by_key(helm_template("--set", f"mode={mode}"))
    off = by_key(helm_template("--set", f"mode={mode},views.port=null"))
    assert without_views(on) != on
    assert off == without_views(on)
    services = [obj for obj in off.values() if obj["kind"] == "Service"]
    assert [[p["name"] for p in s["spec"]["ports"]] for s in services] == (
        [["https"]] if mode == "mtls" else []
    )


def test_the_viewer_role_off_removes_it_and_nothing_else() -> None:
    on = by_key(helm_template())
    off = by_key(helm_template("--set", "views.viewerRole=false"))
    viewer = ("rbac.authorization.k8s.io/v1", "ClusterRole", "", "schedext-viewer")
    assert viewer in on
    assert off == {name: obj for name, obj in on.items() if name != viewer}


AGENT = ("apps/v1", "DaemonSet", "schedext-node", "schedext-agent")
REGISTRY = "plugins-registry"  # the kubelet's plugin registry, for the agent's DRA check


def with_device_plugin(objects: dict[Key, dict[str, Any]], mode: str) -> dict[Key, dict[str, Any]]:
    """``objects`` as agent.devicePlugin=``mode`` should render them: the agent told so, and
    without the kubelet's plugin registry, which only auto reads."""
    changed = copy.deepcopy(objects)
    spec = changed[AGENT]["spec"]["template"]["spec"]
    spec["volumes"] = [v for v in spec["volumes"] if v["name"] != REGISTRY]
    agent = container_of(spec, "agent")
    agent["volumeMounts"] = [m for m in agent["volumeMounts"] if m["name"] != REGISTRY]
    for env in agent["env"]:
        if env["name"] == "SCHEDEXT_AGENT_DEVICE_PLUGIN":
            env["value"] = mode
    return changed


@pytest.mark.parametrize("mode", ["on", "off"])
def test_the_agent_reads_the_plugin_registry_only_to_decide_its_device_plugin(mode: str) -> None:
    """agent.devicePlugin=auto (the default): the agent is told auto and gets the kubelet's
    plugin registry read-only, where a DRA driver's socket turns its device plugins off. on or
    off: told so, no registry mounted, nothing else changed."""
    auto = by_key(helm_template("--set", "agent.enabled=true"))
    spec = auto[AGENT]["spec"]["template"]["spec"]
    agent = container_of(spec, "agent")
    assert {"name": "SCHEDEXT_AGENT_DEVICE_PLUGIN", "value": "auto"} in agent["env"]
    (mount,) = [m for m in agent["volumeMounts"] if m["name"] == REGISTRY]
    assert mount == {
        "name": REGISTRY, "mountPath": "/var/lib/kubelet/plugins_registry", "readOnly": True,
    }  # fmt: skip
    (volume,) = [v for v in spec["volumes"] if v["name"] == REGISTRY]
    assert volume["hostPath"] == {"path": "/var/lib/kubelet/plugins_registry", "type": "Directory"}
    chosen = by_key(helm_template("--set", f"agent.enabled=true,agent.devicePlugin={mode}"))
    assert chosen == with_device_plugin(auto, mode) != auto


def operator_objects(objects: dict[Key, dict[str, Any]]) -> set[tuple[str, str, str]]:
    return {name[1:] for name in objects if name[0].startswith(OPERATOR_GROUPS)}


@pytest.mark.parametrize(
    ("values", "added"),
    [
        (
            f"agent.enabled=true,{MONITORING_ON}",
            {
                ("PodMonitor", SYSTEM_NAMESPACE, "schedext"),
                ("PodMonitor", "schedext-node", "schedext-agent"),
                ("PrometheusRule", SYSTEM_NAMESPACE, "schedext"),
            },
        ),
        ("mode=mtls,monitoring.podMonitors=true", {("PodMonitor", SYSTEM_NAMESPACE, "schedext")}),
        ("monitoring.prometheusRule=true", {("PrometheusRule", SYSTEM_NAMESPACE, "schedext")}),
    ],
    ids=["all, with the agent", "podMonitors, mtls", "prometheusRule"],
)
def test_the_monitoring_objects_are_off_by_default_and_add_only_themselves(
    values: str, added: set[tuple[str, str, str]]
) -> None:
    """Off (the default), the chart renders nothing of monitoring.coreos.com, which a cluster
    without the Prometheus Operator refuses; on, it adds them and changes nothing else."""
    others = ",".join(v for v in values.split(",") if not v.startswith("monitoring."))
    base = by_key(helm_template(*(("--set", others) if others else ())))
    on = by_key(helm_template("--set", values))
    assert not operator_objects(base)
    assert operator_objects(on) == added
    assert {k: v for k, v in on.items() if not k[0].startswith(OPERATOR_GROUPS)} == base


def test_the_chart_alerts_read_exported_metrics_and_follow_the_http_timeout() -> None:
    """The chart's PrometheusRule is the file's (test_monitoring holds that one to the code;
    test_the_chart_renders_the_objects_of_the_manifests compares them with the defaults) but
    for the filter alert, whose budget is the httpTimeout the chart gives kube-scheduler.
    monitoring.labels reach every monitoring object, for the operator's selectors."""
    rendered = helm_template(
        "--set", MONITORING_ON,
        "--set-json", 'schedext.config={"bind": {"extender_http_timeout_s": 40}}',
        "--set-json", 'monitoring.labels={"release": "kube-prometheus-stack"}',
    )  # fmt: skip
    found = rules(find(rendered, "PrometheusRule", "schedext"))
    exported = exported_names()
    for rule in found:
        assert not unknown_metrics(rule["expr"], exported), rule["alert"]
    configmap = find(rendered, "ConfigMap", "schedext-scheduler-config")
    (extender,) = yaml.safe_load(configmap["data"]["scheduler-config.yaml"])["extenders"]
    assert extender["httpTimeout"] == "40s"
    assert filter_budget(found) == 40 != filter_budget(rules())
    (budget,) = [r for r in found if r["alert"] == FILTER_BUDGET_ALERT]
    assert "40 s httpTimeout" in budget["annotations"]["summary"]
    others = [r for r in found if r["alert"] != FILTER_BUDGET_ALERT]
    assert others == [r for r in rules() if r["alert"] != FILTER_BUDGET_ALERT]
    for obj in rendered:
        if obj["apiVersion"].startswith(OPERATOR_GROUPS):
            labels = obj["metadata"]["labels"]
            assert labels["release"] == "kube-prometheus-stack", obj["metadata"]["name"]
            assert labels["app.kubernetes.io/part-of"] == "schedext"


def test_one_mtls_replica_without_leader_election_is_served_without_the_leader_label() -> None:
    """Without --leader-elect nobody labels a pod schedext.io/role=leader: the Service selects
    the pods alone, readiness is /readyz, and no Role to label pods is granted."""
    rendered = helm_template(*variant_args("mtls-one-replica"))
    service = find(rendered, "Service", "schedext")
    deployment = find(rendered, "Deployment", "schedext")
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    assert deployment["spec"]["replicas"] == 1
    schedext = container_of(deployment["spec"]["template"]["spec"], "schedext")
    assert "--leader-elect" not in flags(schedext["args"])
    assert schedext["readinessProbe"]["exec"]["command"][2].endswith(
        "'https://127.0.0.1:8443/readyz', context=c, timeout=3)"
    )
    assert ("Role", "schedext-leader-election") not in rbac_names(rendered)


# --- the node agent: MPS host paths, and the Kubernetes version it needs -------------------

MPS_VOLUMES = {"mps", "mps-shm"}


def without_mps(objects: dict[Key, dict[str, Any]]) -> dict[Key, dict[str, Any]]:
    """``objects`` as agent.mps=false should render them: no MPS host path, nothing over the
    container's /dev/shm, the runtime asked for NVML only and the agent told MPS is off."""
    changed = copy.deepcopy(objects)
    spec = changed[AGENT]["spec"]["template"]["spec"]
    spec["volumes"] = [v for v in spec["volumes"] if v["name"] not in MPS_VOLUMES]
    agent = container_of(spec, "agent")
    agent["volumeMounts"] = [m for m in agent["volumeMounts"] if m["name"] not in MPS_VOLUMES]
    off = {"NVIDIA_DRIVER_CAPABILITIES": "utility", "SCHEDEXT_AGENT_MPS": "false"}
    for env in agent["env"]:
        env["value"] = off.get(env["name"], env.get("value"))
        if env["value"] is None:
            del env["value"]
    return changed


def test_the_agent_mounts_the_mps_host_paths_only_with_mps() -> None:
    """agent.mps=false (the default): no hostPath under /run/schedext/mps, and nothing over
    the container's /dev/shm. true: both, and the runtime asked for compute. Nothing else
    differs."""
    off = by_key(helm_template("--set", "agent.enabled=true"))
    on = by_key(helm_template("--set", "agent.enabled=true,agent.mps=true"))
    for objects, mps in ((off, False), (on, True)):
        spec = objects[AGENT]["spec"]["template"]["spec"]
        host_paths = {v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
        agent = container_of(spec, "agent")
        mounted = {m["mountPath"] for m in agent["volumeMounts"]}
        env = {e["name"]: e.get("value") for e in agent["env"]}
        assert env["SCHEDEXT_AGENT_MPS"] == str(mps).lower()
        if mps:
            assert {"/run/schedext/mps", "/run/schedext/mps/shm"} <= host_paths
            assert {"/run/schedext/mps", "/dev/shm"} <= mounted
        else:
            assert not {p for p in host_paths if p.startswith("/run/schedext")}, host_paths
            assert not mounted & {"/run/schedext/mps", "/dev/shm"}, mounted
    assert without_mps(on) == off != on


@pytest.mark.parametrize(
    ("version", "values", "refusal"),
    [
        ("1.29.0", "agent.enabled=true", "agent.enabled needs Kubernetes 1.30 or later"),
        ("1.29.0", "agent.enabled=false", None),
        ("1.29.0", "mode=mtls", None),
        ("1.30.0", "agent.enabled=true", None),
        ("1.28.9", "agent.enabled=false", "chart requires kubeVersion: >=1.29.0-0"),
    ],
)
def test_the_agent_needs_kubernetes_1_30_and_the_rest_of_the_chart_1_29(
    version: str, values: str, refusal: str | None
) -> None:
    """The agent's ValidatingAdmissionPolicy (admissionregistration.k8s.io/v1) and the node-name
    claim of service-account tokens it checks came in 1.30: on 1.29 the chart refuses the agent
    and says why; without it, 1.29 (native sidecars) is enough."""
    result = run_tool(
        "helm", "template", "schedext", str(CHART), "--namespace", SYSTEM_NAMESPACE,
        "--kube-version", version, "--set", values,
    )  # fmt: skip
    if refusal is None:
        assert result.returncode == 0, result.stderr
        policies = [d for d in parse(result.stdout) if d["kind"] == "ValidatingAdmissionPolicy"]
        assert len(policies) == ("agent.enabled=true" in values)
        return
    assert result.returncode != 0, result.stdout
    assert refusal in result.stderr, result.stderr
    if "agent" in refusal:
        assert "ValidatingAdmissionPolicy" in result.stderr
        assert "authentication.kubernetes.io/node-name" in result.stderr


# --- availability: disruption budgets and spreading of the replicas -----------------------

HOSTNAME = "kubernetes.io/hostname"


def pod_spec(objects: list[dict[str, Any]], name: str) -> dict[str, Any]:
    spec: dict[str, Any] = find(objects, "Deployment", name)["spec"]["template"]["spec"]
    return spec


def selector_of(objects: list[dict[str, Any]], name: str) -> dict[str, str]:
    labels: dict[str, str] = find(objects, "Deployment", name)["spec"]["selector"]["matchLabels"]
    return labels


def budgets(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o["spec"] for o in objects if o["kind"] == "PodDisruptionBudget"}


def preferred(selector: dict[str, str]) -> dict[str, Any]:
    """The default anti-affinity: rather not two of these pods on one node."""
    term = {"topologyKey": HOSTNAME, "labelSelector": {"matchLabels": selector}}
    return {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 100, "podAffinityTerm": term}
    ]}  # fmt: skip


def test_mtls_replicas_get_a_disruption_budget_and_rather_different_nodes() -> None:
    """mTLS mode's defaults, two leader-electing replicas: the PodDisruptionBudget schedext
    (minAvailable 1) over exactly the Deployment's pods, so a drain leaves the leader or the
    standby, and a preferred anti-affinity on the hostname among them. The scheduler's one pod
    gets neither; two standbys get both."""
    rendered = helm_template("--set", "mode=mtls")
    selector = selector_of(rendered, "schedext")
    assert budgets(rendered) == {
        "schedext": {"minAvailable": 1, "selector": {"matchLabels": selector}}
    }
    assert pod_spec(rendered, "schedext")["affinity"] == {"podAntiAffinity": preferred(selector)}
    assert "affinity" not in pod_spec(rendered, "schedext-kube-scheduler")

    two = helm_template("--set", "mode=mtls,scheduler.replicas=2")
    scheduler = selector_of(two, "schedext-kube-scheduler")
    assert budgets(two)["schedext-kube-scheduler"] == {
        "minAvailable": 1, "selector": {"matchLabels": scheduler}
    }  # fmt: skip
    affinity = pod_spec(two, "schedext-kube-scheduler")["affinity"]
    assert affinity == {"podAntiAffinity": preferred(scheduler)}


def test_one_pod_gets_no_disruption_budget_nor_anti_affinity() -> None:
    """A PodDisruptionBudget of minAvailable 1 over one pod would keep its node from draining:
    sidecar mode's one pod and a single mTLS replica get none, and no anti-affinity."""
    for rendered, name in (
        (helm_template(), "schedext-scheduler"),
        (helm_template(*variant_args("mtls-one-replica")), "schedext"),
    ):
        assert budgets(rendered) == {}
        assert "affinity" not in pod_spec(rendered, name)
        assert "topologySpreadConstraints" not in pod_spec(rendered, name)


NODE_AFFINITY = {
    "requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [
            {"key": "pool", "operator": "In", "values": ["system"]}
        ]}]
    }
}  # fmt: skip
OWN_ANTI_AFFINITY = {
    "requiredDuringSchedulingIgnoredDuringExecution": [
        {"topologyKey": "topology.kubernetes.io/zone",
         "labelSelector": {"matchLabels": {"team": "sched"}}}
    ]
}  # fmt: skip


def expected_affinity(case: str, selector: dict[str, str]) -> dict[str, Any] | None:
    required = [{"topologyKey": HOSTNAME, "labelSelector": {"matchLabels": selector}}]
    return {
        "none": None,
        "required": {
            "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": required}
        },
        # An affinity of the user's keeps the default anti-affinity beside it ...
        "nodeAffinity": {"nodeAffinity": NODE_AFFINITY, "podAntiAffinity": preferred(selector)},
        # ... unless it has a podAntiAffinity of its own, which replaces it.
        "own podAntiAffinity": {"podAntiAffinity": OWN_ANTI_AFFINITY},
    }[case]


AFFINITY_CASES = {
    "none": ("--set", "schedext.podAntiAffinity=none"),
    "required": ("--set", "schedext.podAntiAffinity=required"),
    "nodeAffinity": (
        "--set-json", f"schedext.affinity={json.dumps({'nodeAffinity': NODE_AFFINITY})}"
    ),
    "own podAntiAffinity": (
        "--set-json", f"schedext.affinity={json.dumps({'podAntiAffinity': OWN_ANTI_AFFINITY})}"
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(AFFINITY_CASES))
def test_the_anti_affinity_can_be_required_replaced_or_turned_off(case: str) -> None:
    rendered = helm_template("--set", "mode=mtls", *AFFINITY_CASES[case])
    want = expected_affinity(case, selector_of(rendered, "schedext"))
    assert pod_spec(rendered, "schedext").get("affinity") == want
    assert "schedext" in budgets(rendered)  # the budget is a value of its own


def test_the_disruption_budget_can_be_turned_off_or_sized() -> None:
    assert budgets(helm_template("--set", "mode=mtls,schedext.pdb.enabled=false")) == {}
    three = helm_template("--set", "mode=mtls,schedext.replicas=3,schedext.pdb.minAvailable=2")
    assert budgets(three)["schedext"]["minAvailable"] == 2
    half = helm_template("--set", "mode=mtls,schedext.pdb.minAvailable=50%")
    assert budgets(half)["schedext"]["minAvailable"] == "50%"


def test_values_without_the_availability_keys_get_their_defaults() -> None:
    """`helm upgrade --reuse-values` from chart 0.1.0 keeps that chart's values, which lack
    pdb, podAntiAffinity and topologySpreadConstraints: the defaults apply all the same."""
    missing = ",".join(
        f"{group}.{value}=null"
        for group in ("schedext", "scheduler")
        for value in ("pdb", "podAntiAffinity", "topologySpreadConstraints")
    )
    rendered = helm_template("--set", f"mode=mtls,scheduler.replicas=2,{missing}")
    assert budgets(rendered) == budgets(helm_template("--set", "mode=mtls,scheduler.replicas=2"))
    for name in ("schedext", "schedext-kube-scheduler"):
        affinity = pod_spec(rendered, name)["affinity"]
        assert affinity == {"podAntiAffinity": preferred(selector_of(rendered, name))}


def test_topology_spread_constraints_select_their_own_pods_unless_told() -> None:
    """schedext.topologySpreadConstraints and scheduler.topologySpreadConstraints reach the pod
    specs; an entry without a labelSelector selects the Deployment's own pods."""
    own = {"matchLabels": {"team": "sched"}}
    constraints = [
        {"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone",
         "whenUnsatisfiable": "ScheduleAnyway"},
        {"maxSkew": 2, "topologyKey": HOSTNAME, "whenUnsatisfiable": "DoNotSchedule",
         "labelSelector": own},
    ]  # fmt: skip
    for mode, name, group in (
        ("mtls", "schedext", "schedext"),
        ("mtls", "schedext-kube-scheduler", "scheduler"),
        ("sidecar", "schedext-scheduler", "scheduler"),
    ):
        rendered = helm_template(
            "--set", f"mode={mode}",
            "--set-json", f"{group}.topologySpreadConstraints={json.dumps(constraints)}",
        )  # fmt: skip
        selector = {"matchLabels": selector_of(rendered, name)}
        assert pod_spec(rendered, name)["topologySpreadConstraints"] == [
            {**constraints[0], "labelSelector": selector}, constraints[1]
        ], name  # fmt: skip


# --- two releases: each selects its own pods only ----------------------------------------


def label_selectors(obj: dict[str, Any]) -> Iterator[tuple[str, dict[str, str]]]:
    """Every label selector of ``obj`` that picks pods, named by where it is. Each is a plain
    matchLabels (the chart writes no matchExpressions)."""
    kind, name, spec = obj["kind"], obj["metadata"]["name"], obj.get("spec", {})
    where = f"{kind} {name}"
    if kind == "Service":
        yield where, spec["selector"]
    if kind in ("Deployment", "DaemonSet", "PodDisruptionBudget", "PodMonitor"):
        assert set(spec["selector"]) == {"matchLabels"}, where
        yield where, spec["selector"]["matchLabels"]
    if kind in ("Deployment", "DaemonSet"):
        pod = spec["template"]["spec"]
        anti = pod.get("affinity", {}).get("podAntiAffinity", {})
        terms = anti.get("requiredDuringSchedulingIgnoredDuringExecution", []) + [
            weighted["podAffinityTerm"]
            for weighted in anti.get("preferredDuringSchedulingIgnoredDuringExecution", [])
        ]
        for term in terms:
            assert set(term["labelSelector"]) == {"matchLabels"}, where
            yield f"{where} anti-affinity", term["labelSelector"]["matchLabels"]
        for constraint in pod.get("topologySpreadConstraints", []):
            yield f"{where} spread", constraint["labelSelector"]["matchLabels"]


def pods_of(objects: list[dict[str, Any]]) -> list[tuple[str, dict[str, str]]]:
    """The namespace and labels of each pod template, with the label the leader puts on its
    own pod at run time (any of them may lead)."""
    return [
        (obj["metadata"]["namespace"],
         {**obj["spec"]["template"]["metadata"]["labels"], ROLE_LABEL: LEADER})
        for obj in objects
        if obj["kind"] in ("Deployment", "DaemonSet")
    ]  # fmt: skip


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return selector.items() <= labels.items()


@pytest.mark.parametrize(
    ("args", "count"),
    [
        # The Service; the Deployments schedext (its anti-affinity and spread) and
        # schedext-kube-scheduler (its anti-affinity); their budgets; the DaemonSet; the
        # PodMonitors.
        (("--set", f"mode=mtls,scheduler.replicas=2,agent.enabled=true,{MONITORING_ON}",
          "--set-json", f"schedext.topologySpreadConstraints={ZONE_SPREAD}"), 11),
        # The Service; the Deployment and its spread; the DaemonSet; the PodMonitors.
        (("--set", f"agent.enabled=true,{MONITORING_ON}",
          "--set-json", f"scheduler.topologySpreadConstraints={ZONE_SPREAD}"), 6),
    ],
    ids=["mtls", "sidecar"],
)  # fmt: skip
def test_two_releases_in_one_namespace_select_only_their_own_pods(
    args: tuple[str, ...], count: int
) -> None:
    """Every selector of the chart (Services, the leader's Service with its role label,
    Deployments, the agent's DaemonSet, PodDisruptionBudgets, PodMonitors, anti-affinity and
    topology spread) names the release: rendered as two releases in one namespace, each
    selects some of its own pods and none of the other's."""
    releases = {name: helm_template(*args, release=name) for name in ("one", "two")}
    for name, objects in releases.items():
        (other,) = (o for n, o in releases.items() if n != name)
        own_pods, other_pods = pods_of(objects), pods_of(other)
        found = 0
        for obj in objects:
            namespace = obj["metadata"].get("namespace")
            for where, selector in label_selectors(obj):
                found += 1
                assert selector.get(INSTANCE) == name, where
                assert any(
                    selects(selector, labels) for ns, labels in own_pods if ns == namespace
                ), where
                assert not any(
                    selects(selector, labels) for ns, labels in other_pods if ns == namespace
                ), where
        assert found == count
    # Still one set of names: the objects of the two releases collide but for the labels.
    keys = [{key(o) for o in objects} for objects in releases.values()]
    assert keys[0] == keys[1]


# --- values: the schema, and what the chart refuses --------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--set", "schedext.replica=3"), "additional properties 'replica' not allowed"),
        (("--set", "mode=tls"), "value must be one of 'sidecar', 'mtls'"),
        (("--set", "agent.enable=true"), "additional properties 'enable' not allowed"),
        (("--set", "agent.devicePlugin=maybe"), "at '/agent/devicePlugin'"),
        (("--set", "metrics.port=http"), "at '/metrics/port'"),
        (("--set", "scheduler.schedulerName=Schedext"), "at '/scheduler/schedulerName'"),
        # schedext's own settings, checked against app.service.settings' schema.
        (
            ("--set-json", 'schedext.config={"policy": {"gpu_scorng": "spread"}}'),
            "additional properties 'gpu_scorng' not allowed",
        ),
        (
            ("--set-json", 'schedext.config={"bind": {"extender_http_timeout_s": "soon"}}'),
            "at '/schedext/config/bind/extender_http_timeout_s'",
        ),
        # What the schema cannot say, the templates refuse with a reason.
        (("--set", "scheduler.replicas=2"), "scheduler.replicas must be 1 in sidecar mode"),
        (
            ("--set", "mode=mtls,schedext.leaderElect=false"),
            "schedext.replicas > 1 needs schedext.leaderElect",
        ),
        (
            ("--set", f"agent.enabled=true,agent.namespace={SYSTEM_NAMESPACE}"),
            "agent.namespace must differ from the release namespace",
        ),
        (("--set", "views.port=9090"), "views.port must differ from metrics.port"),
        (("--set", "views.port=8888"), "views.port must differ from the verbs' port 8888"),
        (
            ("--set", "mode=mtls,views.port=8443"),
            "views.port must differ from the verbs' port 8443",
        ),
        (("--set", "views.port=10259"), "kube-scheduler's secure port 10259 in the same pod"),
        (("--set", "views.viewerRole=yes"), "at '/views/viewerRole'"),
        (("--set", "monitoring.podMonitor=true"), "additional properties 'podMonitor' not allowed"),
        (
            ("--set", "metrics.port=null,monitoring.podMonitors=true"),
            "monitoring.podMonitors needs metrics.port",
        ),
        (("--set", "schedext.podAntiAffinity=soft"), "at '/schedext/podAntiAffinity'"),
        (("--set", "scheduler.pdb.minAvailable=half"), "at '/scheduler/pdb/minAvailable'"),
        (("--set", "schedext.pdb.enable=true"), "additional properties 'enable' not allowed"),
        (
            ("--set", "mode=mtls,schedext.pdb.minAvailable=2"),
            "pdb.minAvailable (2) must be below its replicas (2)",
        ),
        (
            ("--set", "mode=mtls,scheduler.replicas=3,scheduler.pdb.minAvailable=3"),
            "PodDisruptionBudget of schedext-kube-scheduler",
        ),
    ],
    ids=lambda value: value if isinstance(value, str) else value[1],
)
def test_bad_values_fail_helm_template_with_the_reason(args: tuple[str, ...], message: str) -> None:
    result = run_tool(
        "helm", "template", "schedext", str(CHART), "--namespace", SYSTEM_NAMESPACE, *args
    )
    assert result.returncode != 0, result.stdout
    assert message in result.stderr, result.stderr


def test_settings_reach_schedext_as_a_file_and_the_scheduler_config_follows_them(
    tmp_path: Path,
) -> None:
    settings = {
        "policy": {"gpu_scoring": "spread", "shortlist": 0},
        "bind": {"extender_http_timeout_s": 40},
    }
    rendered = helm_template("--set-json", f"schedext.config={json.dumps(settings)}")
    # The file schedext reads is the value, and schedext's own loader takes it.
    data = find(rendered, "ConfigMap", SETTINGS)["data"]["schedext.yaml"]
    assert yaml.safe_load(data) == settings
    (tmp_path / "schedext.yaml").write_text(data)
    loaded = load_settings(tmp_path / "schedext.yaml")
    assert (loaded.policy.gpu_scoring, loaded.bind.extender_http_timeout_s) == ("spread", 40)
    deployment = find(rendered, "Deployment", "schedext-scheduler")
    spec = deployment["spec"]["template"]["spec"]
    schedext = container_of(spec, "schedext")
    mount = next(m for m in schedext["volumeMounts"] if m["name"] == SETTINGS)
    assert flags(schedext["args"])["--config"] == f"{mount['mountPath']}/schedext.yaml"
    volume = next(v for v in spec["volumes"] if v["name"] == SETTINGS)
    assert volume["configMap"]["name"] == SETTINGS
    # kube-scheduler waits as long as schedext's binds may take, and full mode (shortlist 0)
    # registers prioritize; the pod outlives the longest bind at shutdown.
    configmap = find(rendered, "ConfigMap", "schedext-scheduler-config")
    config = yaml.safe_load(configmap["data"]["scheduler-config.yaml"])
    (extender,) = config["extenders"]
    assert (extender["httpTimeout"], extender["prioritizeVerb"]) == ("40s", "prioritize")
    assert spec["terminationGracePeriodSeconds"] > 40
    # A change of settings changes the pod template, so that `helm upgrade` rolls the pod.
    before = find(helm_template(), "Deployment", "schedext-scheduler")["spec"]["template"]
    after = deployment["spec"]["template"]
    checksum = "schedext.io/config-checksum"
    assert before["metadata"]["annotations"][checksum] != after["metadata"]["annotations"][checksum]


# --- sidecar mode, installed from the chart's rendering, for real -----------------------------


def test_sidecar_mode_installed_from_the_chart_places_gpu_pods_as_its_settings_say(
    control_plane: ControlPlane,
    kube: Kube,
    kube_version: str,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    # A setting with a visible effect: spread sends the second pod to the other node, where
    # the default (binpack) would stack it beside the first.
    settings = {"policy": {"gpu_scoring": "spread"}}
    rendered = helm_template(
        "--set-json", f"schedext.config={json.dumps(settings)}", kube_version=kube_version
    )
    # The install: every object as the API server stores it (the CRDs are the session's,
    # which are the chart's; see test_the_chart_crds_are_those_of_the_manifests).
    installed = {key(obj)[1:]: kube.apply(obj, dry_run=False)[0] for obj in rendered}
    ns = SYSTEM_NAMESPACE
    deployment = installed["Deployment", ns, "schedext-scheduler"]
    spec = deployment["spec"]["template"]["spec"]
    scheduler_configmap = installed["ConfigMap", ns, "schedext-scheduler-config"]
    settings_file = installed["ConfigMap", ns, SETTINGS]["data"]["schedext.yaml"]
    identity = service_account_kubeconfig(
        control_plane, spec["serviceAccountName"], tmp_path / "sa.kubeconfig"
    )

    # schedext as its container runs it: the args and env of the installed Deployment, only
    # the ports and the mounted file's path replaced.
    container = container_of(spec, "schedext")
    assert all("value" in env for env in container.get("env", [])), "downward API unexpected"
    env = {e["name"]: e["value"] for e in container.get("env", [])}
    schedext = Schedext(identity, tmp_path / "schedext.log", env=env)
    (tmp_path / "schedext.yaml").write_text(settings_file)
    replaced = {
        "--port": str(schedext.port),
        "--metrics-port": str(free_port()),
        "--views-port": str(free_port()),
        "--config": str(tmp_path / "schedext.yaml"),
    }
    args = flags(container["args"])
    assert args["--host"] == "127.0.0.1"
    assert replaced.keys() <= args.keys()
    schedext.extra_args = tuple(f"{flag}={replaced.get(flag, v)}" for flag, v in args.items())

    # kube-scheduler with the installed ConfigMap's configuration and the container's flags.
    scheduler = container_of(spec, "kube-scheduler")
    command = flags(scheduler["command"][1:])
    config_path = command.pop("--config")
    assert config_path.endswith("/scheduler-config.yaml")

    def sidecar_config(schedext: Schedext) -> str:
        config = yaml.safe_load(scheduler_configmap["data"]["scheduler-config.yaml"])
        config["clientConnection"]["kubeconfig"] = str(identity)
        (extender,) = config["extenders"]
        assert extender["urlPrefix"] == f"http://127.0.0.1:{args['--port']}"
        extender["urlPrefix"] = schedext.url  # the same, on a free port
        return yaml.safe_dump(config)

    scheduler_name = yaml.safe_load(scheduler_configmap["data"]["scheduler-config.yaml"])[
        "profiles"
    ][0]["schedulerName"]
    scheduler_args = (
        *(f"{flag}={value}" for flag, value in command.items()),
        # Delegated authentication and authorization of its secure port, as the pod's identity.
        f"--authentication-kubeconfig={identity}",
        f"--authorization-kubeconfig={identity}",
    )
    scheduler_log = control_plane.logs_tail("kube-scheduler", 1_000_000)
    try:
        with running_cluster(
            control_plane, request, schedext, sidecar_config, scheduler_args=scheduler_args
        ) as cluster:
            for name in ("gpu-a", "gpu-b"):
                cluster.node(name, gpus=8, model=H100, memory_mib=81559,
                             groups=[[0, 1, 2, 3], [4, 5, 6, 7]])  # fmt: skip
            nodes = []
            for name in ("train-1", "train-2"):
                pod = pod_manifest(name, requests={"cpu": "100m", GPU: "2"}, limits={GPU: "2"},
                                   scheduler_name=scheduler_name)  # fmt: skip
                cluster.api.create_pod(cluster.namespace, pod)
                nodes.append(cluster.wait_bound(name, timeout=60))
                ids = cluster.gpu_ids(name)
                assert len(ids) == 2
                assert set(ids) <= {0, 1, 2, 3} or set(ids) <= {4, 5, 6, 7}
            assert sorted(nodes) == ["gpu-a", "gpu-b"], "spread from the settings file not applied"

            assert "forbidden" not in schedext.tail(100_000).lower()
            log = new_lines(scheduler_log, control_plane.logs_tail("kube-scheduler", 1_000_000))
            assert f'"Successfully acquired lease" lock="{ns}/{scheduler_name}"' in log
            assert "forbidden" not in log.lower(), log
    finally:
        delete(control_plane, kube, list(installed.values()))


def delete(control_plane: ControlPlane, kube: Kube, objects: list[dict[str, Any]]) -> None:
    """Delete what is there of ``objects`` (nothing runs them here: no controller, no kubelet)."""
    for obj in objects:
        try:
            control_plane.api.apply_raw("DELETE", kube.path(obj, SYSTEM_NAMESPACE))
        except HarnessApiError as error:
            if error.status != 404:
                raise


# --- helm itself against the API server --------------------------------------------------


def test_helm_installs_upgrades_and_uninstalls_against_the_api_server(
    control_plane: ControlPlane, kube: Kube
) -> None:
    """`helm install` with the API server's own version and discovery (the chart's
    kubeVersion, the schema), an upgrade that changes a setting rolls the pod template, and
    `helm uninstall` removes what it installed but leaves the CRDs (Helm never deletes crds/)."""
    ns = SYSTEM_NAMESPACE
    common = ("--namespace", ns, "--kubeconfig", str(control_plane.kubeconfig))
    release = "schedext-e2e"
    deployment = f"/apis/apps/v1/namespaces/{ns}/deployments/schedext-scheduler"
    crd = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/ipclaims.schedext.io"

    def checksum() -> str:
        template = control_plane.api.apply_raw("GET", deployment)["spec"]["template"]
        value: str = template["metadata"]["annotations"]["schedext.io/config-checksum"]
        return value

    # Helm adopts no object it did not create: what other tests applied with the same names
    # (the RBAC of manifests/) goes first.
    delete(control_plane, kube, helm_template())
    installed = run_tool("helm", "install", release, str(CHART), *common)
    try:
        assert installed.returncode == 0, installed.stderr
        assert "Pods opt in with `spec.schedulerName: schedext-scheduler`" in installed.stdout
        assert "--clusterrole=schedext-viewer" in installed.stdout
        before = checksum()
        upgraded = run_tool(
            "helm", "upgrade", release, str(CHART), *common,
            "--set-json", 'schedext.config={"policy": {"gpu_scoring": "spread"}}',
        )  # fmt: skip
        assert upgraded.returncode == 0, upgraded.stderr
        assert checksum() != before
    finally:
        removed = run_tool("helm", "uninstall", release, *common)
    assert removed.returncode == 0, removed.stderr
    with pytest.raises(HarnessApiError, match="404"):
        control_plane.api.apply_raw("GET", deployment)
    assert control_plane.api.apply_raw("GET", crd)["metadata"]["name"] == "ipclaims.schedext.io"
