"""Why an attempt failed, and what the shard does next: back off, fail at once, or block."""

from __future__ import annotations

import math
import signal
from collections.abc import Mapping
from dataclasses import dataclass

from shardops.api.enums import ErrorClass, ShardPhase
from shardops.logic.transitions import Action

# sysexits.h EX_TEMPFAIL: the portable way for any program to say "try again later".
EXIT_TEMPFAIL = 75
# POSIX shells exit 127 when the command does not exist and 126 when it cannot be executed;
# retrying cannot fix either.
_EXIT_COMMAND_NOT_FOUND = frozenset({126, 127})
# A shell reports death by signal n as 128+n.
_SIGNAL_EXIT_BASE = 128
# Messages end up in Shard status and Events; a megabyte of stderr must not.
MAX_MESSAGE_CHARS = 1024
# The error file's `retryAfterSeconds` (a provider's Retry-After) is honoured up to this long; a
# longer wait is still a retry after an hour, never a shard parked for a day by one header.
MAX_RETRY_AFTER_SECONDS = 3600.0

_ALIASES: dict[str, ErrorClass] = {
    **{c.value: c for c in ErrorClass},
    "429": ErrorClass.RATE_LIMITED,
    "ratelimited": ErrorClass.RATE_LIMITED,
    "rate-limit": ErrorClass.RATE_LIMITED,
    "throttled": ErrorClass.RATE_LIMITED,
    "too-many-requests": ErrorClass.RATE_LIMITED,
    "408": ErrorClass.TIMEOUT,
    "504": ErrorClass.TIMEOUT,
    "timed-out": ErrorClass.TIMEOUT,
    "deadline-exceeded": ErrorClass.TIMEOUT,
    "500": ErrorClass.UNAVAILABLE,
    "502": ErrorClass.UNAVAILABLE,
    "503": ErrorClass.UNAVAILABLE,
    "service-unavailable": ErrorClass.UNAVAILABLE,
    "401": ErrorClass.UNAUTHORIZED,
    "403": ErrorClass.UNAUTHORIZED,
    "forbidden": ErrorClass.UNAUTHORIZED,
    "unauthenticated": ErrorClass.UNAUTHORIZED,
    "permission-denied": ErrorClass.UNAUTHORIZED,
    "400": ErrorClass.INVALID_INPUT,
    "422": ErrorClass.INVALID_INPUT,
    "invalid": ErrorClass.INVALID_INPUT,
    "bad-request": ErrorClass.INVALID_INPUT,
    "invalid-argument": ErrorClass.INVALID_INPUT,
    "404": ErrorClass.NOT_FOUND,
    "410": ErrorClass.NOT_FOUND,
    "notfound": ErrorClass.NOT_FOUND,
    "413": ErrorClass.RESULT_TOO_LARGE,
    "budget-exceeded": ErrorClass.OVER_BUDGET,
    "invalid-output": ErrorClass.BAD_OUTPUT,
}


@dataclass(frozen=True)
class ClassifiedError:
    error_class: ErrorClass
    source: str | None
    message: str
    # The upstream said when to come back (Retry-After): the shard's notBefore is at least this far off.
    retry_after_seconds: float | None = None


def parse_error_class(name: object) -> ErrorClass | None:
    """Maps what a user's command may write ("429", "Rate_Limited", 404, ...) to an ErrorClass."""
    if name is None or isinstance(name, bool):
        return None
    key = str(name).strip().lower().replace("_", "-").replace(" ", "-")
    return _ALIASES.get(key)


def classify_failure(
    exit_code: int, error_file: Mapping[str, object] | None, default_source: str | None
) -> ClassifiedError | None:
    """None when the attempt did not fail (exit 0 means done, whatever else was written).

    A structured error file `{class, source, message, retryAfterSeconds}` wins over the exit code;
    without a recognisable class the exit code decides, keeping the file's source and message.
    `retryAfterSeconds` counts only for a retryable class.
    """
    if exit_code == 0:
        return None
    details = error_file or {}
    source = _text(details.get("source")) or default_source
    named = parse_error_class(details.get("class"))
    message = _text(details.get("message")) or describe_exit(exit_code)
    if named is None and details.get("class") is not None:
        message = f"unrecognised error class {details.get('class')!r}: {message}"
    error_class = named if named is not None else class_from_exit_code(exit_code)
    retry_after = retry_after_seconds(details.get("retryAfterSeconds")) if error_class.retryable else None
    return ClassifiedError(error_class, source, _bounded(message), retry_after)


def retry_after_seconds(value: object) -> float | None:
    """The error file's retryAfterSeconds as a wait in [0, MAX_RETRY_AFTER_SECONDS]; None when absent
    or not a finite number >= 0 (then the backoff alone decides)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        return None
    return min(float(value), MAX_RETRY_AFTER_SECONDS)


def class_from_exit_code(exit_code: int) -> ErrorClass:
    if exit_code == EXIT_TEMPFAIL:
        return ErrorClass.UNAVAILABLE
    if exit_code in _EXIT_COMMAND_NOT_FOUND:
        return ErrorClass.COMMAND_NOT_FOUND
    # Crashes and signals (OOM kill, segfault) stay UNKNOWN: retryable, but bounded by maxAttempts.
    return ErrorClass.UNKNOWN


def describe_exit(exit_code: int) -> str:
    signum = _signal_number(exit_code)
    if signum is None:
        return f"exit code {exit_code}"
    try:
        name = signal.Signals(signum).name
    except ValueError:
        name = f"signal {signum}"
    return f"killed by {name} (exit code {exit_code})"


def _signal_number(exit_code: int) -> int | None:
    if exit_code < 0:
        return -exit_code
    if _SIGNAL_EXIT_BASE < exit_code < _SIGNAL_EXIT_BASE + 65:
        return exit_code - _SIGNAL_EXIT_BASE
    return None


@dataclass(frozen=True)
class FailureDecision:
    """What a failed attempt leads to. `backoff` says whether notBefore must be set (see backoff.py)."""

    action: Action
    phase: ShardPhase
    backoff: bool
    reason: str


def next_phase_after_failure(error_class: ErrorClass, attempt: int, max_attempts: int) -> FailureDecision:
    """`attempt` is the 1-based attempt that just failed."""
    if attempt < 1 or max_attempts < 1:
        raise ValueError(f"attempt and max_attempts are 1-based, got {attempt}/{max_attempts}")
    if not error_class.retryable:
        return FailureDecision(Action.FAIL_FINAL, ShardPhase.FAILED, False, f"{error_class} is not retryable")
    if attempt >= max_attempts:
        return FailureDecision(
            Action.BLOCK,
            ShardPhase.BLOCKED,
            False,
            f"{error_class} on attempt {attempt} of {max_attempts}: no attempts left",
        )
    return FailureDecision(
        Action.FAIL_RETRYABLE,
        ShardPhase.PENDING,
        True,
        f"{error_class} on attempt {attempt} of {max_attempts}: retry after backoff",
    )


def _text(value: object) -> str | None:
    if value is None:
        return None
    text = str(value).strip()
    return text or None


def _bounded(message: str) -> str:
    if len(message) <= MAX_MESSAGE_CHARS:
        return message
    return message[: MAX_MESSAGE_CHARS - 1] + "…"
