"""One measured run: a shardops Campaign, or the Indexed Job a user would write instead, doing the
same per-item work (the example agent, with its latency as the work) through the same kubelet.

Both are timed alike: from the create call to the first poll (every POLL_SECONDS, one GET) that sees
the whole thing finished, so that controller bookkeeping counts on both sides. A run that is not
finished when its time budget runs out is stopped (a Campaign is suspended, a Job deleted) and
reported with what it completed.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from testbed.harness import wait_for
from testbed.kits import scheduler as schedulerkit

from benchmarks.cpu import CpuCounter
from benchmarks.lanes import Lanes
from benchmarks.target import ProcessStat, Target, process_stat
from shardops.api.names import API_GROUP_VERSION, CAMPAIGN_LABEL
from shardops.k8s.api import CAMPAIGNS, CONFIGMAPS, EVENTS, JOBS, LEASES, PODS, SHARDS, NotFound, Resource
from shardops.k8s.jobs import list_worker_pods
from shardops.logic.timefmt import parse_rfc3339

JSON = dict[str, Any]
POLL_SECONDS = 0.25
AGENT = "shardops-example-agent"
# The campaigns run their command as a user after throughput would: one process per worker serving
# shard after shard (spec.worker.persistent; the example agent speaks the protocol). An Indexed Job
# cannot: its pods start the command once per item. SHARDOPS_BENCH_PERSISTENT=0 measures the
# process-per-shard mode instead.
PERSISTENT = os.environ.get("SHARDOPS_BENCH_PERSISTENT", "1") != "0"
# Shards each worker pod runs at once (spec.worker.slots): one process's start, client and watches
# serve that many, as a user after throughput sets it. SHARDOPS_BENCH_SLOTS=1: a pod per slot;
# SHARDOPS_BENCH_SLOTS=0: left unset, the product's default from what the work is (with
# SHARDOPS_BENCH_PERSISTENT=0: a Campaign as a user who tunes nothing writes it).
SLOTS = int(os.environ.get("SHARDOPS_BENCH_SLOTS", "10"))
# spec.worker.workload, the hint the defaults follow (IOBound: the example agent's work is a wait);
# unset unless SHARDOPS_BENCH_WORKLOAD names it.
WORKLOAD = os.environ.get("SHARDOPS_BENCH_WORKLOAD") or None
# The kinds whose live count a scale run samples: what one campaign keeps on the API server.
COUNTED: dict[str, Resource] = {
    "Shards": SHARDS,
    "Leases": LEASES,
    "ConfigMaps": CONFIGMAPS,
    "Events": Resource("", "v1", "events"),
    "Jobs": JOBS,
    "Pods": PODS,
}
assert EVENTS.plural == "events"  # the same objects as the events.k8s.io view the operator writes


def epoch(text: str) -> float:
    return parse_rfc3339(text).timestamp()


@dataclass(frozen=True)
class Sample:
    at: float
    counts: dict[str, int]
    operator_rss: int | None
    operator_cpu: float | None
    # CPU seconds by kind of process since the previous sample (benchmarks.cpu; local control plane).
    cpu: dict[str, float] = field(default_factory=dict)
    # The Campaign object's size in bytes as the API server returned it (when the run measures it).
    campaign_bytes: int | None = None
    # The largest RSS of the campaign's worker processes (one per worker pod; when the run measures
    # them, local control plane only) and how many were running.
    worker_rss: int | None = None
    workers: int | None = None


def object_bytes(obj: JSON) -> int:
    """An object's size as compact JSON, the encoding the API server stores custom resources in:
    what counts against etcd's request limit (1.5 MiB) and what every status write sends whole."""
    return len(json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode())


def peak_counts(samples: Sequence[Sample]) -> dict[str, int]:
    """The most objects of each counted kind alive at any sample (0 for a kind never counted)."""
    return {kind: max((s.counts.get(kind, 0) for s in samples), default=0) for kind in COUNTED}


