"""API cost from the local control plane's audit log (testbed/cluster/lifecycle.py's policy): every write
and, at metadata level, every read of shardops objects, Leases, Jobs (and jobs/status), Pods (and
pods/status, pods/binding), ConfigMaps and Events.

Counted per run: the entries of the run's namespace whose request arrived inside the run's window,
by writer x verb x resource[/subresource]. The benchmark's own requests (its polls and samples,
user agent `shardops-bench`) and kubectl's are left out, and so are deletions by others than
shardops (the cleanup of the run before). A watch counts once, when it starts.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from testbed.cluster.lifecycle import READ_VERBS, WRITE_VERBS
from testbed.kits import scheduler as schedulerkit

from benchmarks.runs import epoch
from benchmarks.target import USER_AGENT as BENCH_AGENT

JSON = dict[str, Any]
# Whose requests are not part of what a run costs: the benchmark itself and the installer.
NOT_COUNTED = frozenset({"bench", "kubectl"})
# Deletions count only when shardops makes them: neither side deletes anything while it runs, so a
# deletion by the garbage collector or the kubelet is the cleanup of the run before.
CLEANUP_VERBS = frozenset({"delete", "deletecollection"})
SHARDOPS_WRITERS = frozenset({"operator", "worker"})


def load(path: Path | None, namespaces: Iterable[str]) -> list[JSON]:
    """The audit entries of `namespaces` (one pass over the log)."""
    return list(entries(path, namespaces))


def entries(path: Path | None, namespaces: Iterable[str]) -> Iterator[JSON]:
    """The audit entries of `namespaces` one by one (one pass over the log): for a run whose
    entries would not fit in memory at once (the million-item run's are millions)."""
    if path is None or not path.exists():
        return
    wanted = set(namespaces)
    needles = [f'"namespace":"{n}"' for n in wanted]
    with path.open(errors="replace") as handle:
        for line in handle:
            if not any(needle in line for needle in needles):
                continue
            entry = json.loads(line)
            if (entry.get("objectRef") or {}).get("namespace") in wanted:
                yield entry


def writer(entry: JSON) -> str:
    """Who made the request, in a word: operator, worker, job-controller, kubelet, bench, kubectl..."""
    user = str((entry.get("user") or {}).get("username") or "")
    agent = str(entry.get("userAgent") or "")
    if agent.startswith(BENCH_AGENT):
        return "bench"
    if agent.startswith("kubectl") or agent.startswith("Helm"):
        return "kubectl"
    if user.startswith("system:serviceaccount:"):
        name = user.rsplit(":", 1)[-1]
        return {"shardops-operator": "operator", "shardops-worker": "worker"}.get(name, name)
    if user.startswith("system:node:") or user == "shardops-admin":
        # The process-kubelet acts with the admin credentials of the local control plane.
        return "kubelet"
    return user


def _counted(entry: JSON) -> bool:
    verb = entry.get("verb")
    stage = entry.get("stage")
    if verb == "watch":
        return stage == "ResponseStarted"
    return stage == "ResponseComplete"


def what(entry: JSON) -> str:
    ref = entry.get("objectRef") or {}
    sub = ref.get("subresource")
    return str(ref.get("resource", "")) + (f"/{sub}" if sub else "")


@dataclass
class Cost:
    """Requests of one run, by (writer, verb, resource[/subresource])."""

    units: int
    writes: Counter[tuple[str, str, str]] = field(default_factory=Counter)
    reads: Counter[tuple[str, str, str]] = field(default_factory=Counter)
    refused_writes: int = 0

    @property
    def writes_per_unit(self) -> float:
        return sum(self.writes.values()) / max(self.units, 1)

    @property
    def reads_per_unit(self) -> float:
        return sum(self.reads.values()) / max(self.units, 1)

    def by(self, counter: Counter[tuple[str, str, str]], key: str) -> Counter[str]:
        """Collapse to one dimension: 'verb_what' (verb x resource) or 'writer'."""
        collapsed: Counter[str] = Counter()
        for (who, verb, resource), count in counter.items():
            collapsed[f"{verb} {resource}" if key == "verb_what" else who] += count
        return collapsed


def cost(
    entries: Iterable[JSON],
    namespace: str,
    window: tuple[float, float],
    units: int,
    exclude: frozenset[str] = frozenset(),
) -> Cost:
    """The requests of `namespace` inside `window`, except the benchmark's and those of `exclude`."""
    begin, end = window
    found = Cost(units)
    for entry in entries:
        if (entry.get("objectRef") or {}).get("namespace") != namespace or not _counted(entry):
            continue
        at = epoch(str(entry.get("requestReceivedTimestamp") or entry.get("stageTimestamp")))
        if not begin <= at <= end:
            continue
        who = writer(entry)
        if who in NOT_COUNTED or who in exclude:
            continue
        verb = str(entry.get("verb"))
        if verb in CLEANUP_VERBS and who not in SHARDOPS_WRITERS:
            continue  # the previous run's cleanup (garbage collector, kubelet), which overlaps this run
        code = int((entry.get("responseStatus") or {}).get("code") or 0)
        key = (who, verb, what(entry))
        if verb in WRITE_VERBS:
            if 200 <= code < 300:
                found.writes[key] += 1
            else:
                found.refused_writes += 1
        elif verb in READ_VERBS:
            found.reads[key] += 1
    return found


def in_window(entries: Sequence[JSON], window: tuple[float, float]) -> list[JSON]:
    begin, end = window
    return [
        e
        for e in entries
        if begin <= epoch(str(e.get("requestReceivedTimestamp") or e.get("stageTimestamp"))) <= end
    ]


def lifecycle(entries: Sequence[JSON], shards: Sequence[JSON]) -> schedulerkit.LifecycleWrites | None:
    """Mean writes of one shard's lifecycle (its Shard, status, Lease, result ConfigMaps),
    split into heartbeats and the rest, by the e2e suite's own rule (schedulerkit.lifecycle_writes)."""
    per_shard = schedulerkit.writes_by_shard(entries, shards)
    transitions = {str(s["metadata"]["name"]): schedulerkit.worker_transitions(s) for s in shards}
    return schedulerkit.mean_lifecycle_writes(per_shard, transitions) if per_shard else None
