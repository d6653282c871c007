"""The invariants of a finished run, checked offline on its History (testbed/faults/history.py).

`check` returns every Violation found (empty when all hold); each invariant is one small function
below, named as its Violation's `invariant`. Times are the API server's (stageTimestamp); the order
of versions is the server's (resourceVersion). docs/faults.md states each invariant in a sentence.

A claim (a Lease version with a holder) is live until a full leaseDurationSeconds after the API
server stored its latest renewal (the write that changed holder, token or renewTime), on the
server's clock. Observers judge expiry the same way — on their own clock, from when they saw the
renewal (`logic.leases`, "Whose clock") — and they see a renewal only after the server stored it,
so an honest takeover is never earlier. The holder's own timestamps are not used: a holder whose
clock runs behind must not have its claim end early, nor one whose clock runs ahead stretch it.
"""

from __future__ import annotations

import argparse
import datetime as dt
import re
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from decimal import Decimal
from itertools import pairwise
from pathlib import Path
from typing import TypeVar

from shardops.api.enums import ErrorClass, ShardPhase
from shardops.api.money import parse_money
from shardops.logic.transitions import EventReason
from testbed.faults.history import (
    CampaignVersion,
    History,
    LeaseVersion,
    ObjectKey,
    ShardVersion,
    Version,
    Write,
    from_entries,
    key_text,
)
from testbed.faults.recording import read_entries

# How a zombie's reclaim (or its block on the last attempt) words its lastError, whoever noticed
# it: the operator's lease sweep (scheduler/reconcile.py) and the worker that took the expired
# Lease over (worker/claim.py).
ZOMBIE_MESSAGE_PREFIX = "worker lost:"
FINAL_PHASES = frozenset({ShardPhase.DONE, ShardPhase.FAILED, ShardPhase.BLOCKED, ShardPhase.PAUSED})
FINGERPRINT = re.compile(r"^sha256:[0-9a-f]{64}$")


@dataclass(frozen=True)
class Violation:
    invariant: str
    # "shard <namespace>/<name>", "lease <namespace>/<name>", ...
    object: str
    detail: str

    def __str__(self) -> str:
        return f"{self.invariant}: {self.object}: {self.detail}"


@dataclass(frozen=True)
class Identities:
    """Who may change shard status: the service account names of the operator (any namespace)
    and of the workers (in the shard's namespace, with a shardops worker's user agent)."""

    operator_accounts: frozenset[str]
    worker_accounts: frozenset[str]
    # The operator replicas' leader Lease (the chart's default name; SHARDOPS_LEADER_ELECTION_LEASE_NAME).
    leader_lease: str = "shardops-operator"

    def role(self, write: Write) -> str | None:
        """The role of the writer: operator, worker, or None for anyone else."""
        account = write.account
        if account is None:
            return None
        namespace, name = account
        if name in self.operator_accounts:
            return "operator"
        if name in self.worker_accounts and namespace == write.namespace and write.agent_identity:
            return "worker"
        return None


@dataclass(frozen=True)
class _Run:
    history: History
    identities: Identities
    # What was checked, by kind (printed by the e2e tests, so a pass says how much it covered).
    tally: Counter[str]


Invariant = Callable[[_Run], Iterator[Violation]]
V = TypeVar("V", bound=Version)


def _shard(key: ObjectKey) -> str:
    return f"shard {key_text(key)}"


def _lease(key: ObjectKey) -> str:
    return f"lease {key_text(key)}"


def _incarnations(versions: Sequence[V]) -> list[list[V]]:
    """The versions of one name split by object uid (a Shard or Lease deleted and made again)."""
    groups: dict[str, list[V]] = {}
    for version in versions:
        groups.setdefault(version.uid, []).append(version)
    return list(groups.values())


def _stored(versions: Sequence[V]) -> list[V]:
    return [v for v in versions if not v.deleted]


