"""API cost per shard, from the local control plane's audit log: writes and reads by resource,
heartbeats apart."""

from __future__ import annotations

from collections import Counter
from typing import Any

from testbed.kits import scheduler as schedulerkit
from testbed.kits.chart import worker_service_account

from benchmarks import audit, stats
from benchmarks.model import Section, Table, fmt, meets
from benchmarks.scenarios.context import (
    Context,
    spread_text,
)

WORKER_SERVICE_ACCOUNT = worker_service_account()


def api_cost(ctx: Context) -> Section:
    target = ctx.target
    section = Section(
        "cost",
        "API cost per shard (audit log)",
        "From the local control plane's audit log: requests in the run's namespace during the run, "
        "by writer, verb and resource[/subresource], divided by the shards (Job: completions). The "
        "benchmark's own polls are left out. 'Lifecycle' counts what belongs to one shard (its Shard "
        "and status, Lease, result ConfigMaps) by the e2e suite's rule; 'all' adds worker "
        "Jobs, their pods, the Campaign's status and Events, and reads.",
    )
    if target.cluster.audit_log is None:
        section.notes.append("Not measured: the audit log exists only on the local control plane.")
        for figure, bound in (
            ("writes per shard lifecycle, heartbeats excluded", "<= 8"),
            ("writes per heartbeat", "<= 2"),
        ):
            section.check(figure, "n/a", bound, None)
        return section
    namespaces = {pair[0].namespace for pairs in ctx.versus_runs.values() for pair in pairs}
    entries = audit.load(target.cluster.audit_log, namespaces)
    summary = []
    per_case: dict[str, dict[str, Any]] = {}
    for key, pairs in ctx.versus_runs.items():
        ours, job = pairs[0]
        shards = ctx.shard_objects.get(f"{ours.namespace}/{ours.name}", [])
        window = ours.window
        cost = audit.cost(entries, ours.namespace, window, max(ours.completed, 1))
        # The namespace's idle operator (it watches, even with no Campaign) is not the Job's cost.
        job_cost = audit.cost(
            entries,
            job.namespace,
            job.window,
            max(job.completed, 1),
            exclude=frozenset({"operator", "worker"}),
        )
        life = audit.lifecycle(audit.in_window(entries, window), shards)
        per_case[key] = {"cost": cost, "job": job_cost, "life": life}
        summary.append(
            [
                key,
                fmt(life.without_heartbeats if life else None),
                fmt(life.heartbeats if life else None),
                fmt(life.beats if life else None),
                fmt(cost.writes_per_unit),
                fmt(cost.reads_per_unit),
                fmt(job_cost.writes_per_unit),
                fmt(job_cost.reads_per_unit),
            ]
        )
        section.tables.append(_cost_table(f"{key}: shardops, per shard", cost))
        section.tables.append(_cost_table(f"{key}: Indexed Job, per completion", job_cost))
    section.tables.insert(
        0,
        Table(
            "per shard (first repeat of each case)",
            [
                "case",
                "lifecycle writes w/o heartbeats",
                "heartbeat writes",
                "heartbeats",
                "all writes",
                "all reads",
                "Job writes / item",
                "Job reads / item",
            ],
            summary,
        ),
    )
    base = per_case.get("zero") or per_case.get("1s")
    life = base["life"] if base else None
    section.check(
        "API writes per shard lifecycle, heartbeats excluded (zero-work run)",
        fmt(life.without_heartbeats if life else None),
        "<= 8",
        meets(life.without_heartbeats if life else None, 8, at_least=False),
        life.without_heartbeats if life else None,
    )
    beat = per_case.get("5s")
    no_beat = per_case.get("1s")
    per_heartbeat = None
    if beat and no_beat and beat["life"] and no_beat["life"] and beat["life"].beats:
        with_beats, without = _worker_writes(beat["life"]), _worker_writes(no_beat["life"])
        per_heartbeat = (with_beats - without) / beat["life"].beats
        section.notes.append(
            f"Writes per heartbeat = (the worker's writes per shard with heartbeats {with_beats:.2f} - "
            f"without {without:.2f}) / {beat['life'].beats:.2f} heartbeats per shard (5 s case vs 1 s case)."
        )
    section.check(
        "API writes per heartbeat",
        fmt(per_heartbeat),
        "<= 2",
        meets(per_heartbeat, 2, at_least=False),
        per_heartbeat,
    )
    ctx.plots.cost(per_case)
    section.plots.append("cost.png")
    section.data["per_case"] = {
        key: {
            "writes_per_shard": v["cost"].writes_per_unit,
            "reads_per_shard": v["cost"].reads_per_unit,
            "job_writes_per_item": v["job"].writes_per_unit,
        }
        for key, v in per_case.items()
    }
    # Efficiency: achieved / (write limit / all writes one shard costs).
    zero = per_case.get("zero")
    if zero and ctx.write_rate:
        runs = [pair[0] for pair in ctx.versus_runs["zero"]]
        achieved = stats.spread([r.throughput for r in runs])
        writes = zero["cost"].writes_per_unit
        best = ctx.write_rate / writes if writes else None
        efficiency = stats.ratio(achieved.median if achieved else None, best)
        section.notes.append(
            f"Best possible shards/s = write limit {ctx.write_rate:.0f} writes/s / {writes:.1f} writes per "
            f"shard = {fmt(best)} shards/s; achieved {spread_text(achieved, 2)} shards/s."
        )
        section.check(
            "efficiency: zero-work shards/s / (write limit / writes per shard)",
            fmt(efficiency * 100 if efficiency is not None else None, 1, " %"),
            ">= 50 %",
            meets(efficiency, 0.5),
            efficiency,
        )
    return section


def _worker_writes(life: schedulerkit.LifecycleWrites) -> float:
    worker = f"{WORKER_SERVICE_ACCOUNT} "
    return float(sum(count for key, count in life.breakdown.items() if key.startswith(worker)))


def _cost_table(title: str, cost: audit.Cost) -> Table:
    rows = []
    units = max(cost.units, 1)
    combined: Counter[tuple[str, str, str]] = Counter()
    combined.update(cost.writes)
    for key, count in sorted(combined.items(), key=lambda kv: -kv[1]):
        rows.append(["write", *key, f"{count / units:.2f}"])
    for key, count in sorted(cost.reads.items(), key=lambda kv: -kv[1]):
        rows.append(["read", *key, f"{count / units:.2f}"])
    rows.append(["total", "", "", "writes", f"{cost.writes_per_unit:.2f}"])
    rows.append(["total", "", "", "reads", f"{cost.reads_per_unit:.2f}"])
    return Table(title, ["kind", "who", "verb", "resource", "per unit"], rows)
