"""Freed capacity wakes the pod that waits for it, against the real kube-scheduler.

kube-scheduler retries a pod an extender turned away on the next cluster event it sees: the
deletion of a pod holding what it waits for is one. It sees that deletion on its own watch
and retries within milliseconds, often before schedext's watch has given the capacity back;
schedext then turns the retry away, and nothing else wakes the pod before kube-scheduler's
five-minute flush of unschedulable pods. schedext sends such a pod back itself (the
``schedext.io/requeued-at`` nudge) once its own watch sees the capacity freed.

Each test runs one waiting pod against one deletion, twenty times in a row: the pod turned
away (the watch shows it Unschedulable), a pod holding what it waits for deleted, and the
waiting pod placed within five seconds of the deletion, as the test's own watch shows it.
The placed pod is the holder deleted in the next round. The delays are logged
(``--log-cli-level=INFO`` shows them).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import pytest

from extender import names
from testbed.manifests import pod_manifest
from tests.e2e.conftest import Cluster
from tests.e2e.podwatch import PodWatch
from tests.e2e.test_gpu_shares import GIB, share_node, share_pod
from tests.e2e.test_preemption import seen_bound
from tests.e2e.test_scheduling import H100
from tests.mig_builders import mig_topology, mig_uuid

RUNS = 20
WITHIN_S = 5.0  # from the holder's deletion to the waiting pod's placement
TURNED_AWAY_S = 30.0  # a new waiting pod's first scheduling attempt
PROFILE = "1g.10gb"
MIG_RESOURCE = names.MIG_RESOURCE_PREFIX + PROFILE

log = logging.getLogger("tests.e2e.wakeups")


def rounds(
    cluster: Cluster, *, first_holder: str, waiter: Callable[[str], None], what: str
) -> list[float]:
    """:data:`RUNS` rounds of: ``waiter(name)`` creates a pod that waits, the holder is
    deleted, the waiting pod must be placed within :data:`WITHIN_S`. The delays, in seconds."""
    delays: list[float] = []
    holder = first_holder
    with PodWatch(cluster.cp, cluster.namespace) as watch:
        for run in range(RUNS):
            name = f"waiting-{run:02d}"
            waiter(name)
            watch.wait(
                lambda name=name: watch.unschedulable_at(name),
                timeout=TURNED_AWAY_S,
                message=f"run {run}: {name} was not turned away while {holder} held {what}",
            )
            assert watch.bound_at(name) is None, f"run {run}: {name} placed with no room made"
            cluster.api.delete_pod(cluster.namespace, holder)
            gone = watch.wait(
                lambda holder=holder: watch.deleted_at(holder),
                timeout=10,
                message=f"run {run}: {holder} not seen deleted",
            )
            try:
                placed = watch.wait(
                    lambda name=name: watch.bound_at(name),
                    timeout=WITHIN_S - (time.monotonic() - gone),
                    message=f"run {run}: {name}, waiting for {what}, not placed",
                )
            except AssertionError as error:
                raise AssertionError(
                    f"{error} within {WITHIN_S:g}s of {holder}'s deletion; the runs before "
                    f"took {fmt(delays)}; {cluster.api.events_for(cluster.namespace, name)[-3:]}"
                ) from None
            delays.append(placed - gone)
            holder = name
    log.info("%s: %d of %d placed within %gs; %s", what, len(delays), RUNS, WITHIN_S, fmt(delays))
    return delays


def fmt(delays: list[float]) -> str:
    if not delays:
        return "no run before"
    shown = ", ".join(f"{d:.2f}" for d in delays)
    return f"delays {shown} s (worst {max(delays):.2f} s)"


# ---------------------------------------------------------------------------- scenarios
# Each sets up a node full for one more pod of its kind and returns (the first holder to
# delete, what makes a waiting pod, what it waits for).

Scenario = tuple[str, Callable[[str], None], str]


def shares_full_per_device(cluster: Cluster) -> Scenario:
    """A 4 x 80 GiB node whose every device holds two 30 GiB shares: 80 GiB of share memory
    free on the node in sum, so kube-scheduler's own filters let a 40 GiB share through, and
    20 GiB on each device, so schedext turns it away (no GPU with 40 GiB free)."""
    share_node(cluster, "s1")
    held = [f"base-{gpu}-{k}" for gpu in range(4) for k in range(2)]
    for name in held:
        share_pod(cluster, name, mib=30 * GIB, node="s1", gpu=int(name.split("-")[1]))
    seen_bound(cluster, *held)
    return "base-0-0", lambda name: share_pod(cluster, name, mib=40 * GIB), "share memory"


def whole_gpus_taken_by_shares(cluster: Cluster) -> Scenario:
    """A 4-GPU node with a 10 GiB share on each device: kube-scheduler's own filters see four
    whole GPUs free, schedext none (a device holding a share is not free whole). The first
    deletion frees a device of its share; the later ones free the whole GPU the previous
    waiting pod took."""
    share_node(cluster, "g1")
    held = [f"base-{gpu}" for gpu in range(4)]
    for gpu, name in enumerate(held):
        share_pod(cluster, name, mib=10 * GIB, node="g1", gpu=gpu)
    seen_bound(cluster, *held)
    return "base-0", lambda name: cluster.pod(name, gpus=1), "a whole GPU"


def mig_devices_taken(cluster: Cluster, *, counted_unhealthy: bool = False) -> Scenario:
    """One H100 in MIG mode cut into seven 1g.10gb MIG devices, each held by a pod: the
    node's allocatable counts them all, so kube-scheduler's own filters turn a waiting pod
    away first. With ``counted_unhealthy``, a second H100 in MIG mode has one more, on a GPU
    the node agent found unhealthy, which the kubelet still counts (it updates allocatable
    on its own schedule): kube-scheduler's filters see a MIG device free, schedext none."""
    mig_node(cluster, "m1", devices=7, counted_unhealthy=counted_unhealthy)
    held = [f"base-{device}" for device in range(7)]
    for device, name in enumerate(held):
        mig_pod(cluster, name, node="m1", device=device)
    seen_bound(cluster, *held)
    return "base-0", lambda name: mig_pod(cluster, name), "a 1g.10gb MIG device"


