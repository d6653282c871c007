from __future__ import annotations

import pytest

from shardops.api.enums import ErrorClass, ShardPhase
from shardops.logic.failures import (
    MAX_MESSAGE_CHARS,
    ClassifiedError,
    classify_failure,
    next_phase_after_failure,
    parse_error_class,
)
from shardops.logic.transitions import Action


def test_exit_zero_is_not_a_failure_even_with_an_error_file() -> None:
    assert classify_failure(0, {"class": "429"}, "openai") is None


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("429", ErrorClass.RATE_LIMITED),
        (429, ErrorClass.RATE_LIMITED),
        ("rate-limited", ErrorClass.RATE_LIMITED),
        ("Rate_Limited", ErrorClass.RATE_LIMITED),
        ("401", ErrorClass.UNAUTHORIZED),
        ("403", ErrorClass.UNAUTHORIZED),
        ("404", ErrorClass.NOT_FOUND),
        ("not-found", ErrorClass.NOT_FOUND),
        ("timeout", ErrorClass.TIMEOUT),
        ("unavailable", ErrorClass.UNAVAILABLE),
        ("503", ErrorClass.UNAVAILABLE),
        ("invalid-input", ErrorClass.INVALID_INPUT),
        ("over-budget", ErrorClass.OVER_BUDGET),
        ("result-too-large", ErrorClass.RESULT_TOO_LARGE),
        ("bad-output", ErrorClass.BAD_OUTPUT),
        ("command-not-found", ErrorClass.COMMAND_NOT_FOUND),
        ("unknown", ErrorClass.UNKNOWN),
        ("gremlins", None),
        (None, None),
        (True, None),
    ],
)
def test_error_class_names(name: object, expected: ErrorClass | None) -> None:
    assert parse_error_class(name) is expected


def test_structured_error_wins_over_exit_code() -> None:
    got = classify_failure(75, {"class": "401", "source": "anthropic", "message": "bad key"}, "openai")
    assert got == ClassifiedError(ErrorClass.UNAUTHORIZED, "anthropic", "bad key")


def test_error_file_without_source_uses_the_shard_source() -> None:
    got = classify_failure(1, {"class": "429"}, "openai")
    assert got is not None
    assert (got.error_class, got.source, got.message) == (ErrorClass.RATE_LIMITED, "openai", "exit code 1")


def test_unrecognised_class_falls_back_to_exit_code_and_says_so() -> None:
    got = classify_failure(75, {"class": "gremlins", "message": "odd"}, None)
    assert got is not None
    assert got.error_class is ErrorClass.UNAVAILABLE
    assert "gremlins" in got.message and "odd" in got.message


@pytest.mark.parametrize(
    ("exit_code", "expected", "text"),
    [
        (75, ErrorClass.UNAVAILABLE, "exit code 75"),
        (1, ErrorClass.UNKNOWN, "exit code 1"),
        (127, ErrorClass.COMMAND_NOT_FOUND, "exit code 127"),
        (126, ErrorClass.COMMAND_NOT_FOUND, "exit code 126"),
        (-9, ErrorClass.UNKNOWN, "SIGKILL"),
        (137, ErrorClass.UNKNOWN, "SIGKILL"),
        (139, ErrorClass.UNKNOWN, "SIGSEGV"),
        (128, ErrorClass.UNKNOWN, "exit code 128"),
    ],
)
def test_exit_codes_without_error_file(exit_code: int, expected: ErrorClass, text: str) -> None:
    got = classify_failure(exit_code, None, "src")
    assert got is not None
    assert got.error_class is expected
    assert text in got.message
    assert got.source == "src"


def test_crashes_are_retryable_but_bounded() -> None:
    got = classify_failure(-11, None, None)
    assert got is not None and got.error_class.retryable


def test_long_messages_are_bounded() -> None:
    got = classify_failure(1, {"class": "timeout", "message": "x" * 10_000}, None)
    assert got is not None
    assert len(got.message) == MAX_MESSAGE_CHARS


@pytest.mark.parametrize(
    "error_class",
    [
        ErrorClass.UNAUTHORIZED,
        ErrorClass.INVALID_INPUT,
        ErrorClass.NOT_FOUND,
        ErrorClass.OVER_BUDGET,
        ErrorClass.RESULT_TOO_LARGE,
        ErrorClass.BAD_OUTPUT,
        ErrorClass.COMMAND_NOT_FOUND,
    ],
)
def test_non_retryable_fail_at_once(error_class: ErrorClass) -> None:
    decision = next_phase_after_failure(error_class, 1, 3)
    assert (decision.action, decision.phase, decision.backoff) == (
        Action.FAIL_FINAL,
        ShardPhase.FAILED,
        False,
    )


@pytest.mark.parametrize(
    "error_class", [ErrorClass.RATE_LIMITED, ErrorClass.TIMEOUT, ErrorClass.UNAVAILABLE, ErrorClass.UNKNOWN]
)
def test_retryable_backs_off_until_the_last_attempt_then_blocks(error_class: ErrorClass) -> None:
    for attempt in (1, 2):
        decision = next_phase_after_failure(error_class, attempt, 3)
        assert (decision.action, decision.phase, decision.backoff) == (
            Action.FAIL_RETRYABLE,
            ShardPhase.PENDING,
            True,
        )
    last = next_phase_after_failure(error_class, 3, 3)
    assert (last.action, last.phase, last.backoff) == (Action.BLOCK, ShardPhase.BLOCKED, False)
    assert "attempt 3 of 3" in last.reason


def test_attempts_are_one_based() -> None:
    with pytest.raises(ValueError):
        next_phase_after_failure(ErrorClass.TIMEOUT, 0, 3)
