"""Which shard to claim, and claiming it: the Lease first, then one status patch.

Choosing is pure (`choose`): the same planner the operator uses, on the same inputs
(`operator.observe.claim_inputs`), decides what is claimable (phase, backoff, suspend, budget gate,
per-source breakers and fallbacks, capacity), in claim order — priority, then FIFO — and the
worker picks at random among the first K so a crowd of workers does not all race for the head of
the queue. Running shards whose lease ran out (zombies: no heartbeat and the
lease expired means anyone may claim it again, attempt+1) are candidates too: whoever takes the
expired Lease over reclaims the shard (attempt+1, event LeaseExpired) and then claims it, or blocks
it when that was its last attempt — unless the lost claim's result is stored and verifies: then it
completes the shard with that result (`store.finished`), charging nothing and running nothing.

Claiming (`claim`) is two writes, each with a precondition: the Lease (create, or take over an
expired one at its resourceVersion; leaseTransitions is the fencing token), then the shard status
(owner, leaseUntil, attempt, fencingToken, source in one patch at the shard's resourceVersion).
Losing either race gives the Lease back and moves on to the next candidate.
"""

from __future__ import annotations

import datetime as dt
import logging
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from shardops.api.campaign import Campaign
from shardops.api.common import Item
from shardops.api.enums import FINISHED_PHASES, ErrorClass, ShardPhase
from shardops.api.names import API_GROUP_VERSION, SHARD_KIND
from shardops.api.shard import Progress, Shard, ShardError
from shardops.k8s import leases
from shardops.k8s.api import SHARDS, Conflict, KubeClient, NotFound
from shardops.k8s.shards import Actor, TransitionRequest, apply_transition
from shardops.logic.breaker import route
from shardops.logic.budget import BudgetGate, allows
from shardops.logic.idempotency import item_subkey
from shardops.logic.leases import LeaseVerdict, Renewals, is_expired, lease_action
from shardops.logic.planner import claim_order_key, plan_dispatch
from shardops.logic.timefmt import rfc3339
from shardops.logic.transitions import Action, EventReason
from shardops.state import error_threshold, observe, shardview
from shardops.store import ResultStore
from shardops.store.finished import commit_for_reuse, completion, stored_result_of
from shardops.store.records import ItemRecord
from shardops.worker.observed import Observed

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Candidate:
    shard: Shard
    # The source to call: the shard's own, or its fallback while the own breaker is open.
    source: str | None
    zombie: bool


@dataclass(frozen=True)
class Claimed:
    shard: Shard
    lease: leases.Claim
    source: str | None
    # Item results found in the store at claim time: the attempt skips these (partial resume).
    stored: Mapping[str, ItemRecord]
    items: Sequence[Item]
    reclaimed_from: str | None


def expected_shards(campaign: Campaign) -> int | None:
    """Shards the campaign will have in all (finalize included), or None while unknown."""
    status = campaign.current_status
    work = status.shards_total
    inline = campaign.spec.inline_items_total
    if work is None and inline is not None:
        work = campaign.spec.expected_shards(inline)
    if work is None:
        return None
    return work + (1 if campaign.spec.finalize is not None else 0)


def uncut_shards(campaign: Campaign, unfinished: Sequence[Shard]) -> int:
    """Work shards the operator has still to cut: while there are any, more work is coming."""
    total = observe.known_items_total(campaign, unfinished)
    return observe.item_progress(campaign, unfinished, total).uncut_shards


def exit_reason(observed: Observed | None, namespace: str, name: str, started_for: str | None) -> str | None:
    """Why a worker of campaign `namespace`/`name` should exit, judged on `observed` (None: the
    campaign does not exist). `started_for`: the uid of the campaign the worker was started for
    (SHARDOPS_CAMPAIGN_UID), if known."""
    if observed is None:
        return f"campaign {namespace}/{name} does not exist"
    if started_for and observed.campaign.metadata.uid != started_for:
        return (
            f"campaign {namespace}/{name} was deleted and applied again "
            f"(uid {observed.campaign.metadata.uid}, this worker's was {started_for})"
        )
    return stop_reason(observed.campaign, observed.unfinished)


