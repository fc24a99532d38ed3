"""The claims ledger (extender.dra): which GPUs ResourceClaims hold on each node, for whom;
which are unhealthy; who owns a node's GPUs; held devices as GPU indices; and bad input read
as "unknown" with a reason, never an exception."""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pytest

from extender.dra import (
    ClaimsLedger,
    Ownership,
    decode_claim,
    decode_device_class,
    decode_pod_claims,
    decode_slice,
    decode_taint_rule,
    held_gpus,
    ownership,
)
from testbed.dra_builders import (
    DRIVER,
    device_class,
    dra_pod,
    gpu,
    gpu_uuid,
    mig,
    resource_claim,
    resource_slice,
    result,
    taint_rule,
)

Obj = dict[str, Any]
WHOLE = "whole"


@dataclass(frozen=True)
class Delete:
    kind: str
    key: str


Step = Obj | Delete


def feed(ledger: ClaimsLedger, step: Step) -> tuple[str, ...]:
    """One watch event into the ledger, through the decoder of its kind."""
    if isinstance(step, Delete):
        deletes: dict[str, Callable[[str], Any]] = {
            "ResourceSlice": ledger.delete_slice,
            "ResourceClaim": ledger.delete_claim,
            "Pod": ledger.delete_pod,
            "DeviceTaintRule": ledger.delete_taint_rule,
            "DeviceClass": ledger.delete_device_class,
        }
        return deletes[step.kind](step.key) or ()
    kind = step["kind"]
    if kind == "ResourceSlice":
        piece = decode_slice(step)
        assert piece is not None
        return ledger.upsert_slice(piece)
    if kind == "ResourceClaim":
        claim = decode_claim(step)
        assert claim is not None
        return ledger.upsert_claim(claim)
    if kind == "Pod":
        pod = decode_pod_claims(step)
        assert pod is not None
        return ledger.upsert_pod(pod)
    if kind == "DeviceTaintRule":
        rule = decode_taint_rule(step)
        assert rule is not None
        return ledger.upsert_taint_rule(rule)
    found = decode_device_class(step)
    assert found is not None
    ledger.upsert_device_class(found)
    return ()


def ledger_of(steps: Sequence[Step], **kwargs: Any) -> ClaimsLedger:
    ledger = ClaimsLedger(**kwargs)
    for step in steps:
        feed(ledger, step)
    return ledger


def held(ledger: ClaimsLedger, node: str = "n1") -> dict[str, tuple[Any, ...]]:
    """Per held device: whole or the MiB its shares consumed, the pods and the claims."""
    return {
        h.ref.device: (WHOLE if h.whole else h.memory_mib, h.pods, h.claims)
        for h in ledger.node(node).held
    }


SLICE = resource_slice("n1", [gpu(i) for i in range(4)])
SHARED = resource_slice("n1", [gpu(0, shared=True), gpu(1)])


def claim(name: str, *devices: str, **kwargs: Any) -> Obj:
    return resource_claim(name, results=[result("n1", d) for d in devices], **kwargs)


def share(name: str, memory: str | None, pod: str, device: str = "gpu-0") -> Obj:
    entry = result("n1", device, share_id=f"share-{name}", consumed_memory=memory)
    return resource_claim(name, results=[entry], reserved_for=[pod])


@dataclass
class Case:
    name: str
    steps: list[Step]
    expected: dict[str, tuple[Any, ...]]


