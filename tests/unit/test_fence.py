"""The fence (dra.fence): the DeviceTaintRules schedext publishes on the GPUs its binds hold
where DRA advertises them too (extender.fencing, extender.dra.fence): which devices, under
which names, and the writes that make the published rules match; a fenced GPU stays
schedext's to hand out, and a bind's plan carries its pod's rules."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from extender.config import DraConfig, PolicyConfig
from extender.dra import (
    FENCE_KEY,
    HELD,
    ClaimsLedger,
    DeviceRef,
    FenceRule,
    TaintRule,
    decode_slice,
    decode_taint_rule,
    fence_diff,
    fence_name,
)
from extender.fencing import Unfenced, fence_plan
from extender.model import Holding, HoldingKind, NodeSpec
from extender.scheduler import Scheduler
from testbed.builders import agent_annotations, make_node, make_pod
from testbed.dra_builders import DRIVER, gpu, gpu_uuid, mig, resource_slice, taint_rule

Obj = dict[str, Any]
NOW = 1000.0
DNS_1123 = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def ref(device: str, *, pool: str = "n1", driver: str = DRIVER) -> DeviceRef:
    return DeviceRef(driver, pool, device)


def rule(device: str, value: str, *, node: str = "n1", pool: str = "n1") -> FenceRule:
    at = ref(device, pool=pool)
    return FenceRule(fence_name(node, at), node, at, value)


def selector(wanted: FenceRule) -> dict[str, str]:
    driver, pool, device = wanted.ref
    return {"driver": driver, "pool": pool, "device": device}


def published(wanted: FenceRule, **changes: Any) -> TaintRule:
    """``wanted`` as the ledger reads it back from the API server (``changes`` to it)."""
    fields = {
        "selector": selector(wanted),
        "key": FENCE_KEY,
        "value": wanted.value,
    } | changes
    decoded = decode_taint_rule(taint_rule(wanted.name, **fields))
    assert decoded is not None
    return decoded


# ----------------------------------------------------------------------------- names


@pytest.mark.parametrize(
    ("node", "device"),
    [
        pytest.param("n1", "gpu-0", id="plain"),
        pytest.param("Node_A.example.com", "GPU_0", id="upper case, dots and underscores"),
        pytest.param("n" * 253, "gpu-0", id="a node name of 253 characters"),
        pytest.param("---", "---", id="nothing readable"),
    ],
)
def test_a_fence_rule_name_is_a_dns_name_that_follows_from_node_and_device(
    node: str, device: str
) -> None:
    name = fence_name(node, ref(device))
    assert name.startswith("schedext-fence-")
    assert len(name) <= 253
    assert DNS_1123.fullmatch(name), name
    assert name == fence_name(node, ref(device))  # deterministic: any replica finds it


def test_fence_rule_names_keep_devices_apart_whatever_the_cut_or_the_case() -> None:
    long = "n" * 253
    names = {
        fence_name("n1", ref("gpu-0")),
        fence_name("n1", ref("gpu-1")),
        fence_name("n1", ref("gpu-0", pool="other")),
        fence_name("n1", ref("gpu-0", driver="other.example.com")),
        fence_name("N1", ref("gpu-0")),
        fence_name(long, ref("gpu-0")),
        fence_name(long, ref("gpu-1")),
    }
    assert len(names) == 7
    assert fence_name("n1", ref("gpu-0")).startswith("schedext-fence-n1-gpu-0-")


# ------------------------------------------------------------------------------ diff

A, B, C = rule("gpu-0", "uid-a"), rule("gpu-1", "uid-b"), rule("gpu-2", "uid-c")


@dataclass(frozen=True)
class DiffCase:
    id: str
    wanted: Sequence[FenceRule]
    seen: Sequence[TaintRule]
    create: Sequence[FenceRule] = ()
    update: Sequence[FenceRule] = ()
    delete: Sequence[str] = ()


DIFFS = [
    DiffCase("none wanted, none seen", [], []),
    DiffCase("wanted, not seen: created", [A, B], [], create=[A, B]),
    DiffCase("wanted and seen as wanted: nothing", [A, B], [published(A), published(B)]),
    DiffCase("seen, no longer wanted: deleted", [A], [published(A), published(B)], delete=[B.name]),
    DiffCase(
        "another holder: rewritten",
        [A],
        [published(A, value="uid-old")],
        update=[A],
    ),
    DiffCase(
        "another device under the name: rewritten",
        [A],
        [published(A, selector={"driver": DRIVER, "pool": "n1", "device": "gpu-9"})],
        update=[A],
    ),
    DiffCase(
        "another effect: rewritten",
        [A],
        [published(A, effect="NoExecute")],
        update=[A],
    ),
    DiffCase(
        "rules not schedext's are left alone",
        [],
        [decode_taint_rule(taint_rule("xid-79", selector={"driver": DRIVER}, key=FENCE_KEY))],
    ),
    DiffCase(
        "a rule labelled as schedext's, under another name, is schedext's",
        [],
        [TaintRule("renamed", selects=True, managed=True)],
        delete=["renamed"],
    ),
    DiffCase("the same rule wanted twice: created once", [C, A, C], [], create=[A, C]),
]


@pytest.mark.parametrize("case", DIFFS, ids=lambda c: c.id)
def test_the_diff_makes_the_published_fence_exactly_the_wanted_one(case: DiffCase) -> None:
    diff = fence_diff(case.wanted, case.seen)
    assert diff.create == tuple(case.create)
    assert diff.update == tuple(case.update)
    assert diff.delete == tuple(case.delete)
    assert bool(diff) == bool(case.create or case.update or case.delete)


def test_a_rule_decoded_with_schedexts_label_is_managed() -> None:
    obj = taint_rule("any", selector={"driver": DRIVER})
    obj["metadata"]["labels"] = {"app.kubernetes.io/managed-by": "schedext"}
    decoded = decode_taint_rule(obj)
    assert decoded is not None
    assert decoded.managed
    other = decode_taint_rule(taint_rule("any", selector={"driver": DRIVER}))
    assert other is not None
    assert not other.managed


# ------------------------------------------------------------- wanted, from holdings


def uuids(node: str = "n1", gpus: int = 4) -> tuple[str, ...]:
    return tuple(gpu_uuid(node, i) for i in range(gpus))


def held(
    uid: str,
    gpu_ids: tuple[int, ...] = (),
    *,
    node: str = "n1",
    gpu_uuids: tuple[str, ...] | None = None,
    mig_uuids: tuple[str, ...] | None = None,
    kind: HoldingKind = HoldingKind.BOUND,
) -> Holding:
    return Holding(
        uid=uid,
        namespace="default",
        name=f"pod-{uid}",
        node=node,
        gpus=len(gpu_ids),
        gpu_ids=gpu_ids,
        gpu_uuids=gpu_uuids,
        mig_uuids=mig_uuids,
        kind=kind,
    )


@dataclass(frozen=True)
class WantCase:
    id: str
    holdings: Sequence[Holding]
    rules: Sequence[FenceRule]
    unfenced: Sequence[Unfenced] = ()
    devices: Sequence[Obj] = field(default_factory=lambda: [gpu(i) for i in range(4)])
    agent_uuids: tuple[str, ...] = uuids()


def unfenced(uid: str, gpu_: str, why: str) -> Unfenced:
    return Unfenced("n1", f"default/pod-{uid}", gpu_, why)


WANTS = [
    WantCase("no holding: no rule", [], []),
    WantCase(
        "a bound pod's GPUs, each its own rule, for its UID",
        [held("a", (1, 2))],
        [rule("gpu-1", "a"), rule("gpu-2", "a")],
    ),
    WantCase(
        "a reservation (a bind under way) is fenced as well",
        [held("a", (0,), kind=HoldingKind.RESERVED)],
        [rule("gpu-0", "a")],
    ),
    WantCase(
        "two pods on one GPU (shares): one rule, held",
        [held("a", (3,)), held("b", (3,))],
        [rule("gpu-3", HELD)],
    ),
    WantCase(
        "the UUIDs the bind wrote win over the agent's indices",
        [held("a", (0,), gpu_uuids=(gpu_uuid("n1", 2),))],
        [rule("gpu-2", "a")],
    ),
    WantCase(
        "a pod holding no GPU: nothing",
        [held("a", ())],
        [],
    ),
    WantCase(
        "a pod on a node DRA does not know: nothing",
        [held("a", (0,), node="elsewhere")],
        [],
    ),
    WantCase(
        "a GPU DRA does not advertise (every device has a UUID): nothing, and no report",
        [held("a", (3,))],
        [],
        devices=[gpu(0), gpu(1)],
    ),
    WantCase(
        "no UUID from the node agent: reported, not fenced",
        [held("a", (1,))],
        [],
        unfenced=[unfenced("a", "GPU 1", "the node agent publishes no UUID for it")],
        agent_uuids=(),
    ),
    WantCase(
        "a device with no UUID: a GPU no device matches is reported, the others fenced",
        [held("a", (0, 3))],
        [rule("gpu-0", "a")],
        unfenced=[
            unfenced(
                "a",
                f"GPU 3 ({gpu_uuid('n1', 3)})",
                f"no DRA device has UUID {gpu_uuid('n1', 3)}, and 1 of the node's DRA devices "
                "have no UUID schedext can read",
            )
        ],
        devices=[gpu(0), gpu(1), gpu(2, attributes={"uuid": None})],
    ),
    WantCase(
        "a whole GPU's partitions (MIG devices of it) are fenced with it",
        [held("a", (1,))],
        [rule("gpu-1", "a"), rule("gpu-1-mig-0", "a")],
        devices=[gpu(0), gpu(1), mig("gpu-1-mig-0", uuid="MIG-1", parent_uuid=gpu_uuid("n1", 1))],
    ),
    WantCase(
        "a MIG device schedext handed out: it, and the GPU it is on",
        [held("a", mig_uuids=("MIG-1",))],
        [rule("gpu-1", "a"), rule("gpu-1-mig-0", "a")],
        devices=[
            gpu(0),
            gpu(1),
            mig("gpu-1-mig-0", uuid="MIG-1", parent_uuid=gpu_uuid("n1", 1)),
            mig("gpu-1-mig-1", uuid="MIG-2", parent_uuid=gpu_uuid("n1", 1)),
        ],
    ),
]


@pytest.mark.parametrize("case", WANTS, ids=lambda c: c.id)
def test_the_fence_covers_the_gpus_schedexts_pods_hold_where_dra_offers_them(
    case: WantCase,
) -> None:
    ledger = ClaimsLedger()
    ledger.upsert_slice(decode_slice(resource_slice("n1", case.devices)))
    spec = NodeSpec(name="n1", gpu_count=4, gpu_uuids=case.agent_uuids)
    specs = {"n1": spec}
    plan = fence_plan(case.holdings, specs.get, ledger.node, tuple(ledger.rules.values()))
    assert plan.rules == tuple(sorted(case.rules))
    assert plan.unfenced == tuple(case.unfenced)
    assert plan.diff.create == plan.rules  # nothing published yet
    assert plan.diff.delete == ()


# --------------------------------------------------------------- through the scheduler


def mixed_node() -> Obj:
    """n1: four nvidia.com/gpu the agent names by UUID, and the same four in a slice."""
    return make_node("n1", gpus=4, annotations=agent_annotations(4, uuid_prefix="GPU-n1"))


def fenced_scheduler(*pods: Obj, fence: bool = True) -> Scheduler:
    scheduler = Scheduler(PolicyConfig(dra=DraConfig(fence=fence)))
    scheduler.upsert_node(mixed_node())
    scheduler.upsert_resource_slice(resource_slice("n1", [gpu(i) for i in range(4)]))
    for pod in pods:
        scheduler.upsert_pod(pod)
    return scheduler


def publish(scheduler: Scheduler, rules: Sequence[FenceRule]) -> None:
    """The rules as the watch brings them back once published."""
    for wanted in rules:
        obj = taint_rule(
            wanted.name,
            selector=selector(wanted),
            key=FENCE_KEY,
            value=wanted.value,
        )
        obj["metadata"]["labels"] = {"app.kubernetes.io/managed-by": "schedext"}
        scheduler.upsert_device_taint_rule(obj)


def test_the_scheduler_plans_rules_for_bound_pods_and_takes_them_back_when_they_go() -> None:
    pod = make_pod("a", uid="uid-a", gpus=2, node="n1", gpu_ids=[0, 2])
    scheduler = fenced_scheduler(pod)
    plan = scheduler.fence_plan()
    assert plan.rules == (rule("gpu-0", "uid-a"), rule("gpu-2", "uid-a"))
    assert plan.diff.create == plan.rules

    publish(scheduler, plan.rules)
    assert not scheduler.fence_plan().diff  # published: nothing left to write

    scheduler.delete_pod("uid-a")
    after = scheduler.fence_plan()
    assert after.rules == ()
    assert after.diff.delete == tuple(r.name for r in plan.rules)


def test_a_fenced_gpu_stays_schedexts_to_hand_out() -> None:
    """The fence's rules make the devices unfit for DRA, not for schedext: its own pods'
    GPUs are freed as ever, and only a claim's devices are in use."""
    scheduler = fenced_scheduler()
    publish(scheduler, [rule(f"gpu-{i}", HELD) for i in range(4)])
    view = scheduler.inventory.node("n1")
    assert view is not None
    assert view.free_gpu_ids == (0, 1, 2, 3)
    assert view.spec.gpu_in_use == ()
    dra = view.spec.dra
    assert dra is not None
    assert (dra.total, dra.free) == (0, 0)  # DRA's allocator has none left here
    verdict = scheduler.filter(make_pod("four", uid="uid-four", gpus=4), ["n1"])
    assert verdict.passed == ["n1"], verdict.failed


@pytest.mark.parametrize(
    ("fence", "planned"),
    [
        pytest.param(True, True, id="fence on: the plan carries the pod's rules"),
        pytest.param(False, False, id="fence off: none (the node is refused anyway)"),
    ],
)
def test_a_bind_plan_carries_the_rules_of_its_pods_gpus(fence: bool, planned: bool) -> None:
    other = make_pod("other", uid="uid-other", gpus=1, node="n1", gpu_ids=[0])
    scheduler = fenced_scheduler(other, fence=fence)
    pod = make_pod("a", uid="uid-a", gpus=2)
    verdict = scheduler.filter(pod, ["n1"])
    if not fence:
        assert verdict.passed == []
        return
    assert verdict.passed == ["n1"]
    plan = scheduler.plan_bind(uid="uid-a", namespace="default", name="a", node="n1", now=NOW)
    assert planned
    assert plan.fence == tuple(rule(f"gpu-{i}", "uid-a") for i in plan.gpu_ids)
    # The pass wants them as well (the reservation holds them), with the other pod's.
    assert set(plan.fence) < set(scheduler.fence_plan().rules)
    scheduler.abort_bind(plan)
    assert scheduler.fence_plan().rules == (rule("gpu-0", "uid-other"),)