def stop_reason(campaign: Campaign, unfinished: Sequence[Shard]) -> str | None:
    """Why a worker of this campaign should exit now rather than wait for work, or None.

    `unfinished`: the campaign's shards that are not Done (`k8s.shards.list_unfinished`); what a
    worker knows of the Done ones comes from the Campaign status."""
    if campaign.metadata.deletion_timestamp is not None:
        return "campaign is being deleted"
    if campaign.spec.suspend:
        return "campaign is suspended"
    if error_threshold.held(campaign):
        return "campaign is held by its error threshold (condition ErrorThreshold)"
    budget = observe.campaign_budget(campaign, (shardview.shard_view(s) for s in unfinished))
    if budget.gate is BudgetGate.EXHAUSTED:
        return f"campaign is out of budget ({budget.describe()})"
    expected = expected_shards(campaign)
    if expected is None or uncut_shards(campaign, unfinished):
        return None
    if not all(s.phase is not None and s.phase.terminal for s in unfinished):
        return None
    finalize = shardview.finalize_name(campaign.name)
    if campaign.spec.finalize is not None and all(s.name != finalize for s in unfinished):
        # The finalize shard is not cut yet, or Done: only the status can tell which.
        phase = campaign.current_status.phase
        if phase not in FINISHED_PHASES:
            return None
    # The gave-up shards folded into the ledger are listed no more: the status counts them.
    done = expected - len(unfinished) - campaign.current_status.folded.gave_up
    return f"campaign is finished ({done} of {expected} shard(s) Done, the rest Failed or Blocked)"


def is_zombie(shard: Shard, silent_seconds: float, lease_seconds: int) -> bool:
    """Running, and this worker has not seen its claim renewed for a full lease duration on its own
    clock (`shardview.claim_silence`). The Lease object decides at claim time; this only says it is
    worth trying."""
    if shard.current_status.phase is not ShardPhase.RUNNING:
        return False
    return is_expired(silent_seconds, lease_seconds)


def choose(
    campaign: Campaign,
    shards: Sequence[Shard],
    now: dt.datetime,
    k: int,
    rng: random.Random,
    silent: Mapping[str, float],
) -> list[Candidate]:
    """Candidates to try, in the order to try them: a random order of the first `k` in claim order.
    `silent`: how long this worker has not seen each Running shard's claim renewed (none: just seen).

    The planner's inputs are the operator's (`observe.claim_inputs`), so per-source cooldowns,
    fallbacks, the budget gate (spent: the larger of the campaign's status and the shards' costs)
    and capacity are decided exactly as the operator decides them."""
    by_name = {s.name: s for s in shards}
    inputs = observe.claim_inputs(campaign, shards, now)
    views = {v.name: v for v in inputs.shards}
    plan = plan_dispatch(inputs)
    ranked: list[tuple[tuple[int, int, str], Candidate]] = []
    for name in plan.claimable:
        shard = by_name[name]
        found = plan.routes.get(name)
        source = found.source if found is not None else shard.spec.source
        ranked.append((claim_order_key(views[name]), Candidate(shard, source, zombie=False)))
    budget, breakers = inputs.budget, inputs.breakers
    if not inputs.suspended and budget.gate is not BudgetGate.EXHAUSTED:
        for shard in shards:
            zombie = is_zombie(shard, silent.get(shard.name, 0.0), campaign.spec.lease_seconds)
            if not zombie or not allows(budget.gate, shard.spec.shard_class):
                continue
            # Reclaimed, it calls its own source again (or that source's fallback).
            source = shard.spec.source
            if source is not None:
                found = route(
                    source, breakers.states, breakers.fallbacks, now, breakers.cooldown, probing=frozenset()
                )
                if found is None:
                    continue
                source = found.source
            ranked.append((claim_order_key(views[shard.name]), Candidate(shard, source, zombie=True)))
    ranked.sort(key=lambda pair: pair[0])
    head = [candidate for _, candidate in ranked[:k]]
    rng.shuffle(head)
    return head