C = ("default/c",)
HOLD_CASES = [
    Case("one device for one pod", [SLICE, claim("c", "gpu-0", reserved_for=["a"])],
         {"gpu-0": (WHOLE, ("a",), C)}),
    Case("several devices for one request", [SLICE, claim("c", "gpu-0", "gpu-1")],
         {"gpu-0": (WHOLE, (), C), "gpu-1": (WHOLE, (), C)}),
    Case("several requests of one claim",
         [SLICE, resource_claim("c", results=[result("n1", "gpu-0", request="train"),
                                              result("n1", "gpu-3", request="eval")])],
         {"gpu-0": (WHOLE, (), C), "gpu-3": (WHOLE, (), C)}),
    Case("two claims share one device by memory: their MiB add up",
         [SHARED, share("c1", "20Gi", "a"), share("c2", "30Gi", "b")],
         {"gpu-0": (51200, ("a", "b"), ("default/c1", "default/c2"))}),
    Case("a share's memory is rounded up to whole MiB",
         [SHARED, share("c1", "1000000", "a")], {"gpu-0": (1, ("a",), ("default/c1",))}),
    Case("consumed memory on a device that allows one allocation: held whole",
         [SHARED, share("c1", "20Gi", "a", device="gpu-1")],
         {"gpu-1": (WHOLE, ("a",), ("default/c1",))}),
    Case("a share with no consumed memory on a shared device holds it whole",
         [SHARED, share("c1", "20Gi", "a"), share("c2", None, "b")],
         {"gpu-0": (WHOLE, ("a", "b"), ("default/c1", "default/c2"))}),
    Case("adminAccess occupies nothing",
         [SLICE, resource_claim("c", results=[result("n1", "gpu-0", admin=True)])], {}),
    Case("adminAccess beside an ordinary result: only the ordinary one holds",
         [SLICE, resource_claim("c", results=[result("n1", "gpu-0", admin=True),
                                              result("n1", "gpu-1")])],
         {"gpu-1": (WHOLE, (), C)}),
    Case("deallocated (status.allocation cleared): the devices are free",
         [SLICE, claim("c", "gpu-0", reserved_for=["a"]), resource_claim("c")], {}),
    Case("the claim deleted: the devices are free",
         [SLICE, claim("c", "gpu-0"), Delete("ResourceClaim", "default/c")], {}),
    Case("a claim shared by two pods (reservedFor)",
         [SLICE, claim("c", "gpu-0", reserved_for=["b", "a"])], {"gpu-0": (WHOLE, ("a", "b"), C)}),
    Case("KEP-5004: a claim schedext did not write, named by the pod's status",
         [SLICE, claim("c", "gpu-2", extended=True), dra_pod("x", extended_claim="c")],
         {"gpu-2": (WHOLE, ("x",), C)}),
    Case("a pod naming the claim, before it is reserved for it",
         [SLICE, claim("c", "gpu-0"), dra_pod("p", claims={"gpu": "c"})],
         {"gpu-0": (WHOLE, ("p",), C)}),
    Case("a pod whose template's claim was generated (resourceClaimStatuses)",
         [SLICE, claim("c", "gpu-0"), dra_pod("p", templates={"gpu": "c"})],
         {"gpu-0": (WHOLE, ("p",), C)}),
    Case("a template's claim not generated yet charges nothing",
         [SLICE, claim("c", "gpu-0"), dra_pod("p", templates={"gpu": None})],
         {"gpu-0": (WHOLE, (), C)}),
    Case("the pod deleted: its charge goes, the allocated claim still holds",
         [SLICE, claim("c", "gpu-0"), dra_pod("p", claims={"gpu": "c"}), Delete("Pod", "p")],
         {"gpu-0": (WHOLE, (), C)}),
    Case("a pod's claim is in the pod's namespace",
         [SLICE, claim("c", "gpu-0"), dra_pod("p", namespace="team", claims={"gpu": "c"})],
         {"gpu-0": (WHOLE, (), C)}),
    Case("another driver's result is no GPU",
         [SLICE, resource_claim("c", results=[result("n1", "nic-0", driver="nic.example.com")])],
         {}),
    Case("the claim seen before its slice: placed when the slice comes",
         [claim("c", "gpu-0", reserved_for=["a"]), SLICE], {"gpu-0": (WHOLE, ("a",), C)}),
    Case("a newer generation of the pool replaces the older",
         [SLICE, resource_slice("n1", [gpu(0, uuid="GPU-new")], generation=2),
          claim("c", "gpu-0")],
         {"gpu-0": (WHOLE, (), C)}),
]  # fmt: skip


@pytest.mark.parametrize("case", HOLD_CASES, ids=[c.name for c in HOLD_CASES])
def test_what_claims_hold_and_for_whom(case: Case) -> None:
    ledger = ledger_of(case.steps)
    assert held(ledger) == case.expected
    assert ledger.node("n1").unknown == ()
    assert ledger.problems() == ()


def test_a_share_is_charged_per_result() -> None:
    ledger = ledger_of([SHARED, share("c1", "20Gi", "a"), share("c2", "30Gi", "b")])
    [device] = ledger.node("n1").held
    assert [(c.claim, c.share_id, c.memory_mib, c.pods) for c in device.charges] == [
        ("default/c1", "share-c1", 20480, ("a",)),
        ("default/c2", "share-c2", 30720, ("b",)),
    ]
    assert not device.whole