@dataclass
class Run:
    """What one run did, in epoch seconds."""

    kind: str  # "shardops" or "indexed-job"
    name: str
    namespace: str
    total: int
    started: float
    ended: float
    completed: int
    finished: bool
    budget_seconds: float
    max_concurrency: int
    completions: list[float] = field(default_factory=list)
    running: list[tuple[float, float]] = field(default_factory=list)
    work: list[tuple[float, float]] = field(default_factory=list)
    pending_to_running: list[tuple[float, float]] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)
    cpu: dict[str, float] = field(default_factory=dict)
    operator_peak_rss: int | None = None
    operator_cpu: float | None = None
    # Until when the API requests in the namespace are this run's: set when its cleanup starts.
    quiet_until: float | None = None
    # Where the worker slots' time went (their pods' logs; local control plane only).
    lanes: Lanes | None = None

    @property
    def window(self) -> tuple[float, float]:
        """The time whose API requests the run caused: its own, and the bookkeeping right after it,
        up to the cleanup (which neither side of a comparison is charged for)."""
        end = self.ended + 2.0
        return (self.started, min(end, self.quiet_until) if self.quiet_until else end)

    @property
    def seconds(self) -> float:
        return self.ended - self.started

    @property
    def throughput(self) -> float:
        return self.completed / self.seconds if self.seconds > 0 else 0.0


# --- manifests ------------------------------------------------------------------------------------


def agent_env(work_seconds: float, ledger: Path | None) -> list[JSON]:
    env = [
        {"name": "SHARDOPS_AGENT_LATENCY", "value": str(work_seconds)},
        {"name": "SHARDOPS_AGENT_COST", "value": "0"},
    ]
    if ledger is not None:
        env.append({"name": "SHARDOPS_AGENT_LEDGER", "value": str(ledger)})
    return env


def campaign_manifest(
    name: str,
    *,
    image: str,
    items: Sequence[JSON] | None = None,
    items_from: JSON | None = None,
    shard_size: int = 1,
    max_concurrency: int = 20,
    work_seconds: float = 0.0,
    ledger: Path | None = None,
    persistent: bool = PERSISTENT,
    slots: int = SLOTS,
    workload: str | None = WORKLOAD,
    **spec: Any,
) -> JSON:
    """A Campaign as a user writes it: everything not given keeps the product's default, except
    `spec.worker.persistent` (PERSISTENT), `spec.worker.slots` (SLOTS; 0: unset) and
    `spec.worker.workload` (WORKLOAD)."""
    worker: JSON = {"image": image, "command": [AGENT], "env": agent_env(work_seconds, ledger)}
    if persistent:
        worker["persistent"] = True
    if slots >= 1:
        worker["slots"] = slots
    if workload is not None:
        worker["workload"] = workload
    body: JSON = {"shardSize": shard_size, "maxConcurrency": max_concurrency, "worker": worker, **spec}
    if items_from is not None:
        body["itemsFrom"] = items_from
    else:
        body["items"] = list(items or [])
    return {"apiVersion": API_GROUP_VERSION, "kind": "Campaign", "metadata": {"name": name}, "spec": body}


# The per-item command of the Indexed Job: the example agent on a one-line items file built from the
# completion index, in a fresh directory (pods of the process-kubelet share the host's /tmp).
INDEXED_SCRIPT = (
    'd=$(mktemp -d) && cd "$d" && export SHARDOPS_SHARD="{name}-$JOB_COMPLETION_INDEX" && '
    'printf \'{{"key":"item-%s","index":%s,"item":{{"i":%s}}}}\\n\' '
    '"$JOB_COMPLETION_INDEX" "$JOB_COMPLETION_INDEX" "$JOB_COMPLETION_INDEX" > items.jsonl && '
    f'{AGENT}; code=$?; cd / && rm -rf "$d"; exit $code'
)


