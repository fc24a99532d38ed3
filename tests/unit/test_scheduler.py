import copy

import pytest

from extender import names
from extender.errors import BindRefusedError
from extender.model import HoldingKind
from extender.scheduler import Scheduler
from testbed.builders import make_node, make_pod, name_of, uid_of
from tests.unit.helpers import scheduler_with


def filtered(scheduler, pod, nodes):  # type: ignore[no-untyped-def]
    return scheduler.filter(pod, nodes)


def plan(scheduler, pod, node, now=0.0):  # type: ignore[no-untyped-def]
    return scheduler.plan_bind(
        uid=uid_of(pod), namespace="default", name=name_of(pod), node=node, now=now
    )


def test_bind_reserves_distinct_gpus_for_successive_pods() -> None:
    scheduler = scheduler_with([make_node("g", gpus=4)])
    first, second = make_pod("a", gpus=2), make_pod("b", gpus=2)
    filtered(scheduler, first, ["g"])
    filtered(scheduler, second, ["g"])
    plan_a = plan(scheduler, first, "g")
    plan_b = plan(scheduler, second, "g")
    assert set(plan_a.gpu_ids).isdisjoint(plan_b.gpu_ids)
    assert plan_a.annotations == {names.GPU_IDS: "0,1"}
    assert plan_b.annotations == {names.GPU_IDS: "2,3"}


def test_reservation_is_visible_to_the_next_filter() -> None:
    scheduler = scheduler_with([make_node("g", gpus=2)])
    first, second = make_pod("a", gpus=2), make_pod("b", gpus=1)
    filtered(scheduler, first, ["g"])
    plan(scheduler, first, "g")
    verdict = filtered(scheduler, second, ["g"])
    assert verdict.passed == []
    assert "fewer than 1 free" in verdict.failed["g"]


def test_bind_rechecks_against_the_current_inventory() -> None:
    scheduler = scheduler_with([make_node("g", gpus=2)])
    first, second = make_pod("a", gpus=2), make_pod("b", gpus=2)
    assert filtered(scheduler, first, ["g"]).passed == ["g"]
    assert filtered(scheduler, second, ["g"]).passed == ["g"]  # both saw a free node
    plan(scheduler, first, "g")
    with pytest.raises(
        BindRefusedError, match="no longer fits node g: schedext: fewer than 2 free"
    ):
        plan(scheduler, second, "g")


def test_bind_of_a_pod_never_filtered_is_refused_clearly() -> None:
    scheduler = scheduler_with([make_node("g", gpus=2)])
    with pytest.raises(BindRefusedError, match="unknown to schedext"):
        plan(scheduler, make_pod("stranger", gpus=1), "g")


def test_bind_after_filter_refused_the_pod_as_invalid_gives_filters_reason() -> None:
    scheduler = scheduler_with([make_node("g", gpus=2)])
    pod = make_pod("bad", gpus=1, workload="memory-intensive")
    reason = filtered(scheduler, pod, ["g"]).rejections[0].message
    assert reason.startswith("schedext: invalid pod: label workload-type='memory-intensive'")
    with pytest.raises(BindRefusedError) as refused:
        plan(scheduler, pod, "g")
    assert str(refused.value) == f"pod default/bad: {reason}"


def test_a_pod_refused_as_invalid_then_read_again_is_bound_as_it_is_now() -> None:
    scheduler = scheduler_with([make_node("g", gpus=2)])
    pod = make_pod("p", gpus=1)
    filtered(scheduler, pod, ["g"])
    pod["metadata"]["labels"][names.WORKLOAD_TYPE] = "memory-intensive"
    filtered(scheduler, pod, ["g"])  # invalid now: what filter saw before no longer holds
    with pytest.raises(BindRefusedError, match="invalid pod"):
        plan(scheduler, pod, "g")
    del pod["metadata"]["labels"][names.WORKLOAD_TYPE]
    filtered(scheduler, pod, ["g"])
    assert plan(scheduler, pod, "g").gpu_ids == (0,)


def test_bind_with_a_uid_of_another_pod_is_refused() -> None:
    scheduler = scheduler_with([make_node("g", gpus=2)])
    pod = make_pod("real", gpus=1)
    filtered(scheduler, pod, ["g"])
    with pytest.raises(BindRefusedError, match="belongs to pod default/real"):
        scheduler.plan_bind(uid=uid_of(pod), namespace="default", name="imposter", node="g", now=0)


def test_bind_to_an_unknown_node_is_refused() -> None:
    scheduler = scheduler_with([make_node("g", gpus=2)])
    pod = make_pod("p", gpus=1)
    filtered(scheduler, pod, ["g"])
    with pytest.raises(BindRefusedError, match="node not in inventory"):
        plan(scheduler, pod, "ghost")


