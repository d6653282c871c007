"""Shard history entries are numbered per shard (`HistoryEntry.sequence`): one above the entry before,
whoever writes it, past HISTORY_LIMIT, and from what is there for histories written before the field."""

from __future__ import annotations

import datetime as dt

from hypothesis import given, settings
from hypothesis import strategies as st

from shardops.api.enums import ShardPhase
from shardops.api.shard import HISTORY_LIMIT, HistoryEntry, Shard, ShardStatus, history_sequences
from shardops.k8s.shards import TransitionRequest, planned_status
from shardops.logic.transitions import Action
from tests.schedulerkit import T0, entry, shard


def _entry(n: int, sequence: int | None = None) -> HistoryEntry:
    return HistoryEntry(
        phase=ShardPhase.PENDING, at=T0 + dt.timedelta(seconds=n), reason=f"R{n}", sequence=sequence
    )


def _legacy(count: int) -> ShardStatus:
    """A status written before sequences: `count` transitions, the oldest dropped past the limit."""
    return ShardStatus(history=[_entry(n) for n in range(count)][-HISTORY_LIMIT:])


def _append(status: ShardStatus, n: int) -> ShardStatus:
    return ShardStatus.model_validate(status.with_history(_entry(n)).model_dump())


def test_each_entry_is_numbered_one_above_the_one_before_past_the_limit() -> None:
    status = ShardStatus()
    assert status.last_sequence == 0
    for n in range(HISTORY_LIMIT + 10):
        status = _append(status, n)
    assert [e.sequence for e in status.history] == list(range(11, HISTORY_LIMIT + 11))
    assert status.sequences() == list(range(11, HISTORY_LIMIT + 11))
    assert status.last_sequence == HISTORY_LIMIT + 10
    # Not a list position: the numbers say how many transitions the shard had.
    assert len(status.history) == HISTORY_LIMIT


def test_the_appending_helper_numbers_the_entry_whatever_the_writer_put_in_it() -> None:
    status = _append(_append(ShardStatus(), 0), 1)
    grown = status.with_history(_entry(2, sequence=99))
    assert grown.history[-1].sequence == 3


def test_every_transition_numbers_its_entry() -> None:
    """Operator and workers append through `planned_status` (k8s.shards), the one helper."""
    body = shard("c", 0, "Pending", history=[entry("Pending", T0, "Materialized")])
    planned = planned_status(
        Shard.parse(body), TransitionRequest(Action.CLAIM, "claimed", attempt=1), T0, None
    )
    assert [e.sequence for e in planned.history] == [None, 2]
    assert planned.sequences() == [1, 2]


def test_a_history_from_before_sequences_is_numbered_from_what_is_there() -> None:
    assert history_sequences([]) == []
    assert _legacy(3).sequences() == [1, 2, 3]
    full = _legacy(HISTORY_LIMIT + 7)
    assert full.sequences() == list(range(1, HISTORY_LIMIT + 1)), "what was dropped is not known"
    grown = _append(full, 100)
    assert grown.history[-1].sequence == HISTORY_LIMIT + 1
    # The older entries count back from the numbered one: their numbers stay as they were.
    assert grown.sequences() == list(range(2, HISTORY_LIMIT + 2))
    # An entry without a number after numbered ones (an earlier release appended it) counts on.
    mixed = [_entry(0, 7), _entry(1), _entry(2, 9), _entry(3)]
    assert history_sequences(mixed) == [7, 8, 9, 10]
    # A number that does not rise is not trusted.
    assert history_sequences([_entry(0, 5), _entry(1, 5), _entry(2, 2)]) == [5, 6, 7]


@settings(max_examples=200, deadline=None)
@given(
    legacy=st.integers(min_value=0, max_value=HISTORY_LIMIT + 10),
    appends=st.integers(min_value=0, max_value=3 * HISTORY_LIMIT),
)
def test_numbers_rise_by_one_and_never_change_while_an_entry_is_kept(legacy: int, appends: int) -> None:
    status = _legacy(legacy)
    seen: dict[str, int] = dict(zip((e.reason for e in status.history), status.sequences(), strict=True))
    for n in range(1000, 1000 + appends):
        before = status.last_sequence
        status = _append(status, n)
        numbers = status.sequences()
        assert numbers == list(range(numbers[0], numbers[0] + len(numbers))), "consecutive"
        assert numbers[-1] == before + 1
        for e, number in zip(status.history, numbers, strict=True):
            assert seen.setdefault(e.reason, number) == number, f"{e.reason} renumbered"
