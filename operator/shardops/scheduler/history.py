"""The shard history folded into the per-source breakers (`HistoryFold`), and what follows once the
status holds it (`commit`: the counters, the BreakerOpened/BreakerClosed Events).

`fold_history` is pure: per shard, the entries above the sequence the status says was folded
(`state.history`). Nothing is counted or announced there: the status write of the pass records the
fold (the breakers and the new sequences together), and `commit` counts and announces it once that
write is in. A pass whose write is lost leaves the status as it was, so the next pass (or the next
leader) folds the same entries again, once."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass, field

from shardops.api.campaign import CampaignStatus
from shardops.k8s import campaigns, events
from shardops.k8s.api import KubeClient
from shardops.k8s.shards import Actor
from shardops.logic import transitions
from shardops.logic.breaker import SourceBreaker, effective
from shardops.scheduler.metrics import Metrics
from shardops.scheduler.observed import Observed
from shardops.state import breakers, history


@dataclass(frozen=True)
class HistoryFold:
    """A fold computed by a pass, to be recorded by its status write and only then committed."""

    states: dict[str, SourceBreaker]
    reasons: dict[str, str]
    # status.historyFolded after this fold, for every shard the pass saw; the status write keeps
    # those still live (not folded into the ledger by the same write).
    marks: dict[str, int]
    # status.historyFoldedUntil (deprecated), still written for readers of earlier releases.
    watermark: dt.datetime | None
    outcomes: list[history.Outcome] = field(default_factory=list)
    opened: list[str] = field(default_factory=list)
    closed: list[str] = field(default_factory=list)


def fold_history(seen: Observed, status: CampaignStatus) -> HistoryFold:
    """Fold the history entries not folded yet into the breakers `status` holds."""
    outcomes = history.new_outcomes(seen.shards.values(), status.history_folded, status.history_folded_until)
    policies = breakers.breaker_policies(seen.campaign.spec)
    fold = history.fold_breakers(
        breakers.breakers_from_status(status), outcomes, policies, breakers.UNDECLARED_SOURCE_POLICY
    )
    return HistoryFold(
        fold.states,
        fold.reasons,
        history.folded_marks(seen.shards.values(), status.history_folded),
        history.watermark_after(status.history_folded_until, outcomes),
        outcomes,
        fold.opened,
        fold.closed,
    )


def commit(
    kube: KubeClient,
    metrics: Metrics,
    actor: Actor,
    series: events.EventSeries,
    seen: Observed,
    fold: HistoryFold,
    now: dt.datetime,
) -> None:
    """The fold is in the status: count it, raise the campaign's Event for each reason by its count,
    announce the breakers it turned."""
    spec = seen.campaign.spec
    key = seen.key
    counts = history.tally(fold.outcomes)
    if counts.claims:
        metrics.claims.labels(campaign=key).inc(counts.claims)
    if counts.lease_expirations:
        metrics.lease_expirations.labels(campaign=key).inc(counts.lease_expirations)
    if counts.blocked:
        metrics.blocked.labels(campaign=key).inc(counts.blocked)
    for cls, n in counts.retries.items():
        metrics.retries.labels(campaign=key, error_class=cls).inc(n)
    for cls, n in counts.failed.items():
        metrics.failed.labels(campaign=key, error_class=cls).inc(n)
    announce_transitions(kube, actor, series, seen, fold.outcomes, now)
    for source in fold.opened:
        fallback = next((s.fallback for s in spec.sources or [] if s.name == source), None)
        then = f"its shards use fallback {fallback}" if fallback else "its shards wait for the cooldown"
        campaigns.record_event(
            kube,
            seen.body,
            reason="BreakerOpened",
            note=f"source {source}: {fold.reasons.get(source, 'rate limited')}; {then}",
            actor=actor,
            now=now,
            warning=True,
        )
    for source in fold.closed:
        campaigns.record_event(
            kube,
            seen.body,
            reason="BreakerClosed",
            note=f"source {source} answered again: claims resume",
            actor=actor,
            now=now,
        )
    for source, breaker in fold.states.items():
        state = effective(breaker, now, breakers.cooldown_of(spec, source))
        metrics.set_breaker(key, source, state)


def announce_transitions(
    kube: KubeClient,
    actor: Actor,
    series: events.EventSeries,
    seen: Observed,
    outcomes: Sequence[history.Outcome],
    now: dt.datetime,
) -> None:
    """One write per reason a person should hear about, whatever the number of shards it happened
    to: the campaign's Event for the reason counts them (`events.EventSeries`). Its note is
    written once (an Event's note cannot change), so it names the first shard and where the rest
    are."""
    counted = transitions.counted_reasons()
    by_reason: dict[str, list[history.Outcome]] = {}
    for outcome in outcomes:
        if outcome.reason in counted:
            by_reason.setdefault(outcome.reason, []).append(outcome)
    name = seen.campaign.name
    for reason, happened in by_reason.items():
        first = happened[0]
        why = f" ({first.error_class})" if first.error_class else ""
        note = (
            f"{reason}: shard {first.shard}{why} first, as many shards in all as the series counts: "
            f"kubectl campaign events SHARD shows a shard's attempts and why, kubectl campaign "
            f"results {name} --failed lists those that gave up"
        )
        warning = counted[transitions.EventReason(reason)] is transitions.EventType.WARNING
        body = campaigns.series_event_body(
            seen.body, reason=reason, note=note, actor=actor, now=now, warning=warning
        )
        series.add(kube, body, len(happened), now)
