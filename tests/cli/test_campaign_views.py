"""`kubectl campaign` views: what status, events and report compute from the objects (no cluster)."""

from __future__ import annotations

import datetime as dt

import pytest

from shardops.api.campaign import Campaign
from shardops.api.enums import BreakerState, ShardPhase
from shardops.api.names import CANCELLED_ANNOTATION
from shardops.cli.campaign_events import timeline_view
from shardops.cli.campaign_list import campaign_rows, seconds_between
from shardops.cli.campaign_report import Check, ReportView, report_view
from shardops.cli.campaign_status import estimate, status_view
from shardops.cli.campaign_summary import parse_shards
from shardops.cli.text import duration, iso
from shardops.k8s.leases import parse_time
from tests.clikit import (
    NOW,
    ago,
    campaign_body,
    done_status,
    history,
    shard_body,
    t,
)


def _campaign(**kwargs: object) -> Campaign:
    return Campaign.parse(campaign_body(**kwargs))  # type: ignore[arg-type]


# --- status ---------------------------------------------------------------------------------------------


def test_status_counts_live_shards_and_the_ones_not_cut_yet() -> None:
    campaign = _campaign(items=6, maxAttempts=4, finalize={"image": "x", "command": ["merge"]})
    shards = parse_shards(
        [
            shard_body("papers", 0, "Done", status=done_status(100)),
            shard_body(
                "papers",
                1,
                "Running",
                attempt=2,
                status={
                    "owner": "w-7",
                    "leaseUntil": t(-40),
                    "lastHeartbeat": t(5),
                    "progress": {"done": 3, "total": 5},
                    "source": "large",
                },
            ),
            shard_body(
                "papers", 2, "Pending", status={"history": history(("Pending", "Materialized", 90, 1))}
            ),
            shard_body(
                "papers", 3, "Pending", status={"history": history(("Pending", "Materialized", 30, 1))}
            ),
        ]
    )
    view = status_view(campaign, shards, NOW)
    assert view.counts[ShardPhase.DONE] == 1
    assert view.counts[ShardPhase.PENDING] == 2
    # Items 4 and 5 are not cut into shards yet, and the finalize shard comes after them.
    assert view.not_cut == 3
    assert view.total == 7
    assert view.oldest_pending == "papers-00002"
    assert view.oldest_pending_seconds == 90
    [running] = view.running
    assert (running.name, running.owner, running.attempt, running.max_attempts) == (
        "papers-00001",
        "w-7",
        2,
        4,
    )
    assert (running.done, running.total, running.source) == (3, 5, "large")
    assert running.lease_until == ago(-40)
    data = view.as_dict()
    assert data["counts"]["notYetCut"] == 3
    assert data["progress"] == {"done": 1, "total": 7, "percent": 14.3}


def test_status_breaker_open_in_status_whose_cooldown_passed_is_half_open() -> None:
    status = {
        "breakers": [
            {
                "source": "large",
                "state": "Open",
                "consecutiveFailures": 3,
                "openedAt": t(400),
                "reason": "429s",
            }
        ]
    }
    campaign = _campaign(
        sources=[{"name": "large", "fallback": "small", "cooldownSeconds": 300}, {"name": "small"}],
        status=status,
    )
    view = status_view(campaign, [], NOW)
    by_source = {b.source: b for b in view.breakers}
    assert by_source["large"].state is BreakerState.HALF_OPEN
    assert by_source["large"].half_open_at == ago(100)
    assert by_source["large"].reason == "429s"
    assert by_source["large"].fallback == "small"
    assert by_source["small"].state is BreakerState.CLOSED


def test_status_breaker_counts_history_the_operator_has_not_folded_yet() -> None:
    """Three rate-limited failures after status.historyFoldedUntil open the breaker, as a new leader
    folding them would; the status still says Closed."""
    campaign = _campaign(sources=[{"name": "large"}], status={"historyFoldedUntil": t(1000)})
    failures = history(
        *(
            ("Pending", "AttemptFailed", 50 - i, i + 1, {"source": "large", "errorClass": "rate-limited"})
            for i in range(3)
        )
    )
    shards = parse_shards([shard_body("papers", 0, "Pending", attempt=3, status={"history": failures})])
    [row] = status_view(campaign, shards, NOW).breakers
    assert row.state is BreakerState.OPEN
    assert row.opened_at == ago(48)