def indexed_job_manifest(
    name: str, *, image: str, completions: int, parallelism: int, work_seconds: float, ledger: Path | None
) -> JSON:
    env = [
        *agent_env(work_seconds, ledger),
        {"name": "SHARDOPS_ITEMS_FILE", "value": "items.jsonl"},
        {"name": "SHARDOPS_RESULTS_FILE", "value": "results.jsonl"},
        {"name": "SHARDOPS_ERROR_FILE", "value": "error.json"},
    ]
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            "completionMode": "Indexed",
            "completions": completions,
            "parallelism": parallelism,
            "backoffLimit": 6,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "automountServiceAccountToken": False,
                    "containers": [
                        {
                            "name": "item",
                            "image": image,
                            "command": ["sh", "-c", INDEXED_SCRIPT.format(name=name)],
                            "env": env,
                        }
                    ],
                }
            },
        },
    }


# --- sampling while a run goes -------------------------------------------------------------------


class Sampler:
    """Every `interval` seconds: live objects per kind in the namespace (when `count`), the
    operator's memory and CPU (when its pid is known) and, when `count_cpu`, the machine's CPU by
    kind of process (both on the local control plane only, whose processes are all on this
    machine; the CPU by kind reads every process's /proc files, so only the runs that report it
    pay for it) and, when `campaign` is named, that Campaign object's size (one GET) and, when
    `workers` names a Campaign, the RSS of its worker pods' processes (one list of its worker pods, at most
    maxConcurrency of them)."""

    def __init__(
        self,
        target: Target,
        namespace: str,
        interval: float,
        *,
        count: bool,
        operator: schedulerkit.Operator | None,
        count_cpu: bool = False,
        campaign: str | None = None,
        workers: str | None = None,
    ) -> None:
        self.target = target
        self.campaign = campaign
        self.workers = workers
        self.namespace = namespace
        self.interval = interval
        self.count = count
        self.operator = operator
        self.samples: list[Sample] = []
        self.peak_rss: int | None = None
        self.last_cpu: float | None = None
        self.cpu = CpuCounter() if count_cpu and target.local is not None else None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-sampler", daemon=True)

    def _operator_stat(self) -> ProcessStat | None:
        if self.operator is None or self.target.local is None:
            return None
        with contextlib.suppress(Exception):
            for pid in self.operator.running_pids().values():
                return process_stat(pid)
        return None

    def _worker_stats(self) -> list[ProcessStat]:
        """The campaign's running worker processes (the process-kubelet's containerID is the pid)."""
        if self.workers is None or self.target.local is None:
            return []
        found = []
        with contextlib.suppress(Exception):
            for pod in list_worker_pods(self.target.kube, self.namespace, self.workers):
                for status in (pod.get("status") or {}).get("containerStatuses") or []:
                    container = str(status.get("containerID") or "")
                    if (status.get("state") or {}).get("running") and container.startswith("process://"):
                        stat = process_stat(int(container.removeprefix("process://")))
                        if stat is not None:
                            found.append(stat)
        return found

    def sample(self) -> None:
        counts: dict[str, int] = {}
        if self.count:
            for kind, resource in COUNTED.items():
                with contextlib.suppress(Exception):
                    counts[kind] = self.target.count(resource, self.namespace)
        campaign_bytes = None
        if self.campaign is not None:
            with contextlib.suppress(Exception):  # not created yet (the first sample), or gone
                campaign_bytes = object_bytes(self.target.kube.get(CAMPAIGNS, self.namespace, self.campaign))
        stat = self._operator_stat()
        if stat is not None:
            self.peak_rss = max(self.peak_rss or 0, stat.peak_rss_bytes)
            self.last_cpu = stat.cpu_seconds
        workers = self._worker_stats()
        self.samples.append(
            Sample(
                time.time(),
                counts,
                stat.rss_bytes if stat else None,
                stat.cpu_seconds if stat else None,
                self.cpu.read() if self.cpu is not None else {},
                campaign_bytes,
                max((w.rss_bytes for w in workers), default=None),
                len(workers) if self.workers is not None and self.target.local is not None else None,
            )
        )

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def __enter__(self) -> Sampler:
        self.sample()
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        self.sample()


# --- running ------------------------------------------------------------------------------------------


