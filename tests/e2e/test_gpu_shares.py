"""GPU shares against the real kube-scheduler and kube-apiserver.

Share nodes advertise what the node agent advertises: `schedext.io/gpu-memory` (MiB) and
`schedext.io/gpu-cores` (percent) summed over their GPUs, and `schedext.io/gpu-shares` (the
device plugin's count). manifests/scheduler-config.yaml manages them with
`ignoredByScheduler: false`, so kube-scheduler's in-tree NodeResourcesFit counts them node by
node (and in-tree preemption finds victims when they run out), while schedext places each
share on one device. Bind's annotations (`schedext.io/gpu-ids`,
`schedext.io/gpu-share-memory-mib`) are the record read back here: no device may hold more
than its memory, whatever happens to schedext meanwhile.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from extender import names
from testbed.manifests import pod_manifest
from tests.e2e.conftest import Cluster, eventually
from tests.e2e.test_preemption import pods, seen_bound
from tests.e2e.test_scheduling import H100

GIB = 1024
DEVICE_MIB = 80 * GIB  # each GPU's memory, as the nvidia.com/gpu.memory label says
SHARES_PER_GPU = 32  # the count the agent's device plugin advertises per device

Device = tuple[str, int]  # (node, GPU index)


def share_node(cluster: Cluster, name: str, *, gpus: int = 4) -> None:
    """A node of ``gpus`` 80 GiB GPUs, advertising shares as the node agent does."""
    cluster.api.create_node(
        name,
        cpu="32",
        memory="256Gi",
        gpus=gpus,
        labels={names.GPU_PRODUCT_LABEL: H100, names.GPU_MEMORY_LABEL: str(DEVICE_MIB)},
        extended={
            names.SHARE_MEMORY_RESOURCE: str(gpus * DEVICE_MIB),
            names.SHARE_CORES_RESOURCE: str(gpus * 100),
            names.SHARE_COUNT_RESOURCE: str(gpus * SHARES_PER_GPU),
        },
    )


def share_pod(
    cluster: Cluster,
    name: str,
    *,
    mib: int,
    priority_class: str | None = None,
    node: str | None = None,
    gpu: int | None = None,
) -> None:
    """A pod asking for ``mib`` MiB of one GPU. With ``node`` and ``gpu``, created bound there
    with the annotations schedext's bind writes (a pod that was running before)."""
    asked = {names.SHARE_MEMORY_RESOURCE: str(mib), names.SHARE_COUNT_RESOURCE: "1"}
    annotations = None
    if gpu is not None:
        annotations = {names.GPU_IDS: str(gpu), names.GPU_SHARE_MEMORY: str(mib)}
    manifest = pod_manifest(
        name,
        requests={"cpu": "100m", "memory": "64Mi", **asked},
        limits=asked,
        annotations=annotations,
        priority_class=priority_class,
    )
    if node is not None:
        manifest["spec"]["nodeName"] = node
    cluster.api.create_pod(cluster.namespace, manifest)


def placements(cluster: Cluster) -> dict[str, tuple[Device, int]]:
    """Each bound share pod's device and MiB, from its bind annotations. A share pod bound
    without them is a failure: nothing would then say which device it uses."""
    found: dict[str, tuple[Device, int]] = {}
    for pod in cluster.api.list_pods(cluster.namespace):
        node = pod["spec"].get("nodeName")
        requests: dict[str, Any] = pod["spec"]["containers"][0]["resources"].get("requests", {})
        if not node or names.SHARE_MEMORY_RESOURCE not in requests:
            continue
        name = pod["metadata"]["name"]
        annotations = pod["metadata"].get("annotations") or {}
        ids = annotations.get(names.GPU_IDS, "")
        mib = annotations.get(names.GPU_SHARE_MEMORY, "")
        assert ids.isdigit(), f"{name} bound without its one GPU index: {annotations}"
        assert mib.isdigit(), f"{name} bound without its share's memory: {annotations}"
        assert int(mib) == int(requests[names.SHARE_MEMORY_RESOURCE]), (name, annotations)
        found[name] = ((node, int(ids)), int(mib))
    return found


