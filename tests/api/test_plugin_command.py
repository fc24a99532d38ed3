"""The installed ``kubectl-schedext`` console script where no cluster answers: a person who has
no kubeconfig, mistypes a name, or whose API server is down gets one line and an exit code,
never a traceback. (tests/e2e/test_kubectl_plugin.py runs it against a real API server.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.api.test_cli import free_port

pytestmark = pytest.mark.api

PLUGIN = Path(sys.executable).parent / "kubectl-schedext"


def run(*args: str, home: Path, kubeconfig: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    env["HOME"] = str(home)
    if kubeconfig is not None:
        env["KUBECONFIG"] = kubeconfig
    return subprocess.run(
        [str(PLUGIN), *args], capture_output=True, text=True, timeout=60, env=env, check=False
    )


def test_the_plugin_is_installed_next_to_the_interpreter_for_kubectl_to_find() -> None:
    assert PLUGIN.is_file(), f"{PLUGIN} is missing: is the project installed (pip install -e .)?"
    assert os.access(PLUGIN, os.X_OK)


def test_without_a_kubeconfig_the_person_is_told_where_it_was_looked_for(tmp_path: Path) -> None:
    result = run("nodes", home=tmp_path)
    assert (result.returncode, result.stdout) == (1, "")
    assert result.stderr == (
        f"error: no kubeconfig: {tmp_path}/.kube/config does not exist "
        "(set KUBECONFIG or pass --kubeconfig)\n"
    )


def test_an_api_server_that_does_not_answer_is_one_line(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "config"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": f"https://127.0.0.1:{free_port()}",
                                                        "insecure-skip-tls-verify": True}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )  # fmt: skip
    result = run("gangs", "--request-timeout", "5s", home=tmp_path, kubeconfig=str(kubeconfig))
    assert (result.returncode, result.stdout) == (1, "")
    assert result.stderr.startswith(
        "error: cannot reach the API server: GET /api/v1/namespaces/schedext-system/services/"
        "http:schedext:views/proxy/inventory: "
    )
    assert len(result.stderr.splitlines()) == 1
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("explain", "Bad_Name"), "kubectl schedext: 'Bad_Name' is not a pod name"),
        (("explain", "a/p", "-n", "b"), "kubectl schedext: the pod a/p is not in -n b"),
        (("nodes", "--service", "no/such"), "kubectl schedext: --service 'no/such' is not a "
                                            "Kubernetes name"),
        (("quotas", "--request-timeout", "soon"), "kubectl schedext: --request-timeout 'soon': "
                                                  "give seconds, e.g. 30, 30s or 1m"),
    ],
)  # fmt: skip
def test_a_mistyped_argument_is_a_usage_error_before_any_request(
    tmp_path: Path, args: tuple[str, ...], message: str
) -> None:
    result = run(*args, home=tmp_path)  # no kubeconfig: nothing is asked of a cluster
    assert (result.returncode, result.stderr) == (2, message + "\n")


def test_no_subcommand_prints_the_help_and_is_a_usage_error(tmp_path: Path) -> None:
    result = run(home=tmp_path)
    assert result.returncode == 2
    for command in ("explain", "nodes", "gangs", "quotas"):
        assert command in result.stdout