def test_second_bind_of_the_same_pod_is_refused_while_in_flight_and_after() -> None:
    scheduler = scheduler_with([make_node("g", gpus=4)])
    pod = make_pod("p", gpus=1)
    filtered(scheduler, pod, ["g"])
    first = plan(scheduler, pod, "g")
    with pytest.raises(BindRefusedError, match="already being bound to node g"):
        plan(scheduler, pod, "g")
    scheduler.confirm_bind(first)
    with pytest.raises(BindRefusedError, match="already bound to node g"):
        plan(scheduler, pod, "g")


def test_aborted_bind_gives_the_gpus_back() -> None:
    scheduler = scheduler_with([make_node("g", gpus=2)])
    pod = make_pod("p", gpus=2)
    filtered(scheduler, pod, ["g"])
    scheduler.abort_bind(plan(scheduler, pod, "g"))
    assert filtered(scheduler, make_pod("q", gpus=2), ["g"]).passed == ["g"]
    # and the pod itself can be bound again
    assert plan(scheduler, pod, "g").gpu_ids == (0, 1)


def test_confirmed_bind_becomes_a_bound_holding_without_expiry() -> None:
    scheduler = scheduler_with([make_node("g", gpus=2)])
    pod = make_pod("p", gpus=1)
    filtered(scheduler, pod, ["g"])
    scheduler.confirm_bind(plan(scheduler, pod, "g"))
    held = scheduler.inventory.holding(uid_of(pod))
    assert held is not None
    assert (held.kind, held.expires_at, held.gpu_ids) == (HoldingKind.BOUND, None, (0,))
    assert scheduler.expire(1e9) == []


def test_unconfirmed_reservation_expires() -> None:
    scheduler = scheduler_with([make_node("g", gpus=2)])
    pod = make_pod("p", gpus=2)
    filtered(scheduler, pod, ["g"])
    plan(scheduler, pod, "g", now=100.0)
    assert scheduler.expire(100.0 + 59) == []
    assert [h.uid for h in scheduler.expire(100.0 + 60)] == [uid_of(pod)]
    assert filtered(scheduler, make_pod("q", gpus=2), ["g"]).passed == ["g"]


def test_watch_event_of_the_bound_pod_replaces_the_reservation() -> None:
    scheduler = scheduler_with([make_node("g", gpus=4)])
    pod = make_pod("p", gpus=2)
    filtered(scheduler, pod, ["g"])
    bind = plan(scheduler, pod, "g")
    bound = make_pod("p", uid=uid_of(pod), gpus=2, node="g", gpu_ids=bind.gpu_ids)
    scheduler.upsert_pod(bound)
    held = scheduler.inventory.holding(uid_of(pod))
    assert held is not None
    assert held.kind is HoldingKind.BOUND
    scheduler.abort_bind(bind)  # a late failure report must not free a bound pod's GPUs
    assert scheduler.inventory.holding(uid_of(pod)) is not None


def test_pending_pods_from_the_watch_can_be_bound() -> None:
    scheduler = scheduler_with([make_node("g", gpus=1)])
    pod = make_pod("p", gpus=1)
    scheduler.upsert_pod(pod)  # seen by the informer, never filtered by this process
    assert plan(scheduler, pod, "g").gpu_ids == (0,)


def test_deleted_pod_frees_its_gpus_and_is_forgotten() -> None:
    scheduler = scheduler_with(
        [make_node("g", gpus=1)], [make_pod("old", uid="old", gpus=1, node="g", gpu_ids=[0])]
    )
    scheduler.delete_pod("old")
    assert filtered(scheduler, make_pod("new", gpus=1), ["g"]).passed == ["g"]


def test_pending_memory_is_bounded() -> None:
    scheduler = Scheduler(pending_capacity=2)
    scheduler.upsert_node(make_node("g", gpus=8))
    pods = [make_pod(f"p{i}", gpus=1) for i in range(3)]
    for pod in pods:
        scheduler.filter(pod, ["g"])
    assert scheduler.pending_count == 2
    with pytest.raises(BindRefusedError, match="unknown to schedext"):
        plan(scheduler, pods[0], "g")


def test_pending_pods_are_listed_by_namespace_and_name_up_to_the_limit() -> None:
    scheduler = Scheduler()
    scheduler.upsert_node(make_node("g", gpus=8))
    for name, namespace in (("c", "ml"), ("a", "serving"), ("b", "ml"), ("d", "ml")):
        scheduler.filter(make_pod(name, namespace=namespace, gpus=1), ["g"])
    scheduler.upsert_pod(make_pod("bound", namespace="ml", gpus=1, node="g", gpu_ids=[0]))
    assert [r.key for r in scheduler.pending_pods(3)] == ["ml/b", "ml/c", "ml/d"]
    assert [r.key for r in scheduler.pending_pods(10)] == ["ml/b", "ml/c", "ml/d", "serving/a"]
    assert scheduler.pending_count == 4