def _poll(done: Callable[[], bool], budget: float) -> tuple[bool, float]:
    """Poll `done` until it holds or `budget` seconds pass: (finished, epoch when seen)."""
    deadline = time.monotonic() + budget
    while time.monotonic() < deadline:
        if done():
            return True, time.time()
        time.sleep(POLL_SECONDS)
    return False, time.time()


def _campaign_finished(target: Target, namespace: str, name: str, expected: int) -> bool:
    status = target.kube.get(CAMPAIGNS, namespace, name).get("status") or {}
    counts = status.get("counts") or {}
    terminal = int(counts.get("done", 0)) + int(counts.get("failed", 0)) + int(counts.get("blocked", 0))
    return status.get("phase") in ("Succeeded", "Failed") or (expected > 0 and terminal >= expected)


def read_ledger(path: Path | None) -> list[tuple[float, float]]:
    """[start, done) of every item the agent finished, from its ledger."""
    if path is None or not path.exists():
        return []
    starts: dict[tuple[Any, ...], float] = {}
    intervals = []
    for line in path.read_text().splitlines():
        with contextlib.suppress(ValueError):
            entry = json.loads(line)
            key = (entry.get("shard"), entry.get("attempt"), entry.get("index"), entry.get("pid"))
            if entry.get("event") == "start":
                starts[key] = float(entry["at"])
            elif entry.get("event") == "done" and key in starts:
                intervals.append((starts.pop(key), float(entry["at"])))
    return intervals


def shard_timeline(
    shards: Sequence[JSON],
) -> tuple[list[float], list[tuple[float, float]], list[tuple[float, float]]]:
    """From the shards' own history: completion times, Running intervals, (Pending, first Running)."""
    completions = []
    pending_to_running = []
    for shard in shards:
        entries = schedulerkit.history(shard)
        pending = next((epoch(e["at"]) for e in entries if e["reason"] == "Materialized"), None)
        claimed = next((epoch(e["at"]) for e in entries if e["reason"] == "Claimed"), None)
        if pending is not None and claimed is not None:
            pending_to_running.append((pending, claimed))
        completions.extend(epoch(e["at"]) for e in entries if e["reason"] == "Completed")
    running = [(a.timestamp(), b.timestamp()) for a, b, _ in schedulerkit.running_intervals(shards)]
    return sorted(completions), running, pending_to_running


def run_campaign(
    target: Target,
    namespace: str,
    manifest: JSON,
    *,
    expected_shards: int,
    budget: float,
    ledger: Path | None = None,
    operator: schedulerkit.Operator | None = None,
    sample_every: float | None = None,
    count_objects: bool = False,
    count_cpu: bool = False,
    measure_campaign: bool = False,
    measure_workers: bool = False,
    on_start: Callable[[], None] | None = None,
) -> Run:
    name = manifest["metadata"]["name"]
    cpu_before = target.cpu_seconds()
    sampler = (
        Sampler(
            target,
            namespace,
            sample_every,
            count=count_objects,
            operator=operator,
            count_cpu=count_cpu,
            campaign=name if measure_campaign else None,
            workers=name if measure_workers else None,
        )
        if sample_every
        else None
    )
    with sampler or contextlib.nullcontext():
        started = time.time()
        target.kube.create(CAMPAIGNS, namespace, manifest)
        if on_start is not None:
            on_start()
        finished, ended = _poll(lambda: _campaign_finished(target, namespace, name, expected_shards), budget)
        if not finished:
            # Stopped, not abandoned: no shard starts any more, workers exit after their current one.
            target.kube.patch(CAMPAIGNS, namespace, name, {"spec": {"suspend": True}})
    cpu_after = target.cpu_seconds()
    shards = schedulerkit.campaign_shards(target.kube, namespace, name, target.cluster.object_store)
    completions, running, pending_to_running = shard_timeline(shards)
    if finished and completions:
        ended = max(ended, completions[-1])
    return Run(
        kind="shardops",
        name=name,
        namespace=namespace,
        total=expected_shards,
        started=started,
        ended=ended if finished else time.time(),
        completed=len(completions),
        finished=finished,
        budget_seconds=budget,
        max_concurrency=int(manifest["spec"].get("maxConcurrency", 6)),
        completions=completions,
        running=[(a, min(b, ended)) for a, b in running],
        work=read_ledger(ledger),
        pending_to_running=pending_to_running,
        samples=sampler.samples if sampler else [],
        cpu={k: cpu_after[k] - cpu_before.get(k, 0.0) for k in cpu_after},
        operator_peak_rss=sampler.peak_rss if sampler else None,
        operator_cpu=sampler.last_cpu if sampler else None,
    )


