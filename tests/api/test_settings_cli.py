"""Settings on the command line, as an operator meets them: a bad file, variable or value is
one line naming its source and exit status 2, never a traceback; ``schedext config`` prints
the merged settings with their sources and checks a file; ``serve`` logs what it runs with;
the help says where the settings live and every default."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from app.agent.settings import AgentSettings
from tests.api.test_cli import SCHEDEXT, schedext_serve


def schedext(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("SCHEDEXT_")}
    # The source tree first, wherever the command runs.
    environ["PYTHONPATH"] = os.pathsep.join([str(Path.cwd()), environ.get("PYTHONPATH", "")])
    return subprocess.run(
        [*SCHEDEXT, *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**environ, **(env or {})},
        cwd=cwd,
    )


def one_line(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


@pytest.mark.parametrize("command", ["serve", "config"])
@pytest.mark.parametrize(
    ("text", "said"),
    [
        (b"policy: [\n", "bad.yaml line 2: not valid YAML ("),
        (b"- policy\n- server\n", "bad.yaml line 1: a settings file must be a mapping"),
        (b"policy:\n  gpu_scoring: \xe9\n", "bad.yaml line 2: not UTF-8 text (byte 0xe9)"),
    ],
    ids=["malformed", "top-level list", "not utf-8"],
)
def test_a_bad_settings_file_is_one_line_naming_file_and_line(
    tmp_path: Path, command: str, text: bytes, said: str
) -> None:
    (tmp_path / "bad.yaml").write_bytes(text)
    line = one_line(schedext(command, "--config", "bad.yaml", cwd=tmp_path))
    prog = "schedext" if command == "serve" else "schedext config"
    assert line.startswith(f"{prog}: invalid settings: {said}"), line


def test_a_directory_given_as_the_settings_file_is_said_to_be_one(tmp_path: Path) -> None:
    assert one_line(schedext("serve", "--config", ".", cwd=tmp_path)) == (
        "schedext: invalid settings: .: is a directory, not a settings file"
    )


def test_a_variable_that_is_no_json_names_itself() -> None:
    line = one_line(schedext("serve", env={"SCHEDEXT_POLICY__WEIGHTS": "notjson"}))
    assert line.startswith("schedext: invalid settings: SCHEDEXT_POLICY__WEIGHTS: policy.weights")


def test_a_typo_in_a_group_name_is_refused_with_the_nearest_name() -> None:
    line = one_line(schedext("serve", env={"SCHEDEXT_POLCY__GPU_SCORING": "spread"}))
    assert line.startswith(
        "schedext: invalid settings: SCHEDEXT_POLCY__GPU_SCORING: names no setting "
        "(did you mean SCHEDEXT_POLICY__GPU_SCORING?)"
    )


def test_a_value_out_of_bounds_names_the_key_the_rule_the_value_and_the_variable() -> None:
    assert one_line(schedext("serve", env={"SCHEDEXT_POLICY__SHORTLIST": "-1"})) == (
        "schedext: invalid settings: policy.shortlist: must be between 0 and 1000 "
        "(got -1, from SCHEDEXT_POLICY__SHORTLIST)"
    )


def test_the_agent_refuses_bad_variables_in_one_line_each() -> None:
    line = one_line(schedext("agent", env={"SCHEDEXT_AGENT_DRA_DRIVERS": "notjson"}))
    assert line.startswith("schedext agent: invalid settings: SCHEDEXT_AGENT_DRA_DRIVERS: ")
    line = one_line(
        schedext("agent", env={"SCHEDEXT_AGENT_NODE_NAME": "n1", "SCHEDEXT_AGENT_SHRES": "false"})
    )
    assert line.startswith(
        "schedext agent: invalid settings: SCHEDEXT_AGENT_SHRES: names no setting "
        "(did you mean SCHEDEXT_AGENT_SHARES?)"
    )


def test_kubectl_schedext_with_a_malformed_kubeconfig_names_file_and_line(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "config"
    kubeconfig.write_text("apiVersion: v1\nclusters: [\n")
    result = subprocess.run(
        [sys.executable, "-m", "app.plugin.command", "nodes", "--kubeconfig", str(kubeconfig)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr.startswith(
        f"error: cannot read the kubeconfig {kubeconfig} line 3: not valid YAML ("
    )
    assert len(result.stderr.splitlines()) == 1
    kubeconfig.write_text("- a\n")
    listed = subprocess.run(
        [sys.executable, "-m", "app.plugin.command", "nodes"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "KUBECONFIG": str(kubeconfig)},
    )
    assert listed.returncode == 2
    assert listed.stderr == (
        f"error: cannot read the kubeconfig {kubeconfig} line 1: a kubeconfig must be a mapping "
        "(such as `clusters:`), not a list\n"
    )


# --- schedext config ------------------------------------------------------------------------


def test_config_prints_the_merged_settings_each_with_its_source(tmp_path: Path) -> None:
    (tmp_path / "schedext.yaml").write_text("policy:\n  gpu_scoring: spread\n")
    result = schedext(
        "config",
        "--config",
        "schedext.yaml",
        "--port",
        "9000",
        env={"SCHEDEXT_POLICY__SHORTLIST": "3"},
        cwd=tmp_path,
    )
    assert (result.returncode, result.stderr) == (0, "")
    lines = result.stdout.splitlines()
    assert "  port: 9000  # flag --port" in lines
    assert "  gpu_scoring: spread  # file schedext.yaml line 2" in lines
    assert "  shortlist: 3  # env SCHEDEXT_POLICY__SHORTLIST" in lines
    assert "  max_wait_s: 20.0  # default" in lines
    # What it prints is a settings file schedext takes, to the same effect.
    (tmp_path / "printed.yaml").write_text(result.stdout)
    again = schedext("config", "--config", "printed.yaml", cwd=tmp_path)
    assert [line.split("  #")[0] for line in again.stdout.splitlines()] == [
        line.split("  #")[0] for line in lines
    ]


def test_config_check_passes_a_good_file_and_refuses_a_bad_one_with_the_reasons(
    tmp_path: Path,
) -> None:
    (tmp_path / "good.yaml").write_text("gang:\n  max_wait_s: 10\n")
    good = schedext("config", "--check", "good.yaml", cwd=tmp_path)
    assert (good.returncode, good.stderr) == (0, "")
    (tmp_path / "bad.yaml").write_text("bind:\n  extender_http_timeout_s: 10\n")
    line = one_line(schedext("config", "--check", "bad.yaml", cwd=tmp_path))
    assert line.startswith(
        "schedext config: invalid settings: gang.max_wait_s, bind.api_deadline_s, "
        "bind.extender_http_timeout_s: "
    )
    assert line.endswith("bind.extender_http_timeout_s = 10 from bad.yaml line 2)")
    # The environment is checked with the file.
    env = {"SCHEDEXT_GANG__MAX_WAIT_S": "60"}
    assert schedext("config", "--check", "good.yaml", env=env, cwd=tmp_path).returncode == 2


def test_serve_logs_a_hash_of_its_settings_and_the_keys_off_their_defaults(
    tmp_path: Path,
) -> None:
    (tmp_path / "schedext.yaml").write_text("policy:\n  gpu_scoring: spread\n")
    with schedext_serve("--config", str(tmp_path / "schedext.yaml")) as served:
        logged = served.stop()
    (line,) = (json.loads(x) for x in logged.splitlines() if '"message":"settings"' in x)
    assert len(line["config_hash"]) == 16
    assert line["non_default"] == {"server.port": line["non_default"]["server.port"],
                                   "policy.gpu_scoring": "spread"}  # fmt: skip
    assert line["non_default_from"]["policy.gpu_scoring"].endswith("schedext.yaml line 2")
    assert line["non_default_from"]["server.port"] == "--port"


def test_serve_never_logs_the_path_of_a_private_key_or_credentials(tmp_path: Path) -> None:
    (tmp_path / "kubeconfig").write_text("apiVersion: v1\nclusters: [\n")
    result = schedext("serve", "--kubeconfig", str(tmp_path / "kubeconfig"))
    assert result.returncode == 2
    (logged,) = (json.loads(x) for x in result.stderr.splitlines() if x.startswith("{"))
    assert logged["non_default"] == {"kubeconfig": "<redacted>"}
    assert str(tmp_path) not in json.dumps(logged)
    # And the malformed kubeconfig itself is one line naming its line.
    assert result.stderr.splitlines()[-1] == (
        f"schedext: cannot read the kubeconfig {tmp_path}/kubeconfig line 3: not valid YAML "
        "(while parsing a flow node: expected the node content, but found '<stream end>')"
    )


# --- help -----------------------------------------------------------------------------------


def test_serve_help_says_where_the_settings_live_and_every_flag_has_help() -> None:
    text = " ".join(schedext("serve", "--help").stdout.split())
    assert "SCHEDEXT_<GROUP>__<KEY>" in text
    assert "docs/configuration.md" in text
    assert "--log-level {debug,info,warning,error} the least severe log lines" in text


def test_agent_help_states_the_default_of_every_setting_with_a_flag() -> None:
    text = " ".join(schedext("agent", "--help").stdout.split())
    options = text.split("options:", 1)[1]
    flags = [part.split()[0] for part in options.split(" --")[1:]]
    named = [flag for flag in flags if flag.replace("-", "_") in AgentSettings.model_fields]
    assert len(named) >= 20
    for flag in named:
        help_text = options.split(f" --{flag} ", 1)[1].split(" --", 1)[0]
        assert "default" in help_text, f"--{flag} states no default: {help_text}"
    assert "(default 9401)" in options
    assert "(default 10)" in options
