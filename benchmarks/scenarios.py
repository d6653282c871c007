"""The scenarios of `make bench`, each measured side by side in one run on one cluster.

Every scenario returns a `Section` (tables, plots, figures against their targets) and never raises
for a slow system: a run that reaches its budget is stopped, reported with how far it got, and
marked as missing its target.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import subprocess
import sys
import time
import urllib.error
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from testbed.harness import wait_for
from testbed.kits import scheduler as schedulerkit
from testbed.kits.chart import worker_service_account

from benchmarks import audit, cpu, lanes, profiling, runs, stats
from benchmarks.model import Section, Table, fmt, meets
from benchmarks.plan import Plan, Scale, Versus
from benchmarks.plots import Plots
from benchmarks.runs import (
    AGENT as AGENT_COMMAND,
)
from benchmarks.runs import (
    COUNTED,
    Run,
    campaign_manifest,
    delete_campaign,
    delete_campaigns,
    delete_job,
    epoch,
    run_campaign,
    run_indexed_job,
)
from benchmarks.target import Target
from shardops.api.campaign import CampaignSpec
from shardops.api.names import CAMPAIGN_LABEL
from shardops.k8s.api import CAMPAIGNS, CONFIGMAPS, PODS, SHARDS, NotFound

JSON = dict[str, Any]
BACKLOG_RATIO = int(CampaignSpec.model_fields["backlog_ratio"].default)
WORKER_SERVICE_ACCOUNT = worker_service_account()
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


def _items(count: int, offset: int = 0) -> list[JSON]:
    return [{"i": offset + n} for n in range(count)]


def _pod_pids(target: Target, namespace: str, selector: str) -> list[int]:
    """Pids of running containers of the matching pods (the process-kubelet's containerID)."""
    pids = []
    for pod in target.kube.list(PODS, namespace, label_selector=selector):
        for status in (pod.get("status") or {}).get("containerStatuses") or []:
            running = (status.get("state") or {}).get("running")
            container = str(status.get("containerID") or "")
            if running and container.startswith("process://"):
                pids.append(int(container.removeprefix("process://")))
    return pids


# --- physical limit ------------------------------------------------------------------------------


def physical(ctx: Context) -> Section:
    plan, target = ctx.plan, ctx.target
    section = Section(
        "physical",
        "Physical limit: the API server's write rate",
        f"{plan.physical_processes} processes x {plan.physical_threads} threads create and delete "
        f"small ConfigMaps as fast as the API server answers, for {plan.physical_seconds:g} s, "
        f"{plan.physical_repeats} times. Each create and each delete is one write.",
    )
    namespace = target.namespace("bench-physical")
    rates = []
    for repeat in range(plan.physical_repeats):
        cpu_before = target.cpu_seconds()
        processes = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "benchmarks.load",
                    f"--kubeconfig={target.cluster.kubeconfig}",
                    f"--namespace={namespace}",
                    f"--seconds={plan.physical_seconds}",
                    f"--threads={plan.physical_threads}",
                    f"--prefix=r{repeat}p{p}",
                ],
                stdout=subprocess.PIPE,
                text=True,
                env=target.cluster.env(),
            )
            for p in range(plan.physical_processes)
        ]
        results = []
        for process in processes:
            try:
                output, _ = process.communicate(timeout=plan.physical_seconds + 60)
                results.append(json.loads(output.strip().splitlines()[-1]))
            except (subprocess.TimeoutExpired, ValueError, IndexError):
                process.kill()
        cpu = _cpu_delta(cpu_before, target.cpu_seconds())
        writes = sum(r["writes"] for r in results)
        seconds = max((r["seconds"] for r in results), default=plan.physical_seconds)
        rate = writes / seconds if seconds else 0.0
        rates.append(rate)
        section.tables.append(
            Table(
                f"repeat {repeat + 1}",
                ["writes", "errors", "seconds", "writes/s", "CPU seconds by process"],
                [
                    [
                        str(writes),
                        str(sum(r["errors"] for r in results)),
                        f"{seconds:.1f}",
                        f"{rate:.0f}",
                        _cpu_text(cpu),
                    ]
                ],
            )
        )
    spread = stats.spread(rates)
    ctx.write_rate = spread.median if spread else None
    section.data["write_rates"] = rates
    section.notes.append(
        f"Write limit: {spread.show(0, ' writes/s') if spread else 'n/a'}. The load generator runs on the "
        "same 2 cores as the API server, like every client in these benchmarks."
    )
    target.delete_namespace(namespace)
    return section