def test_estimate_uses_the_rate_of_the_recent_window() -> None:
    # First claim 20 min ago, so the window is the last 15 min: 3 finished in it, 1 before it.
    shards = parse_shards(
        [
            shard_body("c", 0, "Done", status=done_status(1190)),
            shard_body("c", 1, "Done", status=done_status(600)),
            shard_body("c", 2, "Done", status=done_status(300)),
            shard_body("c", 3, "Done", status=done_status(60)),
        ]
    )
    e = estimate(shards, remaining=6, now=NOW, hold=None)
    assert e.finished_in_window == 3
    assert e.window_seconds == 900
    assert e.per_hour == pytest.approx(12.0)
    assert e.seconds_left == pytest.approx(1800)


def test_estimate_of_a_young_campaign_counts_since_the_first_claim() -> None:
    shards = parse_shards([shard_body("c", 0, "Done", status=done_status(60))])
    e = estimate(shards, remaining=2, now=NOW, hold=None)
    assert e.window_seconds == 70  # claimed 70 s ago
    assert e.seconds_left == pytest.approx(140)


@pytest.mark.parametrize(
    ("shards", "remaining", "hold", "note"),
    [
        ([], 3, None, "no estimate yet: no shard has been claimed"),
        ([], 0, None, "nothing left to run"),
        ([shard_body("c", 0, "Done", status=done_status(60))], 3, "suspended", "no estimate while suspended"),
    ],
)
def test_estimate_says_why_there_is_none(
    shards: list[dict], remaining: int, hold: str | None, note: str
) -> None:
    e = estimate(parse_shards(shards), remaining, NOW, hold)
    assert e.note == note
    assert e.seconds_left == (0.0 if remaining == 0 else None)


def test_estimate_without_recent_completions_gives_none() -> None:
    claimed = {"history": history(("Running", "Claimed", 2000, 1))}
    e = estimate(parse_shards([shard_body("c", 0, "Running", status=claimed)]), 5, NOW, None)
    assert e.seconds_left is None
    assert "no shard finished in the last 15m" in e.note


def test_status_of_a_suspended_campaign_gives_no_estimate() -> None:
    campaign = _campaign(suspend=True)
    shards = parse_shards([shard_body("papers", 0, "Done", status=done_status(60))])
    assert status_view(campaign, shards, NOW).estimate.note == "no estimate while suspended"


# --- list ---------------------------------------------------------------------------------------------


def test_campaign_rows_read_what_the_operator_wrote() -> None:
    body = campaign_body(
        "b",
        "team",
        budget={"limit": 10},
        suspend=True,
        annotations={CANCELLED_ANNOTATION: t(10)},
        status={
            "phase": "Suspended",
            "counts": {"done": 3, "blocked": 2, "running": 1},
            "shardsTotal": 9,
            "spent": 4.5,
        },
    )
    other = campaign_body("a", "team")
    rows = campaign_rows([body, other], NOW)
    assert [r.name for r in rows] == ["a", "b"]
    row = rows[1]
    assert (row.phase, row.done, row.total, row.blocked, row.running) == ("Suspended", 3, 9, 2, 1)
    assert (row.spent, row.budget, row.suspended, row.cancelled) == (4.5, 10.0, True, t(10))
    assert row.age_seconds == 3600
    assert rows[0].phase == "New"


# --- events --------------------------------------------------------------------------------------------


def _event(
    name: str, reason: str, seconds_ago: float, *, uid: str = "uid-papers-00003", **extra: object
) -> dict:
    return {
        "metadata": {"name": name},
        "eventTime": iso(ago(seconds_ago)),
        "reason": reason,
        "note": f"note of {name}",
        "type": "Warning" if reason == "AttemptFailed" else "Normal",
        "regarding": {"kind": "Shard", "name": "papers-00003", "uid": uid},
        **extra,
    }