def test_only_the_newest_generation_of_a_pool_is_advertised() -> None:
    newer = resource_slice("n1", [gpu(0, uuid="GPU-new")], generation=2)
    ledger = ledger_of([SLICE, newer, claim("c", "gpu-3", node="n1")])
    assert [(s.ref.device, s.uuid) for s in ledger.node("n1").devices] == [("gpu-0", "GPU-new")]
    [device] = ledger.node("n1").held
    assert device.unknown == f"{DRIVER}/n1/gpu-3 is in no ResourceSlice"


def test_what_a_node_advertises() -> None:
    ledger = ledger_of([resource_slice("n1", [gpu(0), gpu(5, memory="81559Mi", shared=True)])])
    assert [
        (s.ref.device, s.uuid, s.device.pcie_root, s.device.memory_mib, s.device.shared)
        for s in ledger.node("n1").devices
    ] == [
        ("gpu-0", gpu_uuid("n1", 0), "pci0000:00", 81920, False),
        ("gpu-5", gpu_uuid("n1", 5), "pci0000:01", 81559, True),
    ]


def test_a_pods_claims() -> None:
    ledger = ledger_of([SLICE, claim("c1", "gpu-0"), claim("c2", "gpu-1", reserved_for=["p"]),
                        dra_pod("p", claims={"gpu": "c1"}), claim("c3", "gpu-2")])  # fmt: skip
    assert ledger.claims_of("p") == ("default/c1", "default/c2")
    assert ledger.claims_of("nobody") == ()


UNKNOWN_CASES = [
    # (id, steps, the unknown held devices on n1 and why, the problems expected (substrings))
    ("a claim names a device no slice has: unknown on its allocation's node",
     [SLICE, claim("c", "gpu-9", node="n1")],
     {"gpu-9": f"{DRIVER}/n1/gpu-9 is in no ResourceSlice"},
     [("ResourceClaim", "default/c", "gpu-9 is in no ResourceSlice")]),
    ("no slice has it and no node is named: on no node, still reported",
     [SLICE, claim("c", "gpu-9")], {},
     [("ResourceClaim", "default/c", "places on no node")]),
    ("the slice deleted under a held device",
     [SLICE, claim("c", "gpu-0", node="n1"), Delete("ResourceSlice", SLICE["metadata"]["name"])],
     {"gpu-0": "is in no ResourceSlice"}, [("ResourceClaim", "default/c", "in no ResourceSlice")]),
    ("an attribute of no known kind",
     [resource_slice("n1", [gpu(0, attributes={"numa": {"float": 0.5}})]), claim("c", "gpu-0")],
     {"gpu-0": "attribute 'numa' has no value schedext reads"},
     [("ResourceSlice", "n1-gpu.nvidia.com-1", "device 'gpu-0': attribute 'numa'")]),
    ("an attribute with two kinds set",
     [resource_slice("n1", [gpu(0, attributes={"uuid": {"string": "GPU-x", "int": 1}})]),
      claim("c", "gpu-0")],
     {"gpu-0": "attribute 'uuid' has no value"}, [("ResourceSlice", "", "no uuid attribute")]),
    ("an int attribute that is a JSON boolean",
     [resource_slice("n1", [gpu(0, attributes={"numa": {"int": True}})]), claim("c", "gpu-0")],
     {"gpu-0": "attribute 'numa'"}, [("ResourceSlice", "", "attribute 'numa'")]),
    ("a device with no uuid attribute",
     [resource_slice("n1", [gpu(0, attributes={"uuid": None})]), claim("c", "gpu-0")],
     {"gpu-0": "no uuid attribute"}, [("ResourceSlice", "", "device 'gpu-0': no uuid")]),
    ("a memory capacity that is no quantity",
     [resource_slice("n1", [gpu(0, memory="lots")]), claim("c", "gpu-0")],
     {"gpu-0": "capacity memory is no quantity: 'lots'"}, [("ResourceSlice", "", "'lots'")]),
    ("a slice of a future apiVersion: its devices are unknown",
     [resource_slice("n1", [gpu(0)], api_version="resource.k8s.io/v2"),
      claim("c", "gpu-0", node="n1")],
     {"gpu-0": "is in no ResourceSlice"},
     [("ResourceSlice", "", "apiVersion 'resource.k8s.io/v2' is not one schedext reads"),
      ("ResourceClaim", "default/c", "in no ResourceSlice")]),
    ("a v1beta1 slice (devices under basic:) is not read",
     [resource_slice("n1", [{"name": "gpu-0", "basic": gpu(0)}],
                     api_version="resource.k8s.io/v1beta1")], {},
     [("ResourceSlice", "", "apiVersion 'resource.k8s.io/v1beta1'")]),
    ("a claim of a future apiVersion",
     [SLICE, {**claim("c", "gpu-0"), "apiVersion": "resource.k8s.io/v2"}], {},
     [("ResourceClaim", "default/c", "apiVersion 'resource.k8s.io/v2'")]),
    ("a v1alpha3 taint rule (it may select by CEL) is not read",
     [SLICE, taint_rule("r", selector={}, api_version="resource.k8s.io/v1alpha3")], {},
     [("DeviceTaintRule", "r", "apiVersion 'resource.k8s.io/v1alpha3'")]),
    ("a result that names no device",
     [SLICE, resource_claim("c", results=[{"request": "gpu", "driver": DRIVER}])], {},
     [("ResourceClaim", "default/c", "result 0: names no device")]),
    ("consumed memory that is no quantity: the whole device",
     [SHARED, share("c", "a lot", "p")], {},
     [("ResourceClaim", "default/c", "consumed memory is no quantity: 'a lot' (the whole")]),
]  # fmt: skip


