"""`kubectl campaign events SHARD`: one shard's life.

The shard's `status.history` merged by time with its Kubernetes Events (events.k8s.io, core/v1 when
that API is not readable), and its latest heartbeat. The view and its text are pure; `run_events` does
the reads.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from pydantic import ValidationError

from shardops.api.common import JSON
from shardops.api.enums import ShardPhase
from shardops.api.shard import Shard, ShardError
from shardops.cli.campaign_client import (
    EXIT_BAD_STATE,
    EXIT_NO_ACCESS,
    EXIT_NOT_FOUND,
    EXIT_OK,
    CliError,
    bad_state,
    no_access,
)
from shardops.cli.campaign_results import cli_store
from shardops.cli.command import Context, parse_campaign
from shardops.cli.text import NONE, iso, relative, table
from shardops.k8s.leases import parse_time
from shardops.logic import transitions
from shardops.logic.transitions import EventReason
from shardops.state import ledger
from shardops.store.records import StoreUnavailable
from shardops.store.s3 import S3Store

# --- view (what -o json|yaml prints) ------------------------------------------------------------------


@dataclass(frozen=True)
class TimelineRow:
    """One step of a shard's life. `origin`: history (status.history), event (a Kubernetes Event),
    history+event (both, joined by the event name), status (the latest heartbeat)."""

    at: dt.datetime
    reason: str
    phase: str | None
    attempt: int | None
    owner: str | None
    lease_until: dt.datetime | None
    event: str | None
    type: str | None
    note: str | None
    origin: str
    source: str | None = None
    error_class: str | None = None

    def as_dict(self) -> JSON:
        return {
            "time": iso(self.at),
            "reason": self.reason,
            "phase": self.phase,
            "attempt": self.attempt,
            "owner": self.owner,
            "leaseUntil": iso(self.lease_until),
            "event": self.event,
            "type": self.type,
            "note": self.note,
            "origin": self.origin,
            "source": self.source,
            "errorClass": self.error_class,
        }


@dataclass(frozen=True)
class TimelineView:
    namespace: str
    shard: str
    campaign: str
    phase: str
    attempt: int
    max_attempts: int | None
    owner: str | None
    lease_until: dt.datetime | None
    last_heartbeat: dt.datetime | None
    progress: tuple[int, int] | None
    last_error: ShardError | None
    rows: tuple[TimelineRow, ...]
    now: dt.datetime
    warnings: tuple[str, ...] = field(default_factory=tuple)

    def as_dict(self) -> JSON:
        error = self.last_error
        return {
            "namespace": self.namespace,
            "shard": self.shard,
            "campaign": self.campaign,
            "phase": self.phase,
            "attempt": self.attempt,
            "maxAttempts": self.max_attempts,
            "owner": self.owner,
            "leaseUntil": iso(self.lease_until),
            "lastHeartbeat": iso(self.last_heartbeat),
            "progress": None
            if self.progress is None
            else {"done": self.progress[0], "total": self.progress[1]},
            "lastError": None if error is None else error.to_dict(),
            "timeline": [r.as_dict() for r in self.rows],
            "warnings": list(self.warnings),
            "now": iso(self.now),
        }


def event_time(event: JSON) -> dt.datetime | None:
    series = event.get("series") or {}
    return (
        parse_time(series.get("lastObservedTime"))
        or parse_time(event.get("eventTime"))
        or parse_time(event.get("deprecatedLastTimestamp"))
        or parse_time((event.get("metadata") or {}).get("creationTimestamp"))
    )


def timeline_view(
    shard: Shard,
    events: Iterable[JSON],
    now: dt.datetime,
    *,
    lease_seconds: int | None = None,
    max_attempts: int | None = None,
    warnings: Sequence[str] = (),
) -> TimelineView:
    """The shard's history merged with its Events by time. A history entry and the Event it names are
    one row. Events of an earlier object of the same name (another uid) are left out.
    `lease_seconds` (from the campaign) gives each claim's first lease expiry."""
    status = shard.current_status
    uid = shard.metadata.uid
    by_name: dict[str, JSON] = {}
    for event in events:
        regarding = event.get("regarding") or {}
        if regarding.get("kind") not in (None, "Shard"):
            continue
        if uid and regarding.get("uid") and regarding.get("uid") != uid:
            continue
        name = (event.get("metadata") or {}).get("name")
        if name:
            by_name[str(name)] = event
    rows: list[TimelineRow] = []
    used: set[str] = set()
    # An entry's Event counts it with the campaign's other shards (`k8s.events.EventSeries`): its
    # type is the transition's, and the shard's own message is its lastError, for the failure it
    # records (earlier attempts' messages are not kept).
    counted = transitions.counted_reasons()
    error = status.last_error
    # lastError is written with the newest failure's history entry: the last one naming its Event.
    naming = [
        n for n, e in enumerate(status.history) if error is not None and e.event and e.event == error.event
    ]
    error_entry = naming[-1] if naming else None
    for index, entry in enumerate(status.history):
        matched = by_name.get(entry.event or "")
        if matched is not None:
            used.add(str(entry.event))
        own_type, own_note = None, None
        if matched is None and entry.event and entry.reason in counted:
            own_type = str(counted[EventReason(entry.reason)])
            if error is not None and index == error_entry:
                own_note = f"{error.error_class}: {error.message}"
        claimed = entry.reason == str(EventReason.CLAIMED)
        lease_until = entry.at + dt.timedelta(seconds=lease_seconds) if claimed and lease_seconds else None
        rows.append(
            TimelineRow(
                at=entry.at,
                reason=entry.reason,
                phase=str(entry.phase),
                attempt=entry.attempt,
                owner=entry.owner,
                lease_until=lease_until,
                event=entry.event,
                type=str(matched.get("type")) if matched is not None and matched.get("type") else own_type,
                note=str(matched.get("note")) if matched is not None and matched.get("note") else own_note,
                origin="history+event" if matched is not None else "history",
                source=entry.source,
                error_class=str(entry.error_class) if entry.error_class is not None else None,
            )
        )
    for name, other in by_name.items():
        if name in used:
            continue
        at = event_time(other)
        if at is None:
            continue
        rows.append(
            TimelineRow(
                at=at,
                reason=str(other.get("reason") or ""),
                phase=None,
                attempt=None,
                owner=None,
                lease_until=None,
                event=name,
                type=str(other.get("type")) if other.get("type") else None,
                note=str(other.get("note")) if other.get("note") else None,
                origin="event",
            )
        )
    if status.last_heartbeat is not None:
        beat = status.last_heartbeat
        # The attempt the heartbeat belongs to: the last claim before it (status.attempt may already
        # count the next attempt of a shard that failed since).
        claims = [e for e in status.history if e.reason == str(EventReason.CLAIMED) and e.at <= beat]
        beat_attempt = claims[-1].attempt if claims else status.attempt
        progress = status.progress
        note = (
            f"progress {progress.done}/{progress.total}" if progress is not None else "no progress reported"
        )
        rows.append(
            TimelineRow(
                at=status.last_heartbeat,
                reason="Heartbeat",
                phase=None,
                attempt=beat_attempt,
                owner=status.owner,
                lease_until=status.lease_until if shard.phase is ShardPhase.RUNNING else None,
                event=None,
                type=None,
                note=f"latest heartbeat (earlier ones are not recorded): {note}",
                origin="status",
            )
        )
    order = {id(row): n for n, row in enumerate(rows)}
    rows.sort(key=lambda r: (r.at, order[id(r)]))
    progress_pair = (status.progress.done, status.progress.total) if status.progress is not None else None
    return TimelineView(
        namespace=shard.namespace,
        shard=shard.name,
        campaign=shard.campaign_name,
        phase=str(shard.phase or ShardPhase.QUEUED),
        attempt=status.attempt,
        max_attempts=max_attempts,
        owner=status.owner,
        lease_until=status.lease_until,
        last_heartbeat=status.last_heartbeat,
        progress=progress_pair,
        last_error=status.last_error,
        rows=tuple(rows),
        now=now,
        warnings=tuple(warnings),
    )