def claim_ends(versions: Sequence[LeaseVersion]) -> list[dt.datetime | None]:
    """For each version of one Lease: when the claim it records runs out (module docstring); None
    for a version without a holder."""
    ends: list[dt.datetime | None] = []
    renewed_at: dt.datetime | None = None
    previous: LeaseVersion | None = None
    for version in versions:
        changed = previous is None or (version.holder, version.transitions, version.renew_time) != (
            previous.holder,
            previous.transitions,
            previous.renew_time,
        )
        if changed:
            renewed_at = version.write.stage
        previous = version
        if version.holder is None or renewed_at is None:
            ends.append(None)
            continue
        ends.append(renewed_at + version.duration)
    return ends


def _lease_pairs(run: _Run) -> Iterator[tuple[ObjectKey, LeaseVersion, LeaseVersion, dt.datetime | None]]:
    """(key, previous, current, when the previous version's claim runs out) for every two
    consecutive stored versions of each Lease incarnation."""
    for key, versions in run.history.leases.items():
        for incarnation in _incarnations(versions):
            stored = _stored(incarnation)
            ends = claim_ends(stored)
            for (before, after), end in zip(pairwise(stored), ends, strict=False):
                yield key, before, after, end


def _early(end: dt.datetime, at: dt.datetime) -> str:
    return f"{(end - at).total_seconds():.3f}s before it ran out ({end.isoformat()})"


def complete_record(run: _Run) -> Iterator[Violation]:
    """Every successful write of the history is recorded with the object it stored."""
    for write in run.history.without_body:
        yield Violation(
            "complete-record",
            f"{write.resource} {write.namespace}/{write.name}",
            f"{write.describe()} has no responseObject: record with the history audit policy "
            "(testbed/cluster/lifecycle.py, record_history)",
        )


def one_holder_at_a_time(run: _Run) -> Iterator[Violation]:
    """A Lease passes from one holder to another only after the first one's claim ran out, and a
    write that keeps the holder is made by that holder (when the writer names itself)."""
    for key, before, after, end in _lease_pairs(run):
        if before.holder is None or after.holder is None:
            continue
        if after.holder != before.holder:
            run.tally["lease takeovers"] += 1
            if end is not None and after.write.stage < end:
                yield Violation(
                    "one-holder-at-a-time",
                    _lease(key),
                    f"{after.holder} took over the live claim of {before.holder} (token "
                    f"{before.transitions}, {before.where()}) at {after.where()}, "
                    + _early(end, after.write.stage),
                )
            continue
        writer = after.write.agent_identity
        run.tally["lease renewals"] += 1
        if writer is not None and writer != after.holder:
            yield Violation(
                "one-holder-at-a-time",
                _lease(key),
                f"{after.where()} renewed the claim of {after.holder} (token {after.transitions}) "
                f"but was written by {writer}",
            )


def _transition(before: ShardVersion | None, after: ShardVersion) -> dict[str, object] | None:
    """The history entry `after`'s write added (None: no transition, e.g. a heartbeat)."""
    entry = after.last_entry
    if entry is None or (before is not None and before.last_entry == entry):
        return None
    return entry


def _recorded_as_stall_revoke(run: _Run, key: ObjectKey, clear: LeaseVersion, holder: str) -> bool:
    """The clearer's next write of the shard records a stall-policy revoke of `holder`'s claim:
    Revoked, or Blocked for no progress (class timeout) when it was the last attempt."""
    rv = clear.resource_version or 0
    previous: ShardVersion | None = None
    for version in run.history.shards.get(key, []):
        if (version.resource_version or 0) < rv:
            previous = version
            continue
        same_writer = (version.write.username, version.write.user_agent) == (
            clear.write.username,
            clear.write.user_agent,
        )
        if version.write.resource != "shards/status" or not same_writer:
            previous = version
            continue
        entry = _transition(previous, version) or {}
        revoked = entry.get("reason") == EventReason.REVOKED or (
            entry.get("reason") == EventReason.BLOCKED and entry.get("errorClass") == ErrorClass.TIMEOUT
        )
        return revoked and entry.get("owner") == holder
    return False


