"""What one measurement sends: the scenarios, their clusters and pods, and the node orders of
filter's requests, the same for every tree; and the names of the trees and verbs measured."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import orjson

from loadtests import dra_payloads, payloads

THIS, BASELINE = "this", "baseline"
WHOLE, SHARES, QUOTAS = "whole", "shares", "quotas"
CLAIM, DRA, DRA_CLAIM = "claim", "dra", "dra-claim"
SCENARIOS = (WHOLE, SHARES, QUOTAS, CLAIM, DRA, DRA_CLAIM)
# The scenarios with Dynamic Resource Allocation's objects: served from a stand-in API
# server's list+watch (a snapshot holds no resource.k8s.io objects), and so is every other
# scenario of a run that has one of them, on equal terms.
DRA_SCENARIOS = frozenset({CLAIM, DRA, DRA_CLAIM})
# Half the nodes DRA's, over the same pod on the cluster without DRA.
DRA_PAIRS = {DRA: WHOLE, DRA_CLAIM: CLAIM}
VERBS = ("constant", "filter", "prioritize")
CORE_VERBS = ("filter", "prioritize")
VARIANTS = 8  # distinct node orders, cycled (kube-scheduler's order varies per cycle)
PODS = {
    "h100": payloads.make_pod("bench-pod", gpus=2, model="H100", uid="bench-pod-uid"),
    "any": payloads.make_pod("bench-pod", gpus=2, model=None, uid="bench-pod-uid"),
}
SHARE_POD = payloads.make_share_pod("bench-pod", uid="bench-pod-uid")
Row = dict[str, Any]
Arm = tuple[str, str]  # (tree, scenario): one server, one core process


@dataclass(frozen=True, slots=True)
class Workload:
    """One scenario at one size: the cluster, the pod under test, and the node orders of its
    filter requests (the same for every tree)."""

    scenario: str
    cluster: dict[str, Any]
    pod: dict[str, Any]
    orders: list[list[str]]

    @property
    def dra(self) -> bool:
        """Whether the scenario has DRA's objects (ResourceSlices, ResourceClaims, a
        DeviceClass)."""
        return self.scenario in DRA_SCENARIOS

    @classmethod
    def build(cls, scenario: str, size: int, pod: dict[str, Any]) -> Workload:
        """``pod``: the whole-GPU pod (``--pod``); the claim scenarios' pod asks for the
        same GPUs through a claim instead."""
        if scenario == SHARES:
            cluster, pod = payloads.make_share_cluster(size), SHARE_POD
        elif scenario == QUOTAS:
            cluster = payloads.make_quota_cluster(size)
        elif scenario == DRA:
            cluster = dra_payloads.make_dra_cluster(size)
        elif scenario in (CLAIM, DRA_CLAIM):
            model = dra_payloads.pod_model(pod)
            pod = dra_payloads.make_claim_pod("bench-pod", uid="bench-pod-uid")
            plain = scenario == CLAIM
            cluster = payloads.make_cluster(size) if plain else dra_payloads.make_dra_cluster(size)
            cluster = dra_payloads.with_claim(cluster, pod, model=model)
        else:
            cluster = payloads.make_cluster(size)
        names = [i["metadata"]["name"] for i in cluster["items"] if i["kind"] == "Node"]
        rng = random.Random(size)
        orders = [rng.sample(names, len(names)) for _ in range(VARIANTS)]
        return cls(scenario, cluster, pod, orders)

    def filter_bodies(self) -> list[bytes]:
        return [orjson.dumps({"Pod": self.pod, "Nodes": None, "NodeNames": o}) for o in self.orders]
