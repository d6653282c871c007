"""`kubectl campaign retry NAME --shard X` with a running operator: only X goes back to Pending.

Two shards give up (one Blocked after a timeout, one Failed on invalid input); the timeout is fixed;
the retry is asked for through the real plugin (`kubectl campaign`, found on the PATH) naming one of
them. The operator acts once: that shard is retried and finishes, the other stays as it was.
"""

from __future__ import annotations

import time

import pytest
from testbed.bed import Bed

from e2e.test_cli_campaign import kc
from shardops.k8s.api import EVENTS, SHARDS, Kube

pytestmark = pytest.mark.usefixtures("crds_installed", "local_cluster")


def _campaign_events(kube: Kube, namespace: str, campaign: str, reason: str) -> list[dict]:
    return [
        e
        for e in kube.list(EVENTS, namespace)
        if e["reason"] == reason
        and e["regarding"]["name"] == campaign
        and e["regarding"]["kind"] == "Campaign"
    ]


def test_retry_of_one_named_shard_sends_only_that_shard_back(bed: Bed) -> None:
    kube = bed.kube
    body = bed.campaign_body(
        "pick",
        [{"q": "slow upstream", "source": "A"}, {"q": "bad", "fault": "invalid"}],
        shardSize=1,
        maxAttempts=1,
        sources=[{"name": "A"}],
        worker_env={"SHARDOPS_AGENT_TIMEOUT_SOURCES": "A"},
    )
    chosen, other = "pick-00000", "pick-00001"
    with bed.operator():
        bed.create_campaign(body)
        gave_up = bed.wait_phase("pick", {"Completed", "Succeeded"}, timeout=120)
        assert gave_up["status"]["phase"] == "Completed"
        assert bed.phase_of(kube.get(SHARDS, bed.namespace, chosen)) == "Blocked"
        assert bed.phase_of(kube.get(SHARDS, bed.namespace, other)) == "Failed"
        other_before = kube.get(SHARDS, bed.namespace, other)

        # The upstream of A is fixed; B's input is still bad. Retry only A, through the plugin.
        bed.patch_spec("pick", {"worker": {**body["spec"]["worker"], "env": []}})
        result = kc(bed.cluster, "retry", "pick", "--shard", chosen, "-n", bed.namespace)
        assert result.returncode == 0, result.stdout + result.stderr
        assert f"1 shard(s), only these shards: {chosen}" in result.stdout
        assert bed.get_campaign("pick")["spec"]["retry"] == {"generation": 1, "shards": [chosen]}

        bed.wait_for(f"{chosen} to be Done again", lambda: bed.shard_phase(chosen) == "Done", timeout=120)
        finished = bed.wait_for(
            "the campaign to record the retry and finish",
            lambda: (
                c
                if (c := bed.get_campaign("pick")).get("status", {}).get("lastRetryGeneration") == 1
                and c["status"].get("phase") == "Completed"
                else None
            ),
            timeout=60,
        )
        # A few more operator passes (tick 2s): the request is acted on once, not per pass.
        time.sleep(6)

        retried = kube.get(SHARDS, bed.namespace, chosen)
        assert bed.reasons(retried)[-4:] == ["Blocked", "Retried", "Claimed", "Completed"], bed.reasons(
            retried
        )
        assert retried["status"]["attempt"] == 1
        left = kube.get(SHARDS, bed.namespace, other)
        assert bed.phase_of(left) == "Failed"
        assert "Retried" not in bed.reasons(left), bed.reasons(left)
        assert left["metadata"]["resourceVersion"] == other_before["metadata"]["resourceVersion"]
        assert finished["status"]["failedShards"] == [other]

        started = _campaign_events(kube, bed.namespace, "pick", "RetryStarted")
        assert len(started) == 1, started
        note = started[0]["note"]
        assert chosen in note and other not in note, note
        assert "1 shard(s) back to Pending" in note, note
        requested = _campaign_events(kube, bed.namespace, "pick", "RetryRequested")
        assert len(requested) == 1 and requested[0]["reportingController"] == "shardops.dev/kubectl-campaign"
        print(f"\nRetryRequested (CLI): {requested[0]['note']}\nRetryStarted (operator): {note}")