def no_live_claim_taken(run: _Run) -> Iterator[Violation]:
    """A live claim is cleared only by its holder, or by the operator's stall-policy revoke that
    the shard's history then records as such."""
    for key, before, after, end in _lease_pairs(run):
        if before.holder is None or after.holder is not None:
            continue
        run.tally["lease clears"] += 1
        if after.write.agent_identity == before.holder:
            continue
        if end is None or after.write.stage >= end:
            continue
        if _recorded_as_stall_revoke(run, key, after, before.holder):
            run.tally["stall revokes"] += 1
            continue
        yield Violation(
            "no-live-claim-taken",
            _lease(key),
            f"{after.where()} cleared the live claim of {before.holder} (token {before.transitions}, "
            f"{before.where()}), " + _early(end, after.write.stage) + ", and the writer's next write "
            "of the shard does not record a stall revoke",
        )


def _shard_pairs(history: History) -> Iterator[tuple[ObjectKey, ShardVersion | None, ShardVersion]]:
    """(key, previous or None, current) for every stored version of each Shard incarnation."""
    for key, versions in history.shards.items():
        for incarnation in _incarnations(versions):
            previous: ShardVersion | None = None
            for version in _stored(incarnation):
                yield key, previous, version
                previous = version


def done_writes(history: History) -> Iterator[tuple[ObjectKey, ShardVersion | None, ShardVersion]]:
    """(key, the version before, the version) of every write that moved a shard into Done."""
    for key, before, after in _shard_pairs(history):
        if after.phase == ShardPhase.DONE and (before is None or before.phase != ShardPhase.DONE):
            yield key, before, after


def _lost_claim_completed(run: _Run, before: ShardVersion, done: ShardVersion, lease: LeaseVersion) -> bool:
    """A zombie completed with the result its lost claim stored (`store.finished`): the Done records
    that claim's own object (the attempt object of its token, `attempts/<key>/t<token>.json`), and
    it was written by whoever ended the claim — the worker that took the expired Lease over (a
    higher token), or the operator's sweep that cleared it. Whether the claim had run out when it
    was ended is `one-holder-at-a-time`'s and `no-live-claim-taken`'s to check."""
    token = before.fencing_token
    ref = str((done.result or {}).get("ref") or "")
    if token is None or not ref.endswith(f"/t{token}.json"):
        return False
    writer = done.write.agent_identity
    taken_over = lease.holder is not None and lease.holder == writer and lease.transitions > token
    cleared = (
        lease.holder is None and lease.transitions == token and run.identities.role(done.write) == "operator"
    )
    return taken_over or cleared


def fencing(run: _Run) -> Iterator[Violation]:
    """Every Done write completes the claim in force: the owner and fencingToken the shard recorded
    before it (a Done write clears them) are the holder and leaseTransitions of the Lease when the
    server stored the Done, and that owner wrote it — or it completes a lost claim with that claim's
    own stored result (`_lost_claim_completed`)."""
    for key, before, done in done_writes(run.history):
        run.tally["Done writes"] += 1
        if before is None or before.phase != ShardPhase.RUNNING:
            phase = before.phase if before is not None else "nothing recorded"
            yield Violation("fencing", _shard(key), f"Done at {done.where()} from {phase}, not from a claim")
            continue
        owner, token = before.owner, before.fencing_token
        lease = run.history.lease_in_force(key, done.resource_version or 0)
        if lease is None:
            yield Violation("fencing", _shard(key), f"Done at {done.where()} with no Lease in force")
            continue
        if (lease.holder, lease.transitions) != (owner, token) and _lost_claim_completed(
            run, before, done, lease
        ):
            run.tally["zombies completed from their stored result"] += 1
            continue
        if (lease.holder, lease.transitions) != (owner, token):
            yield Violation(
                "fencing",
                _shard(key),
                f"Done at {done.where()} completes the claim of {owner} token {token} "
                f"({before.where()}), but the Lease in force ({lease.where()}) is held by "
                f"{lease.holder} with token {lease.transitions}",
            )
            continue
        writer = done.write.agent_identity
        if writer != owner:
            yield Violation(
                "fencing",
                _shard(key),
                f"Done at {done.where()} completes the claim of {owner} but was written by {writer}",
            )


