"""The benchmark harness (`make bench`) on tiny sizes: it runs every kind of run it has against the
session's cluster and writes a well-formed RESULTS.md, results.json and figures. No speed target is
asserted here: the figures are reported by `make bench`, never pass/fail."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from benchmarks.__main__ import run
from benchmarks.plan import SMOKE
from benchmarks.target import for_cluster
from testbed.harness import Cluster

pytestmark = pytest.mark.usefixtures("crds_installed")


def test_bench_harness_writes_a_well_formed_report(cluster: Cluster, tmp_path: Path) -> None:
    target = for_cluster(cluster, tmp_path / "work")
    try:
        sections = run(target, SMOKE, tmp_path / "out", "pytest e2e/test_bench_smoke.py")
    finally:
        for namespace in target.namespaces:
            target.delete_namespace(namespace)
    out = tmp_path / "out"
    assert [s.error for s in sections if s.error] == []
    by_key = {s.key: s for s in sections}
    assert {"physical", "versus", "cost", "latency", "scale", "failing", "profiles"} <= set(by_key)

    # Every run of the smoke set finished, and every figure has a value and a target.
    results = json.loads((out / "results.json").read_text())
    assert results["facts"]["about"]["git revision"]
    checks = [c for s in results["sections"] for c in s["checks"]]
    assert checks and all(c["figure"] and c["value"] and c["target"] for c in checks)
    assert all(rate > 0 for rate in by_key["physical"].data["write_rates"])
    scale = next(t for t in by_key["scale"].tables if t.title == "scale runs")
    # The zero-work run of the comparison starts the curve; then the smoke's own scale campaign.
    assert [row[1] for row in scale.rows] == ["3/3", "2/2"], scale.rows
    # One shard in ten failed non-retryably, the rest succeeded; the Campaign's size was sampled.
    failing = by_key["failing"].tables[0]
    assert [row[1] for row in failing.rows] == ["9 done, 1 failed of 10"], failing.rows
    tiny = by_key["failing"].data["tiny-failing"]
    assert tiny["campaign_bytes_max"] > 1000 and tiny["samples"], tiny
    throughput = by_key["versus"].tables[0]
    assert throughput.rows and throughput.rows[0][4] != "n/a", throughput.rows

    text = (out / "RESULTS.md").read_text()
    for section in sections:
        assert f"## {section.title}" in text
    assert "## Summary" in text and "every figure against its target" in text
    for plot in ("versus.png", "running.png", "deciles.png", "objects.png"):
        assert (out / plot).stat().st_size > 1000, plot
    if cluster.local is not None:
        # The audit log and the processes are there: API cost and a profile were measured.
        cost = by_key["cost"].data["per_case"]["zero"]
        assert cost["writes_per_shard"] > 0 and cost["job_writes_per_item"] > 0
        assert (out / "cost.png").exists()
        # The processes' CPU was sampled with the objects: the scale run's table of it per decile.
        cpu_tables = [t for t in by_key["scale"].tables if "where the CPU went" in t.title]
        assert len(cpu_tables) == 1, [t.title for t in by_key["scale"].tables]
        assert cpu_tables[0].rows and cpu_tables[0].rows[0][0] == "the machine (all processes)"
        # py-spy attached to a live operator or worker process (busy or not, it was profiled).
        profiles = by_key["profiles"].data["profiles"]
        assert any(p["error"] is None for p in profiles), profiles
