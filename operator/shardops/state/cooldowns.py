"""Per-source cooldowns: after a rate-limited answer that said how long to wait (Retry-After), every
worker of the campaign leaves that source alone until then, not only the shard that got it.

Why this mechanism. A 429 is about the source's quota, which all the campaign's workers share, so
the wait applies to all of them. The worker that got it records the moment in its shard's
`lastError.retryAt` (the write it makes anyway when the attempt fails); nothing else is written by
workers. From there the cooldown reaches:

* the claim: a worker lists the unfinished shards before every claim (it does anyway), so it sees
  the other shards' `retryAt` at once; the planner holds every shard of a cooling source (skip
  reason "source ... cooling down until ..."), for the operator, the workers and `kubectl campaign
  plan` alike;
* workers mid-shard: the operator, which sees every live shard, records the cooldowns in the
  Campaign's `status.sourceCooldowns`; a worker running the built-in LLM worker reads the Campaign
  once per heartbeat (one GET per heartbeat per running shard, nothing per item) and hands the
  cooldown of its source to the command, which pauses before its next request until then plus a
  per-worker jitter (so the workers do not all call again in the same instant).

So a worker learns of another's 429 at its next claim (at once) or, mid-shard, at its next heartbeat
after the operator recorded it: within heartbeatSeconds plus one operator pass. Requests it sent
before that are not undone; the bound is stated in the user guide. A shared counter (one object every
worker writes per request) would close the gap but cost a write per item; this costs none.

Pure: no I/O. Cost: the shards given are the live window, each read once.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping

from shardops.api.campaign import Campaign, SourceCooldown
from shardops.api.enums import ErrorClass
from shardops.api.shard import Shard


def recorded(campaign: Campaign, now: dt.datetime) -> dict[str, SourceCooldown]:
    """The cooldowns the operator recorded in the status that are not over yet."""
    return {c.source: c for c in campaign.current_status.source_cooldowns if c.until > now}


def from_shards(shards: Iterable[Shard], now: dt.datetime) -> dict[str, SourceCooldown]:
    """Each source's latest `retryAt` among the shards' last errors, where it is still ahead."""
    found: dict[str, SourceCooldown] = {}
    for shard in shards:
        error = shard.current_status.last_error
        if (
            error is None
            or error.error_class is not ErrorClass.RATE_LIMITED
            or error.source is None
            or error.retry_at is None
            or error.retry_at <= now
        ):
            continue
        known = found.get(error.source)
        if known is None or error.retry_at > known.until:
            found[error.source] = SourceCooldown(source=error.source, until=error.retry_at, shard=shard.name)
    return found


def source_cooldowns(
    campaign: Campaign, shards: Iterable[Shard], now: dt.datetime
) -> dict[str, SourceCooldown]:
    """What the status records and what the shards show, the later `until` of each source."""
    return later(recorded(campaign, now), from_shards(shards, now))


def later(
    known: Mapping[str, SourceCooldown], news: Mapping[str, SourceCooldown]
) -> dict[str, SourceCooldown]:
    """Both sets of cooldowns, the later `until` of each source."""
    merged = dict(known)
    for source, cooldown in news.items():
        if source not in merged or cooldown.until > merged[source].until:
            merged[source] = cooldown
    return merged


def until_by_source(cooldowns: dict[str, SourceCooldown]) -> dict[str, dt.datetime]:
    return {source: c.until for source, c in cooldowns.items()}


def status_list(cooldowns: dict[str, SourceCooldown]) -> list[SourceCooldown]:
    """For status.sourceCooldowns: by source name, so an unchanged set writes nothing."""
    return [cooldowns[source] for source in sorted(cooldowns)]