@pytest.mark.parametrize(
    ("name", "steps", "unknown", "problems"), UNKNOWN_CASES, ids=[c[0] for c in UNKNOWN_CASES]
)
def test_bad_input_is_an_unknown_device_with_a_reason(
    name: str, steps: list[Step], unknown: dict[str, str], problems: list[tuple[str, str, str]]
) -> None:
    ledger = ledger_of(steps)
    found = {h.ref.device: h.unknown for h in ledger.node("n1").unknown}
    assert found.keys() == unknown.keys()
    for device, why in unknown.items():
        assert why in found[device]
    reported = ledger.problems()
    for kind, key, why in problems:
        assert any(p.kind == kind and key in p.key and why in p.reason for p in reported), (
            kind, key, why, reported,
        )  # fmt: skip
    assert len(reported) == len(problems)


def test_consumed_memory_unread_holds_the_whole_device() -> None:
    [device] = ledger_of([SHARED, share("c", "a lot", "p")]).node("n1").held
    assert device.whole


def test_an_unreadable_device_is_advertised_as_unknown() -> None:
    ledger = ledger_of([resource_slice("n1", [gpu(0, attributes={"numa": {}}), gpu(1)])])
    assert [(s.ref.device, bool(s.unknown)) for s in ledger.node("n1").devices] == [
        ("gpu-0", True),
        ("gpu-1", False),
    ]


HOSTILE: list[tuple[Callable[[Any], Any], Any]] = [
    (decode_slice, None),
    (decode_slice, []),
    (decode_slice, {"metadata": {"name": "s"}, "spec": "nope"}),
    (decode_slice, {"metadata": {"name": "s"}, "spec": {"devices": ["x", 1, None]}}),
    (decode_slice, {"metadata": {"name": "s"}, "spec": {
        "driver": DRIVER, "pool": {"name": 5, "generation": "1"},
        "devices": [{"name": "d", "attributes": [], "capacity": {"memory": 5}, "taints": "t"}]}}),
    (decode_slice, {"metadata": {"name": "s"}, "spec": {"driver": DRIVER, "devices": [
        {"name": "d", "attributes": {"uuid": "GPU-x"}, "capacity": {"memory": {"value": "1e999"}}}
    ]}}),
    (decode_slice, {"apiVersion": 7, "metadata": {"name": "s"}}),
    (decode_slice, {"metadata": {"name": "s"}, "spec": {"driver": DRIVER, "devices": [
        {"name": "d", "attributes": {1: {"int": 1}}, "capacity": {2: {"value": "1"}}}]}}),
    (decode_claim, {"metadata": {"name": "c"}, "status": {"allocation": {"devices": {"results": [
        {"driver": DRIVER, "pool": "p", "device": "d", "consumedCapacity": {3: "1"}}]}}}}),
    (decode_claim, {"metadata": {"name": "c"}, "status": {"allocation": []}}),
    (decode_claim, {"metadata": {"name": "c"}, "status": {
        "allocation": {"devices": {"results": [{"driver": 1}, "x", {
            "driver": DRIVER, "pool": "p", "device": "d", "consumedCapacity": {"memory": {}}}]},
            "nodeSelector": {"nodeSelectorTerms": "x"}},
        "reservedFor": [1, {"resource": "pods"}]}}),
    (decode_claim, {"metadata": {"name": "c"}, "status": {"allocation": {"devices": {
        "results": [{"driver": DRIVER, "pool": "p", "device": "d", "shareID": 5}] * 40}}}}),
    (decode_pod_claims, {"metadata": {"uid": "u"}, "spec": {"resourceClaims": "x"},
                         "status": {"extendedResourceClaimStatus": []}}),
    (decode_device_class, {"metadata": {"name": "g"}, "spec": {"selectors": [{"cel": "x"}] * 40}}),
    (decode_taint_rule, {"metadata": {"name": "r"}, "spec": {"deviceSelector": [], "taint": 1}}),
]  # fmt: skip