def one_done(run: _Run) -> Iterator[Violation]:
    """A shard of one campaign incarnation moves into Done at most once (a folded shard is never
    made again and run twice)."""
    dones: dict[tuple[ObjectKey, str | None], list[ShardVersion]] = {}
    for key, _, done in done_writes(run.history):
        dones.setdefault((key, done.campaign_uid), []).append(done)
    for (key, _), versions in dones.items():
        if len(versions) > 1:
            yield Violation(
                "one-done",
                _shard(key),
                f"{len(versions)} Done writes: " + "; ".join(v.where() for v in versions),
            )


def lease_transitions_monotonic(run: _Run) -> Iterator[Violation]:
    """A Lease's leaseTransitions (the fencing token) never decreases."""
    for key, before, after, _ in _lease_pairs(run):
        if after.transitions < before.transitions:
            yield Violation(
                "lease-transitions-monotonic",
                _lease(key),
                f"leaseTransitions {before.transitions} ({before.where()}) -> {after.transitions} "
                f"({after.where()})",
            )


def attempts_monotonic(run: _Run) -> Iterator[Violation]:
    """A shard's attempt never decreases, except by an explicit retry (Retried resets it to 1)."""
    for key, before, after in _shard_pairs(run.history):
        if before is None or not before.status or not after.status:
            continue
        entry = _transition(before, after) or {}
        if after.attempt < before.attempt and entry.get("reason") != EventReason.RETRIED:
            yield Violation(
                "attempts-monotonic",
                _shard(key),
                f"attempt {before.attempt} ({before.where()}) -> {after.attempt} ({after.where()})",
            )


def attempts_bounded(run: _Run) -> Iterator[Violation]:
    """A shard's attempt never exceeds its campaign's maxAttempts (reported once per shard)."""
    for key, versions in run.history.shards.items():
        for incarnation in _incarnations(versions):
            for version in _stored(incarnation):
                campaign = run.history.campaign_in_force(
                    (key[0], version.campaign or ""), version.campaign_uid, version.resource_version
                )
                if campaign is None:
                    run.tally["shard versions without a campaign record"] += 1
                    continue
                if version.attempt > campaign.max_attempts:
                    yield Violation(
                        "attempts-bounded",
                        _shard(key),
                        f"attempt {version.attempt} > maxAttempts {campaign.max_attempts} "
                        f"at {version.where()}",
                    )
                    break


def _charges_for_lost_holder(entry: dict[str, object], version: ShardVersion) -> bool:
    """A reclaim (LeaseExpired), or a zombie's block on its last attempt."""
    if entry.get("reason") == EventReason.LEASE_EXPIRED:
        return True
    message = str((version.status.get("lastError") or {}).get("message") or "")
    return entry.get("reason") == EventReason.BLOCKED and message.startswith(ZOMBIE_MESSAGE_PREFIX)


def attempt_charged_rightly(run: _Run) -> Iterator[Violation]:
    """A shard is charged for a lost holder (LeaseExpired, or blocked as a zombie) only after the
    claim it judged — the owner and fencingToken of the version before — ran out by its Lease."""
    for key, before, after in _shard_pairs(run.history):
        entry = _transition(before, after)
        if before is None or entry is None or not _charges_for_lost_holder(entry, after):
            continue
        run.tally["lost-holder charges"] += 1
        owner, token = before.owner, before.fencing_token
        rv = after.resource_version or 0
        versions = [v for v in run.history.leases.get(key, []) if not v.deleted]
        ends = claim_ends(versions)
        claim = [
            (version, end)
            for version, end in zip(versions, ends, strict=True)
            if (version.resource_version or 0) < rv
            and (version.holder, version.transitions) == (owner, token)
        ]
        if not claim:
            yield Violation(
                "attempt-charged-rightly",
                _shard(key),
                f"{entry.get('reason')} at {after.where()} judged the claim of {owner} token {token}, "
                "which no Lease version records",
            )
            continue
        last, end = claim[-1]
        if end is not None and after.write.stage < end:
            yield Violation(
                "attempt-charged-rightly",
                _shard(key),
                f"{entry.get('reason')} at {after.where()} charged attempt {before.attempt} while the "
                f"claim of {owner} token {token} (last renewed {last.where()}) was live, "
                + _early(end, after.write.stage),
            )


