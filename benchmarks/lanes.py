"""Where a worker slot's time goes between two shards, read from the worker pods' own logs.

A slot (a *lane*) runs one shard after another: its claim (Lease create, the item lookup, the claim
write), the command, the Done write (the result stored and the claim's status written), then the
next claim. Each step is a JSON line of the worker's log with its time (`claimed`,
`command-started`, `command-exited`, `completed`; `claim-lost` for a lost race), so the time a slot
spends besides the work is measured per step, not guessed from the total. Only the local control
plane keeps the pods' logs as files (`Target.local`); elsewhere there is no breakdown.
"""

from __future__ import annotations

import datetime as dt
import itertools
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from benchmarks import stats
from benchmarks.model import Table

JSON = dict[str, Any]

# The steps of a shard on its lane, in order: (label, from event, to event).
STEPS = (
    ("claim written -> command started", "claimed", "command-started"),
    ("command started -> exited (the work)", "command-started", "command-exited"),
    ("command exited -> Done written", "command-exited", "completed"),
)
GAP = "Done written -> next claim written (same slot)"
_SHARD_EVENTS = frozenset({"claimed", *(event for _, begin, end in STEPS for event in (begin, end))})


def _no_steps() -> dict[str, list[float]]:
    return {label: [] for label, _, _ in STEPS} | {GAP: []}


@dataclass
class Lanes:
    """The steps of every shard of one run, in seconds; `first_claims`: when each lane claimed its
    first shard, after the run's start; `lost`: claim races lost; `gaps_after_a_loss`: the gaps in
    which the slot's pod lost a race."""

    steps: dict[str, list[float]] = field(default_factory=_no_steps)
    first_claims: list[float] = field(default_factory=list)
    lost: int = 0
    shards: int = 0
    gaps_after_a_loss: list[float] = field(default_factory=list)
    gaps_clean: list[float] = field(default_factory=list)


def parse_log(text: str) -> list[JSON]:
    """The JSON lines of a worker's log (anything else, such as a traceback, is left out)."""
    entries = []
    for line in text.splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict) and "time" in entry:
            entries.append(entry)
    return entries


def _at(entry: JSON) -> float:
    return dt.datetime.fromisoformat(str(entry["time"])).timestamp()


def read(logs: Mapping[str, Iterable[JSON]], started: float) -> Lanes:
    """`logs`: each worker pod's log entries, by pod; `started`: the run's start (epoch seconds)."""
    lanes = Lanes()
    for entries in logs.values():
        times: dict[str, dict[str, float]] = {}
        holder_of: dict[str, str] = {}
        losses: list[float] = []
        for entry in entries:
            event, shard = entry.get("event"), entry.get("shard")
            if event == "claim-lost":
                losses.append(_at(entry))
            if not isinstance(shard, str) or event not in _SHARD_EVENTS:
                continue
            times.setdefault(shard, {})[str(event)] = _at(entry)
            if event == "claimed":
                holder_of[shard] = str(entry.get("holder") or "")
        lanes.lost += len(losses)
        by_lane: dict[str, list[dict[str, float]]] = {}
        for shard, seen in times.items():
            if "completed" not in seen or shard not in holder_of:
                continue
            lanes.shards += 1
            by_lane.setdefault(holder_of[shard], []).append(seen)
            for label, begin, end in STEPS:
                if begin in seen and end in seen:
                    lanes.steps[label].append(seen[end] - seen[begin])
        for shards in by_lane.values():
            shards.sort(key=lambda seen: seen["claimed"])
            lanes.first_claims.append(shards[0]["claimed"] - started)
            for done, then in itertools.pairwise(shards):
                gap = then["claimed"] - done["completed"]
                lanes.steps[GAP].append(gap)
                lost_meanwhile = any(done["completed"] <= at <= then["claimed"] for at in losses)
                (lanes.gaps_after_a_loss if lost_meanwhile else lanes.gaps_clean).append(gap)
    return lanes


def table(label: str, runs: Iterable[Lanes]) -> Table | None:
    """The steps of `runs` pooled (the repeats of one case): median, mean and 90th percentile."""
    pooled = Lanes()
    for lanes in runs:
        for name, values in lanes.steps.items():
            pooled.steps[name].extend(values)
        pooled.first_claims.extend(lanes.first_claims)
        pooled.lost += lanes.lost
        pooled.shards += lanes.shards
        pooled.gaps_after_a_loss.extend(lanes.gaps_after_a_loss)
        pooled.gaps_clean.extend(lanes.gaps_clean)
    if not pooled.shards:
        return None
    rows = [_row(name, values) for name, values in pooled.steps.items()]
    rows.append(_row(f"{GAP}, the pod lost no race meanwhile", pooled.gaps_clean))
    rows.append(_row(f"{GAP}, the pod lost a race meanwhile", pooled.gaps_after_a_loss))
    rows.append(_row("a lane's first claim, after the create", pooled.first_claims))
    return Table(
        f"{label}: where a worker slot's time goes (worker logs, every repeat; "
        f"{pooled.shards} shards, {pooled.lost / pooled.shards:.2f} claim races lost per shard)",
        ["step", "n", "median s", "mean s", "p90 s"],
        rows,
    )


def _row(name: str, values: list[float]) -> list[str]:
    middle, p90 = stats.percentile(values, 0.5), stats.percentile(values, 0.9)
    if middle is None or p90 is None:
        return [name, "0", "n/a", "n/a", "n/a"]
    return [name, str(len(values)), f"{middle:.3f}", f"{sum(values) / len(values):.3f}", f"{p90:.3f}"]