def test_a_pod_seen_bound_leaves_the_pending_list() -> None:
    scheduler = scheduler_with([make_node("g", gpus=2)])
    scheduler.upsert_pod(make_pod("p", namespace="ml", uid="u-p", gpus=1))
    assert [r.key for r in scheduler.pending_pods(10)] == ["ml/p"]
    scheduler.upsert_pod(make_pod("p", namespace="ml", uid="u-p", gpus=1, node="g", gpu_ids=[1]))
    assert scheduler.pending_pods(10) == ()


# ------------------------------------------------------------ live cluster (watch)


def test_with_a_watch_the_reservation_stays_until_the_pod_is_seen_bound() -> None:
    scheduler = scheduler_with([make_node("g", gpus=2)])
    pod = make_pod("p", gpus=1)
    filtered(scheduler, pod, ["g"])
    bind = plan(scheduler, pod, "g", now=0.0)
    scheduler.confirm_bind(bind, awaiting_watch=True)
    held = scheduler.inventory.holding(uid_of(pod))
    assert held is not None
    assert (held.kind, held.expires_at) == (HoldingKind.RESERVED, None)
    assert scheduler.expire(1e9) == []  # a bound pod's GPUs never expire
    scheduler.upsert_pod(make_pod("p", uid=uid_of(pod), gpus=1, node="g", gpu_ids=bind.gpu_ids))
    held = scheduler.inventory.holding(uid_of(pod))
    assert held is not None
    assert held.kind is HoldingKind.BOUND


def test_pod_relist_rebuilds_holdings_from_annotations_and_drops_what_is_gone() -> None:
    scheduler = scheduler_with([make_node("g", gpus=4)])
    gone, pending = make_pod("gone", gpus=1), make_pod("pending", gpus=1)
    for pod in (gone, pending):
        filtered(scheduler, pod, ["g"])
    scheduler.confirm_bind(plan(scheduler, gone, "g"), awaiting_watch=True)  # then deleted unseen
    plan(scheduler, pending, "g")  # a bind in flight for a pod that still exists
    relist = scheduler.pod_relist()
    relist.add([make_pod("old", uid="old", gpus=2, node="g", gpu_ids=[2, 3])])
    relist.add([make_pod("pending", uid=uid_of(pending), gpus=1)])
    relist.commit()
    holders = scheduler.inventory.node("g")
    assert holders is not None
    assert holders.holders == (None, uid_of(pending), "old", "old")


def test_a_relist_is_applied_only_when_committed() -> None:
    scheduler = scheduler_with([make_node("a"), make_node("b")])
    relist = scheduler.node_relist()
    relist.add([make_node("c")])
    assert sorted(scheduler.inventory.node_names()) == ["a", "b"]
    relist.commit()
    assert scheduler.inventory.node_names() == ["c"]


def test_a_pod_that_finishes_gives_its_gpus_back() -> None:
    scheduler = scheduler_with(
        [make_node("g", gpus=1)], [make_pod("job", uid="job", gpus=1, node="g", gpu_ids=[0])]
    )
    scheduler.upsert_pod(
        make_pod("job", uid="job", gpus=1, node="g", gpu_ids=[0], phase="Succeeded")
    )
    assert filtered(scheduler, make_pod("next", gpus=1), ["g"]).passed == ["g"]


def test_a_bound_pod_filtered_again_is_not_pending_again() -> None:
    scheduler = scheduler_with([make_node("g", gpus=4)])
    pod = make_pod("p", namespace="default", gpus=1)
    filtered(scheduler, pod, ["g"])
    assert [r.key for r in scheduler.pending_pods(10)] == ["default/p"]
    scheduler.confirm_bind(plan(scheduler, pod, "g"))
    assert scheduler.pending_pods(10) == ()
    filtered(scheduler, pod, ["g"])
    assert (scheduler.pending_pods(10), scheduler.pending_count) == ((), 0)
    explanation = scheduler.explain("default", "p")
    assert explanation is not None
    assert (explanation.state, explanation.node) == ("bound", "g")


