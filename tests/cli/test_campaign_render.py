"""`kubectl campaign` renderers: views to text, without a cluster."""

from __future__ import annotations

import datetime as dt

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from shardops.api.campaign import Campaign
from shardops.cli.campaign_actions import ActionResult, render_action
from shardops.cli.campaign_events import render_timeline, timeline_view
from shardops.cli.campaign_list import campaign_rows, render_list
from shardops.cli.campaign_plan import plan_view, render_plan
from shardops.cli.campaign_report import render_report, report_view
from shardops.cli.campaign_status import (
    DONE_MARK,
    GAVE_UP_MARK,
    LEFT_MARK,
    RUNNING_MARK,
    StatusView,
    bar,
    render_status,
    status_view,
)
from shardops.cli.campaign_summary import parse_shards
from shardops.cli.text import as_json, as_yaml, relative, table
from tests.clikit import NOW, campaign_body, done_status, shard_body, t


def test_relative_times() -> None:
    assert relative(NOW + dt.timedelta(seconds=40), NOW) == "in 40s"
    assert relative(NOW - dt.timedelta(seconds=125), NOW) == "2m05s ago"
    assert relative(None, NOW) == "-"


@given(
    done=st.integers(0, 500),
    gave_up=st.integers(0, 500),
    running=st.integers(0, 500),
    rest=st.integers(0, 500),
)
def test_bar_is_always_full_width_and_shows_every_non_empty_part(
    done: int, gave_up: int, running: int, rest: int
) -> None:
    total = done + gave_up + running + rest
    text = bar(done, gave_up, running, total, width=30)
    inner = text[1:-1]
    assert len(inner) == 30
    for mark, count in (
        (DONE_MARK, done),
        (GAVE_UP_MARK, gave_up),
        (RUNNING_MARK, running),
        (LEFT_MARK, rest if total else 1),
    ):
        assert (mark in inner) == (count > 0)


def test_bar_parts_are_proportional() -> None:
    assert bar(5, 0, 0, 10, width=10) == "[█████░░░░░]"
    assert bar(1, 1, 1, 3, width=9) == "[███✗✗✗▒▒▒]"


def test_table_pads_every_column_but_the_last() -> None:
    text = table(["A", "LONGER", "NOTE"], [["xx", None, "free text"], ["y", 12, ""]])
    assert text.splitlines() == ["A    LONGER   NOTE", "xx   -        free text", "y    12       -"]


def _status_view() -> StatusView:
    campaign = Campaign.parse(
        campaign_body(
            items=3,
            budget={"limit": 2.0},
            status={
                "phase": "Running",
                "observedGeneration": 1,
                "conditions": [
                    {
                        "type": "Ready",
                        "status": "True",
                        "reason": "SpecValid",
                        "message": "3 item(s)",
                        "lastTransitionTime": t(120),
                    }
                ],
            },
        )
    )
    shards = parse_shards(
        [
            shard_body("papers", 0, "Done", status=done_status(300, cost=0.5)),
            shard_body(
                "papers",
                1,
                "Running",
                status={
                    "owner": "w-9",
                    "leaseUntil": t(-20),
                    "lastHeartbeat": t(3),
                    "progress": {"done": 2, "total": 4},
                },
            ),
            shard_body("papers", 2, "Blocked", attempt=3),
        ]
    )
    return status_view(campaign, shards, NOW)


def test_render_status_shows_counts_running_budget_and_conditions() -> None:
    text = render_status(_status_view())
    lines = text.splitlines()
    assert lines[0] == "Campaign ns/papers: Running"
    assert "1/3 shards done (33%), 3 items" in lines[1]
    assert "queued 0 · pending 0 · running 1 · paused 0 · done 1 · failed 0 · blocked 1" in text
    assert "spent 0.5 of 2 (25%), warn at 80%: gate Open" in text
    running_row = next(line for line in lines if line.strip().startswith("papers-00001"))
    assert running_row.split() == ["papers-00001", "w-9", "1/3", "2/4", "in", "20s", "3s", "ago", "-"]
    assert "Ready" in text and "SpecValid" in text and "2m00s" in text


