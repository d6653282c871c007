"""Failing at scale: a campaign in which one shard in ten fails non-retryably, sampled for the
objects it keeps alive and the size of its Campaign object while the failures are folded into the
ledger with the Done shards (issue 31: "500,000 items with 10 % failing")."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

from benchmarks.model import Section, Table, fmt, meets
from benchmarks.plan import Failing
from benchmarks.runs import Run, Sample, object_bytes, peak_counts
from benchmarks.scenarios import scale
from benchmarks.scenarios.context import Context
from benchmarks.scenarios.scale import compact_items, jsonl
from shardops.api.common import JSON
from shardops.api.items import MAX_CONFIGMAP_ITEMS
from shardops.k8s.api import CAMPAIGNS, CONFIGMAPS, EVENTS, KubeClient
from shardops.k8s.events import occurrences
from shardops.state.ledger import GAVE_UP_TAIL

# The Campaign object's size this scenario holds it to: a quarter of etcd's 1.5 MiB request limit,
# and what every status write of the operator sends whole.
CAMPAIGN_TARGET_BYTES = 256 * 1024
# The example agent's item fault that fails a shard at once: class invalid-input, never retried
# (examples/agent, docs/worker-command.md).
NON_RETRYABLE_FAULT = "invalid"
# Rows of the over-time table: the samples at about every tenth of the run.
OVER_TIME_ROWS = 11


def failing_shards(shards: int, fail_every: int) -> range:
    """The indices of the shards that fail: the last of every `fail_every` (so the first shards
    succeed, and every stretch of `fail_every` shards holds exactly one)."""
    return range(fail_every - 1, shards, fail_every)


def failing_items(count: int, shard_size: int, fail_every: int) -> list[JSON]:
    """`compact_items` with the first item of each failing shard carrying the non-retryable fault:
    that shard fails at its first item, every other shard succeeds."""
    items = compact_items(count, shard_size)
    shards = -(-count // shard_size)
    for shard in failing_shards(shards, fail_every):
        items[shard * shard_size]["fault"] = NON_RETRYABLE_FAULT
    return items


def window_bound(max_concurrency: int) -> int:
    """Objects of one kind a campaign may keep alive: its pending backlog, its running shards and
    the newest gave-up shards the operator keeps for a person to look at (the rest are folded)."""
    return scale.window_bound(max_concurrency) + GAVE_UP_TAIL


def over_time(samples: Sequence[Sample], rows: int = OVER_TIME_ROWS) -> list[Sample]:
    """About `rows` samples spread evenly over the run, the first and the last among them."""
    if len(samples) <= rows:
        return list(samples)
    last = len(samples) - 1
    return [samples[round(n * last / (rows - 1))] for n in range(rows)]


def failing(ctx: Context) -> Section:
    plan = ctx.plan
    section = Section(
        "failing",
        "Failing at scale",
        "One campaign per size in which one shard in ten fails non-retryably (its first item is "
        "invalid input to the example agent), zero work otherwise, maxConcurrency 20, its own "
        "operator and namespace, items from an object in the S3 store. errorThreshold.consecutive "
        "is 0: the failures are the point, so a run of them must not hold the campaign. Sampled every "
        f"{plan.sample_every:g} s: live objects per kind in the namespace and the Campaign object's "
        "size (its JSON as the API server returns it). The bound per kind is backlogRatio x "
        f"maxConcurrency + maxConcurrency + the {GAVE_UP_TAIL} newest gave-up shards the operator "
        "keeps alive (the older ones are folded into the ledger with the Done ones).",
    )
    summary: list[list[str]] = []
    for index, case in enumerate(plan.failing):
        budget = max(
            min(case.budget, plan.scale_min_budget), ctx.budget(case.budget, len(plan.failing) - index)
        )
        result = _failing_case(ctx, case, budget)
        run: Run = result["run"]
        shards = result["shards"]
        expected = len(failing_shards(shards, case.fail_every))
        bound = window_bound(case.max_concurrency)
        peaks = peak_counts(run.samples)
        largest = largest_campaign(run.samples)
        counts = result["counts"]
        failed, done = int(counts.get("failed", 0)), int(counts.get("done", 0))
        stopped = "" if run.finished else f" (stopped at {done + failed}/{shards})"
        summary.append(
            [
                case.label,
                f"{done} done, {failed} failed of {shards}" + stopped,
                f"{run.seconds:.0f}",
                fmt((done + failed) / run.seconds if run.seconds > 0 else None),
                ", ".join(f"{kind} {count}" for kind, count in peaks.items()),
                str(bound),
                kib(largest),
                kib(result["final_bytes"]),
                f"{result['folded'].get('shards', 0)} done, {result['folded'].get('failed', 0)} failed",
                _mib(result["etcd_before"]) + " -> " + _mib(result["etcd_after"]),
                ", ".join(
                    f"{reason} {count}" + (f" (x{times})" if times > count else "")
                    for reason, (count, times) in result["events"].items()
                ),
            ]
        )
        section.tables.append(over_time_table(case.label, run))
        section.data[case.key] = {
            "shards": shards,
            "failed": failed,
            "done": done,
            "expected_failed": expected,
            "bound": bound,
            "peaks": peaks,
            "campaign_bytes_max": largest,
            "campaign_bytes_final": result["final_bytes"],
            "events_by_reason": result["events"],
            "samples": [
                {"at": s.at - run.started, "counts": s.counts, "campaign_bytes": s.campaign_bytes}
                for s in run.samples
            ],
        }
        check_bounds(section, run, bound, ", 10 % failing", case.label, stopped)
        section.check(
            f"Failed shards at the end ({case.label})",
            f"{failed} of {shards}" + stopped,
            f"= {expected} (one in {case.fail_every})",
            failed == expected and run.finished,
            failed,
        )
        ctx.plots.objects({case.label: (run, bound)}, name=f"objects-{case.key}.png")
        section.plots.append(f"objects-{case.key}.png")
    section.tables.insert(
        0,
        Table(
            "failing runs",
            [
                "campaign",
                "shards at the end",
                "s",
                "shards/s (done + failed)",
                "peak objects alive",
                "bound per kind",
                "Campaign KiB, largest sample",
                "Campaign KiB at the end",
                "status.folded",
                "etcd MiB before -> after",
                "Events at the end by kind/reason (xN: the occurrences their series count)",
            ],
            summary,
        ),
    )
    return section


def largest_campaign(samples: Sequence[Sample]) -> int | None:
    """The Campaign object's largest sampled size in bytes."""
    return max((s.campaign_bytes for s in samples if s.campaign_bytes is not None), default=None)


