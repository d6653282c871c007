"""Shared Sources on the leader: the claims campaigns report from their passes, one sharing pass over
every referenced Source (`SourceSharing.run`), and the shares each campaign's pass then writes.

The rules are `logic.shares` (why shares, and why the limit holds while they change); this module
feeds them. A campaign's pass reports its claims (`report`) and writes the share last decided for it
into its own status (`shares_for`): that status is what its workers read and what a restarted
operator starts from. The sharing pass, every `interval` seconds on the leader:

* reads each referenced Source or ClusterSource (one GET each: reads, no writes) and, for its Ready
  condition, a Source's key Secret: when the Source's spec changed, while the Secret is missing (so
  a fix shows within a pass), and otherwise once per KEY_RECHECK (a deleted Secret is noticed);
* names, per campaign, a sourceRef whose Source does not exist or whose ClusterSource does not list
  the campaign's namespace (`problems_for`: its pass sets the SourceUnresolved condition);
* takes as granted, per campaign, the larger of what its status says and what was last decided for
  it (a decided raise may be written already though not reported yet), and, for campaigns the
  Source's status lists that have not reported since this process started, what the Source lists;
* grants no raise until every campaign the operator serves has reported once since it started
  (after a restart, a campaign not heard from yet may hold a share);
* hands the longest wait any of them was told (Retry-After, their status.sourceCooldowns) to all of
  them: their passes record it, so their workers claim nothing of it and pause mid-shard until then;
* keeps the Source's one breaker (logic.breaker.shared_state) from the campaigns' breakers for it, and
  tells each campaign's pass how to adopt it (`adopt_breakers`: open for all, one prober);
* writes the Source's status (one merge patch) only when it changed.

API writes: a campaign's status changes when its share does (it is written in the pass it already
makes); a Source's status when a share on it, its campaigns or its breaker change. Memory: one entry
per campaign served and per Source referenced, each bounded by MAX_SOURCES claims.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from pydantic import ValidationError

from shardops.api.campaign import CampaignSpec, SourceCooldown, SourceShare
from shardops.api.common import JSON
from shardops.api.enums import BreakerState, ConditionReason, ConditionStatus, ConditionType, SourceKind
from shardops.api.llm import SecretKeyRef
from shardops.api.shared_sources import (
    CampaignShare,
    ClusterSharedSource,
    SharedSource,
    SharedSourceSpec,
    SharedSourceStatus,
    SourceBreakerStatus,
)
from shardops.k8s import events
from shardops.k8s.api import CLUSTER_SOURCES, SECRETS, SOURCES, ApiError, Forbidden, KubeClient, NotFound
from shardops.k8s.shards import Actor
from shardops.logic.breaker import (
    CLOSED_BREAKER,
    BreakerPolicy,
    SharedBreaker,
    SourceBreaker,
    adopted,
    holds,
    shared_state,
)
from shardops.logic.conditions import DesiredCondition, SourceProblem
from shardops.logic.shares import Granted, Rates, fair_shares, hand_over, serving_order, settle_time
from shardops.scheduler.builders import merge_conditions
from shardops.state.breakers import cooldown_of
from shardops.state.sources import Endpoint, SourceClaim, SourceKey, share_entries

log = logging.getLogger(__name__)

CampaignKey = tuple[str, str]

# How often a Source whose key Secret was found is looked at again when nothing about the Source
# changed: to notice the Secret deleted or its key removed. A sharing pass runs every few seconds; a
# GET of each Source's Secret on each of them would be most of the loop's reads.
KEY_RECHECK = dt.timedelta(seconds=60)


class SourceSharing:
    def __init__(self, kube: KubeClient, actor: Actor | None = None) -> None:
        self.kube = kube
        # Who reports the Source's breaker Events (None: no Events, for tests of the shares alone).
        self.actor = actor
        self._lock = threading.Lock()
        self._claims: dict[CampaignKey, list[SourceClaim]] = {}
        self._decided: dict[CampaignKey, dict[str, Rates]] = {}
        # The endpoint of each Source a campaign's source refers to, for its status and workers.
        self._endpoints: dict[CampaignKey, dict[str, Endpoint]] = {}
        # Each Source's breaker as this campaign's pass adopts it: (the Source's, its policy, prober).
        self._breakers: dict[CampaignKey, dict[str, BreakerVerdict]] = {}
        # Per Source while its breaker is open: the openedAt asked of each campaign, and those seen
        # holding it (memory only: a restart costs at most a cooldown and one more probe).
        self._asked: dict[SourceKey, dict[str, dt.datetime]] = {}
        self._holding: dict[SourceKey, set[str]] = {}
        # A wait one campaign was told (Retry-After) is every campaign's on that Source.
        self._cooling: dict[CampaignKey, dict[str, SourceCooldown]] = {}
        # Per campaign and source name: why its sourceRef names no Source that serves it (a Source
        # missing, a ClusterSource not listing its namespace), for its SourceUnresolved condition.
        self._problems: dict[CampaignKey, dict[str, Unresolved]] = {}
        # Campaigns that reported since this process started: raises wait until every one served has.
        self._reported: set[CampaignKey] = set()
        # Each referenced Source's Ready condition as its key Secret was last found: the Source's
        # generation then, the condition and when (one entry per Source referenced this pass).
        self._readiness: dict[SourceKey, KeyCheck] = {}

    # --- from the campaigns' passes -----------------------------------------------------------------

    def report(self, namespace: str, name: str, claims: list[SourceClaim]) -> None:
        with self._lock:
            key = (namespace, name)
            if claims:
                self._claims[key] = claims
            else:
                self._drop(key)
            self._reported.add(key)

    def forget(self, namespace: str, name: str) -> None:
        with self._lock:
            self._drop((namespace, name))
            self._reported.discard((namespace, name))

    def _drop(self, key: CampaignKey) -> None:
        """What is kept of a campaign (the lock held)."""
        for kept in (
            self._claims,
            self._decided,
            self._endpoints,
            self._breakers,
            self._cooling,
            self._problems,
        ):
            kept.pop(key, None)

    def shares_for(
        self, namespace: str, name: str, previous: list[SourceShare], now: dt.datetime
    ) -> list[SourceShare]:
        """The sourceShares the campaign's status should hold: the decisions in, the rest as written."""
        with self._lock:
            decided = dict(self._decided.get((namespace, name), {}))
            endpoints = dict(self._endpoints.get((namespace, name), {}))
        return share_entries(previous, decided, now, endpoints)

    def problems_for(self, namespace: str, name: str, spec: CampaignSpec) -> dict[str, SourceProblem]:
        """Why each of the campaign's sourceRefs serves it no Source, by source name (none: all do)."""
        with self._lock:
            unresolved = dict(self._problems.get((namespace, name), {}))
        index = {source.name: i for i, source in enumerate(spec.sources or [])}
        return {
            source: SourceProblem(index[source], problem.reason, problem.fix)
            for source, problem in unresolved.items()
            if source in index
        }

    def adopt_breakers(
        self, namespace: str, name: str, states: dict[str, SourceBreaker], spec: CampaignSpec
    ) -> None:
        """Each shared source's breaker in `states` (a pass's fold) with its Source's adopted, in place."""
        with self._lock:
            verdicts = dict(self._breakers.get((namespace, name), {}))
        for source, verdict in verdicts.items():
            own = states.get(source, CLOSED_BREAKER)
            states[source] = adopted(
                own, verdict.source, verdict.policy, cooldown_of(spec, source), verdict.prober
            )[0]

    def cooldowns_for(self, namespace: str, name: str, now: dt.datetime) -> dict[str, SourceCooldown]:
        """The waits other campaigns on the same Sources were told, by this campaign's source names."""
        with self._lock:
            cooling = dict(self._cooling.get((namespace, name), {}))
        return {source: c for source, c in cooling.items() if c.until > now}

    # --- the sharing pass ---------------------------------------------------------------------------

    def run(self, served: Iterable[CampaignKey], now: dt.datetime) -> None:
        """One pass over every Source a reporting campaign refers to."""
        with self._lock:
            claims = {key: list(value) for key, value in self._claims.items()}
            decided = {key: dict(value) for key, value in self._decided.items()}
            problems = {key: dict(value) for key, value in self._problems.items()}
            warm = set(served) <= self._reported
        by_source: dict[SourceKey, list[SourceClaim]] = {}
        for campaign_claims in claims.values():
            for claim in campaign_claims:
                by_source.setdefault(claim.key, []).append(claim)
        new_decisions: dict[CampaignKey, dict[str, Rates]] = {}
        new_endpoints: dict[CampaignKey, dict[str, Endpoint]] = {}
        new_breakers: dict[CampaignKey, dict[str, BreakerVerdict]] = {}
        new_cooling: dict[CampaignKey, dict[str, SourceCooldown]] = {}
        new_problems: dict[CampaignKey, dict[str, Unresolved]] = {}
        for source_key in sorted(by_source):
            waits = [
                c.cooling_until for c in by_source[source_key] if c.cooling_until and c.cooling_until > now
            ]
            if waits:
                until = max(waits)
                for claim in by_source[source_key]:
                    namespace, name = claim.claimant.campaign.split("/", 1)
                    new_cooling.setdefault((namespace, name), {})[claim.source] = SourceCooldown(
                        source=claim.source, until=until
                    )
            endpoint: Endpoint | None = None
            verdicts: dict[str, BreakerVerdict] = {}
            unresolved: dict[str, Unresolved] | None
            try:
                decisions, endpoint, verdicts, unresolved = self._share(
                    source_key, by_source[source_key], decided, warm, now
                )
            except ApiError as error:
                log.warning("%s: shares not handed out this pass: %s", source_key.describe(), error)
                decisions, unresolved = {}, None  # not read: what was known of it stands
            for claim in by_source[source_key]:
                namespace, name = claim.claimant.campaign.split("/", 1)
                problem = (
                    problems.get((namespace, name), {}).get(claim.source)
                    if unresolved is None
                    else unresolved.get(claim.claimant.campaign)
                )
                if problem is not None:
                    new_problems.setdefault((namespace, name), {})[claim.source] = problem
                if claim.claimant.campaign in decisions:
                    new_decisions.setdefault((namespace, name), {})[claim.source] = decisions[
                        claim.claimant.campaign
                    ]
                if endpoint is not None:
                    new_endpoints.setdefault((namespace, name), {})[claim.source] = endpoint
                if claim.claimant.campaign in verdicts:
                    new_breakers.setdefault((namespace, name), {})[claim.source] = verdicts[
                        claim.claimant.campaign
                    ]
        self._readiness = {key: check for key, check in self._readiness.items() if key in by_source}
        with self._lock:
            for key in claims:
                if key in self._claims:
                    self._decided[key] = new_decisions.get(key, decided.get(key, {}))
                    self._endpoints[key] = new_endpoints.get(key, {})
                    self._breakers[key] = new_breakers.get(key, {})
                    self._cooling[key] = new_cooling.get(key, {})
                    self._problems[key] = new_problems.get(key, {})

    def _share(
        self,
        source_key: SourceKey,
        source_claims: list[SourceClaim],
        decided: Mapping[CampaignKey, Mapping[str, Rates]],
        warm: bool,
        now: dt.datetime,
    ) -> tuple[dict[str, Rates], Endpoint | None, dict[str, BreakerVerdict], dict[str, Unresolved]]:
        body = self._read(source_key)
        if body is None:
            # No such Source: nobody gets a share of it (its campaigns' workers wait for one).
            zero = Rates(0.0, 0.0)
            missing = Unresolved(ConditionReason.SOURCE_NOT_FOUND, _not_found(source_key))
            return (
                {claim.claimant.campaign: zero for claim in source_claims},
                None,
                {},
                {claim.claimant.campaign: missing for claim in source_claims},
            )
        resource, status = self._parse(source_key, body)
        spec = resource.spec
        # A ClusterSource's key Secret is in the operator's namespace, which a worker pod cannot read
        # from: its campaigns call it without a key (docs/security.md).
        endpoint = Endpoint(
            spec.base_url,
            spec.model,
            spec.api_key_secret if isinstance(resource, SharedSource) else None,
            spec.price,
        )
        limits = Rates.from_limits(spec.rate_limit)
        eligible = [
            claim
            for claim in source_claims
            if not isinstance(resource, ClusterSharedSource)
            or resource.spec.serves(claim.claimant.campaign.split("/", 1)[0])
        ]
        unresolved = {
            claim.claimant.campaign: Unresolved(
                ConditionReason.SOURCE_NOT_ALLOWED,
                _not_allowed(source_key, claim.claimant.campaign.split("/", 1)[0]),
            )
            for claim in source_claims
            if isinstance(resource, ClusterSharedSource)
            and not resource.spec.serves(claim.claimant.campaign.split("/", 1)[0])
        }
        targets = fair_shares(limits, [claim.claimant for claim in eligible])
        granted: dict[str, Granted] = {}
        for claim in source_claims:
            campaign = claim.claimant.campaign
            namespace, name = campaign.split("/", 1)
            earlier = decided.get((namespace, name), {}).get(claim.source)
            granted[campaign] = _larger(claim.granted, earlier)
        reporting = {claim.claimant.campaign for claim in source_claims}
        for listed in status.shares:
            if listed.campaign not in reporting:
                granted[listed.campaign] = Granted(Rates.from_limits(listed))
        settle = settle_time(claim.heartbeat_seconds for claim in source_claims)
        held_until = status.lowered_at if warm else now
        shares = hand_over(limits, targets, granted, now, settle, held_until)
        lowered = [g.lowered_at for g in shares.values() if g.lowered_at is not None]
        lowered_at = max([*lowered, *([status.lowered_at] if status.lowered_at else [])], default=None)
        by_campaign = {claim.claimant.campaign: claim.claimant for claim in source_claims}
        breaker, verdicts = self._breaker(source_key, spec, status, eligible, now)
        ready = merge_conditions(
            status.conditions, [self._ready(source_key, resource, now)], now, resource.generation
        )
        new_status = status.model_copy(
            update={
                "observed_generation": resource.generation,
                "campaigns": sum(1 for claim in eligible if claim.claimant.active),
                "granted_requests_per_minute": _total(shares.values(), 0),
                "granted_tokens_per_minute": _total(shares.values(), 1),
                "granted_input_tokens_per_minute": _total(shares.values(), 2),
                "granted_output_tokens_per_minute": _total(shares.values(), 3),
                "lowered_at": lowered_at,
                "breaker": breaker,
                "conditions": ready,
                "shares": [
                    CampaignShare(
                        campaign=campaign,
                        weight=by_campaign[campaign].weight if campaign in by_campaign else 1,
                        priority=by_campaign[campaign].priority if campaign in by_campaign else 0,
                        **g.rates.fields(),
                    )
                    for campaign, g in shares.items()
                ],
            }
        )
        if new_status != status:
            self._write_status(source_key, new_status)
            self._announce_breaker(body, status.breaker, breaker, spec, now)
        return {campaign: g.rates for campaign, g in shares.items()}, endpoint, verdicts, unresolved

    def _breaker(
        self,
        source_key: SourceKey,
        spec: SharedSourceSpec,
        status: SharedSourceStatus,
        eligible: list[SourceClaim],
        now: dt.datetime,
    ) -> tuple[SourceBreakerStatus, dict[str, BreakerVerdict]]:
        """The Source's one breaker (logic.breaker.shared_state) and what each campaign adopts of it."""
        policy = BreakerPolicy(spec.breaker_threshold, dt.timedelta(seconds=spec.cooldown_seconds))
        written = status.breaker
        before = SharedBreaker(
            BreakerState.CLOSED if written.state is BreakerState.CLOSED else BreakerState.OPEN,
            written.opened_at if written.state is not BreakerState.CLOSED else None,
            written.closed_at,
            written.consecutive_failures,
        )
        asked = self._asked.get(source_key, {})
        holding = self._holding.setdefault(source_key, set())
        holding.update(
            c.claimant.campaign for c in eligible if holds(c.breaker, asked.get(c.claimant.campaign))
        )
        campaigns = {c.claimant.campaign: c.breaker for c in eligible}
        after = shared_state(before, campaigns, asked, holding, policy, now)
        actives = serving_order(c.claimant for c in eligible if c.claimant.active)
        prober = actives[0].campaign if actives else None
        verdicts = {
            c.claimant.campaign: BreakerVerdict(after, policy, c.claimant.campaign == prober)
            for c in eligible
        }
        if after.state is BreakerState.CLOSED:
            self._asked.pop(source_key, None)
            self._holding.pop(source_key, None)
        else:
            self._asked[source_key] = {
                c.claimant.campaign: asked_at
                for c in eligible
                if (
                    asked_at := adopted(c.breaker, after, policy, c.cooldown, c.claimant.campaign == prober)[
                        1
                    ]
                )
                is not None
            }
        shown = after.state
        if after.opened_at is not None and now >= after.opened_at + policy.cooldown:
            shown = BreakerState.HALF_OPEN
        return (
            SourceBreakerStatus(
                state=shown,
                consecutive_failures=after.consecutive_rate_limited,
                opened_at=after.opened_at,
                closed_at=after.closed_at,
            ),
            verdicts,
        )

    def _ready(
        self, source_key: SourceKey, resource: SharedSource | ClusterSharedSource, now: dt.datetime
    ) -> DesiredCondition:
        """Ready of the Source: False naming the fix when a ClusterSource lists no namespace or a
        Source's key Secret (or the key in it) is missing. The Secret is read again only when the
        Source's spec changed, while it is missing, or KEY_RECHECK after it was last found."""
        known = self._readiness.get(source_key)
        if (
            known is not None
            and known.generation == resource.generation
            and known.condition.status is ConditionStatus.TRUE
            and now < known.at + KEY_RECHECK
        ):
            return known.condition
        condition = self._check_key(resource)
        self._readiness[source_key] = KeyCheck(resource.generation, condition, now)
        return condition

    def _check_key(self, resource: SharedSource | ClusterSharedSource) -> DesiredCondition:
        """Ready as the resource and its key Secret say now (one GET of the Secret for a Source with
        one); an operator not allowed to read it takes the Secret as there (its workers' pods would say)."""
        if isinstance(resource, ClusterSharedSource):
            if not resource.spec.namespaces:
                return DesiredCondition(
                    ConditionType.READY,
                    ConditionStatus.FALSE,
                    ConditionReason.NO_NAMESPACES,
                    f"spec.namespaces lists none, so it serves no campaign: list them (or '*') with "
                    f"kubectl edit clustersource {resource.name}",
                )
            return _usable()
        secret = resource.spec.api_key_secret
        if secret is None:
            return _usable()
        namespace = resource.namespace
        try:
            body = self.kube.get(SECRETS, namespace, secret.name)
        except Forbidden:
            return _usable()
        except NotFound:
            return _key_missing(f"no Secret {secret.name} in namespace {namespace}", namespace, secret)
        if secret.key not in (body.get("data") or {}) and secret.key not in (body.get("stringData") or {}):
            return _key_missing(f"Secret {secret.name} has no key {secret.key}", namespace, secret)
        return _usable()

    def _read(self, source_key: SourceKey) -> JSON | None:
        resource = SOURCES if source_key.kind is SourceKind.SOURCE else CLUSTER_SOURCES
        try:
            return self.kube.get(resource, source_key.namespace or None, source_key.name)
        except NotFound:
            return None

    @staticmethod
    def _parse(
        source_key: SourceKey, body: JSON
    ) -> tuple[SharedSource | ClusterSharedSource, SharedSourceStatus]:
        model = SharedSource if source_key.kind is SourceKind.SOURCE else ClusterSharedSource
        resource = model.parse(body)
        try:
            status = SharedSourceStatus.model_validate(body.get("status") or {})
        except ValidationError:
            status = SharedSourceStatus()
        return resource, status

    def _announce_breaker(
        self,
        body: JSON,
        before: SourceBreakerStatus,
        after: SourceBreakerStatus,
        spec: SharedSourceSpec,
        now: dt.datetime,
    ) -> None:
        """An Event on the Source when its breaker opened or closed, after the status saying so was
        written (a write that failed is retried by the next pass, and announced then, once)."""
        if self.actor is None:
            return
        if before.state is BreakerState.CLOSED and after.state is not BreakerState.CLOSED:
            reason, warning = ConditionReason.SOURCE_BREAKER_OPENED, True
            note = (
                f"{after.consecutive_failures} rate-limited answers in a row across its campaigns "
                f"(breakerThreshold {spec.breaker_threshold}): every campaign on it moves to its fallback; "
                f"one campaign probes it after cooldownSeconds {spec.cooldown_seconds}"
            )
        elif before.state is not BreakerState.CLOSED and after.state is BreakerState.CLOSED:
            reason, warning = ConditionReason.SOURCE_BREAKER_CLOSED, False
            note = "a probe succeeded: its campaigns use it again"
        else:
            return
        events.record(
            self.kube,
            events.event_body(
                body,
                reason=str(reason),
                note=note,
                action="Breaker",
                controller=self.actor.controller,
                instance=self.actor.instance,
                now=now,
                warning=warning,
            ),
        )

    def _write_status(self, source_key: SourceKey, status: SharedSourceStatus) -> None:
        resource = SOURCES if source_key.kind is SourceKind.SOURCE else CLUSTER_SOURCES
        self.kube.patch(
            resource,
            source_key.namespace or None,
            source_key.name,
            {"status": status.to_dict()},
            subresource="status",
        )