def mig_node(cluster: Cluster, name: str, *, devices: int, counted_unhealthy: bool) -> None:
    """One H100 in MIG mode cut into ``devices`` 1g.10gb MIG devices, as the node agent
    publishes it (NVIDIA's mixed strategy: no whole GPU in allocatable); with
    ``counted_unhealthy``, a second, unhealthy one with one more that allocatable counts."""
    migs, unhealthy = {0: [PROFILE] * devices}, {}
    if counted_unhealthy:
        migs[1], unhealthy[1] = [PROFILE], "XID 79: GPU fell off the bus"
    topology = mig_topology(name, migs, len(migs), unhealthy=unhealthy)
    cluster.api.create_node(
        name,
        cpu="32",
        memory="256Gi",
        labels={names.GPU_PRODUCT_LABEL: H100, names.GPU_MEMORY_LABEL: str(80 * GIB)},
        annotations={names.GPU_TOPOLOGY: topology},
        extended={MIG_RESOURCE: str(sum(map(len, migs.values())))},
    )


def mig_pod(cluster: Cluster, name: str, *, node: str | None = None, device: int = 0) -> None:
    """A pod asking for one 1g.10gb MIG device (and schedext.io/managed, which sends it to
    schedext: the shipped configuration names no MIG profile); with ``node``, created bound
    there holding MIG device ``device``, as schedext's bind writes it."""
    asked = {MIG_RESOURCE: "1", "schedext.io/managed": "1"}
    annotations = None if node is None else {names.MIG_UUIDS: mig_uuid(node, 0, device)}
    manifest = pod_manifest(
        name, requests={"cpu": "100m", "memory": "64Mi", **asked}, limits=asked,
        annotations=annotations,
    )  # fmt: skip
    if node is not None:
        manifest["spec"]["nodeName"] = node
    cluster.api.create_pod(cluster.namespace, manifest)


# -------------------------------------------------------------------------------- tests


def test_a_pod_waiting_for_share_memory_is_placed_within_seconds_of_a_share_deleted(
    cluster: Cluster,
) -> None:
    first, waiter, what = shares_full_per_device(cluster)
    assert len(rounds(cluster, first_holder=first, waiter=waiter, what=what)) == RUNS


def test_a_pod_waiting_for_a_whole_gpu_is_placed_within_seconds_of_its_holder_deleted(
    cluster: Cluster,
) -> None:
    first, waiter, what = whole_gpus_taken_by_shares(cluster)
    assert len(rounds(cluster, first_holder=first, waiter=waiter, what=what)) == RUNS


def test_a_pod_waiting_for_a_mig_device_is_placed_within_seconds_of_its_holder_deleted(
    cluster: Cluster,
) -> None:
    """Where kube-scheduler's own filters turn the waiting pod away first (every MIG device
    counted), its retry after a deletion comes a few milliseconds later than where only
    schedext turns it away, and on an idle machine schedext's watch is usually ahead of it:
    that case is the lagging test's. Here kube-scheduler counts a MIG device more than
    schedext (one on an unhealthy GPU), so only schedext turns the pod away, as for shares."""
    first, waiter, what = mig_devices_taken(cluster, counted_unhealthy=True)
    assert len(rounds(cluster, first_holder=first, waiter=waiter, what=what)) == RUNS


@pytest.mark.parametrize("scenario", [shares_full_per_device, mig_devices_taken],
                         ids=["share-memory", "mig-device"])  # fmt: skip
def test_a_waiting_pod_is_placed_within_seconds_when_schedexts_watch_lags(
    lagging: Cluster, scenario: Callable[[Cluster], Scenario]
) -> None:
    """schedext hears of each deletion a second after kube-scheduler, which retries the
    waiting pod at once: schedext turns that retry away on every run, and only its own nudge,
    once its watch shows the deletion, brings the pod back."""
    first, waiter, what = scenario(lagging)
    what += ", schedext's watch a second late"
    assert len(rounds(lagging, first_holder=first, waiter=waiter, what=what)) == RUNS
