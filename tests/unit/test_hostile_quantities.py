"""A quantity no Kubernetes API server would keep, in any resource schedext reads from a pod,
never escapes the core as anything but the errors the verbs answer with: filter rejects the
pod with its reason, prioritize and bind refuse it, preempt finds no victims worth it, explain
judges it. (Python's int() refuses over 4300 digits with a ValueError; values over 2^63-1
overflowed the inventory's int64 columns.)"""

from __future__ import annotations

import contextlib
import re
from typing import Any

import pytest

from extender.errors import BindRefusedError
from extender.model import Reason, Victim
from extender.requests import PodRequestError
from testbed.builders import make_node, make_pod
from tests.unit.helpers import scheduler_with

RESOURCES = [
    "nvidia.com/gpu",
    "cpu",
    "memory",
    "schedext.io/gpu-memory",
    "schedext.io/gpu-cores",
    "schedext.io/gpu-shares",
    "nvidia.com/mig-1g.10gb",
]
HOSTILE: list[Any] = [
    "1" * 5000,
    "1e" + "9" * 5000,
    "1e30",
    "9223372036854775808",
    "9223372036854775807",  # within Kubernetes's range, over it in milli-CPU
    2**64,
    1e300,
    "\u0663",
]


@pytest.mark.parametrize("value", HOSTILE, ids=lambda value: repr(value)[:16])
@pytest.mark.parametrize("resource", RESOURCES)
@pytest.mark.parametrize("workload", [None, "CPU-intensive"])
def test_a_hostile_quantity_is_a_reason_on_every_verb(
    resource: str, value: Any, workload: str | None
) -> None:
    scheduler = scheduler_with(
        [make_node("g", gpus=4), make_node("cpu")],
        [make_pod("victim", gpus=2, node="g", gpu_ids=[0, 1], priority=0)],
    )
    pod = make_pod("p", gpus=1, workload=workload, priority=10)
    limits = pod["spec"]["containers"][0]["resources"]["limits"]
    requests = pod["spec"]["containers"][0]["resources"]["requests"]
    limits[resource] = requests[resource] = value
    uid = pod["metadata"]["uid"]

    verdict = scheduler.filter(pod, ["g", "cpu"])
    invalid = {r.reason for r in verdict.rejections} == {Reason.INVALID_POD}
    # 2^63-1 is Kubernetes's largest quantity: a pod may ask that much (and fit nowhere, or be
    # refused for another reason), but not of CPU, counted in milli-CPU
    assert invalid or (value == "9223372036854775807" and resource != "cpu")
    if invalid:
        reason = verdict.rejections[0].message
        with pytest.raises(PodRequestError) as refused:
            scheduler.prioritize(pod, ["g", "cpu"])
        assert refused.value.reason == reason
        with pytest.raises(BindRefusedError, match=re.escape(f"pod default/p: {reason}")):
            scheduler.plan_bind(uid=uid, namespace="default", name="p", node="g", now=1.0)
    else:
        scheduler.prioritize(pod, ["g", "cpu"])
        with contextlib.suppress(BindRefusedError):  # it may not fit g
            scheduler.plan_bind(uid=uid, namespace="default", name="p", node="g", now=1.0)
    if invalid:  # preempt says why too, rather than choosing no victims in silence
        with pytest.raises(PodRequestError) as refused:
            scheduler.preempt(pod, {"g": [Victim(uid="uid-victim")]}, now=1.0)
        assert refused.value.reason == reason
    else:
        scheduler.preempt(pod, {"g": [Victim(uid="uid-victim")]}, now=1.0)
    assert (scheduler.explain("default", "p") is None) is invalid  # an invalid pod is not pending