def done_has_result(run: _Run) -> Iterator[Violation]:
    """Every Done shard names its stored result and the result's SHA-256 fingerprint."""
    for key, _, done in done_writes(run.history):
        result = done.result or {}
        if not result.get("ref") or not FINGERPRINT.match(str(result.get("fingerprint") or "")):
            yield Violation("done-has-result", _shard(key), f"Done at {done.where()} with result {result}")


def shardops_writers(run: _Run) -> Iterator[Violation]:
    """Every change of a shard's status is written by the operator or a worker."""
    for key, _, version in _shard_pairs(run.history):
        if version.write.resource != "shards/status":
            continue
        run.tally["shard status writes"] += 1
        if run.identities.role(version.write) is None:
            yield Violation(
                "shardops-writers",
                _shard(key),
                f"{version.where()} by user {version.write.username} ({version.write.user_agent})",
            )


def _folded_before(run: _Run, key: ObjectKey, last: ShardVersion, delete: ShardVersion) -> bool:
    index, rv = last.index, delete.resource_version
    if index is None or not last.is_work:
        return False
    for campaign in run.history.campaigns.get((key[0], last.campaign or ""), []):
        if campaign.uid != last.campaign_uid:
            continue
        crv = campaign.resource_version
        earlier = (
            crv < rv if crv is not None and rv is not None else campaign.write.stage <= delete.write.stage
        )
        if earlier and campaign.folded(index):
            return True
    return False


def _stale_recreation(run: _Run, key: ObjectKey, incarnation: Sequence[ShardVersion]) -> bool:
    """A life of a shard made again after its campaign had folded it — a create an operator replica
    had in flight when it lost leadership, landing late — that no worker ever wrote and an operator
    deleted: workers never work on a folded index, and the leader removes such leftovers."""
    stored = _stored(incarnation)
    if not stored or not incarnation[-1].deleted:
        return False
    first = stored[0]
    if any(run.identities.role(v.write) == "worker" for v in incarnation):
        return False
    if run.identities.role(incarnation[-1].write) != "operator":
        return False
    return _folded_before(run, key, first, first)


def no_shard_lost(run: _Run) -> Iterator[Violation]:
    """Every materialized shard ends Done, Failed, Blocked or Paused; or was folded: deleted by the
    operator, Done, after its index entered its campaign's status.folded.doneRanges; or went with
    its deleted Campaign."""
    for key, versions in run.history.shards.items():
        for incarnation in _incarnations(versions):
            run.tally["shard lives"] += 1
            stored = _stored(incarnation)
            last = stored[-1] if stored else None
            end = incarnation[-1]
            if not end.deleted:
                if end.phase not in FINAL_PHASES:
                    yield Violation("no-shard-lost", _shard(key), f"ends {end.phase} at {end.where()}")
                continue
            campaign_gone = run.history.campaign_deletes.get((key[0], end.campaign or ""))
            if campaign_gone is not None and campaign_gone.stage <= end.write.stage:
                continue
            if _stale_recreation(run, key, incarnation):
                run.tally["stale re-creations removed"] += 1
                continue
            folded = (
                last is not None
                and last.phase == ShardPhase.DONE
                and run.identities.role(end.write) == "operator"
                and _folded_before(run, key, last, end)
            )
            if folded:
                run.tally["folded shards"] += 1
                continue
            yield Violation(
                "no-shard-lost",
                _shard(key),
                f"deleted at {end.where()}, last stored {last.where() if last else 'never'} "
                f"({last.phase if last else None}), and its index was not in its campaign's doneRanges",
            )


