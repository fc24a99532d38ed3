"""loadtests.churnbench's pure parts: the churn's call mix and its bookkeeping, the free GPUs
it takes, the probe's request and verdicts, and the figures (percentiles, ratios, CPU per
event, probes per block). Its measured figures are the benchmark's, never asserted here."""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence

import orjson
import pytest

from loadtests import churnbench, sync
from loadtests.churnbench import (
    CHURN,
    CREATE,
    DELETE,
    IDLE,
    MIX,
    OK,
    PATCH,
    Block,
    Churn,
    ProbeRecord,
)


def plan(nodes: int = 3, pods: int = 30, fill: float = 0.5) -> sync.Plan:
    # Node i is payloads.MODELS[i % 3]: 0 an 8-GPU H100, 1 an 8-GPU A100, 2 a 4-GPU L4;
    # every tenth node (index 9, 19...) has no GPU.
    return sync.Plan.build(nodes, pods, gpu_fill=fill, compact=True)


# ---------------------------------------------------------------------------------------------
# Free GPUs and the churn
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fill", "expected"),
    [
        # half held: GPUs 4-7 of the 8-GPU nodes, 2-3 of the L4 are free, nodes interleaved
        (0.5, [(0, 4), (1, 4), (2, 2), (0, 5), (1, 5), (2, 3), (0, 6), (1, 6), (0, 7), (1, 7)]),
        # none held: every GPU, the first of each node first
        (0.0, [(0, 0), (1, 0), (2, 0), (0, 1), (1, 1), (2, 1)]),
    ],
)
def test_free_slots_are_the_gpus_no_pod_holds_nodes_interleaved(
    fill: float, expected: list[tuple[int, int]]
) -> None:
    slots = churnbench.free_slots(plan(fill=fill))
    assert slots[: len(expected)] == expected
    assert len(slots) == len(set(slots))


def test_free_slots_skip_nodes_without_gpus() -> None:
    slots = churnbench.free_slots(plan(nodes=10, pods=100))
    assert {node for node, _ in slots} == set(range(9))  # node 9 has no GPU


