"""The chart's Grafana dashboard (charts/shardops/dashboards/shardops.json) queries only what
shardops exports: every metric an expression names is a sample name of the operator's registry or of
the worker runtime's, and every label it selects or groups by is one of that metric's labels."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.metrics import MetricWrapperBase

from shardops.scheduler.metrics import Metrics
from shardops.worker.metrics import WorkerMetrics

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = json.loads((ROOT / "charts" / "shardops" / "dashboards" / "shardops.json").read_text())
METRIC = re.compile(r"\b(shardops_[a-zA-Z0-9_]+)")
# Labels every Prometheus series has besides its own (from the scrape), and histogram buckets' `le`.
SCRAPE_LABELS = {"job", "instance", "namespace", "pod", "service", "endpoint", "container"}
SUFFIXES = {
    "counter": ("_total", "_created"),
    "gauge": ("",),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
}


def exported() -> dict[str, set[str]]:
    """Sample name -> its label names, for every shardops_ metric of the operator's and the workers'
    registries (the two processes Prometheus scrapes)."""
    names: dict[str, set[str]] = {}
    registries = (Metrics().registry, WorkerMetrics("namespace/campaign").registry)
    for collector in (c for registry in registries for c in registry._collector_to_names):
        assert isinstance(collector, MetricWrapperBase)
        kind = collector._type
        labels = set(collector._labelnames)
        for suffix in SUFFIXES[kind]:
            names[collector._name + suffix] = labels | ({"le"} if suffix == "_bucket" else set())
    return names


def expressions() -> Iterator[tuple[str, str]]:
    """(panel title, expression) of every query of the dashboard, rows' nested panels included."""

    def walk(panels: list[dict[str, Any]]) -> Iterator[tuple[str, str]]:
        for panel in panels:
            for target in panel.get("targets") or []:
                yield panel["title"], target["expr"]
            yield from walk(panel.get("panels") or [])

    yield from walk(DASHBOARD["panels"])
    for variable in DASHBOARD["templating"]["list"]:
        query = variable.get("query")
        if isinstance(query, dict):
            yield f"variable {variable['name']}", query["query"]


EXPRESSIONS = list(expressions())


def test_the_dashboard_has_the_panels_users_expect() -> None:
    titles = {panel["title"] for panel in DASHBOARD["panels"]}
    for wanted in (
        "Progress",
        "Throughput",
        "Running, and what limits dispatch",
        "Pending, and the oldest pending age",
        "Failures by error class",
        "Circuit breakers",
        "Budget",
        "Worker claims and lost races",
        "Worker heartbeats",
        "Command duration (p50, p99)",
        "Fenced runs",
    ):
        assert wanted in titles
    ids = [panel["id"] for panel in DASHBOARD["panels"]]
    assert len(ids) == len(set(ids)), "panel ids are unique"
    assert all(panel.get("targets") for panel in DASHBOARD["panels"] if panel["type"] != "row")


@pytest.mark.parametrize(("panel", "expr"), EXPRESSIONS, ids=[f"{p}: {e[:40]}" for p, e in EXPRESSIONS])
def test_every_expression_references_exported_metrics_and_labels(panel: str, expr: str) -> None:
    names = exported()
    used = METRIC.findall(expr)
    assert used, f"{panel}: {expr} names no shardops_ metric"
    for metric in used:
        assert metric in names, f"{panel}: {metric} is not exported (exported: {sorted(names)})"
    labels = set().union(*(names[m] for m in used)) | SCRAPE_LABELS
    selected = {m.group(1) for m in re.finditer(r"([a-z_]+)\s*(?:=~|!~|!=|=)\s*\"", expr)}
    grouped = {
        label.strip()
        for m in re.finditer(r"\b(?:by|without)\s*\(([^)]*)\)", expr)
        for label in m.group(1).split(",")
        if label.strip()
    }
    assert selected | grouped <= labels, (
        f"{panel}: labels {sorted((selected | grouped) - labels)} not on {used}"
    )


def test_the_campaign_variable_and_datasource_are_used() -> None:
    variables = {v["name"] for v in DASHBOARD["templating"]["list"]}
    assert variables == {"datasource", "campaign"}
    campaign_metrics = {m for _, e in EXPRESSIONS if "$campaign" in e for m in METRIC.findall(e)}
    assert "shardops_shards" in campaign_metrics
    for panel in DASHBOARD["panels"]:
        if panel["type"] != "row":
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}


def test_every_worker_metric_is_on_the_dashboard() -> None:
    """The worker's figures exist to be seen: each shardops_worker_ metric is on some panel."""
    on_dashboard = {m for _, e in EXPRESSIONS for m in METRIC.findall(e)}
    worker = {
        c._name
        for c in WorkerMetrics("namespace/campaign").registry._collector_to_names
        if isinstance(c, MetricWrapperBase)
    }
    assert worker, "the worker registry has metrics"
    missing = {name for name in worker if not any(m.startswith(name) for m in on_dashboard)}
    assert not missing, f"worker metrics on no panel: {sorted(missing)}"