# --- text ---------------------------------------------------------------------------------------------


def render_timeline(view: TimelineView) -> str:
    attempts = f"attempt {view.attempt}" + (f" of {view.max_attempts}" if view.max_attempts else "")
    lines = [f"Shard {view.namespace}/{view.shard} (campaign {view.campaign}): {view.phase}, {attempts}"]
    if view.owner:
        lease = relative(view.lease_until, view.now)
        heartbeat = relative(view.last_heartbeat, view.now)
        progress = f"{view.progress[0]}/{view.progress[1]}" if view.progress else NONE
        lines.append(
            f"Claimed by {view.owner}: lease {lease}, last heartbeat {heartbeat}, progress {progress}"
        )
    error = view.last_error
    if error is not None:
        source = f" from source {error.source}" if error.source else ""
        event = f"event {error.event}" if error.event else "no event recorded"
        at = f", at {iso(error.at)}" if error.at else ""
        lines.append(
            f"Last error: {error.error_class}{source}: {error.message or '(no message)'} ({event}{at})"
        )
    lines.append("")
    if view.rows:
        rows = [
            [
                iso(r.at),
                r.reason + (" (Warning)" if r.type == "Warning" else ""),
                r.phase,
                r.attempt,
                r.owner,
                iso(r.lease_until),
                r.event,
                _note(r.note, r.error_class, r.source),
            ]
            for r in view.rows
        ]
        lines.append(
            table(["TIME", "REASON", "PHASE", "ATTEMPT", "OWNER", "LEASE UNTIL", "EVENT", "NOTE"], rows)
        )
    else:
        lines.append("No history and no events yet.")
    lines.extend(f"warning: {w}" for w in view.warnings)
    return "\n".join(lines)


