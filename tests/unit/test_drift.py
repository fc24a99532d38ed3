"""Drift between the kubelet's PodResources and the agent's ledger (extender.devices.drift),
and its document on the Node (extender.devices.drift_document)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field

import pytest

from extender.devices import DocumentError
from extender.devices.allocation import AllocationError, NodePod, grant
from extender.devices.drift import (
    KUBELET_UID_PREFIX,
    SETTLE_S,
    Cause,
    Drift,
    DriftResources,
    InUse,
    KubeletDevices,
    StaleRecord,
    describe,
    find_drift,
    ledger_view,
)
from extender.devices.drift_document import (
    DRIFT_VERSION,
    MAX_IN_USE,
    decode_drift,
    encode_drift,
)
from extender.devices.gpus import Gpu

GPU = "nvidia.com/gpu"
SHARES = "schedext.io/gpu-shares"
MIG = "nvidia.com/mig-1g.10gb"
RESOURCES = DriftResources(gpu=GPU, share=SHARES)
GPUS = tuple(Gpu(index=i, uuid=f"GPU-{i}") for i in range(8))
NOW = 1_000_000.0
GRACE_S = 60.0


def uuid(index: int) -> str:
    return f"GPU-{index}"


@dataclass
class Listed:
    """A fluent builder of one pod's lines in the kubelet's List:
    ``listed("ghost").gpus(3).obj()``."""

    pod: str
    namespace: str = "ml"
    container: str = "main"
    entries: list[KubeletDevices] = field(default_factory=list)

    def devices(self, resource: str, *ids: str) -> Listed:
        self.entries.append(
            KubeletDevices(self.namespace, self.pod, self.container, resource, tuple(ids))
        )
        return self

    def gpus(self, *indices: int) -> Listed:
        return self.devices(GPU, *(uuid(i) for i in indices))

    def in_container(self, name: str) -> Listed:
        self.container = name
        return self

    def obj(self) -> list[KubeletDevices]:
        return self.entries or [KubeletDevices(self.namespace, self.pod, self.container, GPU, ())]


def listed(pod: str) -> Listed:
    return Listed(pod)


def placed(name: str, *ids: int, allocated: Sequence[int] | None = None) -> NodePod:
    """A pod schedext bound to GPU ``ids``, granted them (or ``allocated``)."""
    given = ids if allocated is None else allocated
    return NodePod(
        uid=f"uid-{name}",
        namespace="ml",
        name=name,
        gpus=len(ids),
        gpu_ids=tuple(ids),
        gpu_uuids=tuple(uuid(i) for i in ids),
        allocated=tuple(uuid(i) for i in given),
    )


def unplaced(name: str, *allocated: int) -> NodePod:
    """A pod schedext did not bind, given ``allocated`` by the agent's own pick."""
    return NodePod(
        uid=f"uid-{name}",
        namespace="ml",
        name=name,
        gpus=len(allocated),
        allocated=tuple(uuid(i) for i in allocated),
    )


def drift(
    kubelet: Sequence[Listed],
    pods: Sequence[NodePod],
    *,
    now: float = NOW,
    missing: dict[str, float] | None = None,
) -> Drift:
    lines = [line for pod in kubelet for line in pod.obj()]
    return find_drift(
        lines, pods, GPUS, resources=RESOURCES, now=now, grace_s=GRACE_S, missing=missing
    )


def causes(found: Drift) -> list[tuple[str, str, Cause]]:
    return [(use.uuid, use.pod, use.cause) for use in found.in_use]


# ------------------------------------------------------------------------------ in use