def test_timeline_joins_history_and_events_by_event_name_in_time_order() -> None:
    status = {
        "owner": "w-2",
        "leaseUntil": t(-25),
        "lastHeartbeat": t(5),
        "progress": {"done": 1, "total": 2},
        "history": history(
            ("Pending", "Materialized", 100, 1, {"event": "e-mat"}),
            ("Running", "Claimed", 90, 1, {"event": "e-claim1", "owner": "w-1"}),
            ("Pending", "AttemptFailed", 80, 1, {"event": "e-fail", "owner": "w-1", "errorClass": "timeout"}),
            ("Running", "Claimed", 30, 2, {"event": "e-claim2", "owner": "w-2"}),
        ),
    }
    shard = parse_shards([shard_body("papers", 3, "Running", attempt=2, status=status)])[0]
    events = [
        _event("e-claim2", "Claimed", 30),
        _event("e-fail", "AttemptFailed", 80),
        _event("e-stall", "Stalled", 10),  # not a transition: only an event
        _event("e-old", "Claimed", 5000, uid="uid-of-an-earlier-shard"),  # same name, another object
    ]
    view = timeline_view(shard, events, NOW, lease_seconds=60, max_attempts=3)
    reasons = [(r.reason, r.origin) for r in view.rows]
    assert reasons == [
        ("Materialized", "history"),  # its Event has expired (not in the list)
        ("Claimed", "history"),
        ("AttemptFailed", "history+event"),
        ("Claimed", "history+event"),
        ("Stalled", "event"),
        ("Heartbeat", "status"),
    ]
    claim1, failed, claim2 = view.rows[1], view.rows[2], view.rows[3]
    assert claim1.lease_until == ago(30) and claim2.lease_until == ago(-30)
    assert (failed.type, failed.note, failed.error_class) == ("Warning", "note of e-fail", "timeout")
    heartbeat = view.rows[5]
    assert heartbeat.lease_until == ago(-25) and heartbeat.attempt == 2
    assert "progress 1/2" in (heartbeat.note or "")
    assert all(r.event != "e-old" for r in view.rows)
    assert view.as_dict()["timeline"][0]["time"] == t(100)


def test_timeline_rows_counted_in_the_campaigns_events_are_warnings_and_the_last_has_its_error() -> None:
    """The failures are counted in one Event per campaign and reason, about the Campaign (not listed
    with the shard's own Events): the type comes from the transition, the note from lastError."""
    status = {
        "history": history(
            ("Running", "Claimed", 90, 1, {"owner": "w-1"}),
            ("Pending", "AttemptFailed", 80, 1, {"event": "papers.attemptfailed", "errorClass": "timeout"}),
            ("Running", "Claimed", 30, 2, {"owner": "w-2"}),
            ("Blocked", "Blocked", 20, 2, {"event": "papers.blocked", "errorClass": "rate-limited"}),
        ),
        "lastError": {
            "class": "rate-limited",
            "message": "429 from source A",
            "event": "papers.blocked",
            "at": t(20),
        },
    }
    shard = parse_shards([shard_body("papers", 3, "Blocked", attempt=2, status=status)])[0]
    rows = timeline_view(shard, [], NOW).rows
    assert [(r.reason, r.type, r.note) for r in rows] == [
        ("Claimed", None, None),
        ("AttemptFailed", "Warning", None),  # its message was the attempt's; only the last is kept
        ("Claimed", None, None),
        ("Blocked", "Warning", "rate-limited: 429 from source A"),
    ]


def test_timeline_of_a_shard_without_history_or_events_is_empty() -> None:
    shard = parse_shards([shard_body("papers", 3, None)])[0]
    view = timeline_view(shard, [], NOW)
    assert view.rows == ()
    assert view.phase == "Queued"


# --- report --------------------------------------------------------------------------------------------


def _report(shards: list[dict], **campaign: object) -> ReportView:
    status = campaign.pop("status", {"phase": "Completed", "spent": 0.0})
    return report_view(_campaign(status=status, **campaign), shards, NOW)  # type: ignore[arg-type]


def _check(report: ReportView, key: str) -> Check:
    return next(c for c in report.checks if c.key == key)