def _leadership_terms(run: _Run) -> dict[str, list[tuple[dt.datetime, dt.datetime | None]]]:
    """Per operator replica (holder identity): when it led, by the server's clock — from the write
    that made it the holder of the leader Lease until its claim ran out (`claim_ends`) or the write
    that gave the Lease to someone else or cleared it. None: still leading at the end of the log."""
    terms: dict[str, list[tuple[dt.datetime, dt.datetime | None]]] = {}
    for key, versions in run.history.leases.items():
        if key[1] != run.identities.leader_lease:
            continue
        for incarnation in _incarnations(versions):
            stored = _stored(incarnation)
            ends = claim_ends(stored)
            term: tuple[str, dt.datetime, dt.datetime | None] | None = None
            for version, end in zip(stored, ends, strict=True):
                if term is not None and version.holder != term[0]:
                    holder, began, ran_out = term
                    finished = version.write.stage if ran_out is None else min(ran_out, version.write.stage)
                    terms.setdefault(holder, []).append((began, finished))
                    term = None
                if version.holder is None:
                    continue
                began = version.write.stage if term is None else term[1]
                term = (version.holder, began, end)
            if term is not None:
                terms.setdefault(term[0], []).append((term[1], term[2]))
    return terms


def _harmless_late_create(run: _Run, key: ObjectKey, version: Version) -> bool:
    """A Shard create stored after its writer stopped leading, that changed nothing: the cut of an
    index its campaign had not folded (the same Shard the leader cuts itself: a create of it is
    idempotent), or a stale re-creation of a folded one (`_stale_recreation`)."""
    if not isinstance(version, ShardVersion) or version.write.verb != "create" or version.deleted:
        return False
    if not _folded_before(run, key, version, version):
        return True
    incarnation = [v for v in run.history.shards.get(key, []) if v.uid == version.uid]
    return _stale_recreation(run, key, incarnation)


def operator_writes_while_leading(run: _Run) -> Iterator[Violation]:
    """Every write an operator replica made to Shards, their Leases and Campaign status was stored
    while that replica led: a replica that lost its leader Lease (paused past it, cut off) writes
    nothing more — except a harmless late Shard create (`_harmless_late_create`): a request that
    passed the leader check and was then held (a process paused between the check and the send)
    lands whenever the process runs again. Checked when the history holds the leader Lease."""
    terms = _leadership_terms(run)
    if not terms:
        return
    groups: list[tuple[ObjectKey, Sequence[Version]]] = [
        *run.history.shards.items(),
        *((k, v) for k, v in run.history.leases.items() if k[1] != run.identities.leader_lease),
        *run.history.campaigns.items(),
    ]
    for key, versions in groups:
        for version in versions:
            write = version.write
            if run.identities.role(write) != "operator":
                continue
            run.tally["operator writes"] += 1
            identity = write.agent_identity or ""
            led = terms.get(identity, [])
            if any(began <= write.stage and (end is None or write.stage <= end) for began, end in led):
                continue
            if _harmless_late_create(run, key, version):
                run.tally["late harmless operator creates"] += 1
                continue
            when = (
                ", ".join(f"{b.isoformat()} to {e.isoformat() if e else 'the end'}" for b, e in led)
                or "never"
            )
            yield Violation(
                "operator-writes-while-leading",
                f"{write.resource} {key_text((write.namespace, write.name))}",
                f"{write.describe()} was stored while {identity or 'an unnamed operator'} did not lead "
                f"(it led: {when})",
            )


DEFAULT_BACKLOG_RATIO = 5  # spec.backlogRatio when unset (shardops.api.campaign)
DEFAULT_MAX_CONCURRENCY = 6  # spec.maxConcurrency when unset
FINISHED_PHASES = frozenset({"Succeeded", "Completed"})