def test_a_pending_pod_keeps_why_the_last_filter_turned_it_away() -> None:
    scheduler = scheduler_with([make_node("g", gpus=2), make_node("cpu")])
    first, pod, big = make_pod("first", gpus=1), make_pod("p", gpus=2), make_pod("q", gpus=3)
    filtered(scheduler, first, ["g"])
    scheduler.confirm_bind(plan(scheduler, first, "g"))
    assert not filtered(scheduler, pod, ["g", "cpu"]).passed
    why = scheduler.pending_why(uid_of(pod))
    assert why == ("schedext: fewer than 2 free GPUs (1 node); schedext: node has no GPUs (1 node)")
    scheduler.upsert_pod(pod)  # the watch sees it again, still pending: the reason stays
    assert scheduler.pending_why(uid_of(pod)) == why
    scheduler.delete_pod(uid_of(first))
    assert filtered(scheduler, pod, ["g", "cpu"]).passed == ["g"]
    assert scheduler.pending_why(uid_of(pod)) == ""  # it fits now
    filtered(scheduler, big, ["g"])
    assert scheduler.pending_why(uid_of(big)) == "schedext: node has fewer than 3 GPUs (1 node)"
    scheduler.confirm_bind(plan(scheduler, pod, "g"))
    scheduler.delete_pod(uid_of(big))
    assert (scheduler.pending_why(uid_of(pod)), scheduler.pending_why(uid_of(big))) == ("", "")


def test_bind_to_a_node_filter_never_offered_says_it_does_not_fit() -> None:
    # once "no longer fits": the pod never fitted the node, filter had said so
    scheduler = scheduler_with([make_node("a", gpus=2, model="A100"), make_node("b", gpus=2)])
    pod = make_pod("p", gpus=1, model="A100")
    assert filtered(scheduler, pod, ["a", "b"]).passed == ["a"]
    with pytest.raises(BindRefusedError) as refused:
        plan(scheduler, pod, "b")
    assert str(refused.value) == (
        "pod default/p does not fit node b (filter did not offer it): "
        "schedext: GPU model is not A100"
    )


def test_bind_of_a_pod_that_fitted_no_node_says_it_does_not_fit() -> None:
    scheduler = scheduler_with([make_node("g", gpus=1)])
    pod = make_pod("p", gpus=2)
    assert filtered(scheduler, pod, ["g"]).passed == []
    with pytest.raises(BindRefusedError, match=r"^pod default/p does not fit node g \(filter"):
        plan(scheduler, pod, "g")


def test_bind_to_a_node_offered_in_full_mode_still_no_longer_fits() -> None:
    # full mode: filter offers nothing itself, prioritize rates what passed
    scheduler = scheduler_with([make_node("g", gpus=2)])
    first, second = make_pod("a", gpus=2), make_pod("b", gpus=2)
    for pod in (first, second):
        assert filtered(scheduler, pod, ["g"]).passed == ["g"]
        scheduler.prioritize(pod, ["g"])
    plan(scheduler, first, "g")
    with pytest.raises(BindRefusedError, match=r"^pod default/b no longer fits node g: "):
        plan(scheduler, second, "g")


def _version(pod, version: str, gpus: int | None = None):  # type: ignore[no-untyped-def]
    """``pod`` at object version ``version``; ``gpus``: its GPU ask changed too."""
    out = copy.deepcopy(pod)
    out["metadata"]["resourceVersion"] = version
    if gpus is not None:
        for block in ("requests", "limits"):
            out["spec"]["containers"][0]["resources"][block][names.GPU_RESOURCE] = str(gpus)
    return out


@pytest.mark.parametrize(
    ("watched", "filtered_as", "bound_gpus"),
    [
        # The watch decoded version 7; filter gets kube-scheduler's copy of version 7, which
        # is the same object: the watch's decode is used (the copy here differs behind the
        # version's back, which an API server never serves, to show whose decode counts).
        ("7", _version(make_pod("a", uid="a", gpus=2), "7", gpus=4), 2),
        # A version the watch has not seen is decoded afresh.
        ("7", _version(make_pod("a", uid="a", gpus=2), "8", gpus=4), 4),
        # Without a version there is nothing to match: decoded afresh.
        ("", _version(make_pod("a", uid="a", gpus=2), "", gpus=4), 4),
    ],
    ids=["same version", "newer version", "no version"],
)
def test_filter_reuses_the_watchs_decode_of_the_same_object_version(
    watched: str, filtered_as: dict, bound_gpus: int
) -> None:
    scheduler = scheduler_with([make_node("g", gpus=8)])
    scheduler.upsert_pod(_version(make_pod("a", uid="a", gpus=2), watched))
    assert filtered(scheduler, filtered_as, ["g"]).passed == ["g"]
    assert len(plan(scheduler, filtered_as, "g").gpu_ids) == bound_gpus


def test_a_forgotten_pod_is_decoded_afresh_at_its_old_version() -> None:
    scheduler = scheduler_with([make_node("g", gpus=8)])
    pod = _version(make_pod("a", gpus=2), "7")
    scheduler.upsert_pod(pod)
    scheduler.delete_pod(uid_of(pod))
    changed = _version(pod, "7", gpus=4)
    assert filtered(scheduler, changed, ["g"]).passed == ["g"]
    assert len(plan(scheduler, changed, "g").gpu_ids) == 4