def check_bounds(section: Section, run: Run, bound: int, kind_note: str, label: str, stopped: str) -> None:
    """The two bounds a campaign at scale is held to, as checks of `section`: every kind alive at or
    under `bound` at every sample, and the Campaign object's size under CAMPAIGN_TARGET_BYTES."""
    over = {kind: count for kind, count in peak_counts(run.samples).items() if count > bound}
    largest = largest_campaign(run.samples)
    section.check(
        f"every kind alive <= the window bound{kind_note} ({label})",
        (", ".join(f"{k} {v}" for k, v in over.items()) or f"all kinds <= {bound}") + stopped,
        f"<= {bound} per kind at every sample",
        so_far(not over if run.samples else None, run.finished),
    )
    section.check(
        f"Campaign object's size, largest sample ({label})",
        kib(largest, " KiB") + stopped,
        f"<= {CAMPAIGN_TARGET_BYTES // 1024} KiB",
        so_far(meets(largest, CAMPAIGN_TARGET_BYTES, at_least=False), run.finished),
        largest / 1024 if largest is not None else None,
    )


def so_far(met: bool | None, finished: bool) -> bool | None:
    """A bound kept by a run stopped at its budget is not measured yet (the rest of the campaign
    might break it); one broken is broken."""
    return met if finished or met is False else None


