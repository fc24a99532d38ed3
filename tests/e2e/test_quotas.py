"""Team quotas (ElasticQuota) against the real kube-apiserver and kube-scheduler: a team
borrows another's idle GPUs up to its max, a restart of schedext mid-way keeps every quota
within its max, the owner takes its GPUs back through kube-scheduler's preemption with
schedext's victims, status.used follows the bound pods, and bad or shadowed quotas get a
Warning event while the rest keeps working."""

from __future__ import annotations

from typing import Any

from testbed.manifests import pod_manifest
from tests.e2e.conftest import GPU, PODGROUPS, Cluster, eventually
from tests.e2e.test_scheduling import H100


def team(cluster: Cluster, suffix: str) -> str:
    """A namespace of its own for one team (removed with the test's objects)."""
    namespace = f"{cluster.namespace}-{suffix}"
    cluster.api.create_namespace(namespace)
    return namespace


def quota_path(namespace: str, name: str = "") -> str:
    path = f"{PODGROUPS}/namespaces/{namespace}/elasticquotas"
    return f"{path}/{name}" if name else path


def elastic_quota(
    cluster: Cluster, namespace: str, name: str, *, min: dict[str, Any], max: dict[str, Any]
) -> None:
    body = {
        "apiVersion": "scheduling.x-k8s.io/v1alpha1",
        "kind": "ElasticQuota",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"min": min, "max": max},
    }
    cluster.api.apply_raw("POST", quota_path(namespace), body)


def gpu_pod(cluster: Cluster, namespace: str, name: str, *, gpus: int, priority: str) -> None:
    requests = {"cpu": "100m", "memory": "64Mi", GPU: str(gpus)}
    manifest = pod_manifest(
        name, requests=requests, limits={GPU: str(gpus)}, priority_class=priority
    )
    cluster.api.create_pod(namespace, manifest)


def bound(cluster: Cluster, namespace: str) -> dict[str, int]:
    """The namespace's bound pods and their GPUs."""
    return {
        p["metadata"]["name"]: int(p["spec"]["containers"][0]["resources"]["limits"][GPU])
        for p in cluster.api.list_pods(namespace)
        if p["spec"].get("nodeName")
    }


def used(cluster: Cluster, namespace: str, name: str) -> str | None:
    quota = cluster.api.apply_raw("GET", quota_path(namespace, name))
    return (quota.get("status") or {}).get("used", {}).get(GPU)


def said(cluster: Cluster, namespace: str, pod: str, text: str) -> bool:
    return any(text in e.get("message", "") for e in cluster.api.events_for(namespace, pod))


def quota_events(cluster: Cluster, namespace: str, name: str) -> list[dict[str, Any]]:
    selector = f"involvedObject.kind=ElasticQuota,involvedObject.name={name}"
    path = f"/api/v1/namespaces/{namespace}/events"
    items: list[dict[str, Any]] = cluster.api.apply_raw(
        "GET", path, params={"fieldSelector": selector}
    ).get("items", [])
    return items


def test_a_team_borrows_idle_gpus_within_its_max_and_gives_them_back_to_the_owner(
    cluster: Cluster,
) -> None:
    for name in ("n1", "n2", "n3"):  # 12 GPUs: more than team-a's max
        cluster.node(name, gpus=4, model=H100)
    a, b = team(cluster, "a"), team(cluster, "b")
    elastic_quota(cluster, a, "team-a", min={GPU: 4}, max={GPU: 8})
    elastic_quota(cluster, b, "team-b", min={GPU: 4}, max={GPU: 8})
    # schedext has the quotas (it writes their status) before the first pod asks.
    eventually(lambda: used(cluster, b, "team-b") == "0", message="team-b's status not written")

    # team-a borrows team-b's idle GPUs: 6 of 8, over its min of 4.
    for i in range(6):
        gpu_pod(cluster, a, f"a-{i}", gpus=1, priority="low")
    for i in range(6):
        cluster.api.wait_pod_bound(a, f"a-{i}", timeout=60)

    # schedext restarts with more of team-a's pods waiting than its max lets in.
    cluster.schedext.stop(kill=True)
    for i in range(6, 10):
        gpu_pod(cluster, a, f"a-{i}", gpus=1, priority="low")
    cluster.schedext.start()  # the same port; returns once it has listed everything

    def at_max() -> bool:
        taken = bound(cluster, a)
        assert sum(taken.values()) <= 8, f"team-a over its max: {taken}"
        refused = [f"a-{i}" for i in range(6, 10) if f"a-{i}" not in taken]
        return len(taken) == 8 and all(said(cluster, a, p, "of max 8") for p in refused)

    eventually(at_max, timeout=90, message="team-a not filled to its max of 8")
    eventually(lambda: used(cluster, a, "team-a") == "8", message="team-a's status.used not 8")
    for name in [f"a-{i}" for i in range(6, 10)]:
        if name not in bound(cluster, a):
            cluster.api.delete_pod(a, name)  # refused at max: not part of what follows
    # The last free GPUs go to a namespace without a quota, at the priority team-b will have
    # (so never a victim of it): team-b then finds none free.
    for i in range(4):
        cluster.pod(f"other-{i}", gpus=1, priority_class="high")
    for i in range(4):
        cluster.wait_bound(f"other-{i}", timeout=60)
    cluster.scheduler_caught_up()

    # team-b's pods arrive, at higher priority: kube-scheduler proposes team-a's pods as
    # victims, and schedext's preempt takes them from the borrower, down to its min.
    gpu_pod(cluster, b, "b-0", gpus=2, priority="high")
    gpu_pod(cluster, b, "b-1", gpus=2, priority="high")
    cluster.api.wait_pod_bound(b, "b-0", timeout=120)
    cluster.api.wait_pod_bound(b, "b-1", timeout=120)

    def settled() -> bool:
        return sum(bound(cluster, a).values()) == 4 and sum(bound(cluster, b).values()) == 4

    try:
        eventually(settled, timeout=60, message="team-a not back at its min of 4")
    except AssertionError as error:  # say what each team holds, pod by pod
        held = f"team-a holds {bound(cluster, a)}, team-b {bound(cluster, b)}"
        raise AssertionError(f"{error}; {held}") from None
    # A namespace within its min is never a victim: team-a keeps its 4.
    assert len(bound(cluster, a)) == 4
    eventually(lambda: used(cluster, a, "team-a") == "4", message="team-a's status.used not 4")
    eventually(lambda: used(cluster, b, "team-b") == "4", message="team-b's status.used not 4")