def _spec_number(campaign: CampaignVersion | None, field_name: str, default: int) -> int:
    value = ((campaign.obj.get("spec") or {}) if campaign else {}).get(field_name)
    return int(value) if value is not None else default


def _planned_from(version: ShardVersion) -> dict[str, int] | None:
    text = (version.metadata.get("annotations") or {}).get("shardops.dev/planned-from")
    if not text:
        return None
    return {k: int(v) for k, v in (part.split("=", 1) for part in text.split(","))}


def _server_ordered(run: _Run, campaign_uid: str) -> list[ShardVersion]:
    """Every version of the campaign's shards in server order: stored ones by resourceVersion, a
    delete (answered without one) after everything stored before its time."""
    stored: list[ShardVersion] = []
    deletes: list[ShardVersion] = []
    for versions in run.history.shards.values():
        for version in versions:
            if version.campaign_uid != campaign_uid:
                continue
            (deletes if version.resource_version is None else stored).append(version)
    stored.sort(key=lambda v: v.resource_version or 0)
    ordered = list(stored)
    for delete in sorted(deletes, key=lambda v: v.write.stage):
        at = len(ordered)
        while at > 0 and ordered[at - 1].write.stage > delete.write.stage:
            at -= 1
        ordered.insert(at, delete)
    return ordered


def backlog_bound(run: _Run) -> Iterator[Violation]:
    """Each cut keeps the bound of the snapshot it was planned from (its shardops.dev/planned-from
    annotation: pending + its place in the batch <= backlogRatio * max(running, 1)), and at every
    instant of the server's order Pending + Running <= (backlogRatio + 1) * maxConcurrency: the
    bound docs/architecture.md states ("The backlog bound, exactly")."""
    for key, versions in run.history.campaigns.items():
        for uid in {v.uid for v in versions}:
            campaign = run.history.campaign_in_force(key, uid, None)
            ratio = _spec_number(campaign, "backlogRatio", DEFAULT_BACKLOG_RATIO)
            cap = _spec_number(campaign, "maxConcurrency", DEFAULT_MAX_CONCURRENCY)
            phases: dict[tuple[ObjectKey, str], str | None] = {}
            worst = 0
            for version in _server_ordered(run, uid):
                life = ((version.write.namespace, version.write.name), version.uid)
                if version.deleted:
                    phases.pop(life, None)
                    continue
                if life not in phases and version.write.verb == "create":
                    planned = _planned_from(version)
                    if planned is not None:
                        run.tally["cuts audited"] += 1
                        limit = ratio * max(planned["running"], 1)
                        if planned["pending"] + planned["position"] > limit:
                            yield Violation(
                                "backlog-bound",
                                _shard(life[0]),
                                f"cut at {version.where()} from a snapshot of {planned['pending']} "
                                f"pending and {planned['running']} running as number "
                                f"{planned['position']} of its batch: past backlogRatio {ratio} * "
                                f"max(running, 1) = {limit}",
                            )
                phases[life] = version.phase
                live = sum(1 for p in phases.values() if p in ("Pending", "Running"))
                worst = max(worst, live)
                if live > (ratio + 1) * cap:
                    yield Violation(
                        "backlog-bound",
                        f"campaign {key_text(key)}",
                        f"{live} shards Pending or Running after {version.where()}: past "
                        f"(backlogRatio {ratio} + 1) * maxConcurrency {cap} = {(ratio + 1) * cap}",
                    )
            run.tally["most Pending + Running"] = max(run.tally["most Pending + Running"], worst)


def _final_lives(run: _Run, campaign_uid: str) -> list[ShardVersion]:
    """The last stored version of each life of the campaign's shards, stale re-creations left out."""
    found: list[ShardVersion] = []
    for key, versions in run.history.shards.items():
        for incarnation in _incarnations(versions):
            stored = _stored(incarnation)
            if not stored or stored[-1].campaign_uid != campaign_uid:
                continue
            if _stale_recreation(run, key, incarnation):
                continue
            found.append(stored[-1])
    return found


