"""The status a pass wants (scheduler/status.py), computed without I/O from what it observed and
decided: the same inputs give the same status, and each decision shows where it should."""

from __future__ import annotations

import datetime as dt

from shardops.api.campaign import Campaign
from shardops.api.common import Condition
from shardops.api.enums import CampaignPhase, ConditionReason, ShardPhase
from shardops.api.folded import FoldedShards
from shardops.api.shard import Shard
from shardops.logic.conditions import SourceProblem
from shardops.logic.planner import plan_dispatch
from shardops.scheduler.history import fold_history
from shardops.scheduler.observed import Observed
from shardops.scheduler.status import Decided, desired_status, invalid_status, turned
from shardops.state import error_threshold, observe
from tests.schedulerkit import T0, campaign, entry, shard

NOW = T0 + dt.timedelta(minutes=5)


def _seen(*shards: Shard, items: int = 4, **spec: object) -> Observed:
    body = campaign(items=[{"id": i} for i in range(items)], **spec)
    parsed = Campaign.parse(body)
    return Observed(body, parsed, list(parsed.spec.items or []), {s.name: s for s in shards}, [], [])


def _decided(seen: Observed, **overrides: object) -> Decided:
    plan = plan_dispatch(
        observe.dispatch_inputs(
            seen.campaign, seen.shards.values(), seen.jobs, seen.pods, NOW, items_total=len(seen.items)
        )
    )
    values: dict[str, object] = {
        "plan": plan,
        "fold": fold_history(seen, seen.campaign.current_status),
        "stuck": [],
        "retry_generation": None,
        "to_fold": [],
        "folded": seen.campaign.current_status.folded,
        "identity": "op-test",
        "renewing": True,
        "error_threshold": error_threshold.error_threshold_condition(seen.campaign, seen.shards.values()),
    }
    values.update(overrides)
    return Decided(**values)  # type: ignore[arg-type]


def _done(index: int) -> Shard:
    result = {"ref": f"attempts/{index}.json", "fingerprint": "sha256:" + "0" * 64, "bytes": 10}
    history = [entry("Pending", T0, "Materialized"), entry("Done", T0, "Completed")]
    return Shard.parse(shard("camp", index, "Done", history=history, result=result))


def _pending(index: int) -> Shard:
    return Shard.parse(shard("camp", index, "Pending"))


def test_the_same_observation_and_decisions_give_the_same_status() -> None:
    seen = _seen(_done(0), _pending(1))
    first = desired_status(seen, _decided(seen), NOW)
    again = desired_status(seen, _decided(seen), NOW)
    assert first.status == again.status
    assert first.status.items_total == 4 and first.status.observed_generation == 1
    assert first.summary.counts[ShardPhase.PENDING] == 1 and first.summary.counts[ShardPhase.DONE] == 1


def test_the_stuck_shards_and_the_retry_generation_are_recorded() -> None:
    seen = _seen(_pending(0), _pending(1))
    wanted = desired_status(seen, _decided(seen, stuck=["camp-00001"], retry_generation=3), NOW).status
    stalled = wanted.condition("Stalled")
    assert stalled is not None and stalled.status == "True" and "camp-00001" in stalled.message
    assert wanted.last_retry_generation == 3
    unchanged = desired_status(seen, _decided(seen), NOW).status
    assert unchanged.last_retry_generation == seen.campaign.current_status.last_retry_generation


def test_shards_folded_by_the_same_write_count_through_the_fold_not_as_live() -> None:
    done = _done(0)
    seen = _seen(done, _pending(1))
    folded = FoldedShards(shards=1, items=1, done_ranges=[{"start": 0, "end": 1}], sequence=1)  # type: ignore[list-item]
    desired = desired_status(seen, _decided(seen, to_fold=[done], folded=folded), NOW)
    assert desired.status.folded == folded
    assert [v.name for v in desired.summary.views] == ["camp-00001"], "the folded shard is not live"
    assert "camp-00000" not in (desired.status.history_folded or {})


def test_an_unusable_campaign_gets_phase_invalid_and_ready_false_naming_the_fix() -> None:
    body = campaign()
    previous, new = invalid_status(body, ConditionReason.ITEMS_INVALID, "fix line 3", NOW)
    assert previous.phase is None or previous.phase is not CampaignPhase.INVALID
    assert new.phase is CampaignPhase.INVALID and new.observed_generation == 1
    ready = new.condition("Ready")
    assert ready is not None and (ready.status, ready.reason, ready.message) == (
        "False",
        "ItemsInvalid",
        "fix line 3",
    )


def _condition(type_: str, status: str, reason: str = "Because") -> Condition:
    return Condition.model_validate(
        {"type": type_, "status": status, "reason": reason, "message": "m", "lastTransitionTime": T0}
    )


def test_a_loud_condition_is_news_when_it_turns_true_and_only_then() -> None:
    before = [_condition("Complete", "False")]
    after = [_condition("Complete", "True", "Succeeded"), _condition("Backpressured", "True")]
    assert [c.type for c in turned(before, after)] == ["Complete"], "Backpressured is never news"
    assert turned(after, after) == [], "already True: no news"
    held = _condition("BudgetHeld", "True", str(ConditionReason.NO_ROOM_FOR_SHARD))
    assert turned([_condition("BudgetHeld", "True", "ReservedByRunning")], [held]) == [held]
    # Waiting for quota is what a queue is for; a queue that does not exist is a fix to make.
    queued = _condition("WaitingForQuota", "True", str(ConditionReason.QUEUED_BY_KUEUE))
    assert turned([_condition("WaitingForQuota", "False")], [queued]) == []
    missing = _condition("WaitingForQuota", "True", str(ConditionReason.LOCAL_QUEUE_NOT_FOUND))
    assert turned([_condition("WaitingForQuota", "False")], [missing]) == [missing]


def _source_condition(seen: Observed, **overrides: object) -> Condition | None:
    return desired_status(seen, _decided(seen, **overrides), NOW).status.condition("SourceUnresolved")


def test_a_source_ref_naming_no_source_is_a_condition_naming_the_field_and_the_fix() -> None:
    sources = [{"name": "plain"}, {"name": "llm", "sourceRef": {"name": "team"}}]
    seen = _seen(_pending(0), sources=sources)
    fix = "no Source team in namespace default: create a Source named team there"
    problem = SourceProblem(1, ConditionReason.SOURCE_NOT_FOUND, fix)
    missing = _source_condition(seen, source_problems={"llm": problem})
    assert missing is not None
    assert (missing.status, missing.reason) == ("True", "SourceNotFound")
    assert missing.message.startswith(f"spec.sources[1].sourceRef: {fix}")
    resolved = _source_condition(seen)
    assert resolved is not None and (resolved.status, resolved.reason) == ("False", "SourcesResolved")
    assert _source_condition(_seen(_pending(0))) is None, "no sourceRef: no such condition"


def test_a_source_that_cannot_serve_the_campaign_is_news_with_each_reason() -> None:
    resolved = _condition("SourceUnresolved", "False", str(ConditionReason.SOURCES_RESOLVED))
    missing = _condition("SourceUnresolved", "True", str(ConditionReason.SOURCE_NOT_FOUND))
    refused = _condition("SourceUnresolved", "True", str(ConditionReason.SOURCE_NOT_ALLOWED))
    assert turned([resolved], [missing]) == [missing]
    assert turned([missing], [refused]) == [refused]
    assert turned([missing], [missing]) == []
