"""shardops against an Indexed Job: the same zero-work items both ways, side by side, and the CPU to
start a worker and an agent."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from testbed.kits import scheduler as schedulerkit

from benchmarks import lanes, profiling, runs, stats
from benchmarks.model import Section, Table, meets
from benchmarks.plan import Versus
from benchmarks.runs import (
    AGENT as AGENT_COMMAND,
)
from benchmarks.runs import (
    Run,
    campaign_manifest,
    delete_campaign,
    delete_job,
    run_campaign,
    run_indexed_job,
)
from benchmarks.scenarios.context import (
    Context,
    cpu_delta,
    cpu_text,
    numbered_items,
    spread_text,
)
from benchmarks.target import Target
from shardops.api.common import JSON
from shardops.api.names import CAMPAIGN_LABEL
from shardops.k8s.api import PODS


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
            [[name, spread_text(value, 2)] for name, value in ctx.startup.items()],
        )
    )


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
            if runs.SLOTS == 1
            else "spec.worker.slots is unset: the product's default (SHARDOPS_BENCH_SLOTS=0). "
        )
        + (f"spec.worker.workload: {runs.WORKLOAD} (SHARDOPS_BENCH_WORKLOAD). " if runs.WORKLOAD else "")
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
            items=numbered_items(case.shards, offset=repeat * case.shards),
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
        run.cpu = cpu_delta(cpu_before, target.cpu_seconds())
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
        run.cpu = cpu_delta(cpu_before, target.cpu_seconds())
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
            spread_text(stats.spread([o.throughput for o in ours]), 2),
            spread_text(stats.spread([j.throughput for j in jobs]), 2),
            ratio.show(2, "x") if ratio else "n/a",
            util.show(2) if util else "n/a",
            f"{spread_text(work_ours, 2)} | {spread_text(work_job, 2)}",
        ]
    ]
    ratio_value = ratio.median if ratio else None
    if case.key == "zero":
        section.check(
            f"zero-work throughput vs Indexed Job ({case.label})",
            spread_text(ratio, 2, "x"),
            ">= 1.0x",
            meets(ratio_value, 1.0) if not unfinished else False,
            ratio_value,
        )
    if case.key == "1s":
        section.check(
            f"1 s work throughput vs Indexed Job ({case.label})",
            spread_text(ratio, 2, "x"),
            ">= 1.5x",
            meets(ratio_value, 1.5) if not unfinished else False,
            ratio_value,
        )
    if case.key == "5s":
        section.check(
            f"cap utilization with 5 s work ({case.label})",
            spread_text(util, 2),
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
                cpu_text(o.cpu),
                f"{j.completed}/{j.total}",
                f"{j.seconds:.1f}",
                cpu_text(j.cpu),
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