@pytest.mark.parametrize(("decode", "obj"), HOSTILE, ids=[str(i) for i in range(len(HOSTILE))])
def test_decoders_never_raise(decode: Callable[[Any], Any], obj: Any) -> None:
    decoded = decode(obj)
    ledger = ClaimsLedger()
    if decoded is not None and decode is decode_slice:
        ledger.upsert_slice(decoded)
    if decoded is not None and decode is decode_claim:
        ledger.upsert_claim(decoded)
    ledger.problems()


def test_more_than_the_api_allows_is_cut_and_said() -> None:
    piece = decode_slice(resource_slice("n1", [gpu(i) for i in range(130)]))
    assert piece is not None
    assert len(piece.devices) == 128
    assert piece.problem == "only the first 128 of 130 devices read"
    results = [result("n1", f"gpu-{i}") for i in range(33)]
    found = decode_claim(resource_claim("c", results=results))
    assert found is not None
    assert (len(found.results), found.problem) == (32, "only the first 32 of 33 results read")


TAINTS: dict[str, str] = {"key": f"{DRIVER}/xid", "value": "79"}
TAINT_CASES = [
    # (id, steps, unhealthy devices of n1 and why)
    ("a NoSchedule taint in the slice",
     [resource_slice("n1", [gpu(0), gpu(1, taints=[{**TAINTS, "effect": "NoSchedule"}])])],
     {"gpu-1": f"{DRIVER}/xid=79:NoSchedule (in its ResourceSlice)"}),
    ("a NoExecute taint in the slice",
     [resource_slice("n1", [gpu(0, taints=[{"key": f"{DRIVER}/gpu-lost",
                                            "effect": "NoExecute"}])])],
     {"gpu-0": f"{DRIVER}/gpu-lost:NoExecute (in its ResourceSlice)"}),
    ("an informational taint (None) leaves it healthy",
     [resource_slice("n1", [gpu(0, taints=[{"key": f"{DRIVER}/unmonitored",
                                            "effect": "None"}])])], {}),
    ("an effect this version does not know is informational",
     [resource_slice("n1", [gpu(0, taints=[{**TAINTS, "effect": "NoExecuteWithPDB"}])])], {}),
    ("a DeviceTaintRule naming the device",
     [SLICE, taint_rule("r", selector={"driver": DRIVER, "pool": "n1", "device": "gpu-2"})],
     {"gpu-2": f"{DRIVER}/xid=79:NoSchedule (DeviceTaintRule r)"}),
    ("a DeviceTaintRule naming the pool taints all of it",
     [SLICE, taint_rule("r", selector={"pool": "n1"}, effect="NoExecute")],
     {f"gpu-{i}": "NoExecute (DeviceTaintRule r)" for i in range(4)}),
    ("an empty selector matches every device",
     [SLICE, taint_rule("r", selector={})], {f"gpu-{i}": "DeviceTaintRule r" for i in range(4)}),
    ("no selector matches no device", [SLICE, taint_rule("r", selector=None)], {}),
    ("a rule for another pool", [SLICE, taint_rule("r", selector={"pool": "n2"})], {}),
    ("a rule for another driver",
     [SLICE, taint_rule("r", selector={"driver": "x.example.com"})], {}),
    ("a rule with the None effect", [SLICE, taint_rule("r", selector={}, effect="None")], {}),
    ("a rule deleted", [SLICE, taint_rule("r", selector={}), Delete("DeviceTaintRule", "r")], {}),
    ("a rule seen before the slice",
     [taint_rule("r", selector={"device": "gpu-3"}), SLICE], {"gpu-3": "DeviceTaintRule r"}),
    ("a rule changed to another device",
     [SLICE, taint_rule("r", selector={"device": "gpu-3"}),
      taint_rule("r", selector={"device": "gpu-1"})], {"gpu-1": "DeviceTaintRule r"}),
    ("a v1 DeviceTaintRule reads the same",
     [SLICE, taint_rule("r", selector={"device": "gpu-0"}, api_version="resource.k8s.io/v1")],
     {"gpu-0": "DeviceTaintRule r"}),
    ("both: the slice's taint and a rule's",
     [resource_slice("n1", [gpu(0, taints=[{**TAINTS, "effect": "NoSchedule"}])]),
      taint_rule("r", selector={"device": "gpu-0"}, key="example.com/maintenance", value="")],
     {"gpu-0": f"{DRIVER}/xid=79:NoSchedule (in its ResourceSlice); "
               "example.com/maintenance:NoSchedule (DeviceTaintRule r)"}),
]  # fmt: skip