def was_claimed(shard: Shard) -> bool:
    """The shard has been claimed before, so its Lease exists (a Lease lives as long as its shard).
    A shard whose history was trimmed of its claims also counts as claimed: a guess either way only
    costs a request (`leases.acquire`)."""
    status = shard.current_status
    if status.phase is not ShardPhase.PENDING or status.attempt > 1:
        return True  # a Running one (a zombie) is claimed by definition
    return any(entry.reason != EventReason.MATERIALIZED for entry in status.history)


def lease_owner_reference(shard: Shard) -> dict[str, Any]:
    """The Shard owns its Lease, so the garbage collector removes the Lease with the shard."""
    return {
        "apiVersion": API_GROUP_VERSION,
        "kind": SHARD_KIND,
        "name": shard.name,
        "uid": shard.metadata.uid,
    }


def progress_of(items: Sequence[Item], done_keys: Mapping[str, object] | set[str]) -> Progress:
    keys = [item_subkey(item) for item in items]
    return Progress(done=sum(1 for key in keys if key in done_keys), total=len(keys))


@dataclass(frozen=True)
class ClaimContext:
    kube: KubeClient
    namespace: str
    holder: str
    actor: Actor
    now: Callable[[], dt.datetime]
    items_of: Callable[[Shard], Sequence[Item]]
    stored_of: Callable[[Shard, Sequence[Item]], Mapping[str, ItemRecord]]
    # The campaign's result store: a zombie's stored result is looked up before it is charged.
    store: Callable[[], ResultStore]
    # When this worker last saw each claim renewed: a held Lease is taken over only after a full
    # lease duration without a renewal on this worker's own clock (`leases.is_free`).
    seen: Renewals
    # This worker lost a claim of the shard before: its Lease exists, read it before taking it.
    lost_before: Callable[[Shard], bool] = lambda shard: False
    # Called once the shard's Lease is this worker's, before the claim is written: nobody else can
    # claim the shard from here on (the slot counts its process busy: SlotGroup).
    leased: Callable[[Shard], None] = lambda shard: None


def claim(ctx: ClaimContext, campaign: Campaign, candidate: Candidate) -> Claimed | None:
    """Claim `candidate`, or None when another worker was faster (or it is not claimable any more)."""
    shard = candidate.shard
    lease = leases.acquire(
        ctx.kube,
        ctx.namespace,
        shard.lease_name,
        ctx.holder,
        campaign.spec.lease_seconds,
        ctx.now(),
        owner=lease_owner_reference(shard),
        seen=ctx.seen,
        may_exist=was_claimed(shard) or ctx.lost_before(shard),
    )
    if lease is None:
        return None
    ctx.leased(shard)
    try:
        return _claim_holding(ctx, campaign, candidate, lease)
    except (Conflict, NotFound) as error:
        log.info("claim of %s lost a race (%s); trying another", shard.name, error.reason)
        leases.release(ctx.kube, lease)
        return None
    except BaseException:
        leases.release(ctx.kube, lease)
        raise


def _claim_holding(
    ctx: ClaimContext, campaign: Campaign, candidate: Candidate, lease: leases.Claim
) -> Claimed | None:
    """Holding the Lease, nobody else can claim the shard: write the claim at the version listed a
    moment ago (no read), and only when that write conflicts — the operator wrote the shard since —
    read it once and decide again on what it is now."""
    try:
        return _claim_as_seen(ctx, campaign, candidate, lease, candidate.shard.with_items())
    except Conflict:
        fresh = Shard.parse(ctx.kube.get(SHARDS, ctx.namespace, candidate.shard.name))
        return _claim_as_seen(ctx, campaign, candidate, lease, fresh)


