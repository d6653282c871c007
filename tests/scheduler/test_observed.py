"""What one pass sees (scheduler/observed.py): the campaign's own shards, split into the live ones
and those already folded into the ledger."""

from __future__ import annotations

from shardops.api.campaign import Campaign
from shardops.scheduler.observed import observe
from tests.schedulerkit import NAMESPACE, OperatorKube, campaign, put_campaign, put_shard, shard


def test_the_live_shards_and_the_folded_leftovers() -> None:
    kube = OperatorKube()
    body = campaign(items=[{"id": i} for i in range(3)])
    body["status"] = {
        "folded": {"shards": 1, "items": 1, "doneRanges": [{"start": 0, "end": 1}], "sequence": 1}
    }
    body = put_campaign(kube, body)
    for index in range(3):
        put_shard(kube, shard("camp", index, "Pending"))
    put_shard(kube, shard("other", 0, "Pending"))
    parsed = Campaign.parse(body)
    seen = observe(kube, body, parsed, list(parsed.spec.items or []))  # type: ignore[arg-type]
    assert sorted(seen.shards) == ["camp-00001", "camp-00002"], "folded and other campaigns' shards left out"
    assert [s.name for s in seen.leftovers] == ["camp-00000"], "folded: to delete, never counted"
    assert seen.key == f"{NAMESPACE}/camp"
    assert len(seen.items) == 3