def test_a_churn_needs_free_gpus_for_twice_its_pods() -> None:
    free = len(churnbench.free_slots(plan()))  # 10
    Churn.build(plan(), free // 2)
    with pytest.raises(ValueError, match="needs 12 free GPUs, the plan leaves 10"):
        Churn.build(plan(), free // 2 + 1)


@pytest.mark.parametrize("count", [1, 3, 4, 7, 40, 401])
def test_the_mix_is_a_quarter_creates_a_quarter_deletes_half_patches(count: int) -> None:
    churn = Churn.build(plan(nodes=30, pods=300), 20)
    churn.backlog(20)
    calls, kinds = churn.calls(count)
    methods = {CREATE: "POST", DELETE: "DELETE", PATCH: "PATCH"}
    assert [c[0] for c in calls] == [methods[MIX[i % 4]] for i in range(count)]
    assert kinds == {k: sum(1 for i in range(count) if MIX[i % 4] == k) for k in MIX}
    assert sum(kinds.values()) == count
    assert kinds[CREATE] - kinds[DELETE] in (0, 1)
    assert churn.held_gpus == 20 + kinds[CREATE] - kinds[DELETE]


def test_the_mix_carries_on_from_one_block_to_the_next() -> None:
    one, two = (Churn.build(plan(nodes=30, pods=300), 10) for _ in range(2))
    for churn in (one, two):
        churn.backlog(10)
    whole, _ = one.calls(11)
    first, _ = two.calls(5)
    second, _ = two.calls(6)
    assert [c[:2] for c in first + second] == [c[:2] for c in whole]


def test_deletes_take_the_oldest_churn_pod_and_every_call_is_a_change() -> None:
    churn = Churn.build(plan(nodes=30, pods=300), 8)
    backlog = churn.backlog(8)
    created = [c[2]["metadata"]["name"] for c in backlog if c[2] is not None]
    calls, _ = churn.calls(400)
    values = []
    for method, path, body, _ in calls:
        if method == "POST":
            assert body is not None
            created.append(body["metadata"]["name"])
        elif method == "DELETE":
            # the oldest pod still alive, created at least 8 creates earlier
            assert path.rsplit("/", 1)[1] == created.pop(0)
            assert len(created) >= 7
        else:
            assert body is not None
            values.append(body["metadata"]["labels"][churnbench.TICK_LABEL])
            assert not path.rsplit("/", 1)[1].startswith("churn-")  # a pod of the plan
    assert len(values) == len(set(values)) == 200
    assert [name for name, _ in churn.live] == created


def test_a_churn_pod_is_bound_and_holds_a_free_gpu_no_live_pod_holds() -> None:
    the_plan = plan(nodes=30, pods=300)
    churn = Churn.build(the_plan, 12)
    churn.backlog(12)
    churn.calls(300)
    free = set(churnbench.free_slots(the_plan))
    held = [slot for _, slot in churn.live]
    assert len(held) == len(set(held)) == 12
    assert set(held) <= free
    _, _, pod, _ = churn.create()
    assert pod is not None
    node, gpu = churn.live[-1][1]
    assert pod["spec"]["nodeName"] == the_plan.nodes[node]["metadata"]["name"]
    assert pod["metadata"]["annotations"]["schedext.io/gpu-ids"] == str(gpu)
    assert pod["metadata"]["labels"][churnbench.CHURN_LABEL] == "true"


def test_the_control_mix_churns_configmaps_one_change_per_call() -> None:
    control = churnbench.ControlChurn()
    backlog = control.backlog(6)
    assert [c[0] for c in backlog] == ["POST"] * 6
    calls, kinds = control.calls(40)
    assert kinds == {CREATE: 10, PATCH: 20, DELETE: 10}
    assert all("/configmaps" in path for _, path, _, _ in backlog + calls)
    deleted = [path.rsplit("/", 1)[1] for method, path, _, _ in calls if method == "DELETE"]
    assert deleted == [f"control-{i:07d}" for i in range(10)]  # the oldest first
    values = [body["metadata"]["labels"][churnbench.TICK_LABEL]
              for method, _, body, _ in calls if method == "PATCH" and body]  # fmt: skip
    assert len(values) == len(set(values)) == 20
    assert len(control.live) == 6
    _, _, body, _ = backlog[0]
    assert body is not None
    assert len(body["data"]["payload"]) == churnbench.CONTROL_BYTES


def test_the_sentinel_node_has_a_gpu_model_of_its_own() -> None:
    node = churnbench.Sentinel.node()
    assert node["metadata"]["name"] == churnbench.SENTINEL_NODE
    assert node["metadata"]["labels"]["nvidia.com/gpu.product"] == churnbench.SENTINEL_MODEL
    assert node["status"]["allocatable"]["nvidia.com/gpu"] == "8"
    assert "resourceVersion" not in node["metadata"]


# ---------------------------------------------------------------------------------------------
# The probe
# ---------------------------------------------------------------------------------------------


def test_the_filter_body_is_a_new_pending_pod_asking_one_gpu_with_every_name() -> None:
    names = orjson.dumps(["node-00000", "node-00001"])
    bodies = [orjson.loads(churnbench.filter_body(i, names)) for i in (0, 1)]
    for body in bodies:
        assert body["Nodes"] is None
        assert body["NodeNames"] == ["node-00000", "node-00001"]
        trainer = body["Pod"]["spec"]["containers"][0]
        assert trainer["resources"]["requests"]["nvidia.com/gpu"] == "1"
        assert "nodeName" not in body["Pod"]["spec"]
    assert bodies[0]["Pod"]["metadata"]["uid"] != bodies[1]["Pod"]["metadata"]["uid"]
    assert bodies[0]["Pod"]["metadata"]["name"] != bodies[1]["Pod"]["metadata"]["name"]


@pytest.mark.parametrize(
    ("status", "body", "expected"),
    [
        (200, b'{"NodeNames": ["node-00001"], "FailedNodes": {}, "Error": ""}', OK),
        (200, b'{"NodeNames": [], "FailedNodes": {"n": "full"}, "Error": ""}', "no node"),
        (200, b'{"NodeNames": null, "Error": "pod has no uid"}', "failed: pod has no uid"),
        (500, b"boom", "failed: HTTP 500 b'boom'"),
        (0, b"ConnectionResetError()", "failed: HTTP 0 b'ConnectionResetError()'"),
        (200, b"<html>", "failed: not JSON b'<html>'"),
        (200, b"[1]", "failed: not an object b'[1]'"),
    ],
)
def test_a_probe_is_ok_only_for_a_200_naming_a_node_without_error(
    status: int, body: bytes, expected: str
) -> None:
    assert churnbench.verdict(status, body) == expected


# ---------------------------------------------------------------------------------------------
# Figures
# ---------------------------------------------------------------------------------------------


def block(kind: str, began: float, ended: float, **figures: float) -> Block:
    b = Block(kind, began, ended)
    b.schedext_cpu_s = figures.get("cpu", 0.0)
    b.events = int(figures.get("events", 0))
    b.stream_s = figures.get("stream", 0.0)
    return b


def test_probes_count_in_the_block_they_were_sent_in_and_only_if_ok() -> None:
    blocks = [block(IDLE, 10, 20), block(CHURN, 20, 32), block(IDLE, 32, 42)]
    records = [
        ProbeRecord(9.9, 100.0, 0.0, OK),  # warm-up: before the first block
        ProbeRecord(10.0, 1.0, 0.0, OK),
        ProbeRecord(19.99, 2.0, 0.0, OK),
        ProbeRecord(20.0, 3.0, 0.0, OK),  # a block starts where the last one ended
        ProbeRecord(25.0, 50.0, 0.0, "failed: HTTP 500"),
        ProbeRecord(31.0, 4.0, 0.0, "no node"),
        ProbeRecord(33.0, 5.0, 0.0, OK),
        ProbeRecord(42.0, 200.0, 0.0, OK),  # after the last
    ]
    assert churnbench.in_blocks(records, blocks) == {IDLE: [1.0, 2.0, 5.0], CHURN: [3.0]}


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        (
            [float(v) for v in range(100, 0, -1)],
            {"count": 100, "p50_ms": 50.0, "p90_ms": 90.0, "p99_ms": 99.0, "max_ms": 100.0,
             "mean_ms": 50.5},
        ),
        ([7.0], {"count": 1, "p50_ms": 7.0, "p90_ms": 7.0, "p99_ms": 7.0, "max_ms": 7.0,
                  "mean_ms": 7.0}),
        ([1.0, 2.0, 3.0, 40.0], {"count": 4, "p50_ms": 2.0, "p90_ms": 40.0, "p99_ms": 40.0,
                                 "max_ms": 40.0, "mean_ms": 11.5}),
    ],
)  # fmt: skip
def test_latency_figures_are_nearest_rank_percentiles(
    values: Sequence[float], expected: dict[str, float]
) -> None:
    assert churnbench.latency_figures(values) == expected