@pytest.mark.parametrize(
    ("name", "steps", "unhealthy"), TAINT_CASES, ids=[c[0] for c in TAINT_CASES]
)
def test_tainted_devices_are_unhealthy(
    name: str, steps: list[Step], unhealthy: dict[str, str]
) -> None:
    found = {s.ref.device: s.unhealthy for s in ledger_of(steps).node("n1").unhealthy}
    assert found.keys() == unhealthy.keys()
    for device, why in unhealthy.items():
        assert why in found[device]


OWNERSHIP_CASES = [
    # (id, steps, the node's device-plugin GPUs, owner)
    ("no slices: the device plugin's", [], 8, Ownership.DEVICE_PLUGIN),
    ("no slices and no device-plugin GPUs", [], 0, Ownership.DEVICE_PLUGIN),
    ("a GPU driver's slices only: DRA's", [SLICE], 0, Ownership.DRA),
    ("a GPU driver's slices and nvidia.com/gpu: mixed", [SLICE], 8, Ownership.MIXED),
    ("a slice of another driver is not a GPU driver's",
     [resource_slice("n1", [gpu(0)], driver="nic.example.com")], 0, Ownership.DEVICE_PLUGIN),
    ("a GPU driver's slice with no devices yet", [resource_slice("n1", [])], 0, Ownership.DRA),
    ("the slices deleted", [SLICE, Delete("ResourceSlice", SLICE["metadata"]["name"])], 8,
     Ownership.DEVICE_PLUGIN),
]  # fmt: skip


@pytest.mark.parametrize(
    ("name", "steps", "plugin_gpus", "owner"), OWNERSHIP_CASES, ids=[c[0] for c in OWNERSHIP_CASES]
)
def test_who_owns_a_nodes_gpus(
    name: str, steps: list[Step], plugin_gpus: int, owner: Ownership
) -> None:
    assert ownership(ledger_of(steps).node("n1"), plugin_gpus) is owner


def test_the_gpu_drivers_are_configured() -> None:
    steps: list[Step] = [
        resource_slice("n1", [gpu(0)], driver="gpu.example.com"),
        resource_claim("c", results=[result("n1", "gpu-0", driver="gpu.example.com")]),
    ]
    assert ownership(ledger_of(steps).node("n1"), 0) is Ownership.DEVICE_PLUGIN
    ledger = ledger_of(steps, gpu_drivers=["gpu.example.com"])
    assert (ownership(ledger.node("n1"), 0), list(held(ledger))) == (Ownership.DRA, ["gpu-0"])


AGENT = tuple(gpu_uuid("n1", i) for i in range(4))
MIG_SLICE = resource_slice("n1", [gpu(0), mig("mig-1-0", uuid="MIG-a", parent_uuid=AGENT[1])])
MAPPING_CASES = [
    # (id, steps, the agent's UUIDs by index, mapped (index, device, via parent), unmapped)
    ("whole GPUs by UUID", [SLICE, claim("c", "gpu-2", "gpu-0")], AGENT,
     [(0, "gpu-0", False), (2, "gpu-2", False)], []),
    ("NVML's order is the agent's, not the device names'", [SLICE, claim("c", "gpu-0")],
     tuple(reversed(AGENT)), [(3, "gpu-0", False)], []),
    ("a MIG device maps to its GPU", [MIG_SLICE, claim("c", "mig-1-0")], AGENT,
     [(1, "mig-1-0", True)], []),
    ("a UUID the agent does not list", [SLICE, claim("c", "gpu-0")], ("GPU-other",), [],
     [("gpu-0", f"UUID {AGENT[0]} is none of the node agent's GPUs")]),
    ("no UUIDs from the agent", [SLICE, claim("c", "gpu-0")], (), [],
     [("gpu-0", "the node agent publishes no GPU UUIDs")]),
    ("an unknown device", [SLICE, claim("c", "gpu-1", "gpu-7", node="n1")], AGENT,
     [(1, "gpu-1", False)], [("gpu-7", "is in no ResourceSlice")]),
]  # fmt: skip


