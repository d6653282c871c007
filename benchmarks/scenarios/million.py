"""A million items end to end (issue 36): one zero-work campaign whose items are an object in the S3
store, measured for what grows with its size — throughput by decile, the operator's and the
workers' memory, the objects it keeps alive, its Campaign object, what it leaves in the S3 store
and its API writes per 1,000 items. The full set's case (1,000,000 items) runs only when asked for;
the quick set runs the same code at 20,000."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from benchmarks import audit, stats
from benchmarks.model import Section, Table, fmt, meets
from benchmarks.plan import Scale
from benchmarks.runs import Run, Sample, object_bytes, peak_counts
from benchmarks.scenarios.context import Context
from benchmarks.scenarios.failing import (
    CAMPAIGN_TARGET_BYTES,
    check_bounds,
    items_source,
    kib,
    largest_campaign,
    over_time,
    so_far,
)
from benchmarks.scenarios.scale import OPERATOR_RSS_TARGET_MIB, compact_item, run_sized, window_bound
from shardops.k8s.api import CAMPAIGNS

# What the objects in a namespace's area of the S3 store are, by the first part of their name under
# it (shardops.store.s3's layout); an object directly in the area is the campaign's input.
STORE_OBJECT_KINDS = {
    "attempts": "results (one document per claim)",
    "results": "result pointers (one per shard)",
    "items": "item results flushed at heartbeats",
    "ledger": "ledger (the facts of folded shards)",
}
INPUTS = "inputs (the items object)"


def store_objects(names_and_sizes: Sequence[tuple[str, int]], area: str) -> dict[str, list[int]]:
    """Objects and bytes per kind (STORE_OBJECT_KINDS, INPUTS, or the name's first part) of the
    objects under `area` (`<prefix>/<namespace>/`)."""
    found: dict[str, list[int]] = {}
    for name, size in names_and_sizes:
        rest = name.removeprefix(area)
        first, _, below = rest.partition("/")
        kind = INPUTS if not below else STORE_OBJECT_KINDS.get(first, first)
        entry = found.setdefault(kind, [0, 0])
        entry[0] += 1
        entry[1] += size
    return found


def start_middle_end(
    samples: Sequence[Sample], value: Callable[[Sample], int | None]
) -> tuple[int | None, int | None, int | None]:
    """A sampled figure at the run's start (its first known value), middle (the known value nearest
    to halfway between them) and end (its last known value: the worker pods exit as the run ends)."""
    known = [(s.at, v) for s in samples if (v := value(s)) is not None]
    if not known:
        return None, None, None
    halfway = (known[0][0] + known[-1][0]) / 2
    middle = min(known, key=lambda pair: abs(pair[0] - halfway))
    return known[0][1], middle[1], known[-1][1]


def million(ctx: Context) -> Section:
    plan = ctx.plan
    section = Section(
        "million",
        "A million items",
        "One campaign of zero-work items read from an object in the S3 store, maxConcurrency 20, "
        "its own operator and namespace, the benchmark's worker settings (persistent, 10 slots a "
        "pod) and every other setting at its default. Items/s per decile: the completed shards in "
        "completion order cut into ten equal parts, each part's items / its time. Sampled every "
        f"{plan.sample_every:g} s: live objects per kind, the Campaign object's size, the operator's "
        "RSS and the largest RSS of the campaign's worker processes (one per pod; start = first "
        "sample, middle = nearest halfway, end = last sample with the process alive). The S3 store: "
        "every object in the namespace's area at the end, by kind. API writes: from the audit log, "
        "every write in the namespace during the run (operator, workers, job controller, kubelet), "
        "as the API cost section counts them.",
    )
    for index, case in enumerate(plan.million):
        budget = max(
            min(case.budget, plan.scale_min_budget), ctx.budget(case.budget, len(plan.million) - index)
        )
        result = _million_case(ctx, case, budget)
        _report(ctx, section, case, result)
    return section


def _report(ctx: Context, section: Section, case: Scale, result: dict[str, Any]) -> None:
    run: Run = result["run"]
    shards = -(-case.items // case.shard_size)
    # Every shard holds shard_size items but the last: a count of done items close enough for rates.
    items_done = min(run.completed * case.shard_size, case.items)
    stopped = "" if run.finished else f" (stopped at {run.completed}/{shards} shards)"
    deciles = [rate * case.shard_size for rate in stats.decile_rates(run.started, run.completions)]
    last_vs_first = stats.ratio(deciles[-1], deciles[0]) if len(deciles) >= 2 else None
    bound = window_bound(case.max_concurrency)
    peaks = peak_counts(run.samples)
    operator_rss = start_middle_end(run.samples, lambda s: s.operator_rss)
    worker_rss = start_middle_end(run.samples, lambda s: s.worker_rss)
    largest = largest_campaign(run.samples)
    store: dict[str, list[int]] | None = result["store"]
    writes: audit.Cost | None = result["writes"]

    def per_item(amount: float) -> float | None:
        return amount / items_done if items_done else None

    rows = [
        [
            "items done",
            f"{items_done:,} of {case.items:,} ({run.completed:,} of {shards:,} shards){stopped}",
            "",
        ],
        ["time, s", f"{run.seconds:.0f}", ""],
        ["items/s", fmt(items_done / run.seconds if run.seconds > 0 else None, 0), ""],
        ["items/s by decile", " ".join(f"{d:.0f}" for d in deciles), "flat"],
        ["last / first decile", fmt(last_vs_first), ">= 0.9"],
        ["operator RSS MiB, start / middle / end", _mib3(operator_rss), "flat"],
        ["operator peak RSS MiB (VmHWM)", _mib(run.operator_peak_rss), f"<= {OPERATOR_RSS_TARGET_MIB}"],
        ["worker RSS MiB (largest worker process), start / middle / end", _mib3(worker_rss), "flat"],
        [
            "objects alive per kind, peak",
            ", ".join(f"{kind} {count}" for kind, count in peaks.items()),
            f"<= {bound} per kind",
        ],
        [
            "Campaign object KiB, largest sample / end",
            f"{kib(largest)} / {kib(result['final_bytes'])}",
            f"<= {CAMPAIGN_TARGET_BYTES // 1024}",
        ],
    ]
    if store is None:
        rows.append(["S3 objects at the end", "n/a (no S3 store)", ""])
    else:
        objects = sum(count for count, _ in store.values())
        size = sum(nbytes for _, nbytes in store.values())
        rows.append(
            [
                "S3 objects / bytes per item at the end",
                f"{fmt(per_item(objects), 4)} / {fmt(per_item(size), 1)} "
                f"({objects:,} objects, {size / 2**20:.1f} MiB)",
                "",
            ]
        )
        rows += [
            [f"S3: {kind}", f"{count:,} objects, {nbytes / 2**20:.2f} MiB", ""]
            for kind, (count, nbytes) in sorted(store.items(), key=lambda kv: -kv[1][1])
        ]
    if writes is None:
        rows.append(["API writes per 1,000 items", "n/a (no audit log: local control plane only)", ""])
    else:
        total = sum(writes.writes.values())
        by_writer = writes.by(writes.writes, "writer").most_common()
        rows.append(
            [
                "API writes per 1,000 items",
                fmt(per_item(total * 1000), 1)
                + " ("
                + ", ".join(f"{who} {fmt(per_item(count * 1000), 1)}" for who, count in by_writer)
                + f"; {total:,} writes, {fmt(total / max(run.completed, 1), 1)} per shard)",
                "",
            ]
        )
    section.tables.append(Table(case.label, ["figure", "value", "bound / goal"], rows))
    section.tables.append(_over_time_table(case.label, run))
    ctx.plots.objects({case.label: (run, bound)}, name=f"objects-{case.key}.png")
    section.plots.append(f"objects-{case.key}.png")
    section.check(
        f"last decile / first decile, items/s ({case.label})",
        fmt(last_vs_first) + stopped,
        ">= 0.9",
        meets(last_vs_first, 0.9) if run.finished else False,
        last_vs_first,
    )
    check_bounds(section, run, bound, "", case.label, stopped)
    peak_rss = run.operator_peak_rss / 2**20 if run.operator_peak_rss else None
    section.check(
        f"operator peak RSS ({case.label})",
        fmt(peak_rss, 0, " MiB") + stopped,
        f"<= {OPERATOR_RSS_TARGET_MIB} MiB",
        so_far(meets(peak_rss, OPERATOR_RSS_TARGET_MIB, at_least=False), run.finished),
        peak_rss,
    )
    section.data[case.key] = {
        "items": case.items,
        "shard_size": case.shard_size,
        "items_done": items_done,
        "seconds": run.seconds,
        "finished": run.finished,
        "items_per_second_by_decile": deciles,
        "operator_rss_start_middle_end": operator_rss,
        "worker_rss_start_middle_end": worker_rss,
        "operator_peak_rss": run.operator_peak_rss,
        "bound": bound,
        "peaks": peaks,
        "campaign_bytes_max": largest,
        "campaign_bytes_final": result["final_bytes"],
        "store_objects_and_bytes_by_kind": store,
        "writes_per_1000_items": per_item(sum(writes.writes.values()) * 1000) if writes else None,
        "samples": [
            {
                "at": s.at - run.started,
                "counts": s.counts,
                "campaign_bytes": s.campaign_bytes,
                "operator_rss": s.operator_rss,
                "worker_rss": s.worker_rss,
            }
            for s in run.samples
        ],
    }


def _over_time_table(label: str, run: Run) -> Table:
    kinds = list(peak_counts(run.samples))
    rows = [
        [
            f"{max(sample.at - run.started, 0):.0f}",
            *(str(sample.counts.get(kind, "n/a")) for kind in kinds),
            kib(sample.campaign_bytes),
            _mib(sample.operator_rss),
            _mib(sample.worker_rss),
        ]
        for sample in over_time(run.samples)
    ]
    return Table(
        f"{label}: objects alive, the Campaign's size and memory over time",
        ["s since create", *kinds, "Campaign KiB", "operator RSS MiB", "worker RSS MiB"],
        rows,
    )


def _mib(value: int | None) -> str:
    return fmt(value / 2**20 if value is not None else None, 0)


def _mib3(values: tuple[int | None, int | None, int | None]) -> str:
    return " / ".join(_mib(value) for value in values)


def _store_listing(ctx: Context, namespace: str) -> dict[str, list[int]] | None:
    """Objects and bytes by kind in the namespace's area of the S3 store (None without one): one
    list request per 1,000 objects, counted as they come (bounded by the kinds, not the objects)."""
    target = ctx.target
    store = target.cluster.object_store
    if store is None:
        return None
    area = f"{target.store_prefix(namespace)}/{namespace}/"
    client = store.client()
    found: Counter[str] = Counter()
    sizes: Counter[str] = Counter()
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=store.bucket, Prefix=area):
        for kind, (count, nbytes) in store_objects(
            [(str(o["Key"]), int(o["Size"])) for o in page.get("Contents") or []], area
        ).items():
            found[kind] += count
            sizes[kind] += nbytes
    return {kind: [found[kind], sizes[kind]] for kind in found}


def _million_case(ctx: Context, case: Scale, budget: float) -> dict[str, Any]:
    target = ctx.target
    namespace = target.namespace(f"bench-million-{case.key.lower()}")
    name = f"million-{case.key.lower()}"
    with target.operator(namespace) as operator:
        items = (compact_item(n, case.shard_size) for n in range(case.items))
        source = items_source(ctx, namespace, name, items, case.items)
        run = run_sized(
            ctx, namespace, name, case, operator, budget, source, measure_campaign=True, measure_workers=True
        )
        final = target.kube.get(CAMPAIGNS, namespace, name)
    log = target.cluster.audit_log
    writes = (
        audit.cost(audit.entries(log, [namespace]), namespace, run.window, max(run.completed, 1))
        if log is not None
        else None
    )
    # Not deleted, as the scale runs: the campaign is done or suspended and its operator gone.
    return {
        "run": run,
        "final_bytes": object_bytes(final),
        "store": _store_listing(ctx, namespace),
        "writes": writes,
    }