def over_time_table(label: str, run: Run) -> Table:
    rows = [
        [
            # The first sample is taken just before the create call.
            f"{max(sample.at - run.started, 0):.0f}",
            *(str(sample.counts.get(kind, "n/a")) for kind in ("Shards", "Leases", "Events", "Pods")),
            kib(sample.campaign_bytes),
        ]
        for sample in over_time(run.samples)
    ]
    return Table(
        f"{label}: objects alive and the Campaign's size over time",
        ["s since create", "Shards", "Leases", "Events", "Pods", "Campaign KiB"],
        rows,
    )


def kib(value: int | None, unit: str = "") -> str:
    return fmt(value / 1024 if value is not None else None, 1, unit)


def _mib(value: int | None) -> str:
    return fmt(value / 2**20 if value is not None else None, 1)


def items_source(ctx: Context, namespace: str, name: str, items: Iterable[JSON], count: int) -> JSON:
    """The campaign's `count` items as an object in the S3 store (the namespace's own area), or a
    ConfigMap on a cluster without one (at most MAX_CONFIGMAP_ITEMS items). `items` may be a
    generator: a million of them are not held as objects, only as their JSONL text."""
    target = ctx.target
    store = target.cluster.object_store
    if store is None and count > MAX_CONFIGMAP_ITEMS:
        raise ValueError(
            f"{count:,} items need the S3 store (a ConfigMap holds {MAX_CONFIGMAP_ITEMS:,}): "
            "set SHARDOPS_S3_* for this cluster"
        )
    body = jsonl(items)
    if store is not None:
        key = f"{target.store_prefix(namespace)}/{namespace}/{name}-items.jsonl"
        store.client().put_object(Bucket=store.bucket, Key=key, Body=body.encode())
        return {"items_from": {"object": {"key": key}}}
    target.kube.create(
        CONFIGMAPS, namespace, {"metadata": {"name": f"{name}-items"}, "data": {"items.jsonl": body}}
    )
    return {"items_from": {"configMapName": f"{name}-items", "key": "items.jsonl"}}


def events_by_reason(kube: KubeClient, namespace: str) -> dict[str, list[int]]:
    """The namespace's Events by "kind of the object it is about/reason", most first: how many
    Event objects and how many occurrences they count (an Event's series count, 1 without one):
    which code posts them, and whether repeats are one Event or many (one list; at most the window
    bound of Events when the bound holds)."""
    objects: Counter[str] = Counter()
    times: Counter[str] = Counter()
    for event in kube.list(EVENTS, namespace):
        key = f"{(event.get('regarding') or {}).get('kind')}/{event.get('reason')}"
        objects[key] += 1
        times[key] += occurrences(event)
    return {key: [count, times[key]] for key, count in objects.most_common()}


def _failing_case(ctx: Context, case: Failing, budget: float) -> dict[str, Any]:
    target = ctx.target
    namespace = target.namespace(f"bench-failing-{case.key.lower()}")
    name = f"failing-{case.key.lower()}"
    shards = -(-case.items // case.shard_size)
    etcd_before = target.etcd_bytes()
    with target.operator(namespace) as operator:
        source = items_source(
            ctx, namespace, name, failing_items(case.items, case.shard_size, case.fail_every), case.items
        )
        spec = {"errorThreshold": {"consecutive": 0}}
        run = scale.run_sized(
            ctx, namespace, name, case, operator, budget, source, spec, measure_campaign=True
        )
        final = target.kube.get(CAMPAIGNS, namespace, name)
        # At the end, when the Events of the whole run are alive (the API server keeps them an hour).
        events = events_by_reason(target.kube, namespace)
    status = final.get("status") or {}
    # Not deleted, as the scale runs: the campaign is suspended or done and its operator gone.
    return {
        "run": run,
        "shards": shards,
        "counts": status.get("counts") or {},
        "folded": status.get("folded") or {},
        "final_bytes": object_bytes(final),
        "events": events,
        "etcd_before": etcd_before,
        "etcd_after": target.etcd_bytes(),
    }