def _usable() -> DesiredCondition:
    return DesiredCondition(
        ConditionType.READY,
        ConditionStatus.TRUE,
        ConditionReason.SOURCE_USABLE,
        "campaigns that name it get a share of its limits",
    )


def _key_missing(what: str, namespace: str, secret: SecretKeyRef) -> DesiredCondition:
    return DesiredCondition(
        ConditionType.READY,
        ConditionStatus.FALSE,
        ConditionReason.KEY_SECRET_MISSING,
        f"spec.apiKeySecret: {what}, so its workers cannot call it: kubectl -n {namespace} create secret "
        f"generic {secret.name} --from-literal={secret.key}=<api key>",
    )


@dataclass(frozen=True)
class KeyCheck:
    """A Source's Ready condition as its key Secret was found at `at`, for its spec's `generation`."""

    generation: int
    condition: DesiredCondition
    at: dt.datetime


@dataclass(frozen=True)
class Unresolved:
    """Why a Source serves no share to a campaign that names it, and what to do."""

    reason: ConditionReason
    fix: str


def _not_found(source_key: SourceKey) -> str:
    if source_key.kind is SourceKind.SOURCE:
        return (
            f"no Source {source_key.name} in namespace {source_key.namespace}: create a Source named "
            f"{source_key.name} there (kubectl apply -n {source_key.namespace} -f source.yaml), or name "
            "one that exists (kubectl get sources)"
        )
    return (
        f"no ClusterSource {source_key.name}: ask an administrator to create it, or name a Source "
        "that exists (kubectl get sources,clustersources)"
    )


def _not_allowed(source_key: SourceKey, namespace: str) -> str:
    return (
        f"ClusterSource {source_key.name} does not serve namespace {namespace}: an administrator adds "
        f"{namespace} to its spec.namespaces (kubectl edit clustersource {source_key.name}), or name "
        "another Source"
    )


@dataclass(frozen=True)
class BreakerVerdict:
    """A Source's breaker as a campaign adopts it: the Source's, its policy, and whether this campaign
    is the one to probe it when half-open."""

    source: SharedBreaker
    policy: BreakerPolicy
    prober: bool


def _larger(reported: Granted | None, decided: Rates | None) -> Granted:
    if reported is None and decided is None:
        return Granted(Rates())
    if reported is None:
        assert decided is not None
        return Granted(decided)
    if decided is None:
        return reported
    values = [
        None if a is None and b is None else max(a or 0.0, b or 0.0)
        for a, b in zip(reported.rates.dimensions(), decided.dimensions(), strict=True)
    ]
    return Granted(Rates.of(values), reported.lowered_at)


def _total(shares: Iterable[Granted], index: int) -> float | None:
    values = [g.rates.dimensions()[index] for g in shares]
    present = [v for v in values if v is not None]
    return sum(present) if present else None
