"""Where the machine's CPU goes while a run goes, by kind of process (the local control plane only,
where every process of the run is on this machine).

Every sample reads each process's own CPU time (/proc/PID/stat: utime + stime) and the machine's
(/proc/stat) and attributes the difference since the previous sample to the process's kind, told
from its command line (the API server, etcd, SeaweedFS, the operator, the workers, their agents...).
A process that started since the previous sample counts whole; one that ended loses the part of its
last interval (the runs' long-lived processes dominate: the control plane, the operator, the worker
pods and their persistent agents). What the kinds leave of the machine's busy time (the kernel,
processes gone in between) is shown as its own row, so the rows add up to the machine.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.target import CLOCK_TICKS, stat_fields

MACHINE = "the machine (all processes)"
UNATTRIBUTED = "not attributed (kernel, processes gone between samples)"
OTHER = "other processes"
# The kinds, in the order a table shows them: (kind, how its command line is recognised).
KINDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("kube-apiserver", ("kube-apiserver",)),
    ("etcd", ("etcd",)),
    ("kube-controller-manager", ("kube-controller-manager",)),
    ("SeaweedFS (weed)", ("weed",)),
    ("shardops operator", ("shardops operator",)),
    ("shardops workers", ("shardops worker",)),
    ("agents (the workers' commands)", ("shardops-example-agent",)),
    ("process-kubelet", ("-m testbed.cluster.kubelet",)),
    ("benchmark harness", ("-m benchmarks",)),
)
ORDER = (MACHINE, *(kind for kind, _ in KINDS), OTHER, UNATTRIBUTED)


def kind_of(argv: Sequence[str]) -> str:
    """The kind of a process from its command line (argv as /proc/PID/cmdline gives it)."""
    if not argv:
        return OTHER
    # Paths by their last part; an entry script runs as `python /venv/bin/shardops worker ...`, so
    # the line is matched from the program and, for an interpreter, from its first argument.
    words = [Path(a).name if "/" in a and not a.startswith("-") else a for a in argv]
    lines = [" ".join(words)]
    if words[0].startswith("python"):
        lines.append(" ".join(words[1:]))
    for kind, marks in KINDS:
        for mark in marks:
            if any(line == mark or line.startswith((f"{mark} ", f"{mark}.")) for line in lines):
                return kind
    return OTHER


def machine_busy_seconds(proc_stat: str) -> float:
    """Busy CPU seconds of all cores since boot, from the text of /proc/stat (idle and iowait left out)."""
    fields = [int(v) for v in proc_stat.splitlines()[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    # guest and guest_nice (9th, 10th) are already inside user and nice.
    return (sum(fields[:8]) - idle) / CLOCK_TICKS


@dataclass
class CpuCounter:
    """CPU seconds by kind between one `read` and the next. `_seen`: each live process's (start
    time, kind, CPU seconds at the previous read), pruned to the processes alive at each read, so it
    is bounded by the machine's process count."""

    proc: Path = Path("/proc")
    _seen: dict[int, tuple[str, str, float]] = field(default_factory=dict)
    _machine: float | None = None

    def read(self) -> dict[str, float]:
        """CPU seconds per kind (and MACHINE, UNATTRIBUTED) since the previous read; the first read
        gives {} (it only sets the baseline)."""
        spent: dict[str, float] = {}
        seen: dict[int, tuple[str, str, float]] = {}
        for entry in self.proc.iterdir():
            if not entry.name.isdigit():
                continue
            pid = int(entry.name)
            sample = self._process(entry)
            if sample is None:
                continue
            started, seconds = sample
            before = self._seen.get(pid)
            if before is not None and before[0] == started:
                kind, previous = before[1], before[2]
            else:
                kind, previous = self._kind(entry), 0.0
            seen[pid] = (started, kind, seconds)
            if self._machine is not None:
                spent[kind] = spent.get(kind, 0.0) + max(seconds - previous, 0.0)
        self._seen = seen
        try:
            machine = machine_busy_seconds((self.proc / "stat").read_text())
        except OSError:
            return {}
        previous_machine, self._machine = self._machine, machine
        if previous_machine is None:
            return {}
        return _with_machine(spent, max(machine - previous_machine, 0.0))

    @staticmethod
    def _process(entry: Path) -> tuple[str, float] | None:
        """(start time, own CPU seconds) of the process, None when it is gone."""
        try:
            fields = stat_fields(entry)
        except OSError:
            return None
        return fields[19], (int(fields[11]) + int(fields[12])) / CLOCK_TICKS

    @staticmethod
    def _kind(entry: Path) -> str:
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            return OTHER
        return kind_of([a.decode(errors="replace") for a in argv if a])


def _with_machine(spent: Mapping[str, float], busy: float) -> dict[str, float]:
    result = dict(spent)
    result[MACHINE] = busy
    result[UNATTRIBUTED] = max(busy - sum(spent.values()), 0.0)
    return result


def cores_by_span(
    samples: Iterable[tuple[float, Mapping[str, float]]], spans: Sequence[tuple[float, float]]
) -> dict[str, list[float | None]]:
    """Cores busy per kind in each span (begin, end): the CPU seconds of the sample intervals that
    overlap it, each spread evenly over its interval and counted for the overlapping part, divided
    by the time those parts cover. `samples`: (when taken, CPU seconds since the previous sample; the
    first only sets the baseline). A span that no sample interval overlaps gives None."""
    ordered = sorted(samples, key=lambda s: s[0])
    kinds = {kind for _, spent in ordered for kind in spent}
    result: dict[str, list[float | None]] = {kind: [] for kind in kinds}
    for begin, end in spans:
        covered = 0.0
        totals: dict[str, float] = {}
        for (before, _), (at, spent) in itertools.pairwise(ordered):
            overlap = min(end, at) - max(begin, before)
            if overlap <= 0:  # also when two samples share a time: at == before
                continue
            covered += overlap
            for kind, seconds in spent.items():
                totals[kind] = totals.get(kind, 0.0) + seconds * overlap / (at - before)
        for kind in kinds:
            result[kind].append(totals.get(kind, 0.0) / covered if covered > 0 else None)
    return {kind: result[kind] for kind in ORDER if kind in result}