def device_use(cluster: Cluster) -> dict[Device, int]:
    """MiB held per device; asserts that none holds more than its memory."""
    use: Counter[Device] = Counter()
    for device, mib in placements(cluster).values():
        use[device] += mib
    over = {device: mib for device, mib in use.items() if mib > DEVICE_MIB}
    assert not over, f"devices over their {DEVICE_MIB} MiB: {over}"
    return dict(use)


def all_bound(cluster: Cluster, pod_names: list[str], timeout: float = 120) -> None:
    eventually(
        lambda: set(pod_names) <= set(cluster.bound_pods()),
        timeout=timeout,
        message=f"not all of {len(pod_names)} share pods are bound",
    )


def test_shares_pack_onto_the_fewest_devices_and_whole_gpus_stay_free(cluster: Cluster) -> None:
    share_node(cluster, "s1")
    share_node(cluster, "s2")
    # One at a time: prioritize judges a node as schedext holds it, and a pod whose bind is
    # still under way is not held yet (arrivals faster than binds may open a second device).
    shares = [f"share-{i:02d}" for i in range(12)]
    for name in shares:
        share_pod(cluster, name, mib=10 * GIB)
        cluster.wait_bound(name, timeout=60)
    use = device_use(cluster)
    # 120 GiB fit on two 80 GiB devices: one full (8 shares) and one with 4.
    per_device = Counter(device for device, _ in placements(cluster).values())
    assert sorted(per_device.values()) == [4, 8], per_device
    assert sorted(use.values()) == [40 * GIB, 80 * GIB]
    # A whole GPU is still there for a whole-GPU pod, on a device no share is on.
    cluster.pod("whole", gpus=1)
    node = cluster.wait_bound("whole", timeout=60)
    (index,) = cluster.gpu_ids("whole")
    assert (node, index) not in use, f"the whole GPU {index} on {node} holds shares"


def test_a_restarted_schedext_remembers_the_shares_and_overcommits_no_device(
    cluster: Cluster,
) -> None:
    share_node(cluster, "s1")
    # 20 GiB shares: four fill a device. A schedext that forgot the first ones after its
    # restart would put the later ones on a device it believes empty, past its memory.
    first = [f"before-{i}" for i in range(6)]
    for name in first:
        share_pod(cluster, name, mib=20 * GIB)
    eventually(
        lambda: len(cluster.bound_pods()) >= 3,
        timeout=60,
        message="no share pod bound before the restart",
    )
    cluster.schedext.stop(kill=True)  # mid-way: binds possibly in flight
    cluster.schedext.start()  # returns once /readyz says ready
    later = [f"after-{i}" for i in range(6)]
    for name in later:
        share_pod(cluster, name, mib=20 * GIB)
    all_bound(cluster, first + later)
    use = device_use(cluster)
    # Packed: bind puts each share on the fullest device with room, so 240 GiB fill three.
    assert sorted(use.values()) == [80 * GIB] * 3, use


def test_a_high_priority_share_evicts_the_fewest_shares_of_one_device(cluster: Cluster) -> None:
    """Every device is full of 10 GiB shares, so the node has no share memory left and
    kube-scheduler's own filters find the shortage. Its count-only pick is the four
    lowest-priority shares, one on each device: evicting them would leave 10 GiB free on each
    GPU and none with 40. schedext's preempt evicts four shares of one device instead."""
    share_node(cluster, "s1")
    holders: dict[str, int] = {}
    for gpu in range(4):
        for k in range(8):
            name = f"low-{gpu}-{k}"
            share_pod(cluster, name, mib=10 * GIB, priority_class="lowest" if k == 0 else "low",
                      node="s1", gpu=gpu)  # fmt: skip
            holders[name] = gpu
    seen_bound(cluster, *holders)
    share_pod(cluster, "urgent", mib=40 * GIB, priority_class="high")
    assert cluster.wait_bound("urgent", timeout=120) == "s1"
    evicted = set(holders) - pods(cluster)
    assert len(evicted) == 4, f"evicted {sorted(evicted)}"
    (freed,) = {holders[name] for name in evicted}  # all on one device
    assert cluster.gpu_ids("urgent") == [freed]
    use = device_use(cluster)
    assert use == {("s1", gpu): 80 * GIB for gpu in range(4)}
