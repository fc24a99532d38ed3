"""The chart never renders settings schedext refuses.

For a matrix of values (the defaults, the agent on, mTLS with and without leader election,
the DRA fence, full mode with a longer httpTimeout, settings as environment variables, the
extra listeners off), the settings file the chart renders (the ConfigMap schedext-config) is
checked by ``schedext config --check`` with the schedext container's own flags and
environment, as the pod would start: every rendering helm accepts passes. And for settings
schedext refuses (a bind budget that does not fit kube-scheduler's httpTimeout, a Lease that a
leader could lose mid-bind, a listener setting the chart's flags would clash with, a weight for
no scorer, a variable that names no setting), `helm template` fails too, with schedext's own
words where schedext has a rule between keys."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from app.agent.settings import load_agent_settings
from app.stdio.settings_sources import SettingsError
from testbed.kubeapply import SYSTEM_NAMESPACE
from testbed.pki import CertAuthority
from tests.e2e.rendering import CHART, ROOT, helm_template, run_tool
from tests.e2e.test_manifests import container_of, flags

SETTINGS = "schedext-config"
FENCE = '{"dra": {"fence": true}}'

# Values helm accepts: each rendering must be settings schedext starts with.
ACCEPTED: dict[str, tuple[str, ...]] = {
    "defaults": (),
    "agent": ("--set", "agent.enabled=true"),
    "mtls-leader-election": ("--set", "mode=mtls"),
    "mtls-one-replica": ("--set", "mode=mtls,schedext.replicas=1,schedext.leaderElect=false"),
    "dra-fence": ("--set-json", f"schedext.config={FENCE}"),
    "mtls-dra-fence": ("--set", "mode=mtls", "--set-json", f"schedext.config={FENCE}"),
    "full-mode-longer-timeout": (
        "--set-json",
        'schedext.config={"policy": {"shortlist": 0, "weights": {"live_use": 2}}, '
        '"gang": {"max_wait_s": 30}, "bind": {"extender_http_timeout_s": 40}}',
    ),
    "mtls-longer-lease": (
        "--set", "mode=mtls",
        "--set-json",
        'schedext.config={"leader": {"lease_duration_s": 30, "renew_deadline_s": 10}}',
    ),
    "resources-and-levels": (
        "--set-json",
        'schedext.config={"policy": {"gpu_resource": "example.com/gpu", '
        '"cpu_intensive_min_cpu": "1500m", "shares": '
        '{"cores_resource": "", "memory_resource": "example.com/gpu-memory"}, '
        '"topology_levels": ["example.com/rack", "topology.kubernetes.io/zone"]}, '
        '"dra": {"gpu_drivers": ["gpu.example.com"]}}',
    ),
    "settings-in-env": (
        "--set-json",
        'schedext.env=[{"name": "SCHEDEXT_LOG_LEVEL", "value": "debug"}, '
        '{"name": "SCHEDEXT_POLICY__GPU_SCORING", "value": "spread"}, '
        '{"name": "SCHEDEXT_POLICY__WEIGHTS__LIVE_USE", "value": "2"}]',
    ),
    "listeners-off": ("--set", "metrics.port=null,views.port=null,views.viewerRole=false"),
}  # fmt: skip

BUDGET = (
    "gang.max_wait_s (20) + bind.api_deadline_s (8) + 1s to answer must not exceed "
    "bind.extender_http_timeout_s (10), kube-scheduler's extender httpTimeout: kube-scheduler "
    "would give up on binds that still go through"
)
# Settings schedext refuses: (mode and other values, schedext.config, schedext.env, what helm
# says).
REFUSED: dict[str, tuple[str, dict[str, Any], list[dict[str, str]], str]] = {
    "bind budget": ("sidecar", {"bind": {"extender_http_timeout_s": 10}}, [], BUDGET),
    "bind budget, mtls": ("mtls", {"bind": {"extender_http_timeout_s": 10}}, [], BUDGET),
    "lease too short": (
        "mtls",
        {"leader": {"lease_duration_s": 10}},
        [],
        "leader.renew_deadline_s (5) + bind.api_deadline_s (8) must stay below "
        "leader.lease_duration_s (10)",
    ),
    "retry not below renew": (
        "mtls",
        {"leader": {"retry_period_s": 5}},
        [],
        "leader.retry_period_s must be shorter than leader.renew_deadline_s",
    ),
    "leader election in the file": (
        "sidecar",
        {"leader": {"enabled": True, "lease_duration_s": 12}},
        [],
        "leader.renew_deadline_s (5) + bind.api_deadline_s (8) must stay below "
        "leader.lease_duration_s (12)",
    ),
    # Off in the chart, on in the file: on the port of the verbs, or of the metrics.
    "a metrics listener on the verbs' port": (
        "sidecar,metrics.port=null",
        {"server": {"metrics_port": 8888}},
        [],
        "schedext.config: server.metrics_port is the chart's to set",
    ),
    "a views listener on the metrics port": (
        "mtls,views.port=null,views.viewerRole=false",
        {"server": {"views_port": 9090}},
        [],
        "schedext.config: server.views_port is the chart's to set",
    ),
    "a weight for no scorer": (
        "sidecar",
        {"policy": {"weights": {"nvlink": 2}}},
        [],
        "invalid propertyName 'nvlink'",
    ),
    "a GPU resource that is no extended resource name": (
        "sidecar",
        {"policy": {"gpu_resource": "gpu"}},
        [],
        "at '/schedext/config/policy/gpu_resource'",
    ),
    "a share resource that is no extended resource name": (
        "sidecar",
        {"policy": {"shares": {"cores_resource": "cores"}}},
        [],
        "at '/schedext/config/policy/shares/cores_resource'",
    ),
    "a CPU quantity that is none": (
        "sidecar",
        {"policy": {"cpu_intensive_min_cpu": "two cores"}},
        [],
        "at '/schedext/config/policy/cpu_intensive_min_cpu'",
    ),
    "a negative CPU quantity": (
        "sidecar",
        {"policy": {"cpu_intensive_min_cpu": "-2"}},
        [],
        "at '/schedext/config/policy/cpu_intensive_min_cpu'",
    ),
    "a topology level twice": (
        "sidecar",
        {"policy": {"topology_levels": ["rack", "rack"]}},
        [],
        "at '/schedext/config/policy/topology_levels'",
    ),
    "a blank DRA driver": (
        "sidecar",
        {"dra": {"gpu_drivers": [" "]}},
        [],
        "at '/schedext/config/dra/gpu_drivers/0'",
    ),
    "a variable that names no setting": (
        "sidecar",
        {},
        [{"name": "SCHEDEXT_POLCY__GPU_SCORING", "value": "spread"}],
        "schedext.env: SCHEDEXT_POLCY__GPU_SCORING names no setting of schedext",
    ),
}


def test_the_agent_variables_helm_renders_are_those_the_agent_reads() -> None:
    """The agent refuses a SCHEDEXT_AGENT_* variable that names no setting; so does the chart,
    and it lets the agent's own through."""
    good = [{"name": "SCHEDEXT_AGENT_SHARE_SLOTS", "value": "16"}]
    rendered = helm_template(
        "--set", "agent.enabled=true", "--set-json", f"agent.env={json.dumps(good)}"
    )
    (daemonset,) = (o for o in rendered if o["kind"] == "DaemonSet")
    env = container_of(daemonset["spec"]["template"]["spec"], "agent")["env"]
    named = {
        e["name"]: e["value"] for e in env if "value" in e and e["name"].startswith("SCHEDEXT_")
    }
    assert load_agent_settings({"node_name": "n1"}, named).share_slots == 16
    bad = [{"name": "SCHEDEXT_AGENT_SHARE_SLOT", "value": "16"}]
    with pytest.raises(SettingsError, match="did you mean SCHEDEXT_AGENT_SHARE_SLOTS"):
        load_agent_settings({"node_name": "n1"}, {**named, "SCHEDEXT_AGENT_SHARE_SLOT": "16"})
    helm = run_tool(
        "helm", "template", "schedext", str(CHART), "--namespace", SYSTEM_NAMESPACE,
        "--set", "agent.enabled=true", "--set-json", f"agent.env={json.dumps(bad)}",
    )  # fmt: skip
    assert helm.returncode != 0
    assert "agent.env: SCHEDEXT_AGENT_SHARE_SLOT names no setting of schedext agent" in helm.stderr


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Real files for the mTLS flags' paths: schedext loads them when it checks settings."""
    directory = tmp_path_factory.mktemp("tls")
    ca = CertAuthority.create(directory)
    cert, key = ca.issue_cert("schedext", sans=["schedext.schedext-system.svc"], client=True)
    return {
        "/etc/schedext/tls/tls.crt": str(cert),
        "/etc/schedext/tls/tls.key": str(key),
        "/etc/schedext/tls/ca.crt": str(ca.cert_path),
    }


