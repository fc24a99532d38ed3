"""The intake skips pod events that change nothing it reads (extender.pod_marks): every field
a reader reads makes an event count, no other field does, and a skip leaves the books exactly
as applying the event would."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import orjson
import pytest

import extender.intake
from app.kube.shapes import POD_DECODERS
from extender import names
from extender.pod_marks import fingerprint
from extender.scheduler import Scheduler
from testbed.builders import make_node

JSON = dict[str, Any]
UID = "uid-p-0"


def served_pod(**changes: Any) -> JSON:
    """A bound GPU pod as the API server serves it: defaults, managedFields, a kubelet's
    status, and every kind of field schedext reads present."""
    pod: JSON = {
        "metadata": {
            "name": "p-0",
            "namespace": "team",
            "uid": UID,
            "resourceVersion": "100",
            "generation": 1,
            "creationTimestamp": "2026-11-28T10:00:00Z",
            "labels": {"app": "trainer", names.WORKLOAD_TYPE: "GPU-intensive"},
            "annotations": {
                "kubectl.kubernetes.io/default-container": "main",
                names.GPU_IDS: "0,1",
                names.GPU_MODEL: "H100",
            },
            "ownerReferences": [
                {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "name": "p",
                    "uid": "j",
                    "controller": True,
                }
            ],
            "managedFields": [
                {
                    "manager": "kubectl",
                    "operation": "Update",
                    "fieldsType": "FieldsV1",
                    "fieldsV1": {"f:spec": {"f:containers": {}}},
                }
            ],
        },
        "spec": {
            "nodeName": "node-a",
            "priority": 10,
            "preemptionPolicy": "PreemptLowerPriority",
            "initContainers": [
                {"name": "init", "image": "i", "resources": {"requests": {"cpu": "1"}}}
            ],
            "containers": [
                {
                    "name": "main",
                    "image": "m",
                    "resources": {
                        "requests": {"cpu": "4", "memory": "16Gi", names.GPU_RESOURCE: "2"},
                        "limits": {names.GPU_RESOURCE: "2"},
                    },
                }
            ],
            "tolerations": [{"key": names.GPU_RESOURCE, "operator": "Exists"}],
            "schedulerName": "default-scheduler",
        },
        "status": {
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True"}],
            "hostIP": "10.0.0.1",
            "podIP": "10.244.0.2",
            "podIPs": [{"ip": "10.244.0.2"}],
            "startTime": "2026-11-28T10:00:02Z",
            "containerStatuses": [{"name": "main", "ready": True, "restartCount": 0}],
            "qosClass": "Burstable",
        },
    }
    for path, value in changes.items():
        put(pod, path, value)
    return pod


def put(pod: JSON, path: str, value: Any) -> None:
    """Set ``a|b|0|c`` (list indices as numbers); a value of ``...`` deletes the field."""
    *parents, last = path.split("|")
    node: Any = pod
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node.setdefault(part, {})
    if value is ...:
        node.pop(last, None)
    elif isinstance(node, list):
        node[int(last) : int(last) + 1] = [value]
    else:
        node[last] = value


# Every field a reader of a pod reads (holding_from_pod, pod_request, statefulset_identity,
# group_key, the DRA claims, the phase): a change to any must be applied.
READ = {
    "uid": ("metadata|uid", "uid-other"),
    "name": ("metadata|name", "p-1"),
    "namespace": ("metadata|namespace", "other"),
    "owner kind": ("metadata|ownerReferences|0|kind", "StatefulSet"),
    "owner name": ("metadata|ownerReferences|0|name", "q"),
    "owner controller": ("metadata|ownerReferences|0|controller", False),
    "gang label": (f"metadata|labels|{names.POD_GROUP_LABEL}", "g"),
    "workload label": (f"metadata|labels|{names.WORKLOAD_TYPE}", "CPU-intensive"),
    "model label": (f"metadata|labels|{names.GPU_MODEL}", "A100"),
    "memory label": (f"metadata|labels|{names.GPU_MEMORY_MIB}", "40960"),
    **{
        f"annotation {key}": (f"metadata|annotations|{key}", "2,3")
        for key in (
            names.GPU_IDS,
            names.GPU_UUIDS,
            names.MIG_UUIDS,
            names.GPU_SHARE_MEMORY,
            names.GPU_SHARE_CORES,
            names.GPU_MODEL,
            names.GPU_MEMORY_MIB,
            names.WORKLOAD_TYPE,
            names.IP,
            names.IP_POOL,
            names.IP_POLICY,
            *sorted(names.TOPOLOGY_KEYS),
        )
    },
    "annotations gone": ("metadata|annotations", ...),
    "node": ("spec|nodeName", "node-b"),
    "unbound": ("spec|nodeName", ...),
    "priority": ("spec|priority", 11),
    "preemption policy": ("spec|preemptionPolicy", "Never"),
    "cpu": ("spec|containers|0|resources|requests|cpu", "5"),
    "gpus": (f"spec|containers|0|resources|requests|{names.GPU_RESOURCE}", "3"),
    "gpu limit": (f"spec|containers|0|resources|limits|{names.GPU_RESOURCE}", "3"),
    "share": (f"spec|containers|0|resources|limits|{names.SHARE_MEMORY_RESOURCE}", "1024"),
    "mig": ("spec|containers|0|resources|limits|nvidia.com/mig-1g.10gb", "1"),
    "second container": ("spec|containers|1", {"name": "b", "resources": {}}),
    "init container": ("spec|initContainers|0|resources|requests|cpu", "8"),
    "sidecar": ("spec|initContainers|0|restartPolicy", "Always"),
    "overhead": ("spec|overhead", {"cpu": "1"}),
    "pod resources": ("spec|resources", {"requests": {"cpu": "9"}}),
    "affinity": (
        "spec|affinity",
        {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{}]}},
    ),
    "spread": ("spec|topologySpreadConstraints", [{"whenUnsatisfiable": "ScheduleAnyway"}]),
    "claims": ("spec|resourceClaims", [{"name": "gpu", "resourceClaimName": "c"}]),
    "phase": ("status|phase", "Pending"),
    "finished": ("status|phase", "Succeeded"),
    "claim statuses": ("status|resourceClaimStatuses", [{"name": "g", "resourceClaimName": "c"}]),
    "extended claim": ("status|extendedResourceClaimStatus", {"resourceClaimName": "c"}),
}

# What none of them reads: a change to any of these alone is skipped.
UNREAD = {
    "resourceVersion": ("metadata|resourceVersion", "101"),
    "generation": ("metadata|generation", 2),
    "managedFields": ("metadata|managedFields", [{"manager": "kubelet"}]),
    "another label": ("metadata|labels|bench-tick", "1"),
    "a label changed": ("metadata|labels|app", "server"),
    "another annotation": ("metadata|annotations|example.com/note", "x"),
    "conditions": ("status|conditions|0|status", "False"),
    "container statuses": ("status|containerStatuses|0|restartCount", 3),
    "pod IP": ("status|podIP", "10.244.0.9"),
    "pod IPs": ("status|podIPs", [{"ip": "10.244.0.9"}]),
    "host IP": ("status|hostIP", "10.0.0.2"),
    "start time": ("status|startTime", "2026-11-28T11:00:00Z"),
    "qos class": ("status|qosClass", "Guaranteed"),
}


def decoded(pod: JSON) -> JSON:
    """The pod as the pod informer hands it to the core (msgspec, the read fields only)."""
    event: JSON = POD_DECODERS.event(orjson.dumps({"type": "MODIFIED", "object": pod}))
    return event["object"]


@pytest.fixture
def holdings_decoded(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The uids whose holding the intake decoded (an event it did not skip)."""
    seen: list[str] = []
    real = extender.intake.holding_from_pod

    def spy(pod: JSON, **kwargs: Any) -> Any:
        seen.append(pod["metadata"]["uid"])
        return real(pod, **kwargs)

    monkeypatch.setattr(extender.intake, "holding_from_pod", spy)
    return seen


