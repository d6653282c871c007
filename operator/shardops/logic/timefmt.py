"""The one place timestamps are turned into text and back, in the RFC 3339 form Kubernetes uses."""

from __future__ import annotations

from datetime import UTC, datetime


def rfc3339(moment: datetime) -> str:
    """Second precision in UTC, as metav1.Time serialises; naive times are refused, not guessed."""
    if moment.tzinfo is None:
        raise ValueError(f"naive datetime {moment!r}: pass a timezone-aware time")
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def micro_time(moment: datetime) -> str:
    """Microsecond precision in UTC, as metav1.MicroTime serialises (Lease renewTime, Event eventTime)."""
    if moment.tzinfo is None:
        raise ValueError(f"naive datetime {moment!r}: pass a timezone-aware time")
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_rfc3339(text: str) -> datetime:
    parsed = datetime.fromisoformat(text)
    if parsed.tzinfo is None:
        raise ValueError(f"timestamp {text!r} has no timezone")
    return parsed
