"""Kueue in the local control plane (testbed/cluster/kueue.py): worker Jobs handed to a LocalQueue wait
for the quota of its ClusterQueue, through the real API server, Job controller and Kueue."""

from __future__ import annotations

import json
from typing import Any

import pytest
from testbed.bed import Bed
from testbed.kits import kueue as kueuekit

pytestmark = pytest.mark.usefixtures("kueue")


def _sleeping_job(name: str, queue: str) -> dict[str, Any]:
    """A Job labelled for `queue`, created unsuspended as the operator creates its workers: Kueue's
    webhook is what suspends it."""
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "labels": {kueuekit.QUEUE_LABEL: queue}},
        "spec": {
            "backoffLimit": 0,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "terminationGracePeriodSeconds": 1,
                    "containers": [
                        {
                            "name": "main",
                            "image": "python:3.11-slim",
                            "command": ["python", "-c", "import time; time.sleep(600)"],
                        }
                    ],
                }
            },
        },
    }


def _job(bed: Bed, name: str) -> dict[str, Any]:
    found: dict[str, Any] = json.loads(
        bed.cluster.kubectl("get", "job", name, "-n", bed.namespace, "-o", "json").stdout
    )
    return found


def test_a_labelled_job_is_suspended_until_its_queue_has_quota(bed: Bed) -> None:
    cluster_queue = kueuekit.cluster_queue(f"smoke-{bed.namespace}", pods=1)
    queue = kueuekit.local_queue(bed.namespace, "smoke", cluster_queue["metadata"]["name"])
    kueuekit.apply(bed.cluster, kueuekit.resource_flavor(), cluster_queue, queue)
    try:
        for name in ("first", "second"):
            bed.cluster.kubectl(
                "create", "-n", bed.namespace, "-f", "-", stdin=json.dumps(_sleeping_job(name, "smoke"))
            )
        bed.wait_for(
            "the first Job admitted and running",
            lambda: (
                _job(bed, "first")["spec"]["suspend"] is False
                and (_job(bed, "first").get("status") or {}).get("active")
            ),
            timeout=90,
        )
        waiting = bed.wait_for(
            "the second Job's Workload refused for quota",
            lambda: [
                w
                for w in kueuekit.workloads(bed.cluster, bed.namespace)
                if w["metadata"]["ownerReferences"][0]["name"] == "second"
                and (kueuekit.condition(w, "QuotaReserved") or {}).get("status") == "False"
            ],
        )[0]
        assert _job(bed, "second")["spec"]["suspend"] is True
        print("Kueue on the waiting Job:", kueuekit.condition(waiting, "QuotaReserved"))
        bed.cluster.kubectl("delete", "job", "first", "-n", bed.namespace, "--wait=false")
        bed.wait_for(
            "the second Job admitted once the first is gone",
            lambda: _job(bed, "second")["spec"]["suspend"] is False,
            timeout=90,
        )
    finally:
        kueuekit.delete(bed.cluster, queue, cluster_queue)