def scheduler(*pods: JSON, marks: bool = True) -> Scheduler:
    """A scheduler with two nodes that has seen ``pods``; without ``marks``, one that
    applies every event, as the intake did before it kept marks."""
    s = Scheduler()
    if not marks:
        s._books.marks.applied = lambda *_: False  # type: ignore[method-assign]
    for name in ("node-a", "node-b"):
        s.upsert_node(make_node(name, gpus=8))
    for pod in pods:
        s.upsert_pod(pod)
    return s


def books(s: Scheduler, uid: str = UID) -> tuple[Any, ...]:
    """What the books keep of pod ``uid``."""
    b = s._books
    return (
        s.inventory.holding(uid),
        b.pending.get(uid),
        b.pending.knows(uid),
        b.gangs.group_of(uid),
        b.statefulsets._identities.get(uid),
        b.dra.knows_pod(uid),
        s.inventory.node("node-a"),
        s.inventory.node("node-b"),
    )


def cases(table: dict[str, tuple[str, Any]]) -> list[Any]:
    return [pytest.param(path, value, id=label) for label, (path, value) in table.items()]


FORMS: dict[str, Callable[[JSON], JSON]] = {"decoded": decoded, "full": copy.deepcopy}


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize(("path", "value"), cases(READ))
def test_a_change_to_a_field_read_is_applied(
    form: str, path: str, value: Any, holdings_decoded: list[str]
) -> None:
    shape = FORMS[form]
    before, after = served_pod(), served_pod(**{path: value})
    assert fingerprint(shape(before)) != fingerprint(shape(after))
    s = scheduler(shape(before))
    uid = after["metadata"]["uid"]
    holdings_decoded.clear()
    assert s.upsert_pod(shape(after)) is True  # a change: the shell's freeing hooks run
    assert holdings_decoded == [uid]  # not skipped
    assert books(s, uid) == books(scheduler(shape(before), shape(after), marks=False), uid)


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize(("path", "value"), cases(UNREAD))
def test_a_change_to_nothing_read_is_skipped(
    form: str, path: str, value: Any, holdings_decoded: list[str]
) -> None:
    shape = FORMS[form]
    before, after = served_pod(), served_pod(**{path: value})
    assert fingerprint(shape(before)) == fingerprint(shape(after))
    s = scheduler(shape(before))
    s.upsert_pod(shape(served_pod(**{"metadata|resourceVersion": "100b"})))  # marked now
    held, kept = s.inventory.holding(UID), books(s)
    holdings_decoded.clear()
    assert s.upsert_pod(shape(after)) is False  # nothing kept changed: nothing was freed
    assert holdings_decoded == []  # skipped
    assert s.inventory.holding(UID) is held
    assert books(s) == kept == books(scheduler(shape(before), shape(after), marks=False))