def _failed(
    index: int, *, event: str | None = "e-1", message: str = "bad input", phase: str = "Failed"
) -> dict:
    error = {"class": "invalid-input", "message": message, "at": t(10)}
    if event:
        error["event"] = event
    return shard_body("papers", index, phase, status={"lastError": error})


def test_a_clean_campaign_passes_every_check() -> None:
    shards = [shard_body("papers", i, "Done", status=done_status(100, cost=0.25)) for i in range(4)]
    report = _report(shards, status={"phase": "Succeeded", "spent": 1.0})
    assert report.passed
    assert [c.key for c in report.checks] == [
        "result-fingerprints",
        "failure-records",
        "attempt-distribution",
        "spend-matches",
        "no-manual-changes",
    ]
    assert report.as_dict()["passed"] is True
    assert report.items_done == 4


def test_a_done_shard_without_fingerprint_fails_its_check() -> None:
    shards = [
        shard_body("papers", 0, "Done", status=done_status(100)),
        shard_body("papers", 1, "Done", status=done_status(100, fingerprint="")),
    ]
    check = _check(_report(shards), "result-fingerprints")
    assert not check.passed
    assert check.offenders == ("papers-00001",)


@pytest.mark.parametrize(
    ("shard", "problem"),
    [
        (_failed(0, event=None), "papers-00000 (Failed): no event name"),
        (_failed(0, message=""), "papers-00000 (Failed): no reason"),
        (
            shard_body("papers", 0, "Blocked", attempt=3),
            "papers-00000 (Blocked): no reason and no event name",
        ),
    ],
)
def test_a_failed_or_blocked_shard_without_reason_or_event_fails_its_check(shard: dict, problem: str) -> None:
    check = _check(_report([shard]), "failure-records")
    assert not check.passed
    assert check.offenders == (problem,)


def test_an_event_name_in_the_last_history_entry_is_enough() -> None:
    status = {
        "lastError": {"class": "timeout", "message": "slow"},
        "history": history(("Blocked", "Blocked", 5, 3, {"event": "papers-00000.ab"})),
    }
    report = _report([shard_body("papers", 0, "Blocked", attempt=3, status=status)])
    assert _check(report, "failure-records").passed
    assert report.gave_up[0].event == "papers-00000.ab"


@pytest.mark.parametrize(
    ("at_max", "total", "flagged"),
    [(1, 1, False), (2, 10, False), (3, 10, True), (2, 4, True)],
)
def test_many_shards_at_max_attempts_are_flagged(at_max: int, total: int, flagged: bool) -> None:
    shards = [
        shard_body("papers", i, "Done", attempt=3 if i < at_max else 1, status=done_status(50))
        for i in range(total)
    ]
    check = _check(_report(shards, items=total), "attempt-distribution")
    assert check.passed is not flagged
    assert f"{at_max} of {total} at maxAttempts" in check.detail
    assert len(check.offenders) == (at_max if flagged else 0)


def test_spend_that_does_not_match_the_shard_costs_fails() -> None:
    shards = [shard_body("papers", 0, "Done", status=done_status(100, cost=0.5))]
    assert _check(_report(shards, status={"spent": 0.5}), "spend-matches").passed
    check = _check(_report(shards, status={"spent": 0.75}), "spend-matches")
    assert not check.passed
    assert "gone or were edited" in check.detail
    assert not _check(_report(shards, status=None), "spend-matches").passed


def test_a_status_written_by_another_manager_is_a_manual_change() -> None:
    shards = [
        shard_body(
            "papers", 0, "Done", status=done_status(100), managers=("shardops-operator", "shardops-worker")
        ),
        shard_body(
            "papers", 1, "Done", status=done_status(100), managers=("shardops-worker", "kubectl-patch")
        ),
    ]
    check = _check(_report(shards), "no-manual-changes")
    assert not check.passed
    assert check.offenders == (f"papers-00001: status written by kubectl-patch at {t(60)}",)


