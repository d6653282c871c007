"""Shares of a shared Source's limits: who gets how much (`fair_shares`), and how a change is handed over
without ever letting the campaigns together pass the limit (`hand_over`).

Why shares handed out by the operator, not a shared bucket that workers draw from: a bucket costs an
API write (or a round trip to some other store) per request or per small batch of requests, for
every worker of every campaign; shares cost writes only when the set of active campaigns on a Source
changes (a start, an end, a campaign going idle or busy again): one status write of each campaign
whose share changes, twice at most (lowered, then raised once that is in force), and one of the
Source. Between those events workers pace locally at share / maxConcurrency, as they always did
(llm/pacing.py), and read their share with the Campaign GET their heartbeat already makes.

Why the window holds. Workers pace at a rate, so the requests of any 60 s window are at most the
window's average of the sum of the rates in force (plus one request per worker: pacing spaces
requests, llm/pacing.py). That sum stays within the limit if at no moment a raised share is in force
while a share that was lowered to make room for it is still used at its old value. Hence:

* a lowered share is written at once (a worker obeys it at its next heartbeat, within `settle`);
* a share grows only when no share on the Source was lowered within `settle` (every lowering is
  then in force), and only by the room the written shares leave: `limit - Σ written`, given in
  priority order; so the written shares never sum above the limit, and the ones in force neither;
* every lowering is recorded with its time in the campaign's status (and the Source's), so an
  operator that restarts, or a new leader, continues from the written shares and waits out the same
  `settle` before raising anything: nothing lives only in memory.

A new campaign on a Source with room left gets its share at the next pass; on a full Source it gets it
`settle` after the others were lowered (a heartbeat interval and a margin: seconds, not minutes).
Pure: no clock, no I/O.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

# Below this much per worker a campaign's share is not worth having: when the active campaigns'
# floors do not all fit in a Source's limit it is scarce, and higher spec.priority is served first.
MIN_REQUESTS_PER_WORKER = 1.0
MIN_TOKENS_PER_WORKER = 1000.0
# Added to the longest heartbeat interval of the campaigns on a Source to make its settle time: the
# watch and file latency between the operator's write and a worker's next request.
SETTLE_MARGIN = dt.timedelta(seconds=5)


class PerMinute(Protocol):
    """What names the four rates (a Source's rateLimit, a campaign's share in a status)."""

    @property
    def requests_per_minute(self) -> float | None: ...
    @property
    def tokens_per_minute(self) -> float | None: ...
    @property
    def input_tokens_per_minute(self) -> float | None: ...
    @property
    def output_tokens_per_minute(self) -> float | None: ...


@dataclass(frozen=True)
class Rates:
    """Requests, tokens, prompt tokens and completion tokens per minute; None where the Source sets
    no such limit. Each is shared out on its own, by the same rules."""

    requests_per_minute: float | None = None
    tokens_per_minute: float | None = None
    input_tokens_per_minute: float | None = None
    output_tokens_per_minute: float | None = None

    def dimensions(self) -> tuple[float | None, float | None, float | None, float | None]:
        return (
            self.requests_per_minute,
            self.tokens_per_minute,
            self.input_tokens_per_minute,
            self.output_tokens_per_minute,
        )

    @classmethod
    def of(cls, values: Iterable[float | None]) -> Rates:
        requests, tokens, input_tokens, output_tokens = values
        return cls(requests, tokens, input_tokens, output_tokens)

    @classmethod
    def from_limits(cls, limits: PerMinute | None) -> Rates:
        """The four rates of anything that names them so (a Source's rateLimit, a share in a status);
        none limited without one."""
        if limits is None:
            return cls()
        return cls(
            limits.requests_per_minute,
            limits.tokens_per_minute,
            limits.input_tokens_per_minute,
            limits.output_tokens_per_minute,
        )

    def fields(self) -> dict[str, float | None]:
        """The rates by the names the API's models give them (a share written to a status)."""
        return {
            "requests_per_minute": self.requests_per_minute,
            "tokens_per_minute": self.tokens_per_minute,
            "input_tokens_per_minute": self.input_tokens_per_minute,
            "output_tokens_per_minute": self.output_tokens_per_minute,
        }


@dataclass(frozen=True)
class Claimant:
    """A campaign that names the Source: `active` when it has work that calls it (running or waiting
    shards), `workers` its maxConcurrency."""

    campaign: str
    weight: int
    priority: int
    workers: int
    active: bool


@dataclass(frozen=True)
class Granted:
    """A campaign's written share and when it was last lowered (None: never, or settled long ago)."""

    rates: Rates
    lowered_at: dt.datetime | None = None


def serving_order(claimants: Iterable[Claimant]) -> list[Claimant]:
    """Higher priority first, then by name: the order shares are granted in when room is short."""
    return sorted(claimants, key=lambda c: (-c.priority, c.campaign))


def fair_shares(limits: Rates, claimants: Iterable[Claimant]) -> dict[str, Rates]:
    """Each claimant's target share, in serving order: the active ones admitted share every limit in
    proportion to their weights; the idle ones, and those that do not fit a scarce Source, get 0.

    Admission: in serving order, a campaign is admitted while the floors (workers x the minimum per
    worker) of those admitted fit every limit; the first active campaign always is.
    """
    ordered = serving_order(claimants)
    floors = (MIN_REQUESTS_PER_WORKER, MIN_TOKENS_PER_WORKER, MIN_TOKENS_PER_WORKER, MIN_TOKENS_PER_WORKER)
    used = [0.0] * len(floors)
    admitted: list[Claimant] = []
    for claimant in ordered:
        if not claimant.active:
            continue
        needs = [claimant.workers * floor for floor in floors]
        fits = all(
            limit is None or used[i] + needs[i] <= limit for i, limit in enumerate(limits.dimensions())
        )
        if fits or not admitted:
            admitted.append(claimant)
            used = [used[i] + needs[i] for i in range(len(floors))]
    total_weight = sum(c.weight for c in admitted)
    chosen = {c.campaign for c in admitted}
    return {
        c.campaign: Rates.of(
            None if limit is None else (limit * c.weight / total_weight if c.campaign in chosen else 0.0)
            for limit in limits.dimensions()
        )
        for c in ordered
    }


def settled(
    granted: Iterable[Granted], now: dt.datetime, settle: dt.timedelta, *also: dt.datetime | None
) -> bool:
    """True when no share on the Source was lowered within `settle` (`also`: lowerings recorded
    elsewhere, such as the Source's own status for a campaign whose share was taken away)."""
    moments = [g.lowered_at for g in granted] + list(also)
    return all(moment is None or moment + settle <= now for moment in moments)


def hand_over(
    limits: Rates,
    targets: Mapping[str, Rates],
    granted: Mapping[str, Granted],
    now: dt.datetime,
    settle: dt.timedelta,
    source_lowered_at: dt.datetime | None = None,
) -> dict[str, Granted]:
    """The shares to write now, for every campaign in `targets` (in serving order) or in `granted`.

    A campaign in `granted` but not in `targets` (finished, gone, no longer naming the Source) is
    lowered to 0 and kept until that settles, then left out: the caller forgets it. A share that
    should grow grows only once everything is settled, by at most the room left (see the module).
    """
    is_settled = settled(granted.values(), now, settle, source_lowered_at)
    zero = Rates.of(None if limit is None else 0.0 for limit in limits.dimensions())
    room = [
        None if limit is None else limit - sum(_value(g.rates, i) for g in granted.values())
        for i, limit in enumerate(limits.dimensions())
    ]
    result: dict[str, Granted] = {}
    order = list(targets) + [c for c in granted if c not in targets]
    for campaign in order:
        target = targets.get(campaign, zero)
        current = granted.get(campaign, Granted(zero))
        values: list[float | None] = []
        lowered = False
        for i, limit in enumerate(limits.dimensions()):
            want = target.dimensions()[i]
            have = current.rates.dimensions()[i]
            if limit is None or want is None:
                values.append(None)
                continue
            have_value = 0.0 if have is None else have
            if want <= have_value:
                lowered = lowered or want < have_value
                values.append(want)
                continue
            room_left = room[i]
            assert room_left is not None
            grow = max(0.0, min(want - have_value, room_left)) if is_settled else 0.0
            room[i] = room_left - grow
            values.append(have_value + grow)
        entry = Granted(Rates.of(values), now if lowered else current.lowered_at)
        if campaign not in targets and entry.rates == zero and settled([entry], now, settle):
            continue
        result[campaign] = entry
    return result


def settle_time(heartbeat_seconds: Iterable[float]) -> dt.timedelta:
    """How long a lowered share takes to be in force at every worker: the longest heartbeat interval
    of the campaigns on the Source (a running shard reads its share with its heartbeat's GET) plus
    the margin."""
    longest = max(heartbeat_seconds, default=0.0)
    return dt.timedelta(seconds=longest) + SETTLE_MARGIN


def _value(rates: Rates, index: int) -> float:
    value = rates.dimensions()[index]
    return 0.0 if value is None else value