@pytest.mark.parametrize(
    ("name", "steps", "uuids", "mapped", "unmapped"),
    MAPPING_CASES,
    ids=[c[0] for c in MAPPING_CASES],
)
def test_held_devices_as_gpu_indices(
    name: str,
    steps: list[Step],
    uuids: tuple[str, ...],
    mapped: list[tuple[int, str, bool]],
    unmapped: list[tuple[str, str]],
) -> None:
    mapping = held_gpus(ledger_of(steps).node("n1"), uuids)
    assert [(m.gpu, m.held.ref.device, m.via_parent) for m in mapping.mapped] == mapped
    assert [u.held.ref.device for u in mapping.unmapped] == [device for device, _ in unmapped]
    for found, (_, why) in zip(mapping.unmapped, unmapped, strict=True):
        assert why in found.why
    assert mapping.indices == tuple(sorted({index for index, _, _ in mapped}))


CLASS_CASES = [
    # (id, classes, resource asked, the class that serves it)
    ("the class naming the resource", [device_class("gpu", extended_resource="nvidia.com/gpu")],
     "nvidia.com/gpu", "gpu"),
    ("no class names it", [device_class("gpu")], "nvidia.com/gpu", None),
    ("the implicit name", [device_class("gpu")], "deviceclass.resource.kubernetes.io/gpu", "gpu"),
    ("two classes: the newer serves",
     [device_class("b", extended_resource="nvidia.com/gpu", created="2026-01-02T00:00:00Z"),
      device_class("a", extended_resource="nvidia.com/gpu", created="2026-01-01T00:00:00Z")],
     "nvidia.com/gpu", "b"),
    ("created together: the name sorted first",
     [device_class("b", extended_resource="nvidia.com/gpu"),
      device_class("a", extended_resource="nvidia.com/gpu")], "nvidia.com/gpu", "a"),
    ("a class deleted",
     [device_class("gpu", extended_resource="nvidia.com/gpu"), Delete("DeviceClass", "gpu")],
     "nvidia.com/gpu", None),
]  # fmt: skip


@pytest.mark.parametrize(
    ("name", "steps", "resource", "expected"), CLASS_CASES, ids=[c[0] for c in CLASS_CASES]
)
def test_which_class_serves_an_extended_resource(
    name: str, steps: list[Step], resource: str, expected: str | None
) -> None:
    found = ledger_of(steps).classes.serving(resource)
    assert (found.name if found else None) == expected


SELECTS = 'device.attributes["gpu.nvidia.com"].type == "gpu"'
DRIVER_CASES = [
    ("device.driver == 'gpu.nvidia.com'", ("gpu.nvidia.com",)),
    (f'"gpu.nvidia.com" == device.driver && {SELECTS}', ("gpu.nvidia.com",)),
    ("device.driver == 'a.example.com' || device.driver == 'b.example.com'",
     ("a.example.com", "b.example.com")),
    (SELECTS, ()),
]  # fmt: skip


@pytest.mark.parametrize(("expression", "drivers"), DRIVER_CASES)
def test_the_drivers_a_class_selects(expression: str, drivers: tuple[str, ...]) -> None:
    obj = device_class("gpu", driver=None)
    obj["spec"]["selectors"] = [{"cel": {"expression": expression}}]
    found = decode_device_class(obj)
    assert found is not None
    assert found.drivers == drivers


@pytest.mark.parametrize(
    ("attributes", "uuid", "pcie_root"),
    [
        ({}, gpu_uuid("n1", 0), "pci0000:00"),
        ({"uuid": None, f"{DRIVER}/uuid": {"string": "GPU-q"}}, "GPU-q", "pci0000:00"),
        ({"resource.kubernetes.io/pcieRoot": None, "pcieRoot": {"string": "pci0000:7f"}},
         gpu_uuid("n1", 0), "pci0000:7f"),
        ({"resource.kubernetes.io/pcieRoot": None}, gpu_uuid("n1", 0), ""),
    ],
    ids=["bare names", "qualified uuid", "pcieRoot in the driver's domain", "no pcieRoot"],
)  # fmt: skip
def test_attribute_names_bare_or_qualified(
    attributes: dict[str, Any], uuid: str, pcie_root: str
) -> None:
    piece = decode_slice(resource_slice("n1", [gpu(0, attributes=attributes)]))
    assert piece is not None
    [device] = piece.devices
    assert (device.uuid, device.pcie_root, device.problem) == (uuid, pcie_root, "")