def _note(note: str | None, error_class: str | None, source: str | None) -> str | None:
    if note:
        return note
    if error_class:
        return f"{error_class}" + (f" ({source})" if source else "")
    return None


# --- command ------------------------------------------------------------------------------------------


def folded_shard(ctx: Context, namespace: str, name: str) -> JSON | None:
    """A shard folded into its campaign's ledger (its Shard object deleted), rebuilt from its record;
    None when its campaign has folded no shard of that name."""
    campaign_name = name.rsplit("-", 1)[0]
    try:
        campaign = parse_campaign(ctx.client.get_campaign(namespace, campaign_name))
    except CliError:
        return None
    folded = campaign.current_status.folded
    if not folded.total:
        return None
    store = cli_store(ctx, campaign)
    if not isinstance(store, S3Store):
        return None
    try:
        records = ledger.first_records(store.read_ledger(campaign.name, campaign.metadata.uid or ""), folded)
    except StoreUnavailable as error:
        raise no_access(f"shard {name} is folded into the ledger, which cannot be read: {error}") from None
    record = next((r for r in records.values() if r.get("shard") == name), None)
    return ledger.shard_body(record, namespace, campaign.name) if record is not None else None


def run_events(ctx: Context) -> int:
    namespace = ctx.namespace
    try:
        body = ctx.client.get_shard(namespace, ctx.args.shard)
    except CliError as error:
        rebuilt = folded_shard(ctx, namespace, ctx.args.shard) if error.exit_code == EXIT_NOT_FOUND else None
        if rebuilt is None:
            raise
        body = rebuilt
    try:
        shard = Shard.parse(body)
    except ValidationError as error:
        raise bad_state(f"shard {ctx.args.shard} does not parse: {error.errors()[0].get('msg')}") from None
    found, warning = ctx.client.shard_events(namespace, shard.name)
    warnings = [warning] if warning else []
    lease_seconds = max_attempts = None
    try:
        campaign = parse_campaign(ctx.client.get_campaign(namespace, shard.campaign_name))
        lease_seconds, max_attempts = campaign.spec.lease_seconds, campaign.spec.max_attempts
    except CliError as error:
        if error.exit_code not in (EXIT_NOT_FOUND, EXIT_NO_ACCESS, EXIT_BAD_STATE):
            raise
        warnings.append(f"campaign {shard.campaign_name} not readable ({error.message}): no lease times")
    view = timeline_view(
        shard, found, ctx.clock(), lease_seconds=lease_seconds, max_attempts=max_attempts, warnings=warnings
    )
    ctx.show(view, render_timeline)
    return EXIT_OK
