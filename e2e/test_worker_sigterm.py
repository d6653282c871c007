"""SIGTERM on a worker pod mid-shard: the shard goes back to Pending, the attempt is not charged,
and no finished item is lost.

The worker runs as a Job through the process-kubelet with the chart's worker service account and
RBAC. Deleting its pod sends SIGTERM (as a kubelet does); the worker forwards it to the command,
flushes the items finished so far, releases the shard (event Released, attempt unchanged) and
exits 0. A second worker then finishes the shard computing only what was not finished.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from kubernetes import client
from testbed.harness import Cluster
from testbed.kits import worker as kit

from shardops.k8s.api import JOBS

ITEMS = 8


def _job(campaign: str, work_dir: Path) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": f"{campaign}-worker", "labels": {"shardops.dev/campaign": campaign}},
        "spec": {
            "backoffLimit": 0,
            # One worker at a time: no replacement pod while the deleted one shuts down.
            "podReplacementPolicy": "Failed",
            "template": {
                "metadata": {"labels": {"shardops.dev/campaign": campaign, "shardops.dev/role": "worker"}},
                "spec": {
                    "restartPolicy": "Never",
                    "serviceAccountName": kit.WORKER_SA,
                    "automountServiceAccountToken": True,
                    "terminationGracePeriodSeconds": 20,
                    "containers": [
                        {
                            "name": "worker",
                            "image": "shardops:dev",
                            "command": ["shardops", "worker", "--campaign", campaign],
                            "env": [
                                {
                                    "name": "POD_NAME",
                                    "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}},
                                },
                                {
                                    "name": "SHARDOPS_NAMESPACE",
                                    "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}},
                                },
                                {"name": "SHARDOPS_WORK_DIR", "value": str(work_dir)},
                            ],
                        }
                    ],
                },
            },
        },
    }


def _log_entries(text: str) -> list[dict[str, Any]]:
    entries = []
    for line in text.splitlines():
        if line.startswith("{"):
            entries.append(json.loads(line))
    return entries


def test_sigterm_on_worker_pod_releases_the_shard_without_charging_or_losing_anything(
    local_cluster: Cluster, namespace: str, crds_installed: None, tmp_path: Path
) -> None:
    kube = kit.admin_kube(local_cluster)
    core = client.CoreV1Api(local_cluster.api)
    batch = client.BatchV1Api(local_cluster.api)
    ledger = tmp_path / "ledger.jsonl"
    body = kit.campaign_body(
        "term",
        [{"id": i} for i in range(ITEMS)],
        shard_size=ITEMS,
        env={"SHARDOPS_AGENT_LEDGER": str(ledger), "SHARDOPS_AGENT_LATENCY": "0.6"},
    )
    with kit.worker_pool(local_cluster, namespace, tmp_path) as pool:
        kit.materialize(kube, namespace, body)
        key = kit.shard_key(body, body["spec"]["items"])
        kube.create(JOBS, namespace, _job("term", tmp_path))

        pod = kit.poll(
            "the worker pod to run",
            lambda: next(
                iter(core.list_namespaced_pod(namespace, label_selector="job-name=term-worker").items), None
            ),
        ).metadata.name
        kit.poll(
            "the pod's worker to store 3 items",
            lambda: (
                (p := kit.get_shard(kube, namespace, "term-00000").current_status.progress) and p.done >= 3
            ),
            timeout=60,
        )
        running = kit.get_shard(kube, namespace, "term-00000").current_status
        assert running.owner is not None and running.owner.startswith(pod)
        core.delete_namespaced_pod(pod, namespace)

        released = kit.poll(
            "the shard to be released",
            lambda: (s := kit.get_shard(kube, namespace, "term-00000")).phase == "Pending" and s,
            timeout=30,
        )
        kit.poll(
            "the Job to record the pod's exit 0",
            lambda: (batch.read_namespaced_job_status("term-worker", namespace).status.succeeded or 0) == 1,
            timeout=60,
        )
        log = _log_entries(local_cluster.pod_log(namespace, pod, "worker"))
        finished_before = [e for e in kit.ledger(ledger) if e["event"] == "done"]
        stored_at_release = kit.stored_items(kube, namespace, key)

        # A second worker finishes the shard.
        finisher = pool.start("term", "finisher", SHARDOPS_IDLE_SECONDS="3")
        assert kit.wait_exit([finisher], timeout=60) == [0]

    status = released.current_status
    assert status.attempt == 1 and status.owner is None and status.last_error is None
    assert [(h.reason, h.attempt) for h in status.history] == [
        ("Materialized", 1),
        ("Claimed", 1),
        ("Released", 1),
    ]
    assert status.history[-1].owner == running.owner

    # The pod's worker forwarded SIGTERM, flushed, released, and exited on the stop request.
    events = [e.get("event") for e in log]
    assert "signal" in events and "stopping-command" in events and "released" in events, events
    assert log[-1]["event"] == "exiting" and "SIGTERM" in log[-1]["reason"]
    exited = next(e for e in log if e.get("event") == "command-exited")
    assert exited["code"] == 128 + 15, exited

    # No result lost: every item the command finished before SIGTERM was stored at release.
    assert len(stored_at_release) == len(finished_before) >= 3
    assert status.progress is not None and status.progress.done == len(finished_before)

    # The finisher claimed attempt 1 again (not charged) and computed only the rest.
    final = kit.get_shard(kube, namespace, "term-00000").current_status
    assert final.phase == "Done"
    assert [(h.reason, h.attempt) for h in final.history][-2:] == [("Claimed", 1), ("Completed", 1)]
    finisher_claim = finisher.events("claimed")[0]
    assert finisher_claim["attempt"] == 1 and finisher_claim["resumed"] == len(finished_before)
    done_per_item = Counter(e["key"] for e in kit.ledger(ledger) if e["event"] == "done")
    assert len(done_per_item) == ITEMS and set(done_per_item.values()) == {1}
    print(
        f"\nSIGTERM: pod {pod} released the shard with {len(finished_before)}/{ITEMS} items stored "
        f"(command exit {exited['code']}), attempt stays 1; the finisher resumed with "
        f"{finisher_claim['resumed']} and computed {ITEMS - len(finished_before)}; each item done once"
    )