def _cpu_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {k: after[k] - before.get(k, 0.0) for k in after}


def _cpu_text(cpu: dict[str, float]) -> str:
    if not cpu:
        return "n/a"
    return ", ".join(f"{k} {v:.1f}" for k, v in sorted(cpu.items(), key=lambda kv: -kv[1]) if v >= 0.05)


# --- shardops against an Indexed Job --------------------------------------------------------------


def versus(ctx: Context) -> Section:
    target, plan = ctx.target, ctx.plan
    section = Section(
        "versus",
        "shardops against an Indexed Job",
        "Each case runs a Campaign of one-item shards and an Indexed Job (completionMode Indexed, "
        "completions = shards, parallelism = maxConcurrency) whose pods run the same per-item command "
        "(the example agent, its latency = the work) through the same kubelet. "
        + (
            "The Campaign sets spec.worker.persistent, so each worker's agent process serves shard "
            "after shard; the Job's pods start it once per item, as a Job must. "
            if runs.PERSISTENT
            else "The Campaign starts the agent once per shard (SHARDOPS_BENCH_PERSISTENT=0). "
        )
        + (
            f"Each worker pod runs {runs.SLOTS} shards at once (spec.worker.slots; "
            "SHARDOPS_BENCH_SLOTS), so one process start serves that many slots. "
            if runs.SLOTS > 1
            else "Each worker pod runs one shard at a time (SHARDOPS_BENCH_SLOTS=1). "
        )
        + "Time: from the create "
        "call to the first poll (every 0.25 s) that sees the Campaign Succeeded / the Job Complete. "
        "The order alternates between repeats (Job first, then shardops first, ...); each run starts "
        "after the previous one's worker processes are gone (in the full set also its Shards and "
        "pods). Cap utilization: mean Running shards (from the "
        "shards' history) / maxConcurrency between the 10th and the 90th percentile completion.",
    )
    _startup_costs(ctx, section)
    rows = []
    namespace = target.namespace("bench-versus")
    with target.operator(namespace) as operator:
        for case in plan.versus:
            pairs = [_versus_pair(ctx, case, namespace, operator, repeat) for repeat in range(case.repeats)]
            ctx.versus_runs[case.key] = pairs
            rows.extend(_versus_rows(section, case, pairs))
    target.delete_namespace(namespace)
    section.tables.insert(
        0,
        Table(
            "throughput (median of the repeats, range in brackets)",
            [
                "case",
                "repeats",
                "shardops s",
                "Indexed Job s",
                "shardops shards/s",
                "Job items/s",
                "shardops / Job",
                "cap utilization shardops",
                "work in progress / cap: shardops | Job",
            ],
            rows,
        ),
    )
    ctx.plots.versus(ctx.versus_runs, plan)
    ctx.plots.running(ctx.versus_runs)
    section.plots += ["versus.png", "running.png"]
    return section


