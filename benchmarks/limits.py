"""What limits each figure that misses its target, and what would close it, from the evidence this run
collected: CPU seconds by process during the runs, the py-spy profiles, the API cost by request, and
the recovery times split into their parts. Every number quoted is one measured in this run."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from benchmarks import stats
from benchmarks.model import Check, Section

if TYPE_CHECKING:
    from benchmarks.scenarios import Context

# Frames that are on every stack of a process (entry points, the event loop) say nothing.
GENERIC = (
    "<module>",
    "main (",
    "run (",
    "_run_worker",
    "run_worker",
    "_bootstrap",
    "Worker.run",
    "Thread.run",
)


def _cpu(ctx: Context, key: str, side: int) -> tuple[float, float, dict[str, float]]:
    total: dict[str, float] = {}
    seconds = 0.0
    for pair in ctx.versus_runs.get(key) or []:
        run = pair[side]
        seconds += run.seconds
        for name, value in run.cpu.items():
            total[name] = total.get(name, 0.0) + value
    return sum(total.values()), seconds, total


def _cpu_text(ctx: Context, key: str, side: int) -> str:
    used, seconds, parts = _cpu(ctx, key, side)
    if not parts:
        return "n/a"
    listed = ", ".join(f"{k} {v:.0f}" for k, v in sorted(parts.items(), key=lambda kv: -kv[1]) if v >= 0.5)
    completed = sum(pair[side].completed for pair in ctx.versus_runs.get(key) or [])
    return (
        f"{used:.0f} CPU-s over {seconds:.0f} s of runs ({listed}), "
        f"{used / max(completed, 1):.2f} CPU-s per completed item"
    )


def _profile(ctx: Context, prefix: str, count: int = 6) -> str:
    for profile in ctx.profiles:
        if profile.what.startswith(prefix) and not profile.error and profile.samples:
            inclusive = [
                f"{name} {share:.0f} %"
                for name, share in profile.top(profile.inclusive, 60)
                if not name.startswith(GENERIC) and share < 99.5
            ][:count]
            leaf = [f"{name} {share:.0f} %" for name, share in profile.top(profile.leaf, count)]
            return (
                f"py-spy of {profile.what} ({profile.samples} busy samples): on the stack "
                f"{'; '.join(inclusive)}; running {'; '.join(leaf)}"
            )
    return ""


def _cost(sections: Sequence[Section], key: str) -> dict[str, Any]:
    for section in sections:
        if section.key == "cost":
            return dict(section.data.get("per_case", {}).get(key) or {})
    return {}


def _top_requests(sections: Sequence[Section], title: str, kind: str, count: int = 6) -> str:
    for section in sections:
        for table in section.tables:
            if table.title == title:
                rows = [r for r in table.rows if r[0] == kind][:count]
                return ", ".join(f"{who} {verb} {what} {per}" for _, who, verb, what, per in rows)
    return ""


def _throughput(check: Check, sections: Sequence[Section], ctx: Context) -> str:
    key = "5s" if "utilization" in check.figure else ("1s" if "1 s" in check.figure else "zero")
    ours, theirs = _cpu_text(ctx, key, 0), _cpu_text(ctx, key, 1)
    cost, job = _cost(sections, key), _cost(sections, key)
    parts = [f"CPU during the shardops runs: {ours}; during the Indexed Job runs: {theirs}"]
    if cost:
        parts.append(
            f"API requests per shard: {cost.get('writes_per_shard', 0):.1f} writes and "
            f"{cost.get('reads_per_shard', 0):.1f} reads, against {job.get('job_writes_per_item', 0):.1f} "
            "writes per Job item"
        )
    jobs = _top_requests(sections, f"{key}: shardops, per shard", "write", 40)
    started = next((part for part in jobs.split(", ") if part.startswith("operator create jobs ")), "")
    worker, agent = ctx.startup.get("worker"), ctx.startup.get("agent")
    if worker and agent and started:
        per_shard = float(started.rsplit(" ", 1)[1])
        parts.append(
            f"starting a worker process costs {worker.median:.2f} CPU-s (its imports) and an agent "
            f"{agent.median:.2f} CPU-s; the operator started {per_shard:.2f} worker Jobs per shard, so "
            f"starts alone cost about {per_shard * worker.median + agent.median:.2f} CPU-s per shard "
            f"(the Job starts one agent per item, through sh)"
        )
    reads = _top_requests(sections, f"{key}: shardops, per shard", "read", 4)
    if reads:
        parts.append(f"most frequent reads per shard: {reads}")
    profile = _profile(ctx, "a worker")
    if profile:
        parts.append(profile)
    parts.append(
        "What would close it: fewer API round trips on a shard's path (each claim reads the Campaign "
        "and lists the campaign's shards before it writes the Lease and the status; completion writes "
        "two result ConfigMaps, renews and releases the Lease), and a pool of long-lived workers "
        "that pick up the next shard without a new poll cycle"
    )
    return "; ".join(parts)


def _writes(check: Check, sections: Sequence[Section]) -> str:
    key = "zero"
    writes = _top_requests(sections, f"{key}: shardops, per shard", "write", 8)
    return (
        f"the writes of one zero-work shard, most frequent first: {writes}. What would close it: one "
        "status write per transition with the Event only for what a person must see (routine "
        "transitions in history and metrics), the claim and the Lease in fewer writes, one result "
        "object per shard instead of a result and an items ConfigMap"
    )


def _heartbeat(sections: Sequence[Section]) -> str:
    writes = _top_requests(sections, "5s: shardops, per shard", "write", 6)
    return (
        f"each heartbeat renews the Lease and patches the shard's status (writes per shard with "
        f"heartbeats every 2 s: {writes}); a one-item shard also gets the operator's Stalled Event "
        "when its progress cannot move for two heartbeats. What would close it: one write per "
        "heartbeat (the Lease renewal carrying progress, or the status patch alone)"
    )


def _pending(ctx: Context) -> str:
    return (
        "a Pending shard is claimed only when a worker's poll (SHARDOPS_POLL_SECONDS, 1 s) finds "
        "it, and each worker claims one shard at a time after reading the Campaign and listing its "
        "shards; while the claims queue behind the API server (see the CPU above) the wait grows. "
        "What would close it: workers waiting on a watch instead of a poll, and a claim path of "
        "O(1) requests"
    )


def _restart(ctx: Context) -> str:
    process = stats.spread(ctx.restart_process)
    text = (
        f"the new operator process ran after {process.show(1, ' s')} (container restart and "
        if process
        else ""
    )
    return (
        text + "Python start); then it waits as a standby until the leader Lease its predecessor held "
        "expires (15 s by default): a holder with its own name may be another process, so it does not "
        "take it at once. What would close it: recording a per-process token in the Lease, so that a "
        "restarted process recognises its own dead predecessor and takes over immediately"
    )


def _scale(check: Check, ctx: Context) -> str:
    profile = _profile(ctx, "the operator")
    return (
        (profile + "; " if profile else "")
        + "each reconcile pass lists every Shard of the campaign (and reads each Running shard's Lease), "
        "and Done shards are never deleted, so a pass costs O(campaign) and slows as shards accumulate. "
        "What would close it: the bounded window of the design (fold a Done shard into the Campaign's "
        "status and delete its Shard and Lease), passes driven by the changed shard instead of a full list"
    )


def _objects(check: Check) -> str:
    return (
        f"{check.value}: result ConfigMaps are never deleted (they are the result store and outlive the "
        "Campaign), Done Shards and their Leases stay until the Campaign is deleted, and every "
        "transition posts an Event (kept an hour by the API server). What would close it: results in "
        "object storage, the Done shard folded and deleted, Events only for what a person must see"
    )


def explain(sections: Sequence[Section], ctx: Context) -> list[str]:
    found = []
    for check in (c for s in sections for c in s.checks if c.met is False):
        figure = check.figure
        if "throughput" in figure or "utilization" in figure or "efficiency" in figure:
            why = _throughput(check, sections, ctx)
        elif "heartbeat" in figure and "per heartbeat" in figure:
            why = _heartbeat(sections)
        elif "writes per shard" in figure:
            why = _writes(check, sections)
        elif "Pending->Running" in figure:
            why = _pending(ctx)
        elif "restart" in figure:
            why = _restart(ctx)
        elif "objects alive" in figure:
            why = _objects(check)
        elif "decile" in figure or "RSS" in figure:
            why = _scale(check, ctx)
        else:
            why = "see its section"
        found.append(f"**{figure}** — {check.value} (target {check.target}): {why}.")
    return found
