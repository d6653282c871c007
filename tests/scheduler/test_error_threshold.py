"""The campaign-level error threshold: a broken template or a revoked key holds the campaign after a
bounded number of attempts, with a condition that names the rule, the class and an example shard,
until a person resumes it."""

from __future__ import annotations

import datetime as dt
from typing import Any

from shardops.api.campaign import Campaign
from shardops.api.enums import ErrorClass
from shardops.api.names import RESUMED_ANNOTATION
from shardops.api.shard import Shard
from shardops.cli import campaign_actions
from shardops.cli.campaign_plan import plan_view, render_plan
from shardops.cli.campaign_status import render_status, status_view
from shardops.k8s.api import CAMPAIGNS, SHARDS
from shardops.logic.error_threshold import AttemptEnd, error_threshold_trip
from shardops.state import error_threshold, observe
from tests.schedulerkit import (
    NAMESPACE,
    T0,
    Clock,
    OperatorKube,
    campaign,
    condition,
    entry,
    put_campaign,
    put_shard,
    reconciler,
    shard,
    shard_of,
    status_of,
)

INVALID = ErrorClass.INVALID_INPUT


def at(seconds: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=seconds)


def ends(*classes: ErrorClass | None) -> list[AttemptEnd]:
    return [AttemptEnd(at(i), f"c-{i:05d}", cls) for i, cls in enumerate(classes)]


# --- the rule -------------------------------------------------------------------------------------------


def test_a_run_of_failures_trips_and_a_success_breaks_it() -> None:
    assert error_threshold_trip(ends(*[INVALID] * 4), 5, 0.5, 20) is None
    trip = error_threshold_trip(ends(None, *[INVALID] * 5), 5, 0.5, 20)
    assert trip is not None and trip.error_class is INVALID and trip.shard == "c-00005"
    assert "5 non-retryable failures in a row (errorThreshold.consecutive 5)" in trip.rule
    assert error_threshold_trip(ends(*[INVALID] * 4, None, INVALID), 5, 0.5, 20) is None


def test_more_than_the_ratio_of_a_full_window_trips() -> None:
    mixed = [INVALID if i % 3 else None for i in range(20)]  # 13 of 20 failed, never 5 in a row
    trip = error_threshold_trip(ends(*mixed), 5, 0.5, 20)
    assert trip is not None and "13 of the last 20 attempts failed non-retryably" in trip.rule
    # Half is not more than half; a window not yet full does not count.
    assert error_threshold_trip(ends(*[INVALID if i % 2 else None for i in range(20)]), 5, 0.5, 20) is None
    assert error_threshold_trip(ends(*mixed[:19]), 5, 0.5, 20) is None


def test_the_example_is_the_latest_shard_of_the_most_common_class() -> None:
    unauthorized = ErrorClass.UNAUTHORIZED
    trip = error_threshold_trip(ends(INVALID, unauthorized, INVALID, unauthorized, INVALID), 5, 0.5, 20)
    assert trip is not None and trip.error_class is INVALID and trip.shard == "c-00004"


def test_each_rule_can_be_turned_off() -> None:
    assert error_threshold_trip(ends(*[INVALID] * 30), 0, 1.0, 20) is None


# --- on live objects ------------------------------------------------------------------------------------


def ended(index: int, seconds: float, phase: str, reason: str, **status: Any) -> dict:
    """A shard claimed a second before `seconds` whose attempt then ended `phase` by `reason`."""
    extra = {"errorClass": status["lastError"]["class"]} if "lastError" in status else {}
    history = [
        entry("Pending", T0, "Materialized"),
        entry("Running", at(seconds - 1), "Claimed"),
        entry(phase, at(seconds), reason, **extra),
    ]
    return shard("camp", index, phase, history=history, **status)


def failed(index: int, seconds: float, cls: str = "invalid-input", message: str = "bad") -> dict:
    error = {"class": cls, "message": message, "at": at(seconds).isoformat()}
    return ended(index, seconds, "Failed", "Failed", lastError=error)


def done(index: int, seconds: float) -> dict:
    return ended(index, seconds, "Done", "Completed")


def test_endings_are_done_and_final_failures_after_the_resume() -> None:
    retried = shard(
        "camp",
        9,
        "Pending",
        history=[entry("Pending", at(5), "AttemptFailed", errorClass="timeout")],
    )
    shards = [Shard.parse(b) for b in (failed(0, 10), done(1, 20), failed(2, 30), retried)]
    assert [(e.shard, e.error_class) for e in error_threshold.attempt_ends(shards, None)] == [
        ("camp-00000", INVALID),
        ("camp-00001", None),
        ("camp-00002", INVALID),
    ]
    assert [e.shard for e in error_threshold.attempt_ends(shards, at(20))] == ["camp-00002"]


