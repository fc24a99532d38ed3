"""The shipped monitoring (manifests/monitoring/: the PrometheusRule, the Grafana dashboard)
cannot drift from the code: every metric an alert or a panel reads is one that schedext or
its node agent exports, as their real registries describe them (a counter's ``_total`` and
``_created``, a histogram's ``_bucket``, ``_sum``, ``_count``); every alert carries a
``for``, a severity and its annotations; the filter alert's budget is kube-scheduler's
httpTimeout for the extender, and a latency bucket bound, so that a quantile can cross it."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from app.agent.probes import AgentState, metrics_registry
from app.kube.readiness import Readiness
from app.service.metrics import Metrics
from extender.scheduler import Scheduler
from tests.quality.promql import PromQLError, metric_names

pytestmark = pytest.mark.quality

ROOT = Path(__file__).resolve().parents[2]
MONITORING = ROOT / "manifests" / "monitoring"
RULES = MONITORING / "prometheusrule.yaml"
DASHBOARD = MONITORING / "grafana-dashboard.json"
SCHEDULER_CONFIG = ROOT / "manifests" / "scheduler-config.yaml"
# Series Prometheus makes itself for every target (scrape health), not schedext's.
PROMETHEUS_SERIES = frozenset({"up"})
# The series a metric family of each type exposes, by suffix of the family's name.
SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "summary": ("", "_sum", "_count", "_created"),
    "gaugehistogram": ("_bucket", "_gsum", "_gcount"),
    "info": ("_info",),
}
FILTER_BUDGET_ALERT = "SchedextFilterOverHttpTimeout"


def registries() -> list[CollectorRegistry]:
    """The extender's registry, its inventory collectors over a real (empty) scheduler, and
    the node agent's."""
    metrics = Metrics(Scheduler, Readiness())
    agent = AgentState(ready=lambda: True, gpus=lambda: (), writes=lambda: 0)
    return [metrics.registry, metrics_registry(agent)]


def exported_names() -> set[str]:
    names: set[str] = set()
    for registry in registries():
        for family in registry.collect():
            names.update(family.name + suffix for suffix in SUFFIXES.get(family.type, ("",)))
            names.update(sample.name for sample in family.samples)
    return names