IN_USE_CASES = [
    pytest.param([listed("a").gpus(0, 1)], [placed("a", 0, 1)], [], id="placed-and-granted"),
    pytest.param(
        [listed("ghost").gpus(3)],
        [],
        [(uuid(3), "ml/ghost", Cause.UNKNOWN_POD)],
        id="a-gpu-held-by-a-pod-the-ledger-does-not-know",
    ),
    pytest.param(
        [listed("a").gpus(0, 5)],
        [placed("a", 0, 1)],
        [(uuid(5), "ml/a", Cause.NOT_GIVEN)],
        id="a-pod-holding-another-gpu-than-it-was-given",
    ),
    pytest.param(
        [listed("a").gpus(1)],
        [placed("a", 0, 1, allocated=[0])],
        [],
        id="the-gpu-chosen-for-it-not-yet-recorded-is-its-own",
    ),
    pytest.param(
        [listed("stray").gpus(6)],
        [unplaced("stray", 6)],
        [(uuid(6), "ml/stray", Cause.NOT_PLACED)],
        id="a-pod-schedext-did-not-place-holding-the-agents-pick",
    ),
    pytest.param(
        [listed("s").devices(SHARES, f"{uuid(2)}::5")],
        [placed("s", 2)],
        [],
        id="a-share-on-the-gpu-schedext-chose",
    ),
    pytest.param(
        [listed("s").devices(SHARES, f"{uuid(2)}::5", f"{uuid(2)}::6")],
        [],
        [(uuid(2), "ml/s", Cause.UNKNOWN_POD)],
        id="an-unknown-share-holds-its-gpu-once",
    ),
    pytest.param(
        [listed("m").devices(MIG, "MIG-a")],
        [],
        [("MIG-a", "ml/m", Cause.UNKNOWN_POD)],
        id="a-mig-device-of-an-unknown-pod",
    ),
    pytest.param(
        [listed("nic").devices("example.com/rdma", "mlx5_0")],
        [],
        [],
        id="resources-the-agent-does-not-serve-are-none-of-its-business",
    ),
    pytest.param(
        [listed("a").gpus(0), listed("a").in_container("sidecar").gpus(0)],
        [placed("a", 1)],
        [(uuid(0), "ml/a", Cause.NOT_GIVEN)],
        id="one-entry-per-gpu-and-pod-whatever-its-containers",
    ),
]


@pytest.mark.parametrize(("kubelet", "pods", "expected"), IN_USE_CASES)
def test_gpus_in_use_that_schedext_does_not_account_for(
    kubelet: list[Listed], pods: list[NodePod], expected: list[tuple[str, str, Cause]]
) -> None:
    assert causes(drift(kubelet, pods)) == expected


def test_a_mig_device_in_use_is_marked_as_one() -> None:
    (use,) = drift([listed("m").devices(MIG, "MIG-a")], []).in_use
    assert use.mig
    assert use.resource == MIG


def test_without_shares_the_handle_resource_is_not_read() -> None:
    lines = listed("s").devices(SHARES, f"{uuid(2)}::5").obj()
    found = find_drift(
        lines,
        [],
        GPUS,
        resources=DriftResources(gpu=GPU, share=None),
        now=NOW,
        grace_s=GRACE_S,
    )
    assert not found


def test_a_pod_schedext_bound_by_index_only_is_matched_through_the_node_gpus() -> None:
    pod = NodePod(uid="u", namespace="ml", name="old", gpus=1, gpu_ids=(4,))
    assert not drift([listed("old").gpus(4)], [pod])


# ------------------------------------------------------------------------------ stale

GONE = placed("gone", 2, 3)


def test_a_record_the_kubelet_does_not_list_is_not_reported_while_it_settles() -> None:
    first = drift([], [GONE])
    assert not first
    assert first.missing == {GONE.uid: NOW}


def test_a_record_missing_past_settling_is_reported_then_released_after_the_grace() -> None:
    missing = {GONE.uid: NOW}
    reported = drift([], [GONE], now=NOW + SETTLE_S, missing=missing)
    assert reported.stale == (StaleRecord("ml/gone", GONE.uid, (uuid(2), uuid(3)), NOW, False),)
    assert reported.released() == frozenset()
    released = drift([], [GONE], now=NOW + GRACE_S, missing=dict(reported.missing))
    assert released.stale[0].released
    assert released.released() == {GONE.uid}


def test_a_pod_listed_again_is_forgotten() -> None:
    again = drift([listed("gone").gpus(2, 3)], [GONE], now=NOW + 30, missing={GONE.uid: NOW})
    assert not again
    assert again.missing == {}


