"""Which shards a retry request sends back to Pending: all that gave up, or only the listed ones."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shardops.api.enums import ShardPhase
from shardops.logic.retry import GAVE_UP, RetryChoice, choose_retry, skipped_text

P = ShardPhase
PHASES = {
    "c-00000": P.DONE,
    "c-00001": P.BLOCKED,
    "c-00002": P.FAILED,
    "c-00003": P.RUNNING,
    "c-00004": P.FAILED,
}


@pytest.mark.parametrize("listed", [None, []])
def test_no_list_retries_every_blocked_and_failed_shard(listed: list[str] | None) -> None:
    assert choose_retry(PHASES, listed) == RetryChoice(("c-00001", "c-00002", "c-00004"))


def test_a_list_retries_only_the_listed_shards() -> None:
    assert choose_retry(PHASES, ["c-00004"]) == RetryChoice(("c-00004",))
    assert choose_retry(PHASES, ["c-00002", "c-00001", "c-00002"]) == RetryChoice(("c-00001", "c-00002"))


def test_listed_shards_that_did_not_give_up_are_skipped_with_their_phase() -> None:
    choice = choose_retry(PHASES, ["c-00000", "c-00002", "c-00003", "c-00009"])
    assert choice.retry == ("c-00002",)
    assert choice.skipped == (("c-00000", "Done"), ("c-00003", "Running"), ("c-00009", "not found"))
    assert skipped_text(choice.skipped) == (
        "; skipped (not Blocked or Failed): c-00000 (Done), c-00003 (Running), c-00009 (not found)"
    )
    assert skipped_text(()) == ""
    assert skipped_text([(f"s{i}", "Done") for i in range(12)], limit=2).endswith("s1 (Done), +10 more")


def test_a_list_of_nothing_retryable_retries_nothing() -> None:
    assert choose_retry(PHASES, ["c-00000"]) == RetryChoice((), (("c-00000", "Done"),))


@given(
    st.dictionaries(st.text("ab", min_size=1, max_size=3), st.sampled_from(list(ShardPhase)), max_size=8),
    st.lists(st.text("ab", min_size=1, max_size=3), max_size=6),
)
def test_never_retries_a_shard_that_did_not_give_up_nor_one_not_listed(
    phases: dict[str, ShardPhase], listed: list[str]
) -> None:
    choice = choose_retry(phases, listed)
    assert all(phases[name] in GAVE_UP for name in choice.retry)
    if listed:
        assert set(choice.retry) <= set(listed)
        assert set(choice.retry) | {name for name, _ in choice.skipped} == set(listed)
    else:
        assert set(choice.retry) == {n for n, p in phases.items() if p in GAVE_UP}


@pytest.mark.parametrize("listed", [None, ["c-00001", "c-00002"]])
def test_shards_the_request_already_retried_are_not_retried_again(listed: list[str] | None) -> None:
    # c-00001 was retried by this request in an earlier run of it and has given up again since.
    choice = choose_retry(PHASES, listed, applied={"c-00001"})
    assert choice.retry == (("c-00002", "c-00004") if listed is None else ("c-00002",))
    assert choice.applied == ("c-00001",) and choice.skipped == ()


def test_every_listed_shard_already_retried_is_not_read_as_no_list() -> None:
    choice = choose_retry(PHASES, ["c-00001"], applied={"c-00001"})
    assert choice == RetryChoice((), (), ("c-00001",))
