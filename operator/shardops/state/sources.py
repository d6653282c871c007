"""A Campaign as a claimant of the shared Sources it names (spec.sources[].sourceRef), and the shares
its status records: the one mapping between them and `logic.shares`."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass

from shardops.api.campaign import Campaign, SourceShare
from shardops.api.enums import FINISHED_PHASES, SourceKind
from shardops.api.llm import SecretKeyRef, TokenPrice
from shardops.logic.breaker import CLOSED_BREAKER, SourceBreaker
from shardops.logic.shares import Claimant, Granted, Rates
from shardops.state import breakers


@dataclass(frozen=True, order=True)
class SourceKey:
    """Which Source: a namespaced Source is always the campaign's own namespace's; a ClusterSource has
    no namespace ("")."""

    kind: SourceKind
    namespace: str
    name: str

    def describe(self) -> str:
        return f"{self.kind} {self.namespace}/{self.name}" if self.namespace else f"{self.kind} {self.name}"


@dataclass(frozen=True)
class SourceClaim:
    """One source of a campaign that refers to a shared Source: who claims, with what weight, and the
    share its status holds (None: none yet)."""

    source: str
    key: SourceKey
    claimant: Claimant
    heartbeat_seconds: float
    granted: Granted | None
    # The end of a wait the upstream asked of this campaign (Retry-After, status.sourceCooldowns).
    cooling_until: dt.datetime | None = None
    # The campaign's breaker for this source as its status holds it, and its own cooldown.
    breaker: SourceBreaker = CLOSED_BREAKER
    cooldown: dt.timedelta = dt.timedelta(0)


def campaign_key(campaign: Campaign) -> str:
    return f"{campaign.namespace}/{campaign.name}"


def is_active(campaign: Campaign) -> bool:
    """Whether the campaign has work that calls its sources: shards running, waiting, or still to cut
    (a suspended one: running). A finished campaign, and one whose shards are all paused, gives its
    share away."""
    status = campaign.current_status
    if status.phase in FINISHED_PHASES:
        return False
    counts = status.counts
    if campaign.spec.suspend:
        # Its running shards finish; nothing else is claimed or cut until it is resumed.
        return counts.running > 0
    return counts.running + counts.pending + counts.queued > 0


def granted_of(entry: SourceShare) -> Granted:
    return Granted(Rates.from_limits(entry), entry.lowered_at)


def source_claims(campaign: Campaign) -> list[SourceClaim]:
    """The campaign's claims, one per source with a sourceRef (at most MAX_SOURCES)."""
    spec = campaign.spec
    written = {entry.source: entry for entry in campaign.current_status.source_shares}
    cooling = {c.source: c.until for c in campaign.current_status.source_cooldowns}
    states = breakers.breakers_from_status(campaign.current_status)
    claims: list[SourceClaim] = []
    active = is_active(campaign)
    for source in spec.sources or []:
        ref = source.source_ref
        if ref is None:
            continue
        namespace = campaign.namespace if ref.kind is SourceKind.SOURCE else ""
        entry = written.get(source.name)
        claims.append(
            SourceClaim(
                source=source.name,
                key=SourceKey(ref.kind, namespace, ref.name),
                claimant=Claimant(
                    campaign_key(campaign), source.weight, spec.priority, spec.max_concurrency, active
                ),
                heartbeat_seconds=spec.effective_heartbeat_seconds,
                granted=granted_of(entry) if entry is not None else None,
                cooling_until=cooling.get(source.name),
                breaker=states.get(source.name, CLOSED_BREAKER),
                cooldown=breakers.cooldown_of(spec, source.name),
            )
        )
    return claims


@dataclass(frozen=True)
class Endpoint:
    """What a worker needs of a shared Source besides its share: where to call, with which key (a
    Secret of the campaign's namespace: a namespaced Source's), at what price."""

    base_url: str
    model: str
    api_key_secret: SecretKeyRef | None
    price: TokenPrice | None


def share_entries(
    previous: list[SourceShare],
    decided: Mapping[str, Rates],
    now: dt.datetime,
    endpoints: Mapping[str, Endpoint] | None = None,
) -> list[SourceShare]:
    """The status's sourceShares with the operator's decisions in: a share lowered in any dimension is
    stamped `now` (the write is when workers can start obeying it); others keep their stamp. Sources
    without a decision keep what was written."""
    endpoints = endpoints or {}
    by_source = {entry.source: entry for entry in previous}
    for source, rates in decided.items():
        old = by_source.get(source)
        lowered_at = old.lowered_at if old is not None else None
        if old is not None and _lower(rates, Rates.from_limits(old)):
            lowered_at = now
        endpoint = endpoints.get(source)
        by_source[source] = SourceShare(
            source=source,
            **rates.fields(),
            base_url=endpoint.base_url if endpoint else None,
            model=endpoint.model if endpoint else None,
            api_key_secret=endpoint.api_key_secret if endpoint else None,
            price=endpoint.price if endpoint else None,
            lowered_at=lowered_at,
        )
    return [by_source[name] for name in sorted(by_source)]


def _lower(new: Rates, old: Rates) -> bool:
    """A dimension limited tighter than before (None is no limit: the loosest)."""
    return any(
        now is not None and (was is None or now < was)
        for now, was in zip(new.dimensions(), old.dimensions(), strict=True)
    )


def waiting_for_sources(campaign: Campaign) -> list[str]:
    """The campaign's sources that refer to a shared Source the operator has not resolved yet (no
    endpoint in status.sourceShares): its workers could not call them."""
    if campaign.spec.worker.llm is None:
        return []
    resolved = {e.source for e in campaign.current_status.source_shares if e.base_url is not None}
    return [
        s.name for s in campaign.spec.sources or [] if s.source_ref is not None and s.name not in resolved
    ]