def test_a_pod_listed_without_devices_is_no_stale_record() -> None:
    # An init container's GPUs, or a pod still starting: the pod is there.
    assert not drift([listed("gone")], [GONE], now=NOW + GRACE_S, missing={GONE.uid: NOW})


def test_a_pod_without_a_record_is_nothing_to_release() -> None:
    waiting = NodePod(uid="w", namespace="ml", name="waiting", gpus=1, gpu_ids=(0,))
    found = drift([], [waiting], now=NOW + GRACE_S, missing={"w": NOW})
    assert not found
    assert found.missing == {}


# ---------------------------------------------------------------------- the ledger view


def test_the_ledger_view_drops_released_records_and_stands_in_for_unknown_pods() -> None:
    found = Drift(
        in_use=(
            InUse(uuid(3), "ml/ghost", "main", GPU, Cause.UNKNOWN_POD),
            InUse(uuid(5), "ml/a", "main", GPU, Cause.NOT_GIVEN),
        ),
        stale=(StaleRecord("ml/gone", GONE.uid, GONE.allocated, NOW, released=True),),
    )
    live = placed("a", 0)
    view = ledger_view([live, GONE], found)
    assert [p.uid for p in view] == [live.uid, KUBELET_UID_PREFIX + "ml/ghost"]
    stand_in = view[1]
    assert (stand_in.namespace, stand_in.name, stand_in.allocated) == ("ml", "ghost", (uuid(3),))


def test_a_share_an_unknown_pod_holds_leaves_its_gpu_to_other_shares() -> None:
    found = drift([listed("s").devices(SHARES, f"{uuid(2)}::5")], [])
    assert ledger_view([], found, whole=GPU) == ()
    mig = drift([listed("m").devices(MIG, "MIG-a")], [])
    assert [p.allocated for p in ledger_view([], mig, whole=GPU)] == [("MIG-a",)]


def test_the_agent_never_picks_a_gpu_the_kubelet_says_an_unknown_pod_holds() -> None:
    found = drift([listed("ghost").gpus(0)], [])
    newcomer = NodePod(uid="n", namespace="ml", name="new", gpus=1)
    granted = grant(ledger_view([newcomer], found), GPUS[:2], ((0, 1),), [uuid(0)])
    assert granted.uuids == (uuid(1),)


def test_a_released_record_frees_its_gpus_for_the_agents_own_pick() -> None:
    found = Drift(stale=(StaleRecord("ml/gone", GONE.uid, GONE.allocated, NOW, True),))
    busy = placed("a", 0, 1)
    newcomer = NodePod(uid="n", namespace="ml", name="new", gpus=2)
    pods = [busy, GONE, newcomer]
    with pytest.raises(AllocationError, match="0 are healthy and free"):
        grant(pods, GPUS[:4], ((0, 1), (2, 3)), [uuid(0), uuid(1)])
    granted = grant(ledger_view(pods, found), GPUS[:4], ((0, 1), (2, 3)), [uuid(0), uuid(1)])
    assert granted.uuids == (uuid(2), uuid(3))


# ---------------------------------------------------------------------------- sentences


def test_each_drift_entry_reads_as_a_sentence_naming_gpus_by_index() -> None:
    found = Drift(
        in_use=(
            InUse(uuid(3), "ml/ghost", "main", GPU, Cause.UNKNOWN_POD),
            InUse(uuid(5), "ml/a", "main", GPU, Cause.NOT_GIVEN),
            InUse("MIG-a", "ml/m", "c", MIG, Cause.UNKNOWN_POD, mig=True),
        ),
        stale=(StaleRecord("ml/gone", "u", (uuid(2), "GPU-elsewhere"), NOW, True),),
    )
    index_of = {uuid(i): i for i in range(8)}
    assert describe(found, index_of) == (
        "GPU 3 in use by a container schedext did not place (kubelet: ml/ghost/main)",
        "GPU 5 in use by ml/a/main, which was given other devices (kubelet: ml/a/main)",
        "MIG device MIG-a in use by a container schedext did not place (kubelet: ml/m/c)",
        "stale record: ml/gone holds GPUs 2, GPU-elsewhere but the kubelet no longer lists it "
        "(released)",
    )


