"""The PNG figures of RESULTS.md (matplotlib, no display needed). benchmarks/README.md says how to
read each one."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from benchmarks import stats

if TYPE_CHECKING:
    from benchmarks.plan import Plan
    from benchmarks.runs import Run


class Plots:
    def __init__(self, out: Path) -> None:
        self.out = out
        self.written: list[str] = []

    def _save(self, figure: Any, name: str) -> None:
        figure.tight_layout()
        figure.savefig(self.out / name, dpi=90)
        plt.close(figure)
        self.written.append(name)

    def versus(self, runs: Mapping[str, list[tuple[Run, Run]]], plan: Plan) -> None:
        figure, axis = plt.subplots(figsize=(7, 3.6))
        labels = [case.label for case in plan.versus if case.key in runs]
        keys = [case.key for case in plan.versus if case.key in runs]
        for offset, (side, colour, title) in enumerate(
            ((0, "tab:blue", "shardops"), (1, "tab:gray", "Indexed Job"))
        ):
            medians, lows, highs = [], [], []
            for key in keys:
                spread = stats.spread([pair[side].throughput for pair in runs[key]])
                medians.append(spread.median if spread else 0)
                lows.append((spread.median - spread.low) if spread else 0)
                highs.append((spread.high - spread.median) if spread else 0)
            positions = [i + (offset - 0.5) * 0.38 for i in range(len(keys))]
            axis.bar(positions, medians, 0.36, yerr=[lows, highs], color=colour, label=title, capsize=3)
        axis.set_xticks(range(len(keys)), [label.replace(", ", "\n") for label in labels], fontsize=8)
        axis.set_ylabel("completed per second")
        axis.set_title("throughput: median and range of the repeats")
        axis.legend()
        self._save(figure, "versus.png")

    def running(self, runs: Mapping[str, list[tuple[Run, Run]]]) -> None:
        keys = [key for key in ("1s", "5s") if key in runs] or list(runs)[:1]
        figure, axes = plt.subplots(len(keys), 1, figsize=(7, 2.6 * len(keys)), squeeze=False)
        for axis, key in zip(axes[:, 0], keys, strict=True):
            ours, job = runs[key][0]
            for run, colour, label, intervals in (
                (ours, "tab:blue", "shardops Running shards", ours.running),
                (ours, "tab:cyan", "shardops work in progress", ours.work),
                (job, "tab:gray", "Indexed Job work in progress", job.work),
            ):
                if not intervals:
                    continue
                times = [t * 0.25 for t in range(int((run.ended - run.started) / 0.25) + 1)]
                counts = [stats.open_at(intervals, run.started + t) for t in times]
                axis.step(times, counts, where="post", color=colour, label=label, linewidth=1)
            axis.axhline(
                ours.max_concurrency, color="black", linestyle=":", linewidth=1, label="maxConcurrency"
            )
            axis.set_title(f"{key}: concurrency over time (first repeat)", fontsize=9)
            axis.set_xlabel("seconds since create")
            axis.legend(fontsize=7, loc="upper right")
        self._save(figure, "running.png")

    def cost(self, per_case: Mapping[str, Mapping[str, Any]]) -> None:
        figure, axis = plt.subplots(figsize=(7, 3.6))
        bars: list[tuple[str, Any]] = []
        for key, value in per_case.items():
            bars.append((f"shardops {key}", value["cost"]))
            bars.append((f"Job {key}", value["job"]))
        resources = sorted({k[2] for _, c in bars for k in c.writes})
        bottoms = [0.0] * len(bars)
        for resource in resources:
            heights = [
                sum(n for k, n in c.writes.items() if k[2] == resource) / max(c.units, 1) for _, c in bars
            ]
            axis.bar(range(len(bars)), heights, bottom=bottoms, label=resource)
            bottoms = [b + h for b, h in zip(bottoms, heights, strict=True)]
        axis.set_xticks(range(len(bars)), [label for label, _ in bars], rotation=30, fontsize=8)
        axis.set_ylabel("writes per shard / item")
        axis.set_title("API writes per unit of work, by resource")
        axis.legend(fontsize=7, ncol=2)
        self._save(figure, "cost.png")

    def latency(self, samples: Mapping[str, list[float]], plan: Plan) -> None:
        figure, axis = plt.subplots(figsize=(7, 3))
        targets = {"zombie": plan.zombie_lease_seconds + 5, "restart": 10, "failover": 20}
        keys = [k for k in targets if samples.get(k)]
        for index, key in enumerate(keys):
            axis.scatter([index] * len(samples[key]), samples[key], color="tab:blue", zorder=3)
            axis.hlines(targets[key], index - 0.3, index + 0.3, color="tab:red", linestyle="--")
        axis.set_xticks(range(len(keys)), keys)
        axis.set_ylabel("seconds")
        axis.set_title("recovery times (dots) and their targets (dashed)")
        self._save(figure, "latency.png")

    def deciles(self, curves: Mapping[str, list[float]]) -> None:
        figure, axis = plt.subplots(figsize=(7, 3.4))
        for label, rates in curves.items():
            if rates:
                axis.plot(range(1, len(rates) + 1), rates, marker="o", label=label)
        axis.set_xlabel("decile of the completed shards")
        axis.set_ylabel("shards per second")
        axis.set_ylim(bottom=0)
        axis.set_title("throughput per decile (flat is the goal)")
        axis.legend(fontsize=8)
        self._save(figure, "deciles.png")

    def objects(self, series: Mapping[str, tuple[Run, int]], name: str = "objects.png") -> None:
        figure, axes = plt.subplots(len(series), 1, figsize=(7, 2.8 * max(len(series), 1)), squeeze=False)
        for axis, (label, (run, bound)) in zip(axes[:, 0], series.items(), strict=True):
            kinds = sorted({k for s in run.samples for k in s.counts})
            for kind in kinds:
                axis.plot(
                    [s.at - run.started for s in run.samples],
                    [s.counts.get(kind, 0) for s in run.samples],
                    label=kind,
                    linewidth=1,
                )
            axis.axhline(bound, color="black", linestyle=":", linewidth=1, label="bound")
            axis.set_yscale("symlog")
            axis.set_ylim(bottom=0)
            axis.set_title(f"{label}: objects alive in the namespace", fontsize=9)
            axis.set_xlabel("seconds since create")
            axis.legend(fontsize=7, ncol=4)
        self._save(figure, name)