def test_a_done_shard_all_of_whose_items_errored_ends_as_a_failure() -> None:
    error = {
        "class": "invalid-input",
        "message": "1 of 1 item(s) failed on their own",
        "at": at(10).isoformat(),
    }
    every = ended(0, 10, "Done", "Completed", lastError=error, progress={"done": 1, "total": 1, "errored": 1})
    some = ended(1, 20, "Done", "Completed", lastError=error, progress={"done": 2, "total": 2, "errored": 1})
    shards = [Shard.parse(b) for b in (every, some)]
    assert [(e.shard, e.error_class) for e in error_threshold.attempt_ends(shards, None)] == [
        ("camp-00000", INVALID),
        ("camp-00001", None),
    ]


def test_the_operator_holds_the_campaign_names_the_field_and_a_resume_lifts_it(kube: OperatorKube) -> None:
    clock = Clock()
    message = "item 0: spec.worker.llm.messages[1].content: 'dict object' has no attribute 'question'"
    put_campaign(kube, campaign(items=[{"id": i} for i in range(8)]))
    for index in range(5):
        put_shard(kube, failed(index, 10 + index, message=message))
    for index in (5, 6):
        put_shard(kube, shard("camp", index, "Pending"))
    reconciler(kube, clock.advance(30)).reconcile(NAMESPACE, "camp")
    held = condition(status_of(kube), "ErrorThreshold")
    assert held["status"] == "True" and held["reason"] == "TooManyErrors"
    for phrase in ("5 non-retryable failures in a row", "invalid-input", "shard camp-00004", "'question'"):
        assert phrase in held["message"], held["message"]
    assert "TooManyErrors" in kube.event_reasons("camp")
    # The pass that finds the trip acts on it at once: the unclaimed shards are Paused and nothing new
    # is cut (item 7 has no shard), not left to workers until the condition is read back.
    assert {shard_of(kube, f"camp-0000{i}")["status"]["phase"] for i in (5, 6)} == {"Paused"}
    assert kube.obj(SHARDS, NAMESPACE, "camp-00007") is None

    # The next pass keeps the hold: nothing new, no workers.
    reconciler(kube, clock.advance(1)).reconcile(NAMESPACE, "camp")
    assert {shard_of(kube, f"camp-0000{i}")["status"]["phase"] for i in (5, 6)} == {"Paused"}
    assert kube.obj(SHARDS, NAMESPACE, "camp-00007") is None
    body = kube.obj(CAMPAIGNS, NAMESPACE, "camp")
    assert body is not None
    held_campaign = Campaign.parse(body)
    assert observe.claim_inputs(held_campaign, [], clock()).suspended
    assert status_of(kube)["phase"] == "Suspended"
    # `kubectl campaign plan` and `status` say what holds it: the rule, the class, an example shard.
    live = [Shard.parse(s) for s in kube.list(SHARDS, NAMESPACE)]
    plan_text = render_plan(plan_view(held_campaign, live, [], [], {}, clock(), 8))
    status_text = render_status(status_view(held_campaign, live, clock()))
    for text in (plan_text, status_text):
        for phrase in (
            "held by its error threshold",
            "5 non-retryable failures in a row (errorThreshold.consecutive 5)",
            "invalid-input",
            "shard camp-00004",
        ):
            assert phrase in text, text
    assert "spec.suspend is true" not in plan_text + status_text
    assert "Limited by: Suspended: held by its error threshold" in plan_text

    # A person resumes: the hold lifts, and the old failures do not hold it again.
    patch = campaign_actions.resume_patch(held_campaign, clock.advance(1)())
    assert RESUMED_ANNOTATION in patch["metadata"]["annotations"]
    kube.patch(CAMPAIGNS, NAMESPACE, "camp", patch)
    reconciler(kube, clock.advance(1)).reconcile(NAMESPACE, "camp")
    reconciler(kube, clock.advance(1)).reconcile(NAMESPACE, "camp")
    assert condition(status_of(kube), "ErrorThreshold")["status"] == "False"
    assert {shard_of(kube, f"camp-0000{i}")["status"]["phase"] for i in (5, 6)} == {"Pending"}


def test_a_resume_patch_without_a_hold_writes_no_resume_time() -> None:
    plain = Campaign.parse(campaign(suspend=True))
    assert campaign_actions.resume_patch(plain, T0) == {"spec": {"suspend": False}}