def test_latency_figures_of_no_probes_are_nan() -> None:
    figures = churnbench.latency_figures([])
    assert figures["count"] == 0
    assert all(math.isnan(figures[k]) for k in ("p50_ms", "p99_ms", "max_ms", "mean_ms"))


@pytest.mark.parametrize(
    ("numerator", "denominator", "expected"),
    [(3.0, 2.0, 1.5), (2.0, 3.0, 0.667), (1.0, 0.0, None), (math.nan, 1.0, None),
     (1.0, math.nan, None)],
)  # fmt: skip
def test_ratio(numerator: float, denominator: float, expected: float | None) -> None:
    assert churnbench.ratio(numerator, denominator) == expected


def test_churn_cpu_per_1000_events_is_charged_less_the_idle_rate() -> None:
    idle = [block(IDLE, 0, 10, cpu=0.5), block(IDLE, 30, 40, cpu=0.5)]  # 50 ms/s
    churn = [
        block(CHURN, 10, 30, cpu=3.0, events=2000, stream=10.0),
        block(CHURN, 40, 60, cpu=2.0, events=1000, stream=5.0),
    ]
    blocks = [idle[0], churn[0], idle[1], churn[1]]
    records = [ProbeRecord(t, float(t), 0.0, OK) for t in (1, 2, 11, 12, 13, 31, 41)]
    figures = churnbench.summarize(records, blocks)
    c = figures["conditions"][CHURN]
    # raw: 5 s for 3,000 events; net: less 40 s x 0.05 = 2 s, so 3 s for 3,000 events
    assert c["cpu_ms_per_1000_events_raw"] == pytest.approx(1666.7)
    assert c["cpu_ms_per_1000_events"] == pytest.approx(1000.0)
    assert c["events"] == 3000
    assert c["events_per_s"] == 200.0
    assert figures["conditions"][IDLE]["schedext_cpu_ms_per_s"] == 50.0
    assert "events" not in figures["conditions"][IDLE]
    assert figures["conditions"][IDLE]["filter"]["count"] == 3  # 1, 2, 31
    assert figures["conditions"][CHURN]["filter"]["count"] == 4  # 11, 12, 13, 41
    assert figures["ratios"] == {"p50": 6.0, "p99": 1.323}  # 12 / 2, 41 / 31
    rows = figures["blocks"]
    assert [(r["kind"], r["filter"]["count"], r["events"]) for r in rows] == [
        (IDLE, 2, 0), (CHURN, 3, 2000), (IDLE, 1, 0), (CHURN, 1, 1000)
    ]  # fmt: skip
    assert rows[1]["filter"]["max_ms"] == 13.0