def _child_cpu(argv: list[str], env: dict[str, str]) -> float:
    """CPU seconds (user + system) one child process used from start to exit."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(argv, env=env, capture_output=True, timeout=120, check=False)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def _startup_costs(ctx: Context, section: Section) -> None:
    """What starting a process costs on this machine: a worker (the imports of `shardops worker`,
    before its first request) and the agent (one run on no items), 3 times each."""
    files = ctx.files
    env = dict(os.environ)
    env.update(
        {
            "SHARDOPS_ITEMS_FILE": os.devnull,
            "SHARDOPS_RESULTS_FILE": str(files / "startup-results.jsonl"),
            "SHARDOPS_ERROR_FILE": str(files / "startup-error.json"),
        }
    )
    worker = [sys.executable, "-c", "import shardops.main, shardops.worker.main"]
    agent = [str(Path(sys.executable).parent / AGENT_COMMAND)]
    ctx.startup = {
        "worker": stats.spread([_child_cpu(worker, env) for _ in range(3)]),
        "agent": stats.spread([_child_cpu(agent, env) for _ in range(3)]),
    }
    section.tables.append(
        Table(
            "CPU seconds to start one process (3 times each)",
            ["process", "CPU seconds"],
            [[name, _show(value, 2)] for name, value in ctx.startup.items()],
        )
    )


def _versus_pair(
    ctx: Context, case: Versus, namespace: str, operator: schedulerkit.Operator, repeat: int
) -> tuple[Run, Run]:
    target, plan = ctx.target, ctx.plan
    name = f"{case.key.lower()}-r{repeat}"
    spec: JSON = {}
    if case.heartbeat_seconds:
        spec["heartbeatSeconds"] = case.heartbeat_seconds

    def shardops_run() -> Run:
        ledger = ctx.ledger(f"{namespace}-{name}")
        manifest = campaign_manifest(
            name,
            image=target.image,
            items=_items(case.shards, offset=repeat * case.shards),
            max_concurrency=case.max_concurrency,
            work_seconds=case.work_seconds,
            ledger=ledger,
            **spec,
        )
        profile = None
        if repeat == 0 and case.key == "zero" and target.local:
            profile = profiling.Background(
                f"a worker ({case.label})",
                lambda: next(iter(_pod_pids(target, namespace, f"{CAMPAIGN_LABEL}={name}")), None),
                delay=plan.worker_profile_delay,
                seconds=min(plan.profile_seconds, 10),
                out=ctx.files / f"profile-worker-{name}.txt",
            )
        cpu_before = target.cpu_seconds()
        run = run_campaign(
            target,
            namespace,
            manifest,
            expected_shards=case.shards,
            budget=case.budget,
            ledger=ledger,
            operator=operator,
            sample_every=plan.sample_every,
            # The zero-work run is also the scale curve's smallest campaign.
            count_objects=case.key == "zero",
        )
        if profile is not None:
            result = profile.wait(60)
            if result is not None:
                ctx.profiles.append(result)
        ctx.shard_objects[f"{namespace}/{name}"] = schedulerkit.campaign_shards(
            target.kube, namespace, name, target.cluster.object_store
        )
        run.lanes = _worker_lanes(target, namespace, name, run.started)
        run.quiet_until = time.time()
        delete_campaign(target, namespace, name, plan.cleanup_timeout, shards=plan.wait_for_garbage)
        # Worker processes are reaped (and counted) when they exit, which may be after the run's end.
        run.cpu = _cpu_delta(cpu_before, target.cpu_seconds())
        return run

    def job_run() -> Run:
        job = f"job-{name}"
        cpu_before = target.cpu_seconds()
        run = run_indexed_job(
            target,
            namespace,
            job,
            completions=case.shards,
            parallelism=case.max_concurrency,
            work_seconds=case.work_seconds,
            budget=case.budget,
            ledger=ctx.ledger(f"{namespace}-{job}"),
        )
        run.quiet_until = time.time()
        delete_job(target, namespace, job, plan.cleanup_timeout, pods=plan.wait_for_garbage)
        run.cpu = _cpu_delta(cpu_before, target.cpu_seconds())
        return run

    if repeat % 2 == 0:
        job = job_run()
        ours = shardops_run()
    else:
        ours = shardops_run()
        job = job_run()
    return ours, job


def utilization(run: Run, intervals: Sequence[tuple[float, float]]) -> float | None:
    window = stats.steady_window(run.completions)
    if window is None:
        return None
    mean = stats.mean_concurrency(intervals, window)
    return None if mean is None else mean / run.max_concurrency


def _worker_lanes(target: Target, namespace: str, campaign: str, started: float) -> lanes.Lanes | None:
    """The campaign's worker slots, step by step, from its worker pods' logs (read before the pods
    go; the local control plane keeps them as files). None elsewhere."""
    if target.local is None:
        return None
    pods = target.kube.list(PODS, namespace, label_selector=f"{CAMPAIGN_LABEL}={campaign}")
    names = [pod["metadata"]["name"] for pod in pods]
    logs = {name: lanes.parse_log(target.cluster.pod_log(namespace, name, "worker")) for name in names}
    return lanes.read(logs, started)


def _versus_rows(section: Section, case: Versus, pairs: list[tuple[Run, Run]]) -> list[list[str]]:
    ours = [p[0] for p in pairs]
    jobs = [p[1] for p in pairs]
    # A run stopped by its budget counts with the rate it reached (and its figure misses).
    ratio = stats.spread([o.throughput / j.throughput for o, j in pairs if j.throughput])
    ours_s = stats.spread([o.seconds for o in ours])
    job_s = stats.spread([j.seconds for j in jobs])
    util = stats.spread([u for o in ours if (u := utilization(o, o.running)) is not None])
    work_ours = stats.spread([u for o in ours if (u := utilization(o, o.work)) is not None])
    work_job = stats.spread([u for j in jobs if (u := utilization(j, j.work)) is not None])
    unfinished = [r for r in ours + jobs if not r.finished]
    tail = f" — {len(unfinished)} run(s) stopped at their {case.budget:.0f} s budget" if unfinished else ""
    rows = [
        [
            case.label + tail,
            str(len(pairs)),
            ours_s.show(1) if ours_s else "n/a",
            job_s.show(1) if job_s else "n/a",
            _show(stats.spread([o.throughput for o in ours]), 2),
            _show(stats.spread([j.throughput for j in jobs]), 2),
            ratio.show(2, "x") if ratio else "n/a",
            util.show(2) if util else "n/a",
            f"{_show(work_ours, 2)} | {_show(work_job, 2)}",
        ]
    ]
    ratio_value = ratio.median if ratio else None
    if case.key == "zero":
        section.check(
            f"zero-work throughput vs Indexed Job ({case.label})",
            _show(ratio, 2, "x"),
            ">= 1.0x",
            meets(ratio_value, 1.0) if not unfinished else False,
            ratio_value,
        )
    if case.key == "1s":
        section.check(
            f"1 s work throughput vs Indexed Job ({case.label})",
            _show(ratio, 2, "x"),
            ">= 1.5x",
            meets(ratio_value, 1.5) if not unfinished else False,
            ratio_value,
        )
    if case.key == "5s":
        section.check(
            f"cap utilization with 5 s work ({case.label})",
            _show(util, 2),
            ">= 0.90",
            meets(util.median if util else None, 0.9),
            util.median if util else None,
        )
    if case.key == "1s" and util:
        section.notes.append(
            f"Cap utilization with 1 s work: {util.show(2)} (no target; the 5 s case has one)."
        )
    details = []
    for index, (o, j) in enumerate(pairs):
        details.append(
            [
                str(index + 1),
                f"{o.completed}/{o.total}",
                f"{o.seconds:.1f}",
                _cpu_text(o.cpu),
                f"{j.completed}/{j.total}",
                f"{j.seconds:.1f}",
                _cpu_text(j.cpu),
            ]
        )
    section.tables.append(
        Table(
            f"{case.label}: every repeat (CPU seconds by process during the run)",
            ["repeat", "shardops done", "s", "CPU", "Job done", "s", "CPU"],
            details,
        )
    )
    steps = lanes.table(case.label, [o.lanes for o in ours if o.lanes is not None])
    if steps is not None:
        section.tables.append(steps)
    return rows


def _show(value: stats.Spread | None, digits: int, unit: str = "") -> str:
    return value.show(digits, unit) if value else "n/a"


# --- API cost and efficiency ------------------------------------------------------------------------------


def api_cost(ctx: Context) -> Section:
    target = ctx.target
    section = Section(
        "cost",
        "API cost per shard (audit log)",
        "From the local control plane's audit log: requests in the run's namespace during the run, "
        "by writer, verb and resource[/subresource], divided by the shards (Job: completions). The "
        "benchmark's own polls are left out. 'Lifecycle' counts what belongs to one shard (its Shard "
        "and status, Lease, Events, result ConfigMaps) by the e2e suite's rule; 'all' adds worker "
        "Jobs, their pods, the Campaign's status and reads.",
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
            f"shard = {fmt(best)} shards/s; achieved {_show(achieved, 2)} shards/s."
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


# --- latency -------------------------------------------------------------------------------------------


def latency(ctx: Context) -> Section:
    plan = ctx.plan
    section = Section(
        "latency",
        "Latency: claim, zombie detection, restart, failover",
        "Pending->Running: from each shard's Materialized to its Claimed history entry, in the runs "
        "above, for shards that became Pending while fewer than maxConcurrency shards were Running "
        "(idle capacity); 'cold' ones became Pending before the run's first claim (the worker pods "
        "were still starting). Zombie: a worker's process group is SIGKILLed mid-shard; the time "
        "until its shard is claimable again (LeaseExpired by the operator, or a worker's takeover). "
        "Restart: the single operator's process group is SIGKILLed; the time until the restarted "
        "process's first reconcile (its /metrics reconcile count); it takes over from its dead "
        "predecessor at once. Failover: the leader of two replicas is frozen (SIGSTOP: a hung or "
        "cut-off node; a killed one would restart and take its Lease back itself); the time until "
        "the other holds the leader Lease and until the "
        "Campaign's Scheduled condition names it (its first status write). The operator runs with "
        "its defaults (tick 5 s, leader lease 15 s, renew 5 s, retry 2 s).",
    )
    _pending_to_running(ctx, section)
    rows: list[list[str]] = []
    samples: dict[str, list[float]] = {}
    if plan.zombie_repeats:
        samples["zombie"] = _guard(section, "zombie", lambda: _zombie(ctx, section))
    if plan.restart_repeats:
        samples["restart"] = _guard(section, "restart", lambda: _restart(ctx))
    if plan.failover_repeats:
        failover = _guard(section, "failover", lambda: _failover(ctx))
        samples["failover"] = failover
    for key, bound, label in (
        (
            "zombie",
            plan.zombie_lease_seconds + 5,
            f"zombie detection (leaseSeconds {plan.zombie_lease_seconds})",
        ),
        ("restart", 10, "operator restart recovery"),
        ("failover", 20, "leader failover (two replicas), until the new leader's first status write"),
    ):
        if key not in samples:
            continue
        spread = stats.spread(samples[key])
        rows.append(
            [
                label,
                str(len(samples[key])),
                _show(spread, 1, " s"),
                ", ".join(f"{v:.1f}" for v in samples[key]),
            ]
        )
        worst = max(samples[key]) if samples[key] else None
        section.check(
            label,
            _show(spread, 1, " s"),
            f"<= {bound} s",
            meets(worst, bound, at_least=False) if samples[key] else False,
            spread.median if spread else None,
        )
    if ctx.restart_process:
        process = stats.spread(ctx.restart_process)
        rows.append(
            [
                "operator restart: until the new operator process runs (part of its recovery)",
                str(len(ctx.restart_process)),
                _show(process, 1, " s"),
                ", ".join(f"{v:.1f}" for v in ctx.restart_process),
            ]
        )
    section.tables.append(Table("recovery times", ["what", "repeats", "median (range)", "samples"], rows))
    section.data["samples"] = samples
    ctx.plots.latency(samples, plan)
    section.plots.append("latency.png")
    return section


def _guard(section: Section, what: str, measure: Callable[[], list[float]]) -> list[float]:
    try:
        return measure()
    except Exception as error:  # reported, not fatal: the other figures still count
        section.notes.append(f"{what}: not measured: {type(error).__name__}: {error}"[:600])
        return []


def _pending_to_running(ctx: Context, section: Section) -> None:
    warm: list[float] = []
    cold: list[float] = []
    for pairs in ctx.versus_runs.values():
        for ours, _ in pairs:
            if not ours.pending_to_running:
                continue
            first_claim = min(c for _, c in ours.pending_to_running)
            for pending, claimed in ours.pending_to_running:
                if stats.open_at(ours.running, pending) >= ours.max_concurrency:
                    continue  # no idle capacity: it waited for a slot
                (cold if pending < first_claim else warm).append(claimed - pending)
    p50, p99 = stats.percentile(warm, 0.5), stats.percentile(warm, 0.99)
    section.tables.append(
        Table(
            "Pending -> Running with idle capacity",
            ["shards", "samples", "p50 s", "p99 s"],
            [
                ["after the first claim (workers up)", str(len(warm)), fmt(p50), fmt(p99)],
                [
                    "cold (worker pods still starting)",
                    str(len(cold)),
                    fmt(stats.percentile(cold, 0.5)),
                    fmt(stats.percentile(cold, 0.99)),
                ],
            ],
        )
    )
    section.check(
        "Pending->Running p99 with idle capacity (workers up)",
        f"p50 {fmt(p50)} s, p99 {fmt(p99)} s",
        "p99 <= 2 s",
        meets(p99, 2, at_least=False),
        p99,
    )


def _zombie(ctx: Context, section: Section) -> list[float]:
    target, plan = ctx.target, ctx.plan
    if target.local is None:
        raise RuntimeError("needs the local control plane (the worker's process)")
    namespace = target.namespace("bench-zombie")
    count = plan.zombie_repeats
    name = "zombie"
    manifest = campaign_manifest(
        name,
        image=target.image,
        items=_items(count),
        max_concurrency=count,
        work_seconds=600,
        leaseSeconds=plan.zombie_lease_seconds,
    )
    found: list[float] = []
    rows = []
    with target.operator(namespace):
        target.kube.create(CAMPAIGNS, namespace, manifest)

        def running() -> list[JSON]:
            shards = target.kube.list(SHARDS, namespace, label_selector=f"{CAMPAIGN_LABEL}={name}")
            return (
                [s for s in shards if schedulerkit.phase_of(s) == "Running"] if len(shards) == count else []
            )

        shards = wait_for(
            "every zombie shard to run", lambda: len(running()) == count and running(), timeout=120
        )
        kills = {}
        for shard in shards:
            owner = str(shard["status"]["owner"])
            pid = next(
                (p for pod, p in _worker_pids(target, namespace, name).items() if owner.startswith(pod)), None
            )
            if pid is None:
                continue
            schedulerkit.kill_group(pid)
            kills[shard["metadata"]["name"]] = (time.time(), epoch(shard["status"]["leaseUntil"]))
            time.sleep(1.0)  # kills spread over the heartbeat period
        deadline = time.monotonic() + plan.zombie_lease_seconds * 3 + 30
        pending = dict(kills)
        while pending and time.monotonic() < deadline:
            for shard_name, (killed, lease_until) in list(pending.items()):
                shard = target.kube.get(SHARDS, namespace, shard_name)
                after = [
                    e
                    for e in schedulerkit.history(shard)
                    if epoch(e["at"]) >= killed and e["reason"] in ("LeaseExpired", "Blocked", "Claimed")
                ]
                if after:
                    detected = epoch(after[0]["at"])
                    found.append(detected - killed)
                    rows.append(
                        [
                            shard_name,
                            f"{detected - killed:.1f}",
                            f"{detected - lease_until:.1f}",
                            after[0]["reason"],
                        ]
                    )
                    del pending[shard_name]
            time.sleep(0.25)
        for shard_name in pending:
            rows.append([shard_name, "not detected", "", ""])
            found.append(float(plan.zombie_lease_seconds * 3 + 30))
        with contextlib.suppress(NotFound):
            target.kube.patch(CAMPAIGNS, namespace, name, {"spec": {"suspend": True}})
    section.tables.append(
        Table(
            "zombie detection, per killed worker",
            ["shard", "kill -> claimable again (s)", "after the lease ran out (s)", "how"],
            rows,
        )
    )
    target.delete_namespace(namespace)
    return found


def _worker_pids(target: Target, namespace: str, campaign: str) -> dict[str, int]:
    pids = {}
    for pod in target.kube.list(PODS, namespace, label_selector=f"{CAMPAIGN_LABEL}={campaign}"):
        for status in (pod.get("status") or {}).get("containerStatuses") or []:
            container = str(status.get("containerID") or "")
            if (status.get("state") or {}).get("running") and container.startswith("process://"):
                pids[pod["metadata"]["name"]] = int(container.removeprefix("process://"))
    return pids


def _reconcile_count(operator: schedulerkit.Operator) -> float | None:
    try:
        code, text = operator.http("/metrics")
    except (OSError, urllib.error.URLError):
        return None
    if code != 200:
        return None
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("shardops_reconcile_duration_seconds_count")
    )


def _busy_campaign(ctx: Context, name: str) -> JSON:
    """A campaign that keeps its operator busy for the whole scenario: long shards, a few at a time."""
    return campaign_manifest(
        name, image=ctx.target.image, items=_items(60), max_concurrency=3, work_seconds=5
    )


def _restart(ctx: Context) -> list[float]:
    target, plan = ctx.target, ctx.plan
    if target.local is None:
        raise RuntimeError("needs the local control plane (the operator's process)")
    namespace = target.namespace("bench-restart")
    found = []
    with target.operator(namespace) as operator:
        target.kube.create(CAMPAIGNS, namespace, _busy_campaign(ctx, "busy"))
        for _ in range(plan.restart_repeats):
            wait_for("the operator to reconcile", lambda: (_reconcile_count(operator) or 0) > 0, timeout=90)
            (pid,) = operator.running_pids().values()
            killed = time.time()
            schedulerkit.kill_group(pid)
            wait_for(
                "the operator's new process",
                lambda pid=pid: any(p != pid for p in operator.running_pids().values()),
                timeout=120,
                interval=0.2,
            )
            ctx.restart_process.append(time.time() - killed)
            wait_for(
                "the restarted operator's first reconcile",
                lambda pid=pid: (
                    pid not in operator.running_pids().values() and (_reconcile_count(operator) or 0) > 0
                ),
                timeout=120,
                interval=0.2,
            )
            found.append(time.time() - killed)
    target.delete_namespace(namespace)
    return found


def _failover(ctx: Context) -> list[float]:
    target, plan = ctx.target, ctx.plan
    if target.local is None:
        raise RuntimeError("needs the local control plane (the operator's processes)")
    namespace = target.namespace("bench-failover")
    found = []
    with target.operator(namespace, replicas=2) as operator:
        target.kube.create(CAMPAIGNS, namespace, _busy_campaign(ctx, "busy"))

        def scheduled_by() -> str:
            status = target.kube.get(CAMPAIGNS, namespace, "busy").get("status") or {}
            condition = schedulerkit.condition({"status": status}, "Scheduled") or {}
            return str(condition.get("message") or "")

        for _ in range(plan.failover_repeats):
            wait_for("two operator replicas", lambda: len(operator.running_pids()) == 2, timeout=120)
            leader = wait_for("a leader", operator.leader, timeout=90)
            wait_for("the leader to schedule", lambda leader=leader: leader in scheduled_by(), timeout=90)
            pid = operator.running_pids()[leader]
            killed = time.time()
            # Frozen (a hung or cut-off node), not killed: a killed container restarts in its pod and
            # takes its own Lease back at once (the restart figure), so no other replica would lead.
            schedulerkit.stop_group(pid)
            wait_for(
                "the new leader's first status write",
                lambda leader=leader: (
                    (new := operator.leader()) not in (None, leader) and new in scheduled_by()
                ),
                timeout=120,
                interval=0.2,
            )
            found.append(time.time() - killed)
            # The frozen process dies now; its container restarts and stands by.
            schedulerkit.kill_group(pid)
        target.kube.patch(CAMPAIGNS, namespace, "busy", {"spec": {"suspend": True}})
    target.delete_namespace(namespace)
    return found


# --- many campaigns ----------------------------------------------------------------------------------


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
                    name, image=target.image, items=_items(each, index * each), max_concurrency=mc
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
                items=_items(count * each, count * each),
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


# --- scale curve ---------------------------------------------------------------------------------------


def compact_items(count: int, shard_size: int) -> list[JSON]:
    """`count` items that fit one ConfigMap (1 MiB) as JSONL even at 100,000: the first item of
    each shard carries the item's index, the others their position in the shard. Every shard's
    item list differs (so every shard has its own idempotency key) and no shard holds two equal
    items (so every item runs)."""
    return [{"": n if n % shard_size == 0 else n % shard_size} for n in range(count)]


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
        bound = BACKLOG_RATIO * first.max_concurrency + first.max_concurrency
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
        peaks = {kind: max((s.counts.get(kind, 0) for s in run.samples), default=0) for kind in COUNTED}
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
                "<= 200 MiB",
                meets(rss, 200, at_least=False),
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


def _scale_case(ctx: Context, case: Scale, section: Section, budget: float) -> dict[str, Any]:
    target, plan = ctx.target, ctx.plan
    namespace = target.namespace(f"bench-scale-{case.key.lower()}")
    name = f"scale-{case.key.lower()}"
    shards = -(-case.items // case.shard_size)
    etcd_before = target.etcd_bytes()
    with target.operator(namespace) as operator:
        if case.items > 10000 or case.shard_size > 1:
            lines = "\n".join(
                json.dumps(i, separators=(",", ":")) for i in compact_items(case.items, case.shard_size)
            )
            target.kube.create(
                CONFIGMAPS, namespace, {"metadata": {"name": f"{name}-items"}, "data": {"items.jsonl": lines}}
            )
            source: JSON = {"items_from": {"configMapName": f"{name}-items", "key": "items.jsonl"}}
        else:
            source = {"items": _items(case.items)}
        manifest = campaign_manifest(
            name,
            image=target.image,
            shard_size=case.shard_size,
            max_concurrency=case.max_concurrency,
            **source,
        )
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
        run = run_campaign(
            target,
            namespace,
            manifest,
            expected_shards=shards,
            budget=budget,
            operator=operator,
            sample_every=plan.sample_every,
            count_objects=True,
            count_cpu=True,  # its table per decile (_cpu_by_decile)
        )
        if profile is not None:
            result = profile.wait(plan.profile_seconds + 60)
            if result is not None:
                ctx.profiles.append(result)
    etcd_after = target.etcd_bytes()
    # Not deleted: tens of thousands of objects would keep the garbage collector busy through the
    # next scenario. The campaign is suspended and its operator gone; the namespace goes at the end.
    return {
        "run": run,
        "bound": BACKLOG_RATIO * case.max_concurrency + case.max_concurrency,
        "etcd_before": etcd_before,
        "etcd_after": etcd_after,
    }


# --- profiles -------------------------------------------------------------------------------------------


def profiles(ctx: Context) -> Section:
    section = Section(
        "profiles",
        "Profiles (py-spy)",
        "py-spy samples of the busy threads of one process (50 Hz): the share of samples in which a "
        "function was on the stack (inclusive) and in which it was the running frame (self).",
    )
    for profile in ctx.profiles:
        if profile.error:
            section.notes.append(f"{profile.what}: {profile.error}")
            continue
        if not profile.samples:
            section.notes.append(f"{profile.what}: no busy samples (the process was idle or ended)")
            continue
        rows = []
        inclusive = profile.top(profile.inclusive, 15)
        leaf = profile.top(profile.leaf, 15)
        for index in range(max(len(inclusive), len(leaf))):
            left = inclusive[index] if index < len(inclusive) else ("", 0.0)
            right = leaf[index] if index < len(leaf) else ("", 0.0)
            rows.append([left[0], f"{left[1]:.0f} %", right[0], f"{right[1]:.0f} %"])
        section.tables.append(
            Table(
                f"{profile.what}: {profile.samples} samples",
                ["on the stack (inclusive)", "share", "running (self)", "share"],
                rows,
            )
        )
    section.data["profiles"] = [
        {
            "what": p.what,
            "samples": p.samples,
            "error": p.error,
            "inclusive": p.top(p.inclusive, 30),
            "self": p.top(p.leaf, 30),
        }
        for p in ctx.profiles
    ]
    return section


def stop_everything(target: Target) -> None:
    """Suspend what is left and delete the benchmark's namespaces (in the background)."""
    for namespace in target.namespaces:
        with contextlib.suppress(Exception):
            for campaign in target.kube.list(CAMPAIGNS, namespace):
                target.kube.patch(
                    CAMPAIGNS, namespace, campaign["metadata"]["name"], {"spec": {"suspend": True}}
                )
        target.delete_namespace(namespace)