SCENARIO: list[Step] = [
    resource_slice("n1", [gpu(0, shared=True), gpu(1)]),
    share("c1", "20Gi", "a"),
    claim("c2", "gpu-1", "gpu-5", node="n1"),
    dra_pod("p", claims={"gpu": "c2"}),
    taint_rule("r", selector={"device": "gpu-1"}),
]


def test_the_same_objects_in_any_order_give_the_same_node() -> None:
    expected = ledger_of(SCENARIO).node("n1")
    assert len(expected.held) == 3
    assert len(expected.unhealthy) == 1
    for order in itertools.permutations(SCENARIO):
        assert ledger_of(list(order)).node("n1") == expected


def test_events_undone_leave_nothing() -> None:
    ledger = ledger_of(SCENARIO)
    undo = [
        Delete("ResourceSlice", "n1-gpu.nvidia.com-1"),
        Delete("ResourceClaim", "default/c1"),
        Delete("ResourceClaim", "default/c2"),
        Delete("Pod", "p"),
        Delete("DeviceTaintRule", "r"),
    ]
    random.Random(7).shuffle(undo)
    for step in undo:
        feed(ledger, step)
    assert (len(ledger), ledger.node_names(), ledger.problems()) == (0, (), ())


@dataclass
class Write:
    name: str
    before: list[Step]
    step: Step
    rebuilt: tuple[str, ...]


TWO_NODES = [SLICE, resource_slice("n2", [gpu(0, node="n2")]), claim("c", "gpu-0")]
WRITES = [
    Write("a slice rebuilds its node", [], SLICE, ("n1",)),
    Write("a claim rebuilds the node of its devices", TWO_NODES,
          resource_claim("d", results=[result("n2", "gpu-0")]), ("n2",)),
    Write("a pod rebuilds the nodes of its claims", TWO_NODES,
          dra_pod("p", claims={"gpu": "c"}), ("n1",)),
    Write("a rule rebuilds the nodes of the devices it selects", TWO_NODES,
          taint_rule("r", selector={"pool": "n2"}), ("n2",)),
    Write("a device class rebuilds nothing", TWO_NODES, device_class("gpu"), ()),
    Write("a claim moved to another node rebuilds both", TWO_NODES,
          resource_claim("c", results=[result("n2", "gpu-0")]), ("n1", "n2")),
]  # fmt: skip


@pytest.mark.parametrize("write", WRITES, ids=[w.name for w in WRITES])
def test_a_write_rebuilds_only_the_nodes_it_touches(write: Write) -> None:
    ledger = ledger_of(write.before)
    untouched = {name: ledger.node(name) for name in ledger.node_names()}
    assert feed(ledger, write.step) == write.rebuilt
    for name, summary in untouched.items():
        assert (ledger.node(name) is summary) == (name not in write.rebuilt)


def test_a_read_is_the_value_kept() -> None:
    ledger = ledger_of(SCENARIO)
    assert ledger.node("n1") is ledger.node("n1")
    assert ledger.node("elsewhere").held == ()


def test_the_book_is_bounded_and_says_what_it_refused() -> None:
    ledger = ledger_of([SLICE, claim("c1", "gpu-0"), claim("c2", "gpu-1")], capacity=1)
    assert list(held(ledger)) == ["gpu-0"]
    [refused] = [p for p in ledger.problems() if p.key == "default/c2"]
    assert refused.reason == "refused: the book holds 1 of its kind"
    feed(ledger, claim("c1", "gpu-2"))  # an update of a kept claim is never refused
    assert list(held(ledger)) == ["gpu-2"]
    feed(ledger, Delete("ResourceClaim", "default/c1"))
    feed(ledger, claim("c2", "gpu-1"))  # room again: kept, and no longer reported
    assert (list(held(ledger)), ledger.problems()) == (["gpu-1"], ())
    with pytest.raises(ValueError, match="capacity"):
        ClaimsLedger(capacity=0)