def rules(document: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """The alerting rules of the PrometheusRule file, or of ``document`` (the chart's)."""
    if document is None:
        (document,) = [d for d in yaml.safe_load_all(RULES.read_text()) if d]
    assert (document["apiVersion"], document["kind"]) == (
        "monitoring.coreos.com/v1",
        "PrometheusRule",
    )
    return [rule for group in document["spec"]["groups"] for rule in group["rules"]]


def filter_budget(found: list[dict[str, Any]]) -> float:
    """The seconds past which the filter alert of ``found`` fires: its expression's last
    comparison."""
    (rule,) = [r for r in found if r["alert"] == FILTER_BUDGET_ALERT]
    match = re.search(r">\s*([0-9.]+)\s*$", rule["expr"])
    assert match is not None, rule["expr"]
    return float(match[1])


def dashboard() -> dict[str, Any]:
    return dict(json.loads(DASHBOARD.read_text()))


def panels() -> list[dict[str, Any]]:
    return [p for p in dashboard()["panels"] if p["type"] != "row"]


# Grafana's label_values(<selector>, <label>): not PromQL itself; its selector is.
_LABEL_VALUES = re.compile(r"^label_values\((?P<selector>.*),\s*(?P<label>\w+)\)$")


def template_selectors() -> Iterator[tuple[str, str]]:
    for variable in dashboard()["templating"]["list"]:
        if variable["type"] != "query":
            continue
        query = variable["query"]
        text = query["query"] if isinstance(query, dict) else query
        match = _LABEL_VALUES.match(text)
        assert match is not None, f"${variable['name']}: a query the test cannot read: {text}"
        yield variable["name"], match["selector"]


def expressions() -> list[Any]:
    """One param per PromQL expression of both files."""
    found = [pytest.param(rule["expr"], id=f"rule:{rule['alert']}") for rule in rules()]
    for panel in panels():
        for target in panel["targets"]:
            found.append(
                pytest.param(target["expr"], id=f"panel:{panel['title']}:{target['refId']}")
            )
    found += [
        pytest.param(selector, id=f"variable:{name}") for name, selector in template_selectors()
    ]
    return found


def unknown_metrics(expression: str, exported: set[str]) -> set[str]:
    return metric_names(expression) - exported - PROMETHEUS_SERIES


@pytest.fixture(scope="module")
def exported() -> set[str]:
    return exported_names()


@pytest.mark.parametrize(
    ("expression", "names"),
    [
        pytest.param("up", {"up"}, id="a bare name"),
        pytest.param(
            'rate(schedext_decisions_total{verb="bind",outcome=~"failed|error"}[5m])',
            {"schedext_decisions_total"},
            id="label names and values and the range are not metrics",
        ),
        pytest.param(
            "sum by (model, le) (rate(a_bucket[$__rate_interval])) / ignoring(le) b",
            {"a_bucket", "b"},
            id="grouping and matching label lists are not metrics",
        ),
        pytest.param(
            "histogram_quantile(0.99, sum without (pod) (rate(x[5m]))) > bool 30",
            {"x"},
            id="functions, aggregations, keywords and numbers are not metrics",
        ),
        pytest.param(
            "x * on(instance) group_left(node) y offset 5m and z @ start()",
            {"x", "y", "z"},
            id="group_left's list, offset, the @ modifier",
        ),
        pytest.param(
            'max_over_time(deriv(g[10m])[1h:5m]) or {__name__="h", job="$job"}',
            {"g", "h"},
            id="subqueries and a __name__ matcher",
        ),
        pytest.param(
            "SUM BY (model) (m) # a comment naming not_a_metric\n AND n",
            {"m", "n"},
            id="keywords in capitals and comments",
        ),
        pytest.param(
            'label_replace(k, "dst", "$1", "src", "(.*)") - absent(v == 1)',
            {"k", "v"},
            id="strings are skipped",
        ),
    ],
)
def test_the_tokenizer_reads_only_metric_names(expression: str, names: set[str]) -> None:
    assert metric_names(expression) == names


@pytest.mark.parametrize("expression", ["sum(rate(x[5m])", "x{job='a'", "x[5m", "x)", "x ? y"])
def test_a_broken_expression_is_refused_not_read_as_naming_nothing(expression: str) -> None:
    with pytest.raises(PromQLError):
        metric_names(expression)


def test_the_registries_describe_each_type_with_its_suffixes(exported: set[str]) -> None:
    """The base of the drift check: a counter, a histogram and gauges of both processes."""
    assert {
        "schedext_decisions_total",
        "schedext_request_duration_seconds_bucket",
        "schedext_request_duration_seconds_count",
        "schedext_inventory_gpus_free",
        "schedext_ip_pool_free",
        "schedext_quota_max",
        "schedext_inventory_synced",
        "schedext_leader",
        "schedext_agent_gpus",
    } <= exported
    assert "schedext_decisions" not in exported  # a counter is read by its _total


@pytest.mark.parametrize("expression", expressions())
def test_every_metric_an_alert_or_panel_reads_is_exported(
    expression: str, exported: set[str]
) -> None:
    assert metric_names(expression), f"reads no metric: {expression}"
    unknown = unknown_metrics(expression, exported)
    assert not unknown, f"not exported by schedext or its agent: {sorted(unknown)} in {expression}"


def test_the_gang_holds_row_reads_what_the_service_exports(exported: set[str]) -> None:
    """Holds standing, free GPUs idle under them, their events and the gangs' wait: the
    panels below the row, each reading one of them, all in the service's registry."""
    found = dashboard()["panels"]
    (row,) = [i for i, p in enumerate(found) if p["type"] == "row" and p["title"] == "Gang holds"]
    below = found[row + 1 :]
    below = below[: next((i for i, p in enumerate(below) if p["type"] == "row"), len(below))]
    # schedext_leader: a gauge of the leader's alone (its review keeps the holds)
    read = [
        set().union(*(metric_names(t["expr"]) for t in p["targets"])) - {"schedext_leader"}
        for p in below
    ]
    wanted = {
        "schedext_gang_holds",
        "schedext_gang_hold_idle_gpus",
        "schedext_gang_hold_events_total",
        "schedext_gang_wait_seconds_bucket",
    }
    assert set().union(*read) == wanted
    assert all(len(names) == 1 for names in read)  # one question per panel
    assert wanted <= exported
    assert row > max(i for i, p in enumerate(found) if p["title"] == "Team quotas")


def test_a_metric_renamed_in_a_query_is_caught(exported: set[str]) -> None:
    """The check above cannot pass vacuously: one metric renamed in the rule file's text."""
    text = RULES.read_text().replace("schedext_ip_pool_free", "schedext_ip_pool_available")
    (document,) = [d for d in yaml.safe_load_all(text) if d]
    found = set().union(
        *(
            unknown_metrics(rule["expr"], exported)
            for group in document["spec"]["groups"]
            for rule in group["rules"]
        )
    )
    assert found == {"schedext_ip_pool_available"}


def _seconds(duration: str) -> float:
    """A Prometheus or Go duration of one unit (``30s``, ``10m``) in seconds."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s|m|h)", duration)
    assert match is not None, f"not a simple duration: {duration!r}"
    scale = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}[match[2]]
    return float(match[1]) * scale


def test_every_alert_waits_a_while_and_says_what_and_why() -> None:
    names = [rule["alert"] for rule in rules()]
    assert len(names) == len(set(names)), "alert names repeat"
    for rule in rules():
        assert 60 <= _seconds(rule["for"]) <= 3600, rule["alert"]
        assert rule["labels"]["severity"] in ("warning", "critical"), rule["alert"]
        assert rule["annotations"]["summary"].strip(), rule["alert"]
        assert len(rule["annotations"]["description"].split()) >= 8, rule["alert"]


def test_the_alerts_cover_what_an_operator_must_hear_about() -> None:
    read = {name for rule in rules() for name in metric_names(rule["expr"])}
    assert {
        "up",
        "schedext_inventory_synced",
        "schedext_leader",
        "schedext_decisions_total",
        "schedext_request_duration_seconds_bucket",
        "schedext_inventory_gpus_unhealthy",
        "schedext_ip_pool_free",
        "schedext_gang_events_total",
    } <= read


def test_the_filter_budget_is_kube_schedulers_http_timeout_and_a_bucket_bound() -> None:
    config = yaml.safe_load(SCHEDULER_CONFIG.read_text())
    (extender,) = config["extenders"]
    budget = _seconds(extender["httpTimeout"])
    (rule,) = [r for r in rules() if r["alert"] == FILTER_BUDGET_ALERT]
    assert filter_budget(rules()) == budget, f"{FILTER_BUDGET_ALERT} should fire past {budget} s"
    assert 'verb="filter"' in rule["expr"]
    assert f"{budget:g} s" in rule["annotations"]["summary"]
    # A quantile resolves only between bucket bounds: the budget must be one, with one above.
    metrics = Metrics(lambda: None)
    metrics.observe("filter", "feasible", 0.001)
    bounds = {
        float(sample.labels["le"])
        for family in metrics.registry.collect()
        if family.name == "schedext_request_duration_seconds"
        for sample in family.samples
        if sample.name.endswith("_bucket")
    }
    assert budget in bounds
    assert max(b for b in bounds if b != float("inf")) > budget


def test_the_dashboard_panels_each_read_prometheus_and_do_not_overlap() -> None:
    board = dashboard()
    assert board["uid"] == "schedext"
    # The jobs the PodMonitors set (and the scrape job of docs/deploy.md), overridable on the board.
    jobs = {v["name"]: v["query"] for v in board["templating"]["list"] if v["type"] == "textbox"}
    assert jobs == {"job": "schedext", "agent_job": "schedext-agent"}
    everything = board["panels"]
    ids = [p["id"] for p in everything]
    assert len(ids) == len(set(ids)), "panel ids repeat"
    taken: set[tuple[int, int]] = set()
    for panel in everything:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        cells = {
            (x, y)
            for x in range(grid["x"], grid["x"] + grid["w"])
            for y in range(grid["y"], grid["y"] + grid["h"])
        }
        assert not cells & taken, f"{panel['title']} overlaps another panel"
        taken |= cells
    for panel in panels():
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        refs = [t["refId"] for t in panel["targets"]]
        assert refs, panel["title"]
        assert len(refs) == len(set(refs)), panel["title"]


def _documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


@pytest.mark.parametrize(
    ("monitor", "job", "port", "shipped"),
    [
        pytest.param(
            "schedext",
            "schedext",
            "metrics",
            ("sidecar/deploy-sidecar.yaml", "mtls/deploy-mtls.yaml"),
            id="extender",
        ),
        pytest.param("schedext-agent", "schedext-agent", "probes", ("agent.yaml",), id="agent"),
    ],
)
def test_each_pod_monitor_sets_the_job_the_alerts_select_and_scrapes_a_shipped_port(
    monitor: str, job: str, port: str, shipped: tuple[str, ...]
) -> None:
    monitors = {m["metadata"]["name"]: m for m in _documents(MONITORING / "podmonitors.yaml")}
    spec = monitors[monitor]["spec"]
    (endpoint,) = spec["podMetricsEndpoints"]
    relabeled = [r["replacement"] for r in endpoint["relabelings"] if r.get("targetLabel") == "job"]
    assert relabeled == [job]
    assert endpoint["port"] == port
    selected_jobs = set(re.findall(r'job="([^"]+)"', RULES.read_text()))
    assert job in selected_jobs
    assert selected_jobs <= {
        m["spec"]["podMetricsEndpoints"][0]["relabelings"][0]["replacement"]
        for m in monitors.values()
    }
    # In each shipped deployment mode, a pod the monitor selects, in its namespace, names the port.
    wanted = spec["selector"]["matchLabels"].items()
    namespace = monitors[monitor]["metadata"]["namespace"]
    for name in shipped:
        ports = [
            p.get("name")
            for doc in _documents(ROOT / "manifests" / name)
            if doc["kind"] in ("Deployment", "DaemonSet")
            and doc["metadata"]["namespace"] == namespace
            and wanted <= doc["spec"]["template"]["metadata"]["labels"].items()
            # Sidecar mode's schedext is a native sidecar (an init container); Prometheus'
            # pod discovery lists init containers' ports too.
            for kind in ("initContainers", "containers")
            for container in doc["spec"]["template"]["spec"].get(kind, [])
            for p in container.get("ports", [])
        ]
        assert port in ports, f"no pod of {name} selected by PodMonitor {monitor} has port {port}"
