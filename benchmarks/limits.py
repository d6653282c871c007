"""What limits each figure that misses its target, and what would close it, from the evidence this run
collected: CPU seconds by process during the runs, the py-spy profiles, the API cost by request, and
the recovery times split into their parts. Every number quoted is one measured in this run."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from benchmarks import stats
from benchmarks.model import Check, Section

if TYPE_CHECKING:
    from benchmarks.scenarios.context import Context

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
    "Thread._bootstrap",
    "_worker (concurrent",
    "_WorkItem.run",
    "run_operator",
    "_run_operator",
    "BaseEventLoop.",
    "Runner.run",
    "Handle._run",
    "Worker._step",
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
            busy = max(profile.computing, 1)
            frames = [
                f"{name} {100.0 * n / busy:.0f} %"
                for name, n in profile.computing_inclusive.most_common(80)
                if not name.startswith(GENERIC) and n < busy
            ][:count]
            return (
                f"py-spy of {profile.what}, {profile.samples} busy samples: "
                f"{profile.share(profile.network):.0f} % waiting on a socket (the API server's answers), "
                f"{profile.share(profile.waiting):.0f} % blocked in a selector or lock, "
                f"{profile.share(profile.computing):.0f} % running Python, mostly in: {'; '.join(frames)}"
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


def _throughput(key: str, sections: Sequence[Section], ctx: Context) -> str:
    cost = _cost(sections, key)
    text = (
        f"[{key}] CPU during the shardops runs: {_cpu_text(ctx, key, 0)}; during the Indexed Job runs: "
        f"{_cpu_text(ctx, key, 1)}."
    )
    if cost:
        reads = _top_requests(sections, f"{key}: shardops, per shard", "read", 4)
        writes, read_count = cost.get("writes_per_shard", 0), cost.get("reads_per_shard", 0)
        text += (
            f" Per shard {writes:.1f} writes and {read_count:.1f} reads (most: {reads}), against "
            f"{cost.get('job_writes_per_item', 0):.1f} writes per Job item."
        )
    return text


def _startup(ctx: Context, sections: Sequence[Section]) -> str:
    worker, agent = ctx.startup.get("worker"), ctx.startup.get("agent")
    writes = _top_requests(sections, "zero: shardops, per shard", "write", 40)
    started = next((part for part in writes.split(", ") if part.startswith("operator create jobs ")), "")
    if not (worker and agent and started):
        return ""
    per_shard = float(started.rsplit(" ", 1)[1])
    return (
        f"Starting a worker process costs {worker.median:.2f} CPU-s (its imports) and an agent "
        f"{agent.median:.2f} CPU-s; the operator started {per_shard:.2f} worker Jobs per zero-work shard, "
        f"so process starts alone cost about {per_shard * worker.median + agent.median:.2f} CPU-s per "
        "shard, where the Job pays for one sh and one agent per item"
    )


def _writes(check: Check, sections: Sequence[Section]) -> str:
    key = "zero"
    writes = _top_requests(sections, f"{key}: shardops, per shard", "write", 8)
    return (
        f"The writes of one zero-work shard, most frequent first: {writes}. What would close it: one "
        "status write per transition with the Event only for what a person must see (routine "
        "transitions in history and metrics), the claim and the Lease in fewer writes, one result "
        "object per shard instead of a result and an items ConfigMap"
    )


def _heartbeat(sections: Sequence[Section]) -> str:
    writes = _top_requests(sections, "5s: shardops, per shard", "write", 6)
    return (
        f"Each heartbeat renews the Lease and patches the shard's status (writes per shard with "
        f"heartbeats every 2 s: {writes}); a one-item shard is also counted in its campaign's "
        "Stalled Event when its progress cannot move for two heartbeats. What would close it: one write per "
        "heartbeat (the Lease renewal carrying progress, or the status patch alone)"
    )


def _pending(ctx: Context) -> str:
    return (
        "Workers wake on a watched change (a shard became Pending, a running one stopped), not on a "
        "poll, and a claim is a Lease create and a status patch. The figure counts from the shard's "
        "turn (a slot free for it), so what is left is a free slot's claim: on this machine mostly a "
        "campaign's start, when a new worker pod's slots make their first claims one after another "
        "while their persistent commands start on the same 2 cores (the table's cold row and the "
        "first claims of the slot steps above). What would close it: less CPU per claim and per "
        "worker start (the worker's imports, the API server's share of a claim)"
    )


def _restart(ctx: Context) -> str:
    process = stats.spread(ctx.restart_process)
    text = (
        f"The new operator process ran after {process.show(1, ' s')} (container restart and "
        if process
        else ""
    )
    return (
        text + "Python start); it then takes the leader Lease from its dead predecessor at once (the "
        "Lease names the holder's pod uid and process token), so the rest is kopf's start and the "
        "first pass. What would close it: a faster start (the imports of kopf and the kubernetes client)"
    )


def _scale(check: Check, ctx: Context) -> str:
    profile = _profile(ctx, "the operator")
    return (
        (profile + ". " if profile else "")
        + "A run stopped at its time budget misses however its deciles compare (the figure needs the "
        "whole campaign). Nothing on the per-shard path grows with the campaign: a pass lists the "
        "window (Done shards are folded and deleted), workers look through watches of the window. "
        "What would close it: less CPU per shard, so that the whole campaign fits the run's budget"
    )


def _objects(check: Check) -> str:
    return (
        "Result ConfigMaps are never deleted (they are the result store and outlive the "
        "Campaign), Done Shards and their Leases stay until the Campaign is deleted, and Events "
        "are kept an hour by the API server. What would close it: results in object storage, the Done "
        "shard folded and deleted, one Event per campaign and reason for what happens to its shards"
    )


THROUGHPUT = ("throughput", "utilization", "efficiency")


def explain(sections: Sequence[Section], ctx: Context) -> list[str]:
    """One paragraph per kind of miss, naming the figures it covers."""
    missed = [c for s in sections for c in s.checks if c.met is False]
    found = []
    family = [c for c in missed if any(word in c.figure for word in THROUGHPUT)]
    if family:
        figures = "; ".join(f"{c.figure}: {c.value} (target {c.target})" for c in family)
        keys = [k for k in ("zero", "1s", "5s") if k in ctx.versus_runs]
        evidence = [_throughput(k, sections, ctx) for k in keys]
        startup = _startup(ctx, sections)
        profile = _profile(ctx, "a worker")
        found.append(
            f"**Throughput, cap utilization, efficiency** — {figures}. Evidence: "
            + " ".join(evidence)
            + (f" {startup}." if startup else "")
            + (f" {profile}." if profile else "")
            + " What would close it: a look for work reads nothing (workers watch the window), the S3 "
            "calls go through a thin client, and a worker pod runs spec.worker.slots shards in one "
            "process (one start, one client and one pair of watches for all its slots), so where the "
            "cores are not the limit what is left is a slot's time between two shards (its Done "
            "write, then its next claim: the slots of a pod claim one at a time and pods lose some "
            "Lease creates to each other) and the operator's pass that cuts the next shards; where "
            "they are, each shard's own requests (the API server's share above)."
        )
    groups: dict[str, list[Check]] = {}
    for check in missed:
        if check not in family:
            groups.setdefault(_family(check.figure), []).append(check)
    for key, checks in groups.items():
        figures = "; ".join(f"{c.figure}: {c.value} (target {c.target})" for c in checks)
        why = _why(key, checks[0], sections, ctx)
        found.append(f"**{TITLES.get(key, key)}** — {figures}. {why}.")
    return found


def _why(key: str, check: Check, sections: Sequence[Section], ctx: Context) -> str:
    if key == "heartbeat":
        return _heartbeat(sections)
    if key == "writes":
        return _writes(check, sections)
    if key == "pending":
        return _pending(ctx)
    if key == "restart":
        return _restart(ctx)
    if key == "objects":
        return _objects(check)
    if key == "scale":
        return _scale(check, ctx)
    return "See its section"


TITLES = {
    "heartbeat": "Writes per heartbeat",
    "writes": "Writes per shard",
    "pending": "Pending->Running",
    "restart": "Restart recovery",
    "objects": "Objects alive",
    "scale": "Throughput per decile and memory at scale",
}


def _family(figure: str) -> str:
    if "per heartbeat" in figure:
        return "heartbeat"
    if "writes per shard" in figure:
        return "writes"
    if "Pending->Running" in figure:
        return "pending"
    if "restart" in figure:
        return "restart"
    if "objects alive" in figure:
        return "objects"
    if "decile" in figure or "RSS" in figure:
        return "scale"
    return "other"