def test_with_a_control_condition_the_ratios_compare_all_three() -> None:
    blocks = [
        block(IDLE, 0, 10),
        block(CHURN, 10, 20, cpu=1.0, events=100, stream=1.0),
        block(churnbench.CONTROL, 20, 30, cpu=0.5, events=100, stream=1.0),
    ]
    records = [ProbeRecord(t, ms, 0, OK) for t, ms in ((1, 2.0), (11, 8.0), (21, 4.0))]
    figures = churnbench.summarize(records, blocks)
    assert list(figures["conditions"]) == [IDLE, CHURN, churnbench.CONTROL]
    assert figures["ratios"] == {
        "p50": 4.0, "p99": 4.0,
        "control/idle p50": 2.0, "control/idle p99": 2.0,
        "churn/control p50": 2.0, "churn/control p99": 2.0,
    }  # fmt: skip
    assert churnbench.pooled([figures, figures])["ratios"] == figures["ratios"]


def test_pooled_runs_merge_the_probes_of_each_condition() -> None:
    blocks = [block(IDLE, 0, 10), block(CHURN, 10, 20, cpu=1.0, events=100, stream=1.0)]
    blocks[1].kinds = {CREATE: 25, PATCH: 50, DELETE: 25}
    runs = [
        churnbench.summarize([ProbeRecord(1, 1.0, 0, OK), ProbeRecord(11, 3.0, 0, OK)], blocks),
        churnbench.summarize([ProbeRecord(2, 2.0, 0, OK), ProbeRecord(12, 6.0, 0, OK)], blocks),
    ]
    runs[1]["conditions"][IDLE]["stage_sums"]["handler"] = [10, 0.02]
    runs[1]["conditions"][IDLE]["cpu_s"] = {"schedext": 0.5}
    merged = churnbench.pooled(runs)
    assert merged["conditions"][IDLE]["stages_mean_ms"]["handler"] == 2.0  # 20 ms / 10 calls
    assert merged["conditions"][IDLE]["stages_mean_ms"]["queue"] is None  # no such metric
    assert merged["conditions"][IDLE]["schedext_cpu_ms_per_s"] == 25.0  # 0.5 s in 20 s
    assert merged["conditions"][CHURN]["kinds"] == {CREATE: 50, DELETE: 50, PATCH: 100}
    assert merged["conditions"][IDLE]["filter"]["count"] == 2
    assert merged["conditions"][CHURN]["filter"]["max_ms"] == 6.0
    assert merged["conditions"][CHURN]["events"] == 200
    assert merged["ratios"]["p99"] == 3.0  # 6 / 2
    assert merged["probes"] == 4


