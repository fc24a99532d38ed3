"""What explain says of gangs' holds (extender.gang.holds): a member's explanation says under
its group whether the group has a hold and where, or why not; a pod a hold keeps off a node is
told so there, as filter tells it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from extender.model import Explanation
from extender.scheduler import Scheduler
from testbed.builders import make_pod
from tests.unit.test_gang_holds import BUSY, gang, scheduler_of, waited


def explained(scheduler: Scheduler, name: str) -> Explanation:
    explanation = scheduler.explain("default", name)
    assert explanation is not None
    return explanation


@dataclass(frozen=True)
class GroupCase:
    id: str
    objs: list[dict[str, Any]]
    seconds: float
    said: str


# The reviews are at T0 (2027-01-15T08:00:00Z) and T0 + seconds; a hold lasts 600s.
GROUP_CASES = [
    GroupCase("a hold stands: how many, where, since and until", [*BUSY, *gang(2, 8)], 61,
              "holding 16 GPUs on n1, n2 for the group since 2027-01-15T08:01:01Z, until "
              "2027-01-15T08:11:01Z"),
    GroupCase("none possible: why not", [*BUSY, *gang(3, 8)], 61,
              "no hold: the cluster could hold it even if the pods of no higher priority "
              "outside gangs finished"),
    GroupCase("not waited long enough: nothing said", [*BUSY, *gang(2, 8)], 30, ""),
]  # fmt: skip


@pytest.mark.parametrize("case", GROUP_CASES, ids=lambda c: c.id)
def test_a_members_explanation_says_whether_its_group_has_a_hold(case: GroupCase) -> None:
    scheduler = scheduler_of(case.objs)
    scheduler.filter(case.objs[-1], ["n1", "n2", "n3"])  # a member kube-scheduler asked of
    waited(scheduler, case.seconds)
    assert explained(scheduler, "m1").group_hold == case.said


def test_a_pod_outside_the_gang_is_told_on_each_held_node_that_it_is_kept_off() -> None:
    scheduler = scheduler_of([*BUSY, *gang(2, 8)])
    waited(scheduler, 61)
    newcomer, vip = make_pod("new", gpus=1), make_pod("vip2", gpus=1, priority=5)
    for pod in (newcomer, vip):
        scheduler.filter(pod, ["n1", "n2", "n3"])
    nodes = {n.node: n for n in explained(scheduler, "new").nodes}
    assert [name for name, n in nodes.items() if n.fits] == ["n3"]
    for name in ("n1", "n2"):
        assert nodes[name].reason.startswith(
            "schedext: this node's free GPUs are held for gang default/g, which has waited "
            "since 2027-01-15T08:00:00Z"
        )
        assert not nodes[name].resolvable  # preempting does not lift a hold
    assert explained(scheduler, "new").group_hold == ""  # in no gang
    assert all(n.fits for n in explained(scheduler, "vip2").nodes)  # of higher priority