def schedext_container(rendered: list[dict[str, Any]]) -> dict[str, Any]:
    (deployment,) = (
        o
        for o in rendered
        if o["kind"] == "Deployment"
        and any(
            c["name"] == "schedext"
            for c in o["spec"]["template"]["spec"].get("containers", [])
            + o["spec"]["template"]["spec"].get("initContainers", [])
        )
    )
    return container_of(deployment["spec"]["template"]["spec"], "schedext")


def config_check(
    container: dict[str, Any],
    settings_file: Path,
    tls_files: dict[str, str],
    extra_env: Sequence[dict[str, str]] = (),
) -> subprocess.CompletedProcess[str]:
    """`schedext config --check` of the file, with the container's flags and environment."""
    args = []
    for flag, value in flags(container["args"]).items():
        if flag == "--config":
            continue
        args.append(flag if value == "" else f"{flag}={tls_files.get(value, value)}")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCHEDEXT_")}
    # The harness's own variables, which schedext lets through.
    env.update(
        {k: v for k, v in os.environ.items() if k in ("SCHEDEXT_K8S_BIN", "SCHEDEXT_TOOLS_BIN")}
    )
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    for item in [*container.get("env", []), *extra_env]:
        if "value" in item:  # the downward API's POD_NAME and POD_NAMESPACE: not settings
            env[item["name"]] = item["value"]
    return subprocess.run(
        [sys.executable, "-m", "app.cli", "config", "--check", str(settings_file), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
        cwd=ROOT,
    )


@pytest.mark.parametrize("variant", sorted(ACCEPTED))
def test_every_rendering_helm_accepts_is_settings_schedext_starts_with(
    variant: str, tmp_path: Path, tls_files: dict[str, str]
) -> None:
    rendered = helm_template(*ACCEPTED[variant])
    (configmap,) = (
        o for o in rendered if o["kind"] == "ConfigMap" and o["metadata"]["name"] == SETTINGS
    )
    settings_file = tmp_path / "schedext.yaml"
    settings_file.write_text(configmap["data"]["schedext.yaml"])
    checked = config_check(schedext_container(rendered), settings_file, tls_files)
    assert checked.returncode == 0, checked.stderr
    assert checked.stderr == ""


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_settings_schedext_refuses_are_refused_by_helm_in_its_words(
    case: str, tmp_path: Path, tls_files: dict[str, str]
) -> None:
    mode, config, env, message = REFUSED[case]
    # schedext refuses them, with the flags and environment the chart gives it.
    rendered = helm_template("--set", f"mode={mode}")
    settings_file = tmp_path / "schedext.yaml"
    settings_file.write_text(yaml.safe_dump(config))
    refused = config_check(schedext_container(rendered), settings_file, tls_files, env)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "Traceback" not in refused.stderr
    # helm refuses them at template time, and where schedext has a rule, in its words.
    helm = run_tool(
        "helm", "template", "schedext", str(CHART), "--namespace", SYSTEM_NAMESPACE,
        "--set", f"mode={mode}",
        "--set-json", f"schedext.config={json.dumps(config)}",
        "--set-json", f"schedext.env={json.dumps(env)}",
    )  # fmt: skip
    assert helm.returncode != 0, f"helm renders settings schedext refuses: {refused.stderr}"
    assert message in helm.stderr, helm.stderr
    if not message.startswith(("schedext.", "invalid propertyName", "at '")):
        assert message in refused.stderr, refused.stderr