def _job_done(target: Target, namespace: str, name: str, completions: int) -> bool:
    status = target.kube.get(JOBS, namespace, name).get("status") or {}
    conditions = status.get("conditions") or []
    complete = any(c.get("type") in ("Complete", "Failed") and c.get("status") == "True" for c in conditions)
    return complete or int(status.get("succeeded") or 0) >= completions


def run_indexed_job(
    target: Target,
    namespace: str,
    name: str,
    *,
    completions: int,
    parallelism: int,
    work_seconds: float,
    budget: float,
    ledger: Path | None,
) -> Run:
    manifest = indexed_job_manifest(
        name,
        image=target.image,
        completions=completions,
        parallelism=parallelism,
        work_seconds=work_seconds,
        ledger=ledger,
    )
    cpu_before = target.cpu_seconds()
    started = time.time()
    target.kube.create(JOBS, namespace, manifest)
    finished, ended = _poll(lambda: _job_done(target, namespace, name, completions), budget)
    status = target.kube.get(JOBS, namespace, name).get("status") or {}
    if not finished:
        target.kube.delete(JOBS, namespace, name, propagation="Background")
    cpu_after = target.cpu_seconds()
    work = read_ledger(ledger)
    return Run(
        kind="indexed-job",
        name=name,
        namespace=namespace,
        total=completions,
        started=started,
        ended=ended,
        completed=int(status.get("succeeded") or 0),
        finished=finished,
        budget_seconds=budget,
        max_concurrency=parallelism,
        completions=sorted(b for _, b in work),
        work=work,
        cpu={k: cpu_after[k] - cpu_before.get(k, 0.0) for k in cpu_after},
    )


def _any(target: Target, resource: Resource, namespace: str, selector: str) -> bool:
    """Whether any object matches: one page of one item."""
    page = target.kube.request("GET", resource.path(namespace), query={"labelSelector": selector, "limit": 1})
    return bool(page.get("items"))


def delete_campaign(target: Target, namespace: str, name: str, timeout: float, shards: bool = True) -> bool:
    return delete_campaigns(target, namespace, [name], timeout, shards)


def delete_campaigns(
    target: Target, namespace: str, names: Sequence[str], timeout: float, shards: bool = True
) -> bool:
    """Delete Campaigns (all at once) and wait, bounded, until the garbage collector removed their
    worker Jobs (and, with `shards`, their Shards), so that the next run starts on a quiet namespace.
    False when they outlived `timeout` (the next run then starts anyway)."""
    for name in names:
        with contextlib.suppress(NotFound):
            target.kube.delete(CAMPAIGNS, namespace, name, propagation="Background")
    kinds = (SHARDS, JOBS) if shards else (JOBS,)

    def gone() -> bool:
        return not any(
            _any(target, resource, namespace, f"{CAMPAIGN_LABEL}={name}")
            for name in names
            for resource in kinds
        )

    try:
        wait_for(f"campaigns {', '.join(names)}: objects deleted", gone, timeout=timeout, interval=1.0)
    except AssertionError:
        return False
    return True


def delete_job(target: Target, namespace: str, name: str, timeout: float, pods: bool = True) -> bool:
    with contextlib.suppress(NotFound):
        target.kube.delete(JOBS, namespace, name, propagation="Background")
    if not pods:
        return True  # its pods have exited already: what is left is bookkeeping
    try:
        wait_for(
            f"job {name}'s pods to be deleted",
            lambda: not _any(target, PODS, namespace, f"job-name={name}"),
            timeout=timeout,
            interval=1.0,
        )
    except AssertionError:
        return False
    return True
