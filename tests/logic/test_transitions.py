from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardops.api.enums import ShardPhase
from shardops.logic.transitions import (
    TRANSITIONS,
    Action,
    EventReason,
    EventType,
    IllegalTransition,
    can_transition,
    event_reason,
    event_type,
    next_attempt,
    transition,
)

P = ShardPhase

LEGAL = [
    (P.QUEUED, Action.MATERIALIZE, P.PENDING),
    (P.PENDING, Action.CLAIM, P.RUNNING),
    (P.RUNNING, Action.COMPLETE, P.DONE),
    (P.RUNNING, Action.FAIL_RETRYABLE, P.PENDING),
    (P.RUNNING, Action.FAIL_FINAL, P.FAILED),
    (P.RUNNING, Action.BLOCK, P.BLOCKED),
    (P.RUNNING, Action.RECLAIM, P.PENDING),
    (P.RUNNING, Action.RELEASE, P.PENDING),
    (P.RUNNING, Action.REVOKE, P.PENDING),
    (P.PENDING, Action.PAUSE, P.PAUSED),
    (P.QUEUED, Action.PAUSE, P.PAUSED),
    (P.PAUSED, Action.RESUME, P.PENDING),
    (P.BLOCKED, Action.RETRY, P.PENDING),
    (P.FAILED, Action.RETRY, P.PENDING),
    (P.DONE, Action.RETRY_ERRORED, P.PENDING),
]


@pytest.mark.parametrize(("current", "action", "target"), LEGAL)
def test_design_state_machine(current: ShardPhase, action: Action, target: ShardPhase) -> None:
    assert transition(current, action) is target


def test_everything_else_is_illegal() -> None:
    legal = {(c, a) for c, a, _ in LEGAL}
    for current in ShardPhase:
        for action in Action:
            assert can_transition(current, action) == ((current, action) in legal)
            if (current, action) not in legal:
                with pytest.raises(IllegalTransition, match=str(action)):
                    transition(current, action)


def test_done_leaves_only_to_rerun_its_errored_items_and_terminal_phases_only_by_retry() -> None:
    for action, rule in TRANSITIONS.items():
        assert (P.DONE in rule.sources) == (action is Action.RETRY_ERRORED)
        if any(p.terminal for p in rule.sources):
            assert action in (Action.RETRY, Action.RETRY_ERRORED)


def test_every_action_has_an_event_reason_and_type() -> None:
    assert event_reason(Action.RECLAIM) is EventReason.LEASE_EXPIRED
    assert event_reason(Action.CLAIM) is EventReason.CLAIMED
    assert event_type(Action.FAIL_FINAL) is EventType.WARNING
    assert event_type(Action.COMPLETE) is EventType.NORMAL
    assert len({event_reason(a) for a in Action}) == len(Action)


@pytest.mark.parametrize(
    ("action", "after"),
    [
        (Action.FAIL_RETRYABLE, 3),
        (Action.RECLAIM, 3),
        (Action.REVOKE, 3),
        (Action.RELEASE, 2),
        (Action.CLAIM, 2),
        (Action.RETRY, 1),
        (Action.RETRY_ERRORED, 1),
    ],
)
def test_attempt_accounting(action: Action, after: int) -> None:
    assert next_attempt(2, action) == after


@settings(max_examples=300, deadline=None)
@given(start=st.sampled_from(ShardPhase), actions=st.lists(st.sampled_from(Action), max_size=40))
def test_random_sequences_leave_terminal_only_by_retry(start: ShardPhase, actions: list[Action]) -> None:
    phase = start
    for action in actions:
        try:
            nxt = transition(phase, action)
        except IllegalTransition:
            continue
        if phase.terminal:
            assert action is (Action.RETRY_ERRORED if phase is P.DONE else Action.RETRY)
        phase = nxt
