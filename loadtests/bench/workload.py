"""What one measurement sends: the scenarios, their clusters and pods, and the node orders of
filter's requests, the same for every tree; and the names of the trees and verbs measured."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import orjson

from loadtests import payloads

THIS, BASELINE = "this", "baseline"
WHOLE, SHARES, QUOTAS = "whole", "shares", "quotas"
SCENARIOS = (WHOLE, SHARES, QUOTAS)
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

    @classmethod
    def build(cls, scenario: str, size: int, pod: dict[str, Any]) -> Workload:
        if scenario == SHARES:
            cluster, pod = payloads.make_share_cluster(size), SHARE_POD
        elif scenario == QUOTAS:
            cluster = payloads.make_quota_cluster(size)
        else:
            cluster = payloads.make_cluster(size)
        names = [i["metadata"]["name"] for i in cluster["items"] if i["kind"] == "Node"]
        rng = random.Random(size)
        orders = [rng.sample(names, len(names)) for _ in range(VARIANTS)]
        return cls(scenario, cluster, pod, orders)

    def filter_bodies(self) -> list[bytes]:
        return [orjson.dumps({"Pod": self.pod, "Nodes": None, "NodeNames": o}) for o in self.orders]