def test_what_is_left_names_the_action_for_each_kind_of_leftover() -> None:
    shards = [
        _failed(0),
        shard_body("papers", 1, "Paused"),
        shard_body("papers", 2, "Pending"),
    ]
    report = _report(shards, items=5, budget={"limit": 1.0}, status={"spent": 1.0})
    text = "\n".join(report.left)
    assert "3 shard(s) not finished: 0 running, 1 pending, 2 not yet started" in text
    assert "1 shard(s) paused (budget exhausted" in text
    assert "kubectl campaign retry papers" in text
    assert "budget left: 0 of 1" in text
    assert [g.name for g in report.gave_up] == ["papers-00000"]


def test_what_is_left_says_the_budget_holds_the_campaign_and_how_to_go_on() -> None:
    held = {
        "type": "BudgetHeld",
        "status": "True",
        "reason": "LimitReached",
        "message": "spent 1 of limit 1: raise spec.budget.limit or kubectl campaign cancel papers",
        "lastTransitionTime": t(0),
    }
    status = {"spent": 1.0, "conditions": [held]}
    report = _report([shard_body("papers", 0, "Pending")], items=1, budget={"limit": 1.0}, status=status)
    assert "held by budget: spent 1 of limit 1: raise spec.budget.limit" in "\n".join(report.left)
    # Held only while running shards keep their reservations: that lifts by itself, nothing to say.
    held |= {"reason": "ReservedByRunning"}
    report = _report([shard_body("papers", 0, "Pending")], items=1, budget={"limit": 1.0}, status=status)
    assert not any(line.startswith("held by budget") for line in report.left)


def test_parse_shards_names_a_shard_that_does_not_parse() -> None:
    bad = shard_body("papers", 0, "Done")
    bad["spec"]["unknownField"] = 1
    with pytest.raises(ValueError, match="papers-00000"):
        parse_shards([bad])


def test_parse_shards_orders_work_by_index_then_finalize() -> None:
    shards = parse_shards(
        [
            shard_body("c", 0, None, shard_class="finalize"),
            shard_body("c", 10, None),
            shard_body("c", 2, None),
        ]
    )
    assert [s.name for s in shards] == ["c-00002", "c-00010", "c-finalize"]


def test_time_helpers() -> None:
    assert parse_time("2026-03-01T12:00:00Z") == NOW
    with pytest.raises(ValueError):
        parse_time("garbage")  # the one parser refuses what the API server never writes
    assert parse_time(None) is None
    assert duration(59.6) == "1m00s"
    assert duration(3 * 3600 + 5 * 60) == "3h05m"
    assert duration(50 * 3600) == "2d02h"
    assert duration(None) == "-"
    assert seconds_between(NOW, NOW - dt.timedelta(seconds=5)) == 5


def test_the_heartbeat_row_carries_the_attempt_it_belonged_to() -> None:
    """A shard that failed after its last heartbeat already counts the next attempt in its status."""
    status = {
        "lastHeartbeat": t(20),
        "history": history(
            ("Running", "Claimed", 30, 2, {"event": "c2"}),
            ("Pending", "AttemptFailed", 10, 2, {"event": "f2"}),
        ),
    }
    shard = parse_shards([shard_body("papers", 3, "Pending", attempt=3, status=status)])[0]
    [heartbeat] = [r for r in timeline_view(shard, [], NOW).rows if r.reason == "Heartbeat"]
    assert heartbeat.attempt == 2
    assert heartbeat.lease_until is None  # not Running: no live claim


def test_the_report_counts_gave_up_shards_folded_into_the_ledger_and_says_where_they_are() -> None:
    """Folded Failed/Blocked shards are gone from the API: counted (status.folded) and pointed to."""
    folded = {"shards": 1, "failed": 2, "blocked": 1, "attempts": 5, "doneRanges": [{"start": 1, "end": 5}]}
    report = _report([_failed(0)], items=5, status={"phase": "Completed", "spent": 0.0, "folded": folded})
    text = "\n".join(report.left)
    assert "1 blocked and 3 failed shard(s) are not done" in text
    assert "3 of them folded into the ledger: kubectl campaign results papers --failed" in text
    assert (
        "4 shard(s) folded into the ledger, 5 attempt(s) in all"
        in _check(report, "attempt-distribution").detail
    )
