"""Token counts: from a command's results lines into the shard's status (over its attempts), the
ledger and status.folded, the campaign's status.tokens, and shardops_tokens_total."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from shardops.api.common import TokenCounts
from shardops.api.folded import FoldedShards
from shardops.api.shard import Shard
from shardops.k8s.api import SHARDS
from shardops.scheduler.metrics import Metrics
from shardops.state import ledger
from shardops.worker.runner import CommandFailure, ResultsReader
from shardops.worker.runtime import Worker
from shardops.worker.settings import WorkerSettings
from tests.fakekube import FakeKube
from tests.schedulerkit import shard
from tests.workerkit import NAMESPACE, add_campaign, campaign_body

RESULT = {"ref": "p/ns/attempts/k/t1.json", "fingerprint": "sha256:ab", "bytes": 10}


def _read(tmp_path: Path, line: str) -> ResultsReader:
    path = tmp_path / "results.jsonl"
    path.write_text(line + "\n")
    return ResultsReader(path, ["k"], 10_000)


def test_a_results_line_may_carry_its_token_counts(tmp_path: Path) -> None:
    (line,) = _read(tmp_path, '{"key":"k","result":1,"tokens":{"input":7,"cachedInput":2,"output":3}}').poll()
    assert line.tokens == TokenCounts(input=7, cached_input=2, output=3)
    (plain,) = _read(tmp_path, '{"key":"k","result":1}').poll()
    assert not plain.tokens.used


@pytest.mark.parametrize(
    "tokens", ['{"input":-1}', '{"input":1.5}', '{"prompt":3}', "[1,2]", '{"output":true}']
)
def test_bad_token_counts_are_bad_output_naming_the_line(tmp_path: Path, tokens: str) -> None:
    with pytest.raises(CommandFailure) as failure:
        _read(tmp_path, '{"key":"k","result":1,"tokens":' + tokens + "}").poll()
    assert failure.value.error_class == "bad-output" and "results line 1" in failure.value.message
    assert "tokens" in failure.value.message or "token counts" in failure.value.message


# A command that answers every item with 10 input (4 cached) and 5 output tokens.
COMMAND = [
    sys.executable,
    "-c",
    "import json, os\n"
    "out = open(os.environ['SHARDOPS_RESULTS_FILE'], 'a')\n"
    "for line in open(os.environ['SHARDOPS_ITEMS_FILE']):\n"
    "    key = json.loads(line)['key']\n"
    "    out.write(json.dumps({'key': key, 'result': 1, 'cost': 0.5,"
    " 'tokens': {'input': 10, 'cachedInput': 4, 'output': 5}}) + '\\n')\n",
]


def test_the_worker_sums_the_items_tokens_into_the_shards_status(tmp_path: Path) -> None:
    kube = FakeKube()
    body = campaign_body(items=[{"id": i} for i in range(4)], worker={"image": "x", "command": COMMAND})
    shards = add_campaign(kube, body)
    # The second shard already used tokens on an earlier attempt: they stay counted.
    second = kube.obj(SHARDS, NAMESPACE, shards[1].name)
    assert second is not None
    second["status"]["tokens"] = {"input": 100, "cachedInput": 0, "output": 1}
    settings = WorkerSettings(
        namespace=NAMESPACE,
        pod_name="w",
        tick_seconds=0.01,
        poll_seconds=0.01,
        idle_seconds=0,
        work_dir=tmp_path,
    )  # type: ignore[call-arg]
    worker = Worker(kube=kube, settings=settings, namespace=NAMESPACE, campaign_name="camp")  # type: ignore[arg-type]
    assert worker.run() == 0
    first, after = (Shard.parse(kube.obj(SHARDS, NAMESPACE, s.name) or {}) for s in shards)
    assert first.current_status.phase == "Done"
    assert first.current_status.tokens == TokenCounts(input=20, cached_input=8, output=10)
    assert after.current_status.tokens == TokenCounts(input=120, cached_input=8, output=11)
    assert first.current_status.cost == pytest.approx(1.0)


def test_folded_shards_keep_their_tokens_and_the_campaign_total_never_goes_down() -> None:
    used = {"input": 10, "cachedInput": 4, "output": 5}
    shards = [
        Shard.parse(shard("c", 0, "Done", result=RESULT, tokens=used)),
        Shard.parse(shard("c", 1, "Running", tokens={"input": 1, "output": 2})),
        Shard.parse(shard("c", 2, "Done", result=RESULT)),  # a command that reports no tokens
    ]
    folded = ledger.fold(FoldedShards(), ledger.foldable(shards, FoldedShards()))
    assert folded.tokens == TokenCounts(input=10, cached_input=4, output=5)
    assert ledger.record(shards[0])["tokens"] == used
    assert ledger.shard_body(ledger.record(shards[0]), "ns", "c")["status"]["tokens"] == used
    live = ledger.unfolded(shards, folded)
    total = ledger.campaign_tokens(TokenCounts(), folded, live)
    assert total == TokenCounts(input=11, cached_input=4, output=7)
    # Folding moves a shard's tokens from the live sum to status.folded: the total stays.
    again = ledger.fold(folded, ledger.foldable(live, folded))
    assert ledger.campaign_tokens(total, again, ledger.unfolded(live, again)) == total
    # A Shard deleted by hand cannot un-use its tokens.
    assert ledger.campaign_tokens(total, folded, []) == total


def _samples(metrics: Metrics) -> dict[tuple[str, str], float]:
    return {
        (s.labels["campaign"], s.labels["kind"]): s.value
        for family in metrics.tokens.collect()
        for s in family.samples
        if s.name == "shardops_tokens_total"
    }


def test_the_token_counter_follows_the_campaigns_total() -> None:
    metrics = Metrics()
    metrics.set_tokens("ns/quiet", TokenCounts())
    assert _samples(metrics) == {}, "a campaign that reports no tokens gets no series"
    metrics.set_tokens("ns/c", TokenCounts(input=10, cached_input=4, output=5))
    metrics.set_tokens("ns/c", TokenCounts(input=30, cached_input=4, output=9))
    metrics.set_tokens("ns/c", TokenCounts(input=30, cached_input=4, output=9))
    assert _samples(metrics) == {("ns/c", "input"): 30, ("ns/c", "cached_input"): 4, ("ns/c", "output"): 9}
    metrics.forget_campaign("ns/c")
    assert _samples(metrics) == {}
