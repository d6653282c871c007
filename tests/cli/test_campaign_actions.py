"""`kubectl campaign` actions as patches: what suspend, resume, cancel and retry ask of the operator."""

from __future__ import annotations

import pytest

from shardops.api.campaign import MAX_RETRY_SHARDS, Campaign
from shardops.cli import campaign_actions as actions
from shardops.cli.campaign_actions import CANCELLED_ANNOTATION
from shardops.cli.campaign_summary import parse_shards
from shardops.logic.timefmt import rfc3339
from tests.clikit import NOW, campaign_body, shard_body

CANCELLED = CANCELLED_ANNOTATION


def _campaign(**kwargs: object) -> Campaign:
    return Campaign.parse(campaign_body(**kwargs))  # type: ignore[arg-type]


def _shards() -> list:
    return parse_shards(
        [
            shard_body("papers", 0, "Done"),
            shard_body("papers", 1, "Blocked", attempt=3),
            shard_body("papers", 2, "Failed"),
            shard_body("papers", 3, "Blocked", attempt=3),
            shard_body("papers", 4, "Running"),
        ]
    )


def test_suspend_and_cancel_patch_the_spec_and_annotation() -> None:
    assert actions.suspend_patch() == {"spec": {"suspend": True}}
    assert actions.cancel_patch(rfc3339(NOW)) == {
        "spec": {"suspend": True},
        "metadata": {"annotations": {CANCELLED: "2026-03-01T12:00:00Z"}},
    }


def test_resume_withdraws_a_cancel_only_when_there_is_one() -> None:
    assert actions.resume_patch(_campaign(suspend=True), NOW) == {"spec": {"suspend": False}}
    cancelled = _campaign(suspend=True, annotations={CANCELLED: "2026-03-01T11:00:00Z"})
    assert actions.resume_patch(cancelled, NOW) == {
        "spec": {"suspend": False},
        "metadata": {"annotations": {CANCELLED: None}},
    }


@pytest.mark.parametrize(
    ("blocked", "failed", "names", "chosen", "everything"),
    [
        (False, False, [], ("papers-00001", "papers-00002", "papers-00003"), True),
        (True, False, [], ("papers-00001", "papers-00003"), False),
        (False, True, [], ("papers-00002",), False),
        (True, True, [], ("papers-00001", "papers-00002", "papers-00003"), True),
        (True, False, ["papers-00003"], ("papers-00003",), False),
        (
            False,
            False,
            ["papers-00002", "papers-00001", "papers-00003"],
            ("papers-00001", "papers-00002", "papers-00003"),
            False,  # named: stays a list, even when that is every shard that gave up so far
        ),
    ],
)
def test_select_retry(
    blocked: bool, failed: bool, names: list[str], chosen: tuple[str, ...], everything: bool
) -> None:
    selection = actions.select_retry(
        _campaign(items=5), _shards(), blocked=blocked, failed=failed, names=names
    )
    assert selection.shards == chosen
    assert selection.everything is everything


@pytest.mark.parametrize(
    ("kwargs", "code", "text"),
    [
        ({"names": ["papers-00009"]}, 3, 'shard "papers-00009" is not a shard of campaign papers'),
        ({"names": ["papers-00004"]}, 1, "shard papers-00004 is Running, not Blocked or Failed"),
        ({"names": ["papers-00002"], "blocked": True}, 1, "shard papers-00002 is Failed, not Blocked"),
    ],
)
def test_select_retry_refuses_shards_that_cannot_be_retried(kwargs: dict, code: int, text: str) -> None:
    args = {"blocked": False, "failed": False, "names": [], **kwargs}
    with pytest.raises(actions.ActionRefused) as refused:
        actions.select_retry(_campaign(items=5), _shards(), **args)
    assert refused.value.exit_code == code
    assert text in refused.value.message


def test_select_retry_with_nothing_to_retry_is_a_bad_state() -> None:
    shards = parse_shards([shard_body("papers", 0, "Done"), shard_body("papers", 1, "Failed")])
    with pytest.raises(actions.ActionRefused, match="has no Blocked shard") as refused:
        actions.select_retry(_campaign(items=2), shards, blocked=True, failed=False, names=[])
    assert refused.value.exit_code == 1


def test_select_retry_refuses_while_an_earlier_request_waits_for_the_operator() -> None:
    waiting = _campaign(items=5, retry={"generation": 2}, status={"lastRetryGeneration": 1})
    with pytest.raises(actions.ActionRefused, match="retry generation 2 is still waiting") as refused:
        actions.select_retry(waiting, _shards(), blocked=False, failed=False, names=[])
    assert refused.value.exit_code == 1