def test_every_status_update_after_the_first_is_skipped(holdings_decoded: list[str]) -> None:
    s = scheduler()
    for version in range(5):
        s.upsert_pod(decoded(served_pod(**{"metadata|resourceVersion": str(version)})))
    assert holdings_decoded == [UID]
    assert (s.pod_marks, s.pod_events_skipped) == (1, 4)


def test_a_pod_seen_again_after_other_writers_touched_it_is_applied(
    holdings_decoded: list[str],
) -> None:
    """Filter, preempt and relists write the books too: the same event is then applied, as
    it was before marks."""
    pod = served_pod()
    for touch in (
        lambda s: s._books.pending.refuse(UID, "filter refused it"),
        lambda s: s._books.evictions.record(UID, {"node-a": ["v"]}, now=0.0),
        lambda s: s._books.departures.record(UID, {"node-a": ["v"]}, now=0.0),
        lambda s: s.inventory.remove_holding(UID),
        lambda s: s.replace_pods([]),
        lambda s: s.delete_pod(UID),
    ):
        s = scheduler(decoded(pod), decoded(pod))
        unmarked = scheduler(decoded(pod), decoded(pod), marks=False)
        for each in (s, unmarked):
            touch(each)
        holdings_decoded.clear()
        assert s.upsert_pod(decoded(pod)) is True
        assert holdings_decoded == [UID]
        unmarked.upsert_pod(decoded(pod))
        assert books(s) == books(unmarked)


def test_gang_members_and_dra_pods_are_never_skipped(holdings_decoded: list[str]) -> None:
    gang = served_pod(**{f"metadata|labels|{names.POD_GROUP_LABEL}": "g"})
    dra = served_pod(**{"spec|resourceClaims": [{"name": "gpu", "resourceClaimName": "c"}]})
    for pod in (gang, dra):
        s = scheduler(decoded(pod))
        holdings_decoded.clear()
        s.upsert_pod(decoded(pod))
        assert holdings_decoded == [UID]


def test_marks_go_with_their_pods() -> None:
    s = scheduler()
    for i in range(3):
        s.upsert_pod(decoded(served_pod(**{"metadata|uid": f"u{i}", "metadata|name": f"p{i}"})))
    assert len(s._books.marks) == 3
    s.delete_pod("u0")
    finished = {"metadata|uid": "u1", "metadata|name": "p1", "status|phase": "Succeeded"}
    s.upsert_pod(decoded(served_pod(**finished)))
    assert len(s._books.marks) == 1
    s.replace_pods([decoded(served_pod(**{"metadata|uid": "u2", "metadata|name": "p2"}))])
    assert len(s._books.marks) == 0