# ----------------------------------------------------------------------------- document

FULL = Drift(
    in_use=(
        InUse(uuid(3), "ml/ghost", "main", GPU, Cause.UNKNOWN_POD),
        InUse("MIG-a", "ml/m", "c", MIG, Cause.NOT_GIVEN, mig=True),
    ),
    stale=(StaleRecord("ml/gone", "u-1", (uuid(2),), NOW, False),),
)


def test_the_document_reads_back_what_was_written() -> None:
    text = encode_drift(FULL)
    assert decode_drift(text) == FULL
    assert json.loads(text)["version"] == DRIFT_VERSION
    assert encode_drift(decode_drift(text)) == text


def test_the_document_is_canonical_and_leaves_the_reads_memory_out() -> None:
    remembered = Drift(in_use=FULL.in_use, stale=FULL.stale, missing={"x": 1.0})
    assert encode_drift(remembered) == encode_drift(FULL)
    assert '"mig":true' in encode_drift(FULL)
    assert encode_drift(Drift()) == '{"inUse":[],"stale":[],"version":1}'


def test_a_longer_drift_than_the_document_holds_is_cut_and_counted() -> None:
    many = Drift(
        in_use=tuple(InUse(f"GPU-{i:04}", "ml/p", "c", GPU, Cause.UNKNOWN_POD) for i in range(300))
    )
    document = json.loads(encode_drift(many))
    assert len(document["inUse"]) == MAX_IN_USE
    assert document["omitted"] == 300 - MAX_IN_USE
    assert len(decode_drift(encode_drift(many)).in_use) == MAX_IN_USE


def _document(**changes: object) -> str:
    document = json.loads(encode_drift(FULL))
    document.update(changes)
    return json.dumps(document)


def _entry(key: str, **changes: object) -> str:
    document = json.loads(encode_drift(FULL))
    document[key][0].update(changes)
    return json.dumps(document)


MALFORMED = [
    pytest.param("{not json", "not JSON", id="not-json"),
    pytest.param("[]", "not a JSON object", id="not-an-object"),
    pytest.param(_document(version=2), "version 2 is not supported", id="a-future-version"),
    pytest.param(_document(version="1"), "version is not an integer", id="a-string-version"),
    pytest.param(_document(version=True), "version is not an integer", id="a-boolean-version"),
    pytest.param(json.dumps({"inUse": []}), "version is not an integer", id="no-version"),
    pytest.param(_document(inUse={}), "inUse is not a list", id="in-use-not-a-list"),
    pytest.param(_document(stale=[1]), "stale entry is not an object", id="stale-not-objects"),
    pytest.param(_entry("inUse", cause="gremlins"), "cause 'gremlins'", id="an-unknown-cause"),
    pytest.param(_entry("inUse", uuid=""), "uuid", id="an-empty-uuid"),
    pytest.param(_entry("inUse", pod="ghost"), "is not namespace/name", id="a-pod-without-ns"),
    pytest.param(_entry("inUse", container=7), "container", id="a-container-not-text"),
    pytest.param(_entry("stale", since=-1), "since is not a time", id="a-negative-time"),
    pytest.param(_entry("stale", since="now"), "since is not a time", id="a-time-not-a-number"),
    pytest.param(_entry("stale", uuids="GPU-1"), "uuids is not a list", id="uuids-not-a-list"),
    pytest.param(_entry("stale", uuids=[3]), "uuids", id="a-uuid-not-text"),
    pytest.param(" " * 70_000, "longer than", id="too-long"),
    pytest.param("[" * 100_000, "longer than", id="deeply-nested"),
    pytest.param(_document(inUse=[{}] * (MAX_IN_USE + 1)), "at most", id="too-many-entries"),
]


@pytest.mark.parametrize(("raw", "why"), MALFORMED)
def test_a_malformed_or_future_document_is_refused_with_the_reason(raw: str, why: str) -> None:
    with pytest.raises(DocumentError, match=why.replace("(", r"\(")):
        decode_drift(raw)


def test_missing_lists_read_as_none() -> None:
    assert decode_drift('{"version": 1}') == Drift()
