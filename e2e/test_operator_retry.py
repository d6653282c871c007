"""`kubectl campaign retry NAME --shard X` with a running operator: only X goes back to Pending.

Two shards give up (one Blocked after a timeout, one Failed on invalid input); the timeout is fixed;
the retry is asked for through the real plugin (`kubectl campaign`, found on the PATH) naming one of
them. The operator acts once: that shard is retried and finishes, the other stays as it was.
"""

from __future__ import annotations

import time

import pytest
from testbed.harness import Cluster, wait_for
from testbed.kits.scheduler import (
    campaign_body,
    create_campaign,
    get_campaign,
    kube_for,
    operator_running,
    patch_spec,
    phase_of,
    reasons,
    shard_phase,
    wait_phase,
)

from e2e.test_cli_campaign import kc
from shardops.k8s.api import EVENTS, SHARDS, Kube

pytestmark = pytest.mark.usefixtures("crds_installed")


def _campaign_events(kube: Kube, namespace: str, campaign: str, reason: str) -> list[dict]:
    return [
        e
        for e in kube.list(EVENTS, namespace)
        if e["reason"] == reason
        and e["regarding"]["name"] == campaign
        and e["regarding"]["kind"] == "Campaign"
    ]


def test_retry_of_one_named_shard_sends_only_that_shard_back(local_cluster: Cluster, namespace: str) -> None:
    kube = kube_for(local_cluster)
    body = campaign_body(
        "pick",
        [{"q": "slow upstream", "source": "A"}, {"q": "bad", "fault": "invalid"}],
        shardSize=1,
        maxAttempts=1,
        sources=[{"name": "A"}],
        worker_env={"SHARDOPS_AGENT_TIMEOUT_SOURCES": "A"},
    )
    chosen, other = "pick-00000", "pick-00001"
    with operator_running(local_cluster, namespace):
        create_campaign(kube, namespace, body)
        gave_up = wait_phase(kube, namespace, "pick", {"Completed", "Succeeded"}, timeout=120)
        assert gave_up["status"]["phase"] == "Completed"
        assert phase_of(kube.get(SHARDS, namespace, chosen)) == "Blocked"
        assert phase_of(kube.get(SHARDS, namespace, other)) == "Failed"
        other_before = kube.get(SHARDS, namespace, other)

        # The upstream of A is fixed; B's input is still bad. Retry only A, through the plugin.
        patch_spec(kube, namespace, "pick", {"worker": {**body["spec"]["worker"], "env": []}})
        result = kc(local_cluster, "retry", "pick", "--shard", chosen, "-n", namespace)
        assert result.returncode == 0, result.stdout + result.stderr
        assert f"1 shard(s), only these shards: {chosen}" in result.stdout
        assert get_campaign(kube, namespace, "pick")["spec"]["retry"] == {"generation": 1, "shards": [chosen]}

        wait_for(
            f"{chosen} to be Done again", lambda: shard_phase(kube, namespace, chosen) == "Done", timeout=120
        )
        finished = wait_for(
            "the campaign to record the retry and finish",
            lambda: (
                c
                if (c := get_campaign(kube, namespace, "pick")).get("status", {}).get("lastRetryGeneration")
                == 1
                and c["status"].get("phase") == "Completed"
                else None
            ),
            timeout=60,
        )
        # A few more operator passes (tick 2s): the request is acted on once, not per pass.
        time.sleep(6)

        retried = kube.get(SHARDS, namespace, chosen)
        assert reasons(retried)[-4:] == ["Blocked", "Retried", "Claimed", "Completed"], reasons(retried)
        assert retried["status"]["attempt"] == 1
        left = kube.get(SHARDS, namespace, other)
        assert phase_of(left) == "Failed"
        assert "Retried" not in reasons(left), reasons(left)
        assert left["metadata"]["resourceVersion"] == other_before["metadata"]["resourceVersion"]
        assert finished["status"]["failedShards"] == [other]

        started = _campaign_events(kube, namespace, "pick", "RetryStarted")
        assert len(started) == 1, started
        note = started[0]["note"]
        assert chosen in note and other not in note, note
        assert "1 shard(s) back to Pending" in note, note
        requested = _campaign_events(kube, namespace, "pick", "RetryRequested")
        assert len(requested) == 1 and requested[0]["reportingController"] == "shardops.dev/kubectl-campaign"
        print(f"\nRetryRequested (CLI): {requested[0]['note']}\nRetryStarted (operator): {note}")
