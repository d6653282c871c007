"""Many campaigns at once in one namespace, under one operator."""

from __future__ import annotations

import time

from benchmarks import stats
from benchmarks.model import Section, Table, fmt
from benchmarks.runs import (
    campaign_manifest,
    delete_campaigns,
)
from benchmarks.scenarios.context import (
    Context,
    numbered_items,
)
from benchmarks.target import Target
from shardops.k8s.api import CAMPAIGNS


def many(ctx: Context) -> Section:
    target, plan = ctx.target, ctx.plan
    count, each, mc = plan.many_campaigns, plan.many_shards_each, plan.many_concurrency_each
    section = Section(
        "many",
        "Many campaigns: side by side against one big one",
        f"{count} campaigns of {each} one-item zero-work shards at once, maxConcurrency {mc} each, "
        f"against one campaign of {count * each} shards at maxConcurrency {count * mc}: the same "
        f"work and the same total cap, one operator. Budget {_many_budget(ctx, 2):.0f} s each.",
    )
    namespace = target.namespace("bench-many")
    rows = []
    results = {}
    with target.operator(namespace):
        names = [f"many-{i}" for i in range(count)]
        started = time.time()
        for index, name in enumerate(names):
            target.kube.create(
                CAMPAIGNS,
                namespace,
                campaign_manifest(
                    name, image=target.image, items=numbered_items(each, index * each), max_concurrency=mc
                ),
            )
        done, ended = _wait_campaigns(target, namespace, names, count * each, _many_budget(ctx, 2))
        per_campaign = [_completed(target, namespace, n) for n in names]
        results["many"] = (sum(per_campaign), ended - started, done)
        rows.append(
            [
                f"{count} x {each} (maxConcurrency {mc} each)",
                f"{sum(per_campaign)}/{count * each}",
                f"{ended - started:.1f}",
                f"{sum(per_campaign) / (ended - started):.2f}",
                f"{min(per_campaign)}..{max(per_campaign)}",
                "yes" if done else "no (budget)",
            ]
        )
        for name in names:
            target.kube.patch(CAMPAIGNS, namespace, name, {"spec": {"suspend": True}})
        delete_campaigns(target, namespace, names, plan.cleanup_timeout / 2, shards=plan.wait_for_garbage)
        started = time.time()
        target.kube.create(
            CAMPAIGNS,
            namespace,
            campaign_manifest(
                "one",
                image=target.image,
                items=numbered_items(count * each, count * each),
                max_concurrency=count * mc,
            ),
        )
        done, ended = _wait_campaigns(
            target, namespace, ["one"], count * each, ctx.budget(plan.many_budget, 1)
        )
        completed = _completed(target, namespace, "one")
        results["one"] = (completed, ended - started, done)
        rows.append(
            [
                f"1 x {count * each} (maxConcurrency {count * mc})",
                f"{completed}/{count * each}",
                f"{ended - started:.1f}",
                f"{completed / (ended - started):.2f}",
                "",
                "yes" if done else "no (budget)",
            ]
        )
        target.kube.patch(CAMPAIGNS, namespace, "one", {"spec": {"suspend": True}})
    section.tables.append(
        Table(
            "throughput", ["campaigns", "done", "seconds", "shards/s", "done per campaign", "finished"], rows
        )
    )
    many_rate = results["many"][0] / max(results["many"][1], 1e-9)
    one_rate = results["one"][0] / max(results["one"][1], 1e-9)
    ratio = stats.ratio(many_rate, one_rate)
    section.notes.append(f"Many campaigns / one campaign throughput: {fmt(ratio)}x.")
    section.data["results"] = results
    target.delete_namespace(namespace)
    return section


def _many_budget(ctx: Context, runs_left: int) -> float:
    """The many-campaigns runs' share of the time left, after the scale runs' minimum."""
    scale_reserve = len(ctx.plan.scale) * (ctx.plan.scale_min_budget + 20)
    return ctx.budget(ctx.plan.many_budget, runs_left, reserve=30 + scale_reserve)


def _completed(target: Target, namespace: str, name: str) -> int:
    status = target.kube.get(CAMPAIGNS, namespace, name).get("status") or {}
    return int((status.get("counts") or {}).get("done") or 0)


def _wait_campaigns(
    target: Target, namespace: str, names: list[str], total: int, budget: float
) -> tuple[bool, float]:
    deadline = time.monotonic() + budget
    while time.monotonic() < deadline:
        if sum(_completed(target, namespace, n) for n in names) >= total:
            return True, time.time()
        time.sleep(0.5)
    return False, time.time()