def test_render_status_says_when_the_operator_lags_the_spec() -> None:
    view = _status_view()
    lagging = StatusView(**{**view.__dict__, "generation": 2})
    assert "operator has not seen the latest spec yet: generation 2, observed 1" in render_status(lagging)


def test_render_report_marks_each_check_and_lists_offenders() -> None:
    campaign = Campaign.parse(campaign_body(items=2, status={"phase": "Completed", "spent": 0.0}))
    shards = [
        shard_body("papers", 0, "Done", status=done_status(60, fingerprint="")),
        shard_body("papers", 1, "Done", status=done_status(60), managers=("kubectl-edit",)),
    ]
    text = render_report(report_view(campaign, shards, NOW))
    assert "[FAIL] every Done shard has a result fingerprint: 1 of 2 without one" in text
    assert "- papers-00000" in text
    assert "[FAIL] no sign of a manual state change" in text
    assert "- papers-00001: status written by kubectl-edit" in text
    assert "[PASS] budget spent matches the sum of shard costs" in text
    assert text.rstrip().endswith("Result: 2 of 5 checks failed")


def test_render_list_with_and_without_namespaces() -> None:
    rows = campaign_rows(
        [
            campaign_body(
                "a",
                "team",
                budget={"limit": 4},
                status={"phase": "Running", "spent": 1, "shardsTotal": 4, "counts": {"done": 1}},
            )
        ],
        NOW,
    )
    header, row = render_list(rows, all_namespaces=True).splitlines()
    assert header.split() == [
        "NAMESPACE",
        "NAME",
        "PHASE",
        "PROGRESS",
        "RUNNING",
        "PENDING",
        "BLOCKED",
        "FAILED",
        "SPENT/BUDGET",
        "AGE",
    ]
    assert row.split() == [
        "team",
        "a",
        "Running",
        "1/4",
        "(25%)",
        "0",
        "0",
        "0",
        "0",
        "1/4",
        "(25%)",
        "1h00m",
    ]
    assert render_list(rows, all_namespaces=False).splitlines()[0].split()[0] == "NAME"


def test_render_plan_names_the_reason_and_the_waiting_shards() -> None:
    campaign = Campaign.parse(campaign_body(items=3, maxConcurrency=1))
    shards = parse_shards([shard_body("papers", i, "Pending") for i in range(3)])
    text = render_plan(plan_view(campaign, shards, [], [], {}, NOW, 3))
    assert "nothing was changed" in text.splitlines()[0]
    assert "Limited by: Capacity" in text
    assert "papers-00001   ready; waits for a free slot (maxConcurrency 1)" in text
    assert "hand out (claimable)" in text and "papers-00000" in text


def test_render_timeline_states_the_current_claim_and_last_error() -> None:
    status = {
        "owner": "w-1",
        "leaseUntil": t(-10),
        "lastHeartbeat": t(2),
        "progress": {"done": 1, "total": 3},
        "lastError": {
            "class": "rate-limited",
            "source": "large",
            "message": "429",
            "event": "e-9",
            "at": t(50),
        },
    }
    shard = parse_shards([shard_body("papers", 3, "Running", attempt=2, status=status)])[0]
    text = render_timeline(timeline_view(shard, [], NOW, max_attempts=3, warnings=["events not readable"]))
    assert text.splitlines()[0] == "Shard ns/papers-00003 (campaign papers): Running, attempt 2 of 3"
    assert "Claimed by w-1: lease in 10s, last heartbeat 2s ago, progress 1/3" in text
    assert f"Last error: rate-limited from source large: 429 (event e-9, at {t(50)})" in text
    assert text.splitlines()[-1] == "warning: events not readable"


def test_render_action() -> None:
    result = ActionResult(
        "suspend", "ns", "papers", True, "suspend requested", event="papers.1", user="alice", warnings=("w",)
    )
    assert render_action(result).splitlines() == [
        "campaign ns/papers: suspend requested",
        "recorded as Event papers.1 (by alice)",
        "warning: w",
    ]


@pytest.mark.parametrize("fmt", ["json", "yaml"])
def test_machine_output_round_trips(fmt: str) -> None:
    data = _status_view().as_dict()
    text = as_json(data) if fmt == "json" else as_yaml(data)
    assert yaml.safe_load(text) == data


