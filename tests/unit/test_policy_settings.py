"""Scorer weights from settings: by name, from the YAML file or the environment, into the core's
PolicyConfig; a name no scorer has is a settings error."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.service.settings import SettingsError, load_settings
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
    with pytest.raises(SettingsError) as raised:
        load_settings(policy={"weights": {"nvlink": 3}})
    message = str(raised.value)
    assert "no scorer is named nvlink" in message
    assert all(name in message for name in NAMES)  # the error lists what would be right


# GPU shares: a preset names the resources, each field overrides it; what the core refuses is a
# settings error at start.
SHARE_SETTINGS = [
    ({}, ("schedext.io/gpu-memory", 1, "schedext.io/gpu-cores", "schedext.io/gpu-shares")),
    ({"preset": "gpushare"}, ("aliyun.com/gpu-mem", 1024, None, None)),
    ({"preset": "hami"}, ("nvidia.com/gpumem", 1, "nvidia.com/gpucores", "nvidia.com/gpu")),
    (
        {"preset": "hami", "count_resource": "", "memory_unit": "GiB"},
        ("nvidia.com/gpumem", 1024, "nvidia.com/gpucores", None),
    ),
    (
        {"memory_resource": "example.com/vmem", "cores_resource": ""},
        ("example.com/vmem", 1, None, "schedext.io/gpu-shares"),
    ),
]


@pytest.mark.parametrize(("shares", "expected"), SHARE_SETTINGS)
def test_share_resources_come_from_a_preset_and_its_overrides(
    shares: dict[str, str], expected: tuple[object, ...]
) -> None:
    resources = load_settings(policy={"shares": shares}).policy.config().shares
    assert (resources.memory, resources.memory_unit_mib, resources.cores, resources.count) == (
        expected
    )


@pytest.mark.parametrize(
    ("shares", "message"),
    [
        ({"memory_resource": "gpu-memory"}, "must be an extended resource name"),
        ({"cores_resource": "schedext.io/gpu-memory"}, "distinct names"),
        ({"count_resource": "nvidia.com/gpu"}, None),  # HAMi's way: allowed
        ({"memory_resource": "nvidia.com/gpu"}, "counts whole GPUs"),
        ({"placement": "random"}, "pack"),
    ],
)
def test_share_settings_the_core_refuses_are_settings_errors(
    shares: dict[str, str], message: str | None
) -> None:
    if message is None:
        load_settings(policy={"shares": shares})
        return
    with pytest.raises(SettingsError, match=message):
        load_settings(policy={"shares": shares})


def test_share_placement_and_weight_reach_the_core(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SCHEDEXT_POLICY__SHARES__PLACEMENT", "spread")
    monkeypatch.setenv("SCHEDEXT_POLICY__SHARES__WEIGHT", "4")
    config = load_settings().policy.config()
    assert (config.share_placement.value, config.share_weight) == ("spread", 4)
