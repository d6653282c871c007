"""A worker pod that cannot start is never called healthy: its Campaign's WorkersFailing condition turns
true with the kubelet's own reason and message, and `kubectl campaign plan` names it as the limit.

The worker pod here takes its S3 credentials from a Secret that does not exist in the namespace (the
campaign's own spec.resultStore.s3.credentialsSecret), as happens on a first install that forgot to
create it: the kubelet cannot build the container's environment and reports CreateContainerConfigError.
"""

from __future__ import annotations

import io
import json
import time

import pytest
from testbed.harness import Cluster, wait_for
from testbed.kits.scheduler import (
    campaign_body,
    condition,
    create_campaign,
    get_campaign,
    kube_for,
    operator_running,
)

from shardops.cli import campaign as cli

pytestmark = pytest.mark.usefixtures("crds_installed")

MISSING_SECRET = "shardops-s3"


def test_a_worker_pod_missing_its_secret_turns_workers_failing_naming_the_reason(
    cluster: Cluster, namespace: str
) -> None:
    kube = kube_for(cluster)
    body = campaign_body(
        "nosecret",
        [{"n": i} for i in range(4)],
        shardSize=2,
        maxConcurrency=1,
        resultStore={
            "type": "S3",
            "s3": {
                "endpoint": "http://127.0.0.1:9",
                "bucket": "results",
                "credentialsSecret": MISSING_SECRET,
            },
        },
    )
    with operator_running(cluster, namespace):
        create_campaign(kube, namespace, body)
        started = time.monotonic()

        def failing() -> dict[str, object] | None:
            found = condition(get_campaign(kube, namespace, "nosecret"), "WorkersFailing")
            return found if found and found["status"] == "True" else None

        found = wait_for("WorkersFailing to turn true", failing, timeout=60)
        assert time.monotonic() - started < 60
        message = str(found["message"])
        # The kubelet's own words, as a real kubelet says them.
        assert f'CreateContainerConfigError: secret "{MISSING_SECRET}" not found' in message, message
        campaign = get_campaign(kube, namespace, "nosecret")
        assert condition(campaign, "ClusterFull")["status"] == "False", "a config error is not a full cluster"

        out, err = io.StringIO(), io.StringIO()
        code = cli.main(
            ["plan", "nosecret", "-n", namespace, "-o", "json", "--kubeconfig", str(cluster.kubeconfig)],
            stdout=out,
            stderr=err,
        )
        assert code == 0, err.getvalue()
        plan = json.loads(out.getvalue())
        assert plan["reason"] == "WorkersFailing", plan
        assert "CreateContainerConfigError" in plan["message"] and MISSING_SECRET in plan["message"]