def counts_and_spend_match(run: _Run) -> Iterator[Violation]:
    """A finished campaign's last status, stored after its shards' last writes, says what its shards
    say: counts.done, failed and blocked
    equal the shards that ended in each phase (folded ones as Done), and `spent` equals the sum of
    the shards' costs."""
    for key, versions in run.history.campaigns.items():
        for uid in {v.uid for v in versions}:
            last = [v for v in versions if v.uid == uid][-1]
            status = last.obj.get("status") or {}
            if status.get("phase") not in FINISHED_PHASES:
                continue
            lives = _final_lives(run, uid)
            if any((v.resource_version or 0) > (last.resource_version or 0) for v in lives):
                continue  # shards changed after its last word: nothing final to compare
            run.tally["finished campaigns checked"] += 1
            ended = Counter(str(v.phase) for v in lives)
            counts = status.get("counts") or {}
            for phase, field_name in (("Done", "done"), ("Failed", "failed"), ("Blocked", "blocked")):
                if int(counts.get(field_name) or 0) != ended[phase]:
                    yield Violation(
                        "counts-and-spend-match",
                        f"campaign {key_text(key)}",
                        f"status.counts.{field_name} is {counts.get(field_name)} at {last.where()}, but "
                        f"{ended[phase]} shard(s) ended {phase}",
                    )
            # Money is exact decimals: the status's spent is the shards' costs to the last digit.
            costs = sum((parse_money(v.status.get("cost") or 0) for v in lives), Decimal(0))
            spent = parse_money(status.get("spent") or 0)
            if spent != costs:
                yield Violation(
                    "counts-and-spend-match",
                    f"campaign {key_text(key)}",
                    f"status.spent is {spent:g} at {last.where()}, the shards' costs sum to {costs:g}",
                )


INVARIANTS: tuple[Invariant, ...] = (
    complete_record,
    one_holder_at_a_time,
    no_live_claim_taken,
    fencing,
    one_done,
    lease_transitions_monotonic,
    attempts_monotonic,
    attempts_bounded,
    attempt_charged_rightly,
    done_has_result,
    shardops_writers,
    no_shard_lost,
    operator_writes_while_leading,
    backlog_bound,
    counts_and_spend_match,
)


def check(history: History, identities: Identities, tally: Counter[str] | None = None) -> list[Violation]:
    """Every violation of every invariant in `history` (a finished run); `tally` counts what was checked."""
    run = _Run(history, identities, tally if tally is not None else Counter())
    run.tally.update(history.counts())
    return [violation for invariant in INVARIANTS for violation in invariant(run)]


def main(argv: Sequence[str] | None = None) -> int:
    """Check a recorded run: `python -m testbed.faults.checker <audit.log> --namespace <ns>`. Exit 0: every
    invariant holds; 1: violations (printed); 2: nothing recorded to check."""
    parser = argparse.ArgumentParser(prog="python -m testbed.faults.checker", description=main.__doc__)
    parser.add_argument("audit_log", type=Path, help="the audit log of a cluster started with record_history")
    parser.add_argument("--namespace", action="append", help="only these namespaces (repeat); default all")
    parser.add_argument("--operator-account", action="append", default=None, help="default shardops-operator")
    parser.add_argument("--worker-account", action="append", default=None, help="default shardops-worker")
    args = parser.parse_args(argv)
    identities = Identities(
        frozenset(args.operator_account or ["shardops-operator"]),
        frozenset(args.worker_account or ["shardops-worker"]),
    )
    history = from_entries(read_entries(args.audit_log, args.namespace))
    if not (history.shards or history.leases):
        print(f"no Shard or Lease writes recorded in {args.audit_log} (namespaces {args.namespace or 'all'})")
        return 2
    tally: Counter[str] = Counter()
    violations = check(history, identities, tally)
    print("checked: " + ", ".join(f"{name} {count}" for name, count in sorted(tally.items())))
    for violation in violations:
        print(violation)
    print(f"{len(violations)} violation(s)")
    return 1 if violations else 0


if __name__ == "__main__":
    raise SystemExit(main())