def test_retry_of_everything_bumps_the_generation_and_drops_a_previous_shard_list() -> None:
    campaign = _campaign(
        retry={"generation": 1, "shards": ["papers-00001"]}, status={"lastRetryGeneration": 1}
    )
    patch = actions.retry_patch(
        campaign, actions.RetrySelection(("papers-00001", "papers-00002"), everything=True)
    )
    # One merge patch: null removes the previous request's list, so the operator retries them all.
    assert patch == {"spec": {"retry": {"generation": 2, "shards": None}}}
    assert "metadata" not in patch


def test_retry_of_some_shards_names_them_in_the_spec_with_the_generation() -> None:
    campaign = _campaign(retry={"generation": 4}, status={"lastRetryGeneration": 4})
    patch = actions.retry_patch(
        campaign, actions.RetrySelection(("papers-00001", "papers-00003"), everything=False)
    )
    assert patch == {"spec": {"retry": {"generation": 5, "shards": ["papers-00001", "papers-00003"]}}}
    # What the operator reads back: the model accepts it.
    merged = _campaign(retry=patch["spec"]["retry"], status={"lastRetryGeneration": 4})
    assert merged.spec.retry.shards == ["papers-00001", "papers-00003"]
    assert merged.retry_requested


def test_a_shard_list_longer_than_the_spec_allows_is_refused() -> None:
    names = tuple(f"papers-{i:05d}" for i in range(MAX_RETRY_SHARDS + 1))
    with pytest.raises(actions.ActionRefused, match=f"at most {MAX_RETRY_SHARDS}") as refused:
        actions.retry_patch(_campaign(), actions.RetrySelection(names, everything=False))
    assert refused.value.exit_code == 1
    fits = actions.retry_patch(_campaign(), actions.RetrySelection(names[:-1], everything=False))
    assert len(fits["spec"]["retry"]["shards"]) == MAX_RETRY_SHARDS


def test_action_result_as_dict() -> None:
    result = actions.ActionResult(
        "suspend", "ns", "papers", True, "done", {"spec": {"suspend": True}}, "e1", "alice"
    )
    assert result.as_dict() == {
        "action": "suspend",
        "namespace": "ns",
        "name": "papers",
        "changed": True,
        "message": "done",
        "patch": {"spec": {"suspend": True}},
        "event": "e1",
        "user": "alice",
        "warnings": [],
    }


def test_select_retry_of_everything_goes_ahead_when_only_folded_shards_gave_up() -> None:
    """Gave-up shards folded into the ledger are gone from the API: a retry of all of them is still
    a request (the operator cuts them again from the ledger); --blocked alone names live ones only."""
    shards = parse_shards([shard_body("papers", 0, "Done")])
    folded = _campaign(items=2, status={"folded": {"failed": 3, "doneRanges": [{"start": 1, "end": 4}]}})
    selection = actions.select_retry(folded, shards, blocked=False, failed=False, names=[])
    assert selection.shards == () and selection.everything is True
    with pytest.raises(actions.ActionRefused, match="has no Blocked shard"):
        actions.select_retry(folded, shards, blocked=True, failed=False, names=[])


def test_retry_of_the_errored_items_asks_for_them_and_is_refused_without_any() -> None:
    """`retry --errored`: spec.retry.errored with the next generation and no shard list, counting
    the live Done shards' errored items and the folded ones'; nothing errored: nothing to retry."""
    live = parse_shards(
        [shard_body("papers", 0, "Done", status={"progress": {"done": 2, "total": 2, "errored": 1}})]
    )
    campaign = _campaign(
        items=4, retry={"generation": 2}, status={"lastRetryGeneration": 2, "folded": {"erroredItems": 2}}
    )
    patch, errored = actions.errored_retry_patch(campaign, live)
    assert patch == {"spec": {"retry": {"generation": 3, "shards": None, "errored": True}}}
    assert errored == 3
    merged = _campaign(retry=patch["spec"]["retry"], status={"lastRetryGeneration": 2})
    assert merged.spec.retry.errored and merged.retry_requested
    with pytest.raises(actions.ActionRefused, match="has no errored item"):
        actions.errored_retry_patch(_campaign(items=2), parse_shards([shard_body("papers", 0, "Done")]))
    # A later retry of the gave-up shards drops the errored request.
    after = _campaign(retry={"generation": 3, "errored": True}, status={"lastRetryGeneration": 3})
    again = actions.retry_patch(after, actions.RetrySelection(("papers-00001",), everything=True))
    assert again["spec"]["retry"]["errored"] is None