# --- a campaign the budget holds --------------------------------------------------------------------


def _held_by_budget(**budget: float) -> tuple[Campaign, list]:
    """Spent 1.5 of 3 (done), one shard Pending: with maxPerShard 2 it does not fit (1.5 < 2)."""
    campaign = Campaign.parse(
        campaign_body(items=2, budget=budget, status={"phase": "Running", "observedGeneration": 1})
    )
    shards = parse_shards(
        [
            shard_body("papers", 0, "Done", status=done_status(300, cost=1.5)),
            shard_body("papers", 1, "Pending"),
        ]
    )
    return campaign, shards


def test_render_status_says_the_budget_holds_the_work_and_names_the_fix() -> None:
    campaign, shards = _held_by_budget(limit=3.0, maxPerShard=2.0)
    view = status_view(campaign, shards, NOW)
    text = render_status(view)
    lines = text.splitlines()
    assert (
        lines[0]
        == "Campaign ns/papers: Running (held by the budget: nothing more starts by itself, see Held)"
    )
    assert (
        "spent 1.5 of 3 (50%), warn at 80%: gate Open; 0 reserved by running shards (maxPerShard 2 each)"
        in text
    )
    held = next(line for line in lines if line.startswith("Held"))
    assert "1 work shard(s) left wait for room (the next needs 2, maxPerShard 2 less its cost so far" in held
    assert (
        "raise spec.budget.limit above 3.5 to go on, or accept what is done: kubectl campaign cancel papers"
        in held
    )
    assert "no estimate while the budget holds the work left" in text
    budget = view.as_dict()["budget"]
    assert (budget["maxPerShard"], budget["reserved"]) == ("2", "0")
    assert budget["hold"]["cause"] == "NoRoom" and budget["hold"]["raiseAbove"] == "3.5"
    assert not budget["hold"]["liftsItself"]

    raised, _ = _held_by_budget(limit=10.0, maxPerShard=2.0)
    text = render_status(status_view(raised, shards, NOW))
    assert "held by the budget" not in text and "\nHeld" not in text
    assert status_view(raised, shards, NOW).as_dict()["budget"]["hold"] is None


def test_render_status_of_a_campaign_at_the_warn_ratio_with_work_left() -> None:
    campaign, shards = _held_by_budget(limit=1.8)
    text = render_status(status_view(campaign, shards, NOW))
    assert "held by the budget" in text.splitlines()[0]
    assert "from the warn ratio no work shard starts; 1 work shard(s) left wait" in text
    assert "raise spec.budget.limit above 1.875 to go on" in text


def test_render_plan_says_the_budget_holds_the_work_and_names_the_fix() -> None:
    campaign, shards = _held_by_budget(limit=3.0, maxPerShard=2.0)
    view = plan_view(campaign, shards, [], [], {}, NOW, 2)
    text = render_plan(view)
    assert "Limited by: Budget: spent 1.5 of 3 (50%), warn at 80%" in text
    assert (
        "papers-00001   budget: needs 2 (maxPerShard 2 less its cost so far), 1.5 of limit 3 is unreserved"
        in text
    )
    assert "  held by the budget: " in text and "kubectl campaign cancel papers" in text
    data = view.as_dict()
    assert data["plan"]["claimable"] == [] and data["plan"]["budgetHold"]["cause"] == "NoRoom"
    assert data["observed"]["budget"]["hold"]["raiseAbove"] == "3.5"


def test_render_list_marks_a_campaign_the_budget_holds() -> None:
    held = {
        "type": "BudgetHeld",
        "status": "True",
        "reason": "NoRoomForShard",
        "message": "m",
        "lastTransitionTime": t(5),
    }
    waiting = {**held, "reason": "ReservedByRunning"}
    bodies = [
        campaign_body("held", status={"phase": "Running", "conditions": [held]}),
        campaign_body("busy", status={"phase": "Running", "conditions": [waiting]}),
    ]
    rows = {r.name: r for r in campaign_rows(bodies, NOW)}
    assert rows["held"].budget_held and not rows["busy"].budget_held
    text = render_list(list(rows.values()), all_namespaces=False)
    assert "Running (held by budget)" in text and text.count("held by budget") == 1