def _claim_as_seen(
    ctx: ClaimContext, campaign: Campaign, candidate: Candidate, lease: leases.Claim, fresh: Shard
) -> Claimed | None:
    reclaimed_from: str | None = None
    if fresh.phase is ShardPhase.RUNNING:
        # We hold a Lease that was free, so whoever ran this shard stopped renewing: a zombie.
        reclaimed_from = fresh.current_status.owner
        after = _reclaim(ctx, campaign, fresh, lease)
        if after is None:
            leases.release(ctx.kube, lease)
            return None
        fresh = after
    now = ctx.now()
    status = fresh.current_status
    if fresh.phase is not ShardPhase.PENDING or (status.not_before is not None and status.not_before > now):
        leases.release(ctx.kube, lease)
        return None
    items = ctx.items_of(fresh)
    stored = ctx.stored_of(fresh, items)
    attempt = max(status.attempt, 1)
    message = f"claimed by {ctx.holder} (attempt {attempt}, fencing token {lease.fencing_token})"
    if candidate.source is not None and candidate.source != fresh.spec.source:
        message += f", calling fallback source {candidate.source} instead of {fresh.spec.source}"
    if stored:
        message += f", resuming with {len(stored)} item result(s) already stored"
    claimed = apply_transition(
        ctx.kube,
        fresh,
        TransitionRequest(
            Action.CLAIM,
            message,
            updates={
                "owner": ctx.holder,
                "lease_until": lease.until,
                "fencing_token": lease.fencing_token,
                "source": candidate.source,
                "last_heartbeat": now,
                "progress": progress_of(items, set(stored)),
                "not_before": None,
            },
            attempt=attempt,
        ),
        ctx.actor,
        now,
    )
    return Claimed(claimed, lease, candidate.source, stored, items, reclaimed_from)


def _reclaim(ctx: ClaimContext, campaign: Campaign, shard: Shard, lease: leases.Claim) -> Shard | None:
    """Running shard, expired Lease now ours: reclaim it (attempt+1) and return it Pending, or block
    it when the lost attempt was its last (None). Written as the operator's lease sweep writes it
    (same lastError shape), so the history reads the same whoever noticed the zombie. A zombie whose
    result verifies in the store is completed with it instead (None: nothing left to run)."""
    status = shard.current_status
    attempt = max(status.attempt, 1)
    until = rfc3339(status.lease_until) if status.lease_until else "unknown"
    of = campaign.spec.max_attempts
    what = f"lease of {status.owner} expired (leaseUntil {until}, attempt {attempt} of {of})"
    store = ctx.store()
    stored = stored_result_of(store, shard)
    if stored is not None:
        request = completion(shard, stored, f"{what}; completed by {ctx.holder}")
        apply_transition(ctx.kube, shard, request, ctx.actor, ctx.now())
        log.info("completed %s with the result its lost claim stored (%s)", shard.name, stored.name)
        commit_for_reuse(store, shard, stored)
        return None
    action = lease_action(
        LeaseVerdict.ZOMBIE, campaign.spec.stall.policy, attempt, campaign.spec.max_attempts
    )
    now = ctx.now()
    error = ShardError(
        error_class=ErrorClass.UNKNOWN,
        source=status.source or shard.spec.source,
        message=f"worker lost: {what}; the worker stopped heartbeating (crashed, killed or cut off)",
        at=now,
    )
    updates: dict[str, Any] = {
        "owner": None,
        "lease_until": None,
        "last_heartbeat": None,
        "not_before": None,
        "fencing_token": None,
        "last_error": error,
    }
    if action is Action.BLOCK:
        apply_transition(
            ctx.kube,
            shard,
            TransitionRequest(Action.BLOCK, f"{what}: no attempts left", updates=updates),
            ctx.actor,
            now,
        )
        log.warning("blocked %s: %s", shard.name, error.message)
        return None
    return apply_transition(
        ctx.kube,
        shard,
        TransitionRequest(Action.RECLAIM, f"{what}; reclaimed by {ctx.holder}", updates=updates),
        ctx.actor,
        now,
    )
