"""The scale curve: one campaign per size, its cost per shard by decile and its objects over time."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from typing import Any

from testbed.kits import scheduler as schedulerkit

from benchmarks import cpu, profiling, stats
from benchmarks.model import Section, Table, fmt, meets
from benchmarks.plan import Failing, Scale
from benchmarks.runs import (
    Run,
    campaign_manifest,
    peak_counts,
    run_campaign,
)
from benchmarks.scenarios.context import (
    Context,
    numbered_items,
)
from shardops.api.campaign import CampaignSpec
from shardops.api.common import JSON
from shardops.k8s.api import CONFIGMAPS

BACKLOG_RATIO = int(CampaignSpec.model_fields["backlog_ratio"].default)
# The operator's memory a campaign of many items may take (the scale work's target).
OPERATOR_RSS_TARGET_MIB = 200


def window_bound(max_concurrency: int) -> int:
    """Objects of one kind a campaign without failures may keep alive: its pending backlog and its
    running shards (backlogRatio x maxConcurrency + maxConcurrency)."""
    return BACKLOG_RATIO * max_concurrency + max_concurrency


def compact_item(number: int, shard_size: int) -> JSON:
    """Item `number` of `compact_items`: its index when it starts a shard, else its position in it."""
    return {"": number if number % shard_size == 0 else number % shard_size}


def compact_items(count: int, shard_size: int) -> list[JSON]:
    """`count` items that fit one ConfigMap (1 MiB) as JSONL even at 100,000: the first item of
    each shard carries the item's index, the others their position in the shard. Every shard's
    item list differs (so every shard has its own idempotency key) and no shard holds two equal
    items (so every item runs)."""
    return [compact_item(n, shard_size) for n in range(count)]


def jsonl(items: Iterable[JSON]) -> str:
    """Items as JSONL, compactly (no spaces): what a ConfigMap or an S3 object of items holds."""
    return "\n".join(json.dumps(item, separators=(",", ":")) for item in items)


def scale(ctx: Context) -> Section:
    plan = ctx.plan
    section = Section(
        "scale",
        "Scale curve",
        "One campaign per size, zero work, maxConcurrency 20, each with its own operator and "
        "namespace. Throughput per decile: the completed shards in completion order, split into ten "
        "equal parts, each part's shards / its time (a flat line is the goal). Sampled every "
        f"{plan.sample_every:g} s: live objects per kind in the namespace and the operator's RSS; peak "
        "RSS is the kernel's high-water mark (VmHWM). etcd's size is apiserver_storage_size_bytes. "
        "A run that reaches its budget is suspended and reported with what it completed.",
    )
    curves: dict[str, list[float]] = {}
    summary = []
    object_series: dict[str, Any] = {}
    entries: list[tuple[str, Run, int, dict[str, Any], Scale | None]] = []
    zero = ctx.versus_runs.get("zero")
    if zero:
        first = zero[0][0]
        bound = window_bound(first.max_concurrency)
        label = f"{first.total} one-item shards (the zero-work run against the Indexed Job)"
        entries.append((label, first, bound, {}, None))
    for index, case in enumerate(plan.scale):
        budget = max(
            min(case.budget, plan.scale_min_budget), ctx.budget(case.budget, len(plan.scale) - index)
        )
        result = _scale_case(ctx, case, section, budget)
        entries.append((case.label, result["run"], result["bound"], result, case))
    for label, run, bound, result, case in entries:
        deciles = stats.decile_rates(run.started, run.completions)
        curves[label] = deciles
        object_series[label] = (run, bound)
        last_vs_first = stats.ratio(deciles[-1], deciles[0]) if len(deciles) >= 2 else None
        peaks = peak_counts(run.samples)
        over = {k: v for k, v in peaks.items() if v > bound}
        stopped = "" if run.finished else f" (stopped at {run.completed}/{run.total})"
        summary.append(
            [
                label,
                f"{run.completed}/{run.total}"
                + ("" if run.finished else f" (budget {run.budget_seconds:.0f} s)"),
                f"{run.seconds:.0f}",
                f"{run.throughput:.2f}",
                " ".join(f"{d:.1f}" for d in deciles),
                fmt(last_vs_first),
                fmt(run.operator_peak_rss / 2**20 if run.operator_peak_rss else None, 0),
                fmt(run.operator_cpu, 0),
                ", ".join(f"{k} {v}" for k, v in peaks.items()),
                _mib(result.get("etcd_before")) + " -> " + _mib(result.get("etcd_after")),
            ]
        )
        if case is None:
            continue  # no target of its own: it shows where the curve starts
        section.check(
            f"last decile / first decile ({label})",
            fmt(last_vs_first) + stopped,
            ">= 0.9",
            meets(last_vs_first, 0.9) if run.finished else False,
            last_vs_first,
        )
        if case.shard_size > 1:
            rss = run.operator_peak_rss / 2**20 if run.operator_peak_rss else None
            section.check(
                f"operator peak RSS ({label})",
                fmt(rss, 0, " MiB")
                + (f" (stopped at {run.completed}/{run.total} shards)" if stopped else ""),
                f"<= {OPERATOR_RSS_TARGET_MIB} MiB",
                meets(rss, OPERATOR_RSS_TARGET_MIB, at_least=False),
                rss,
            )
        section.check(
            f"objects alive <= backlogRatio x maxConcurrency + maxConcurrency + needing a person ({label})",
            ", ".join(f"{k} {v}" for k, v in over.items()) or f"all kinds <= {bound}",
            f"<= {bound} per kind at every sample",
            not over if run.samples else None,
        )
    section.tables.insert(
        0,
        Table(
            "scale runs",
            [
                "campaign",
                "done",
                "s",
                "shards/s",
                "shards/s per decile",
                "last/first decile",
                "operator peak RSS MiB",
                "operator CPU s",
                "peak objects alive",
                "etcd MiB before -> after",
            ],
            summary,
        ),
    )
    for label, run, _, _, case in entries:
        if case is not None:
            table = _cpu_by_decile(label, run)
            if table is not None:
                section.tables.append(table)
    ctx.plots.deciles(curves)
    ctx.plots.objects(object_series)
    section.plots += ["deciles.png", "objects.png"]
    return section


def _cpu_by_decile(label: str, run: Run) -> Table | None:
    """Cores busy per kind of process in each decile of `run` (benchmarks.cpu): what the machine
    spent its CPU on while the decile's shards completed, so a decile that is slower than the others
    shows what grew. None without CPU samples (not the local control plane)."""
    # Every sample, the first too: it holds nothing, it is the baseline of the second.
    samples = [(s.at, s.cpu) for s in run.samples]
    spans = [(begin, end) for begin, end, _ in stats.decile_spans(run.started, run.completions)]
    if not any(cpu for _, cpu in samples) or not spans:
        return None
    cores = cpu.cores_by_span(samples, spans)
    rows = [
        [kind, *(fmt(value, 2) for value in values)]
        for kind, values in cores.items()
        if any(value is not None and value >= 0.01 for value in values)
    ]
    return Table(
        f"{label}: where the CPU went in each decile (cores busy; this machine has {os.cpu_count()})",
        ["process", *(f"d{n}" for n in range(1, len(spans) + 1))],
        rows,
    )


def _mib(value: int | None) -> str:
    return fmt(value / 2**20 if value is not None else None, 1)


def run_sized(
    ctx: Context,
    namespace: str,
    name: str,
    case: Scale | Failing,
    operator: schedulerkit.Operator,
    budget: float,
    source: JSON,
    spec: JSON | None = None,
    **measure: bool,
) -> Run:
    """A zero-work campaign of `case`'s size and maxConcurrency, its items from `source`, `spec` added
    to its spec, run to its end or `budget` under `operator` and sampled every plan.sample_every
    seconds with its objects counted; `measure`: run_campaign's other measures (count_cpu,
    measure_campaign, measure_workers)."""
    manifest = campaign_manifest(
        name,
        image=ctx.target.image,
        shard_size=case.shard_size,
        max_concurrency=case.max_concurrency,
        **source,
        **(spec or {}),
    )
    return run_campaign(
        ctx.target,
        namespace,
        manifest,
        expected_shards=-(-case.items // case.shard_size),
        budget=budget,
        operator=operator,
        sample_every=ctx.plan.sample_every,
        count_objects=True,
        **measure,
    )


def _scale_case(ctx: Context, case: Scale, section: Section, budget: float) -> dict[str, Any]:
    target, plan = ctx.target, ctx.plan
    namespace = target.namespace(f"bench-scale-{case.key.lower()}")
    name = f"scale-{case.key.lower()}"
    etcd_before = target.etcd_bytes()
    with target.operator(namespace) as operator:
        if case.items > 10000 or case.shard_size > 1:
            lines = jsonl(compact_items(case.items, case.shard_size))
            target.kube.create(
                CONFIGMAPS, namespace, {"metadata": {"name": f"{name}-items"}, "data": {"items.jsonl": lines}}
            )
            source: JSON = {"items_from": {"configMapName": f"{name}-items", "key": "items.jsonl"}}
        else:
            source = {"items": numbered_items(case.items)}
        profile = None
        if target.local and case is plan.scale[0]:
            delay = plan.operator_profile_delay
            profile = profiling.Background(
                f"the operator ({case.label}, from {delay:.0f} s into the run)",
                lambda: next(iter(operator.running_pids().values()), None),
                delay=delay,
                seconds=plan.profile_seconds,
                out=ctx.files / f"profile-operator-{name}.txt",
            )
        # count_cpu: its table per decile (_cpu_by_decile)
        run = run_sized(ctx, namespace, name, case, operator, budget, source, count_cpu=True)
        if profile is not None:
            result = profile.wait(plan.profile_seconds + 60)
            if result is not None:
                ctx.profiles.append(result)
    etcd_after = target.etcd_bytes()
    # Not deleted: tens of thousands of objects would keep the garbage collector busy through the
    # next scenario. The campaign is suspended and its operator gone; the namespace goes at the end.
    return {
        "run": run,
        "bound": window_bound(case.max_concurrency),
        "etcd_before": etcd_before,
        "etcd_after": etcd_after,
    }
