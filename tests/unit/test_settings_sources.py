"""Settings that explain themselves: every problem is one line naming the key (or the file and
line, or the variable), the rule in plain words, the value got and where it came from; a
``SCHEDEXT_*`` variable that names no setting is refused with the nearest valid name; and the
merged settings can be printed with the source of each key."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from app.agent.settings import load_agent_settings
from app.service.settings import Settings, SettingsError, read_settings
from app.stdio.settings_sources import OTHER_VARIABLES, effective_yaml

FLAGS = {"server.port": "--port", "leader.enabled": "--leader-elect"}


def problems(
    config: Path | None = None,
    environ: dict[str, str] | None = None,
    overrides: dict[str, object] | None = None,
) -> list[str]:
    with pytest.raises(SettingsError) as raised:
        read_settings(config, overrides, flags=FLAGS, environ=environ or {})
    assert "errors.pydantic.dev" not in str(raised.value)
    assert "input_value" not in str(raised.value)
    return raised.value.lines


def write(tmp_path: Path, text: str | bytes, name: str = "schedext.yaml") -> Path:
    path = tmp_path / name
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    return path


# --- files that are no settings file --------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ("policy: [\n", "schedext.yaml line 2: not valid YAML ("),
        ("server:\n  port: 1\n bad: indent\n", "schedext.yaml line 3: not valid YAML ("),
        (
            "- policy\n- server\n",
            "schedext.yaml line 1: a settings file must be a mapping (such as `policy:`), "
            "not a list",
        ),
        ("just words\n", "schedext.yaml line 1: a settings file must be a mapping"),
        (b"policy:\n  shortlist: 3\n\xff\n", "schedext.yaml line 3: not UTF-8 text (byte 0xff)"),
    ],
    ids=["unclosed list", "bad indentation", "top-level list", "a string", "latin-1 byte"],
)
def test_a_file_that_is_no_settings_mapping_is_one_line_with_its_line(
    tmp_path: Path, text: str | bytes, line: str
) -> None:
    path = write(tmp_path, text)
    (said,) = problems(path)
    assert said.startswith(f"{path.parent}/{line}"), said


def test_a_directory_is_said_to_be_one(tmp_path: Path) -> None:
    assert problems(tmp_path) == [f"{tmp_path}: is a directory, not a settings file"]
    assert problems(tmp_path / "gone.yaml") == [f"{tmp_path}/gone.yaml: settings file not found"]


def test_an_empty_file_is_no_settings_at_all(tmp_path: Path) -> None:
    settings, _ = read_settings(write(tmp_path, ""), environ={})
    assert settings == read_settings(environ={})[0]


# --- values out of their rules, with their source -------------------------------------------


def test_a_bound_names_key_rule_value_and_variable() -> None:
    assert problems(environ={"SCHEDEXT_POLICY__SHORTLIST": "-1"}) == [
        "policy.shortlist: must be between 0 and 1000 (got -1, from SCHEDEXT_POLICY__SHORTLIST)"
    ]


def test_each_value_names_where_it_came_from(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "policy:\n  gpu_scoring: sideways\n  allocation_weight: lots\n"
        "server:\n  body_timeout_s: 0\n",
    )
    assert problems(path, overrides={"server": {"port": 70000}}) == [
        "server.port: must be between 0 and 65535 (got 70000, from --port)",
        f"server.body_timeout_s: must be more than 0 (got 0, from {path} line 5)",
        f"policy.gpu_scoring: must be one of 'binpack' or 'spread' (got sideways, from {path} "
        "line 2)",
        f"policy.allocation_weight: must be a whole number (got lots, from {path} line 3)",
    ]


def test_an_unknown_key_names_the_nearest_one(tmp_path: Path) -> None:
    path = write(tmp_path, "polcy:\n  shortlist: 2\npolicy:\n  gpu_scorng: spread\n")
    assert sorted(problems(path)) == [
        f"polcy: is not a setting (did you mean policy?) (from {path} line 1)",
        f"policy.gpu_scorng: is not a setting (did you mean policy.gpu_scoring?) (from {path} "
        "line 4)",
    ]


def test_a_cross_field_rule_names_every_key_with_its_value_and_source(tmp_path: Path) -> None:
    path = write(tmp_path, "bind:\n  extender_http_timeout_s: 10\n")
    (said,) = problems(path, environ={"SCHEDEXT_GANG__MAX_WAIT_S": "15"})
    assert said.startswith("gang.max_wait_s, bind.api_deadline_s, bind.extender_http_timeout_s: ")
    assert said.endswith(
        "(gang.max_wait_s = 15 from SCHEDEXT_GANG__MAX_WAIT_S; bind.api_deadline_s = 8 from the "
        f"default; bind.extender_http_timeout_s = 10 from {path} line 2)"
    )
    (leader,) = problems(
        environ={"SCHEDEXT_LEADER__LEASE_DURATION_S": "10"}, overrides={"leader": {"enabled": True}}
    )
    assert leader.startswith(
        "leader.renew_deadline_s, bind.api_deadline_s, leader.lease_duration_s: "
    )
    assert "leader.lease_duration_s = 10 from SCHEDEXT_LEADER__LEASE_DURATION_S" in leader


def test_a_scorer_name_no_scorer_has_names_the_weights_and_their_source() -> None:
    (said,) = problems(environ={"SCHEDEXT_POLICY__WEIGHTS": '{"nvlink": 2}'})
    assert said.startswith("policy.weights: no scorer is named nvlink")
    assert said.endswith('(policy.weights = {"nvlink": 2} from SCHEDEXT_POLICY__WEIGHTS)')


def test_a_rule_of_the_core_names_its_key_in_full_with_its_source() -> None:
    assert problems(environ={"SCHEDEXT_POLICY__GPU_RESOURCE": "gpu"}) == [
        "policy.gpu_resource: gpu_resource must be an extended resource name such as "
        "nvidia.com/gpu (policy.gpu_resource = gpu from SCHEDEXT_POLICY__GPU_RESOURCE)"
    ]


def test_what_the_core_refuses_of_dra_is_a_settings_error_not_a_failure_at_start() -> None:
    assert problems(environ={"SCHEDEXT_DRA__GPU_DRIVERS": '[" "]'}) == [
        "dra.gpu_drivers: dra.gpu_drivers must name at least one driver, none empty "
        '(dra.gpu_drivers = [" "] from SCHEDEXT_DRA__GPU_DRIVERS)'
    ]


# --- the environment ------------------------------------------------------------------------


def test_a_variable_that_is_no_json_where_json_is_read_names_itself() -> None:
    (said,) = problems(environ={"SCHEDEXT_POLICY__WEIGHTS": "notjson"})
    assert said.startswith(
        'SCHEDEXT_POLICY__WEIGHTS: policy.weights takes JSON here (a mapping such as {"key": 1}), '
        "got notjson: "
    )


@pytest.mark.parametrize(
    ("variable", "nearest"),
    [
        ("SCHEDEXT_POLCY__GPU_SCORING", "SCHEDEXT_POLICY__GPU_SCORING"),
        ("SCHEDEXT_POLICY__GPU_SCORNG", "SCHEDEXT_POLICY__GPU_SCORING"),
        ("SCHEDEXT_POLICY_SHORTLIST", "SCHEDEXT_POLICY__SHORTLIST"),
        ("SCHEDEXT_LOGLEVEL", "SCHEDEXT_LOG_LEVEL"),
        ("SCHEDEXT_SERVER__PORT__X", "SCHEDEXT_SERVER__PORT"),
    ],
)
def test_a_variable_that_names_no_setting_is_refused_with_the_nearest(
    variable: str, nearest: str
) -> None:
    (said,) = problems(environ={variable: "spread"})
    assert said.startswith(f"{variable}: names no setting (did you mean {nearest}?)")


def test_the_variables_that_are_not_settings_are_let_through() -> None:
    environ = {
        "SCHEDEXT_K8S_BIN": "/x",
        "SCHEDEXT_TOOLS_BIN": "/y",
        "SCHEDEXT_AGENT_NODE_NAME": "n1",
        "SCHEDEXT_AGENT_MPS": "false",
        "SCHEDEXT_POLICY__GPU_SCORING": "spread",
        "SCHEDEXT_POLICY__WEIGHTS__LIVE_USE": "2",
        "OTHER": "1",
    }
    settings, _ = read_settings(environ=environ)
    assert settings.policy.gpu_scoring == "spread"
    assert dict(settings.policy.weights) == {"live_use": 2}
    assert all(name.startswith("SCHEDEXT_") for name in OTHER_VARIABLES)


def test_the_agent_refuses_its_own_unknown_variables_and_says_where_a_value_came_from() -> None:
    with pytest.raises(SettingsError) as raised:
        load_agent_settings({}, {"SCHEDEXT_AGENT_NODENAME": "n1"})
    assert raised.value.lines[0].startswith(
        "SCHEDEXT_AGENT_NODENAME: names no setting (did you mean SCHEDEXT_AGENT_NODE_NAME?)"
    )
    with pytest.raises(SettingsError) as raised:
        load_agent_settings({"node_name": "n1"}, {"SCHEDEXT_AGENT_USE_THRESHOLD": "200"})
    assert raised.value.lines == [
        "use_threshold: must be between 0 and 100 (got 200, from SCHEDEXT_AGENT_USE_THRESHOLD)"
    ]
    with pytest.raises(SettingsError) as raised:
        load_agent_settings({}, {"SCHEDEXT_AGENT_DRA_DRIVERS": "gpu.nvidia.com"})
    assert raised.value.lines[0].startswith(
        'SCHEDEXT_AGENT_DRA_DRIVERS: dra_drivers takes JSON here (a list such as ["a", "b"])'
    )
    with pytest.raises(SettingsError) as raised:
        load_agent_settings({}, {})
    assert raised.value.lines == [
        "node_name: is required: give it with --node-name or SCHEDEXT_AGENT_NODE_NAME"
    ]
    # The extender's variables are the extender's business.
    assert load_agent_settings({"node_name": "n1"}, {"SCHEDEXT_POLICY__X": "1"}).node_name == "n1"


# --- the merged settings, each with its source ----------------------------------------------


def test_the_effective_settings_name_each_source_and_read_back_the_same(tmp_path: Path) -> None:
    path = write(tmp_path, "policy:\n  gpu_scoring: spread\n  weights: {live_use: 2}\n")
    settings, layers = read_settings(
        path,
        {"server": {"port": 9000}},
        flags=FLAGS,
        environ={"SCHEDEXT_POLICY__SHORTLIST": "3"},
    )
    text = effective_yaml(settings, layers)
    lines = text.splitlines()
    assert "  port: 9000  # flag --port" in lines
    assert f"  gpu_scoring: spread  # file {path} line 2" in lines
    assert "  shortlist: 3  # env SCHEDEXT_POLICY__SHORTLIST" in lines
    assert "  host: 127.0.0.1  # default" in lines
    assert lines[0] == "server:"
    assert lines[-1] == "log_level: info  # default"
    # Every key is there, and the file reads back to the same settings.
    again, _ = read_settings(write(tmp_path, text, "again.yaml"), environ={})
    assert again == settings
    assert set(yaml.safe_load(text)) == set(Settings.model_fields)