@pytest.mark.parametrize(("churn_p99", "word"), [(15.0, "within"), (15.1, "OVER")])
def test_the_report_says_whether_the_ratio_meets_the_target(churn_p99: float, word: str) -> None:
    blocks = [block(IDLE, 0, 10), block(CHURN, 10, 20, cpu=1.0, events=100, stream=1.0)]
    run = churnbench.summarize(
        [ProbeRecord(1, 10.0, 0, OK), ProbeRecord(11, churn_p99, 0, OK)], blocks
    )
    args = churnbench._parser().parse_args([])
    report = {
        "params": churnbench._params(args),
        "cluster": {"nodes": 1000, "gpus": 6600, "pods": 10000, "churn_pods": 500},
        "by_tree": {"current": run},
        "total_s": 1.0,
    }
    text = churnbench.format_report(report)
    assert f"({word} the target <= 1.5x)" in text
    assert "current  churn" in text


# ---------------------------------------------------------------------------------------------
# Arguments
# ---------------------------------------------------------------------------------------------


def test_the_defaults_are_the_issues_figures() -> None:
    args = churnbench._parser().parse_args([])
    assert (args.nodes, args.pods, args.rate, args.probe_rate) == (1000, 10_000, 200.0, 50.0)
    assert (args.blocks, args.block_s, args.baseline) == (6, 10.0, None)
    churnbench.check_args(args)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--rate", "0"], "--rate must be > 0"),
        (["--probe-rate", "-1"], "--probe-rate must be > 0"),
        (["--blocks", "0"], "--blocks must be > 0"),
        (["--block-s", "0"], "--block-s must be > 0"),
        (["--churn-pods", "0"], "--churn-pods must be >= 1"),
        (["--gpu-fill", "1"], "--gpu-fill must be in"),
        (["--warmup-s", "-1"], "--warmup-s must be >= 0"),
    ],
)
def test_figures_no_run_can_have_are_refused(argv: list[str], message: str) -> None:
    args = churnbench._parser().parse_args(argv)
    with pytest.raises(ValueError, match=message):
        churnbench.check_args(args)


def test_a_plan_without_room_for_the_churn_is_a_usage_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        churnbench.main(["--nodes", "3", "--pods", "30", "--churn-pods", "100"])
    assert exit_info.value.code == 2
    assert "needs 200 free GPUs" in capsys.readouterr().err


def test_params_keep_paths_as_text() -> None:
    args = argparse.Namespace(baseline=churnbench.Path("/x"), rate=200.0)
    assert churnbench._params(args) == {"baseline": "/x", "rate": 200.0}


@pytest.mark.parametrize(
    ("others", "warned"), [(1.0, False), (6.0, False), (6.1, True), (19.0, True)]
)
def test_the_report_warns_when_other_processes_took_the_machine(
    others: float, warned: bool
) -> None:
    # 2 CPUs, 10 + 10 s of blocks: 40 CPU seconds, a warning past 15 % of them
    blocks = [block(IDLE, 0, 10), block(CHURN, 10, 20, cpu=1.0, events=100, stream=1.0)]
    blocks[0].cpu = {"others": others / 2, "wall": 10.0}
    blocks[1].cpu = {"others": others / 2, "wall": 10.0}
    run = churnbench.summarize([ProbeRecord(1, 1.0, 0, OK), ProbeRecord(11, 1.0, 0, OK)], blocks)
    report = {
        "machine": {"nproc": 2, "cpu_model": "test"},
        "params": churnbench._params(churnbench._parser().parse_args([])),
        "cluster": {"nodes": 1, "gpus": 8, "pods": 1, "churn_pods": 1},
        "runs": {"current": [run]},
        "by_tree": {"current": run},
        "total_s": 1.0,
    }
    assert churnbench.others_share(report) == pytest.approx(others / 40)
    assert ("WARNING: others took" in churnbench.format_report(report)) is warned
