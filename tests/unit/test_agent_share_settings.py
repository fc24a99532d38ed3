"""The agent's share settings: the resources read as the extender's ``policy.shares.*``, the
handle they give, and the combinations that cannot be served refused with the reason."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from app.agent.settings import AgentSettings
from extender import names
from extender.config import SHARE_PRESETS, ShareResources
from extender.devices.share_handle import ShareHandle


def settings(**values: Any) -> AgentSettings:
    return AgentSettings(node_name="n1", **values)


@pytest.mark.parametrize(
    ("values", "resources", "handle"),
    [
        ({}, ShareResources(), ShareHandle(names.SHARE_COUNT_RESOURCE, None, 32)),
        (
            {"share_preset": "gpushare"},
            SHARE_PRESETS["gpushare"],
            ShareHandle("aliyun.com/gpu-mem", 1024, 32),
        ),
        (
            {"share_preset": "hami", "share_count_resource": "example.com/gpu-shares"},
            ShareResources(
                memory="nvidia.com/gpumem",
                cores="nvidia.com/gpucores",
                count="example.com/gpu-shares",
            ),
            ShareHandle("example.com/gpu-shares", None, 32),
        ),
        (
            {"share_cores_resource": "", "share_memory_unit": "GiB", "share_slots": 8},
            ShareResources(memory_unit_mib=1024, cores=None),
            ShareHandle(names.SHARE_COUNT_RESOURCE, None, 8),
        ),
    ],
    ids=["schedext", "gpushare", "hami with its own count", "overrides"],
)
def test_share_resources_and_handle(
    values: dict[str, Any], resources: ShareResources, handle: ShareHandle
) -> None:
    chosen = settings(**values)
    assert chosen.share_resources() == resources
    assert chosen.share_handle() == handle


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"share_count_resource": ""}, "counts MiB and no share count resource is set"),
        ({"share_preset": "hami"}, "one kubelet resource cannot count both"),
        ({"share_socket_name": "schedext-gpu.sock"}, "share_socket_name must differ"),
        ({"shares": False, "mps": True}, "it needs shares on"),
        ({"share_memory_resource": "no-slash", "shares": False}, "extended resource name"),
    ],
    ids=["MiB without a count", "hami's count", "one socket for two", "mps alone", "bad name"],
)
def test_what_cannot_be_served_is_refused(values: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        settings(**values)


def test_whole_gpus_only_needs_no_servable_share() -> None:
    assert not settings(shares=False, share_preset="hami").shares
