"""Scorer weights from settings: by name, from the YAML file or the environment, into the core's
PolicyConfig; a name no scorer has is a settings error."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from app.settings import load_settings
from extender.scoring import NAMES


def test_weights_by_name_reach_the_core_sorted_by_name(tmp_path: Path) -> None:
    config_file = tmp_path / "schedext.yaml"
    config_file.write_text("policy:\n  weights:\n    topology: 5\n    cpu_only: 0\n")
    config = load_settings(config_file).policy.config()
    assert config.weights == (("cpu_only", 0), ("topology", 5))


def test_weights_come_from_the_environment_too(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SCHEDEXT_POLICY__WEIGHTS", '{"gang_rack": 4}')
    assert load_settings().policy.config().weights == (("gang_rack", 4),)


def test_no_weights_named_means_the_scorers_defaults() -> None:
    assert load_settings().policy.config().weights == ()


def test_a_weight_for_a_scorer_that_does_not_exist_is_a_settings_error() -> None:
    with pytest.raises(ValidationError) as raised:
        load_settings(policy={"weights": {"nvlink": 3}})
    message = str(raised.value)
    assert "no scorer is named nvlink" in message
    assert all(name in message for name in NAMES)  # the error lists what would be right
