"""What every scenario shares: the Context (cluster, plan, output, figures measured earlier), the
items of a zero-work run, and the small formatters of their tables."""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks import profiling, stats
from benchmarks.plan import Plan
from benchmarks.plots import Plots
from benchmarks.runs import (
    Run,
)
from benchmarks.target import Target
from shardops.api.common import JSON
from shardops.k8s.api import CAMPAIGNS

# No run gets less time than this, even when the plan's deadline is near.
MIN_BUDGET = 10.0


@dataclass
class Context:
    """What the scenarios share: the cluster, the plan, where files go, and figures measured earlier
    that a later section relates to (the write limit, the zero-work runs)."""

    target: Target
    plan: Plan
    out: Path
    plots: Plots
    write_rate: float | None = None
    versus_runs: dict[str, list[tuple[Run, Run]]] = field(default_factory=dict)
    shard_objects: dict[str, list[JSON]] = field(default_factory=dict)
    profiles: list[profiling.Profile] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)
    # Restart recovery, split: SIGKILL -> the new operator process runs.
    restart_process: list[float] = field(default_factory=list)
    # CPU seconds to start one process: "worker" (the worker runtime's imports), "agent".
    startup: dict[str, stats.Spread | None] = field(default_factory=dict)

    def budget(self, wanted: float, runs_left: int, reserve: float = 30.0) -> float:
        """`wanted`, or less when the runs left would not fit before the plan's deadline (each gets
        an equal share of what is left, less `reserve` for setting up and reporting)."""
        left = self.plan.deadline - (time.monotonic() - self.started) - reserve
        return max(MIN_BUDGET, min(wanted, left / max(runs_left, 1)))

    @property
    def files(self) -> Path:
        path = self.target.work_dir / "files"
        path.mkdir(parents=True, exist_ok=True)
        return path

    def ledger(self, name: str) -> Path | None:
        return self.files / f"ledger-{name}.jsonl" if self.target.local else None


def numbered_items(count: int, offset: int = 0) -> list[JSON]:
    return [{"i": offset + n} for n in range(count)]


def cpu_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {k: after[k] - before.get(k, 0.0) for k in after}


def cpu_text(cpu: dict[str, float]) -> str:
    if not cpu:
        return "n/a"
    return ", ".join(f"{k} {v:.1f}" for k, v in sorted(cpu.items(), key=lambda kv: -kv[1]) if v >= 0.05)


def spread_text(value: stats.Spread | None, digits: int, unit: str = "") -> str:
    return value.show(digits, unit) if value else "n/a"


def stop_everything(target: Target) -> None:
    """Suspend what is left and delete the benchmark's namespaces (in the background)."""
    for namespace in target.namespaces:
        with contextlib.suppress(Exception):
            for campaign in target.kube.list(CAMPAIGNS, namespace):
                target.kube.patch(
                    CAMPAIGNS, namespace, campaign["metadata"]["name"], {"spec": {"suspend": True}}
                )
        target.delete_namespace(namespace)