def test_a_bad_quota_gets_a_warning_event_and_the_rest_keeps_working(cluster: Cluster) -> None:
    cluster.node("n1", gpus=4, model=H100)
    good, bad = team(cluster, "good"), team(cluster, "bad")
    elastic_quota(cluster, good, "capped", min={GPU: 1}, max={GPU: 1})
    elastic_quota(cluster, bad, "negative", min={GPU: "-1"}, max={GPU: 2})
    elastic_quota(cluster, bad, "inverted", min={GPU: 4}, max={GPU: 2})
    # A second quota in good's namespace, younger: shadowed, the first keeps applying.
    eventually(lambda: used(cluster, good, "capped") == "0", message="capped's status not written")
    elastic_quota(cluster, good, "late", min={GPU: 4}, max={GPU: 4})

    def warned(namespace: str, name: str, reason: str, text: str) -> bool:
        return any(
            e["type"] == "Warning" and e["reason"] == reason and text in e["message"]
            for e in quota_events(cluster, namespace, name)
        )

    eventually(lambda: warned(bad, "negative", "InvalidQuota", "is negative"),
               message="no Warning event on the negative quota")  # fmt: skip
    eventually(lambda: warned(bad, "inverted", "InvalidQuota", "min 4 is over max 2"),
               message="no Warning event on the inverted quota")  # fmt: skip
    eventually(lambda: warned(good, "late", "ShadowedQuota", f"{good}/capped is older"),
               message="no Warning event on the shadowed quota")  # fmt: skip
    assert "is negative" in cluster.schedext.tail(400)  # and a log line

    # The rest keeps working: good's quota caps it at 1 GPU; bad's namespace has none.
    gpu_pod(cluster, good, "g-0", gpus=1, priority="low")
    cluster.api.wait_pod_bound(good, "g-0", timeout=60)
    gpu_pod(cluster, good, "g-1", gpus=1, priority="low")
    gpu_pod(cluster, bad, "x-0", gpus=3, priority="low")
    cluster.api.wait_pod_bound(bad, "x-0", timeout=60)
    eventually(lambda: said(cluster, good, "g-1", "2 of max 1"), timeout=60,
               message="g-1 not refused by its quota")  # fmt: skip
    assert "g-1" not in bound(cluster, good)
    # Each problem reported once, not on every relist or resync.
    assert len(quota_events(cluster, bad, "negative")) == 1


def test_a_reclaim_takes_a_borrower_down_to_its_min_and_no_further_when_schedexts_watch_lags(
    lagging: Cluster,
) -> None:
    """team-a borrows all 8 GPUs of two nodes (min 4); team-b's four 1-GPU pods arrive at
    once. Each preemption frees one of team-a's GPUs, and schedext hears of each victim's
    deletion a second after kube-scheduler does, so it is asked for more victims while the
    earlier ones still count in team-a's use. It must count them as leaving: team-a ends at
    its min of 4, never below."""
    cluster = lagging
    for name in ("n1", "n2"):
        cluster.node(name, gpus=4, model=H100)
    a, b = team(cluster, "a"), team(cluster, "b")
    elastic_quota(cluster, a, "team-a", min={GPU: 4}, max={GPU: 8})
    elastic_quota(cluster, b, "team-b", min={GPU: 4}, max={GPU: 8})
    eventually(lambda: used(cluster, b, "team-b") == "0", message="team-b's status not written")
    for i in range(8):
        gpu_pod(cluster, a, f"a-{i}", gpus=1, priority="low")
    for i in range(8):
        cluster.api.wait_pod_bound(a, f"a-{i}", timeout=60)
    # schedext chooses only bound pods as victims: its own watch must have seen the binds
    # (it lags), or it would find nothing to preempt and the pods would wait for an event.
    eventually(
        lambda: cluster.schedext.get("/inventory")["reservations"] == 0,
        message="schedext did not see team-a's pods bound",
    )
    cluster.scheduler_caught_up()

    for i in range(4):
        gpu_pod(cluster, b, f"b-{i}", gpus=1, priority="high")
    for i in range(4):
        cluster.api.wait_pod_bound(b, f"b-{i}", timeout=120)
    cluster.scheduler_caught_up()
    # team-a keeps exactly its min, every one of its pods bound (none evicted below it).
    assert sum(bound(cluster, a).values()) == 4, f"team-a holds {bound(cluster, a)}"
    assert len(cluster.api.list_pods(a)) == 4
    eventually(
        lambda: (used(cluster, a, "team-a"), used(cluster, b, "team-b")) == ("4", "4"),
        message="the quotas' status.used did not settle at 4 and 4",
    )
