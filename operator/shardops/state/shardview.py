"""Shards as `logic/` sees them: names, phases, views, lease observations."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable

from shardops.api.campaign import Campaign
from shardops.api.common import JSON
from shardops.api.enums import ShardClass, ShardPhase
from shardops.api.shard import Shard
from shardops.k8s.leases import lease_expires_at
from shardops.logic.leases import NOBODY_RENEWS, LeaseObservation, Renewals
from shardops.logic.shardview import ShardView
from shardops.logic.transitions import EventReason


def shard_name(campaign: str, index: int) -> str:
    return f"{campaign}-{index:05d}"


def finalize_name(campaign: str) -> str:
    return f"{campaign}-finalize"


EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def of_campaign(shards: Iterable[Shard], campaign: Campaign) -> list[Shard]:
    """The listed shards that are this Campaign's. Shards are listed by the campaign's name label,
    and a Campaign deleted and applied again under the same name leaves the old one's Shards until
    the garbage collector removes them: those (their controller is another uid) are never counted,
    claimed, folded or adopted, or the new campaign could report the old one's results as its own.
    Every reader of a campaign's shards (operator, worker, CLI) goes through this."""
    uid = campaign.metadata.uid
    return [shard for shard in shards if shard.metadata.controlled_by(uid)]


def phase_of(shard: Shard) -> ShardPhase:
    """A shard nobody wrote a status for is Queued (created, not yet materialized)."""
    return shard.phase or ShardPhase.QUEUED


def shard_view(shard: Shard) -> ShardView:
    status = shard.current_status
    phase = phase_of(shard)
    since = status.history[-1].at if status.history else (shard.created_at or EPOCH)
    # A running shard's source is the one it really calls (maybe a fallback), which is what a
    # HalfOpen probe in flight is about; an unclaimed one is routed from its own source.
    source = status.source if phase is ShardPhase.RUNNING and status.source else shard.spec.source
    return ShardView(
        name=shard.name,
        phase=phase,
        shard_class=shard.spec.shard_class,
        priority=shard.spec.priority,
        index=shard.spec.index,
        attempt=max(status.attempt, 1),
        source=source,
        not_before=status.not_before,
        since=since,
        cost=status.cost,
    )


def cut_items(shards: Iterable[Shard], shard_size: int, total_items: int) -> int:
    """Items already cut into work shards. Shards are cut in index order, so the highest index tells."""
    indices = [s.spec.index for s in shards if s.spec.shard_class is ShardClass.WORK]
    if not indices:
        return 0
    return min(total_items, (max(indices) + 1) * shard_size)


def claimed_at(shard: Shard) -> dt.datetime | None:
    """When the current attempt was claimed, from the newest Claimed history entry."""
    for entry in reversed(shard.current_status.history):
        if entry.reason == str(EventReason.CLAIMED):
            return entry.at
    return None


def taken_over(shard: Shard, lease: JSON | None) -> bool:
    """The Lease has a holder other than the shard's owner: a takeover newer than the shard's status."""
    holder = ((lease or {}).get("spec") or {}).get("holderIdentity")
    owner = shard.current_status.owner
    return bool(holder) and owner is not None and holder != owner


def claim_silence(seen: Renewals, shard: Shard, lease: JSON | None) -> float:
    """How long this process has not seen the shard's claim renewed, on its own clock: the shard's
    leaseUntil (each heartbeat writes it) and, when read, the Lease (renewed first, so it may be
    newer). A Lease without a holder: nobody renews the claim. A Lease held by someone other than the
    shard's owner was taken over after the shard was last written: that holder's claim is the live
    one, timed from when this process first saw it."""
    status = shard.current_status
    silent = seen.observe(shard.lease_name, status.owner, status.lease_until)
    if lease is None:
        return silent
    spec = lease.get("spec") or {}
    holder = spec.get("holderIdentity")
    if not holder:
        return NOBODY_RENEWS
    return seen.observe(shard.lease_name, holder, lease_expires_at(lease))


def one_look_silence(shard: Shard, lease: JSON | None, lease_seconds: int, now: dt.datetime) -> float:
    """For a one-shot view with no memory of renewals (`kubectl campaign plan`): the silence the
    holder's own timestamps imply on this machine's clock. A prediction only — the operator and the
    workers judge on their own clocks (`claim_silence`)."""
    until = _holder_until(shard, lease, lease_seconds)
    if until is None:
        return NOBODY_RENEWS
    return (now - (until - dt.timedelta(seconds=lease_seconds))).total_seconds()


def _holder_until(shard: Shard, lease: JSON | None, lease_seconds: int) -> dt.datetime | None:
    status = shard.current_status
    if lease is not None:
        if not (lease.get("spec") or {}).get("holderIdentity"):
            return None
        found = lease_expires_at(lease)
        if found is not None:
            return found
    if status.lease_until is not None:
        return status.lease_until
    start = claimed_at(shard) or shard.created_at or EPOCH
    return start + dt.timedelta(seconds=lease_seconds)


def lease_observation(
    shard: Shard,
    lease: JSON | None,
    lease_seconds: int,
    heartbeat_seconds: float,
    progress_changed_at: dt.datetime,
    silent_seconds: float,
) -> LeaseObservation:
    """The claim as judged by an observer that has not seen it renewed for `silent_seconds`
    (`claim_silence`); the holder's leaseUntil (the Lease's when read) is quoted in messages."""
    status = shard.current_status
    return LeaseObservation(
        lease_until=_holder_until(shard, lease, lease_seconds) or EPOCH,
        silent_seconds=silent_seconds,
        lease_seconds=lease_seconds,
        last_heartbeat=status.last_heartbeat,
        heartbeat_seconds=heartbeat_seconds,
        progress_changed_at=progress_changed_at,
    )
