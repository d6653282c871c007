"""Kueue in the local control plane (testbed/cluster/kueue.py): worker Jobs handed to a LocalQueue wait
for the quota of its ClusterQueue, through the real API server, Job controller and Kueue."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from testbed.bed import Bed
from testbed.harness import create_namespace
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


def _kueue_state(bed: Bed, cluster_queue: str) -> str:
    """What Kueue says, for a wait on it that timed out: the namespace's Workloads and their
    conditions, the ClusterQueue's status, and the last lines of Kueue's log."""
    workloads = [
        (w["metadata"]["name"], [(c["type"], c["status"], c.get("message")) for c in kueuekit.conditions(w)])
        for w in kueuekit.workloads(bed.cluster, bed.namespace)
    ]
    queue = bed.cluster.kubectl("get", "clusterqueue", cluster_queue, "-o", "json", check=False).stdout
    status = json.loads(queue).get("status") if queue else None
    log = ""
    if bed.cluster.local is not None:
        lines = (bed.cluster.local.logs / "kueue.log").read_text(errors="replace").splitlines()
        log = "\n".join(lines[-40:])
    return f"workloads: {workloads}\nclusterqueue status: {status}\nkueue log:\n{log}"


def test_a_labelled_job_is_suspended_until_its_queue_has_quota(bed: Bed) -> None:
    cluster_queue = kueuekit.cluster_queue(f"smoke-{bed.namespace}", pods=1)
    queue = kueuekit.local_queue(bed.namespace, "smoke", cluster_queue["metadata"]["name"])
    kueuekit.apply(bed.cluster, kueuekit.resource_flavor(), cluster_queue, queue)
    try:
        # As a queue is set up before work is handed to it: the first test of a cluster creates the
        # flavor in the same apply, and Kueue admits to a ClusterQueue only once it knows its flavors.
        queue_name = cluster_queue["metadata"]["name"]
        bed.wait_for("the ClusterQueue Active", lambda: kueuekit.active(bed.cluster, queue_name), timeout=60)
        for name in ("first", "second"):
            bed.cluster.kubectl(
                "create", "-n", bed.namespace, "-f", "-", stdin=json.dumps(_sleeping_job(name, "smoke"))
            )
        try:
            bed.wait_for(
                "the first Job admitted and running",
                lambda: (
                    _job(bed, "first")["spec"]["suspend"] is False
                    and (_job(bed, "first").get("status") or {}).get("active")
                ),
                timeout=90,
            )
        except AssertionError as timeout:
            state = _kueue_state(bed, queue_name)
            raise AssertionError(f"{timeout}\n{state}") from None
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
        # Its Jobs go with it: the namespace is deleted in the background, and a still-admitted Job
        # would hold a Workload in the cluster-wide watch of the next test.
        bed.cluster.kubectl(
            "delete", "job", "first", "second", "-n", bed.namespace, "--ignore-not-found", "--wait=false"
        )
        kueuekit.delete(bed.cluster, queue, cluster_queue)


# The quota of the must-show: a ClusterQueue admitting 4 worker pods at once, shared by two teams.
QUOTA_PODS = 4
VENV_BIN = Path(sys.executable).parent


def _campaign(
    bed: Bed, name: str, queue: str, *, shards: int, max_concurrency: int, latency: float
) -> dict[str, Any]:
    """One item a shard, `latency` seconds each, its worker Jobs handed to the LocalQueue `queue`."""
    body = bed.campaign_body(
        name,
        [{"n": i} for i in range(shards)],
        shardSize=1,
        maxConcurrency=max_concurrency,
        worker_env={"SHARDOPS_AGENT_LATENCY": latency},
    )
    body["spec"]["worker"]["queueName"] = queue
    return body


def _admitted(workloads: dict[str, dict[str, Any]], cluster_queue: str) -> set[str]:
    """Workloads holding quota of `cluster_queue` now: admitted to it and not finished (a finished one
    gave its quota back). The recorder watches every namespace, so Workloads of other tests' queues are
    there too (the smoke test's still-running Job while its namespace is deleted in the background)."""
    return {
        name
        for name, workload in workloads.items()
        if kueuekit.admitted(workload, cluster_queue)
        and (kueuekit.condition(workload, "Finished") or {}).get("status") != "True"
    }


def _plan_text(bed: Bed, name: str) -> str:
    env = bed.cluster.env()
    env["PATH"] = f"{bed.cluster.bin_dir}{os.pathsep}{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
    shown = subprocess.run(
        [str(bed.cluster.bin_dir / "kubectl"), "campaign", "plan", name, "-n", bed.namespace],
        capture_output=True,
        text=True,
        check=False,
        env=env,
        timeout=120,
    )
    assert shown.returncode == 0, shown.stderr
    return shown.stdout


@contextlib.contextmanager
def _second_namespace(bed: Bed) -> Iterator[Bed]:
    name = create_namespace(bed.cluster, prefix="e2e-team-b")
    try:
        yield bed.namespaced(name)
    finally:
        client.CoreV1Api(bed.cluster.api).delete_namespace(name, propagation_policy="Background")


@pytest.mark.usefixtures("crds_installed", "local_cluster")
def test_two_namespaces_share_four_worker_pods_and_the_waiting_campaign_says_it_waits_for_quota(
    bed: Bed,
) -> None:
    """Team A's campaign takes the ClusterQueue's 4 pods; team B's, started then, waits for quota
    (WaitingForQuota, Kueue's words, not ClusterFull or WorkersFailing) and is admitted as A's workers
    finish. Never more than 4 admitted, by one watch of every Workload in the cluster."""
    cluster_queue = kueuekit.cluster_queue(f"shared-{bed.namespace}", pods=QUOTA_PODS)
    cq_name = cluster_queue["metadata"]["name"]
    with _second_namespace(bed) as team_b, contextlib.ExitStack() as stack:
        queues = [
            kueuekit.local_queue(bed.namespace, "team-a", cq_name),
            kueuekit.local_queue(team_b.namespace, "team-b", cq_name),
        ]
        kueuekit.apply(bed.cluster, kueuekit.resource_flavor(), cluster_queue, *queues)
        stack.callback(kueuekit.delete, bed.cluster, *queues, cluster_queue)
        bed.wait_for("the ClusterQueue Active", lambda: kueuekit.active(bed.cluster, cq_name), timeout=60)
        recorder = bed.scheduler.Recorder(bed.cluster, "", "workloads").start()
        stack.callback(recorder.stop)
        stack.enter_context(bed.operator())
        stack.enter_context(team_b.operator())

        bed.create_campaign(_campaign(bed, "team-a-run", "team-a", shards=24, max_concurrency=6, latency=3.0))
        bed.wait_for(
            "team A's workers holding the whole quota",
            lambda: (
                len(
                    _admitted(
                        {w["metadata"]["name"]: w for w in kueuekit.workloads(bed.cluster, bed.namespace)},
                        cq_name,
                    )
                )
                == QUOTA_PODS
            ),
            timeout=120,
        )
        team_b.create_campaign(
            _campaign(team_b, "team-b-run", "team-b", shards=4, max_concurrency=2, latency=0.2)
        )

        def waiting() -> dict[str, Any] | None:
            found = team_b.condition(team_b.get_campaign("team-b-run"), "WaitingForQuota")
            return found if found and found["status"] == "True" and "Kueue:" in found["message"] else None

        said = bed.wait_for("team B's campaign to say it waits for quota", waiting, timeout=60)
        print("team B while A holds the quota:", said)
        assert said["reason"] == "QueuedByKueue"
        assert "in LocalQueue team-b" in said["message"] and "insufficient" in said["message"]
        b_status = team_b.get_campaign("team-b-run")
        for quiet in ("ClusterFull", "WorkersFailing"):
            assert (team_b.condition(b_status, quiet) or {}).get("status") != "True", b_status["status"]
        plan = _plan_text(team_b, "team-b-run")
        limited = next(line for line in plan.splitlines() if line.startswith("Limited by:"))
        assert limited.startswith("Limited by: WaitingForQuota: ") and "LocalQueue team-b" in limited, plan
        a_while_b_waits = bed.get_campaign("team-a-run")["status"]
        assert a_while_b_waits["phase"] not in {"Succeeded", "Completed"}, (
            "B waits while A's work is not done"
        )

        b_final = team_b.wait_phase("team-b-run", {"Succeeded", "Completed"}, timeout=300)
        a_final = bed.wait_phase("team-a-run", {"Succeeded", "Completed"}, timeout=300)
        assert (a_final["status"]["phase"], b_final["status"]["phase"]) == ("Succeeded", "Succeeded")
        after = team_b.condition(team_b.get_campaign("team-b-run"), "WaitingForQuota")
        assert after is not None and after["status"] == "False", after
        recorder.check()

        # One watch of every Workload: at no point more than the quota held, and the quota used whole.
        most = 0
        b_admitted_first: int | None = None
        a_finished_first: int | None = None
        for index, (seen, workloads) in enumerate(recorder.states()):
            held = _admitted(workloads, cq_name)
            most = max(most, len(held))
            namespace = seen.obj["metadata"]["namespace"]
            if namespace == team_b.namespace and b_admitted_first is None and seen.name in held:
                b_admitted_first = index
            finished = (kueuekit.condition(seen.obj, "Finished") or {}).get("status") == "True"
            if namespace == bed.namespace and finished and a_finished_first is None:
                a_finished_first = index
        seen_versions = len(recorder.events)
        print(f"most Workloads admitted at once: {most} (quota {QUOTA_PODS}); {seen_versions} versions seen")
        assert most == QUOTA_PODS
        assert b_admitted_first is not None and a_finished_first is not None
        assert a_finished_first < b_admitted_first, (
            "B was admitted only once one of A's workers gave its quota back"
        )


@pytest.mark.usefixtures("crds_installed", "local_cluster")
def test_a_queue_name_with_no_local_queue_names_the_field_and_the_fix(bed: Bed) -> None:
    with bed.operator():
        bed.create_campaign(_campaign(bed, "lost", "no-such-queue", shards=2, max_concurrency=1, latency=0.1))

        def told() -> dict[str, Any] | None:
            found = bed.condition(bed.get_campaign("lost"), "WaitingForQuota")
            return found if found and found["reason"] == "LocalQueueNotFound" else None

        said = bed.wait_for("the campaign to name its missing LocalQueue", told, timeout=60)
    assert said["status"] == "True"
    assert said["message"].startswith("spec.worker.queueName no-such-queue: no LocalQueue no-such-queue")
    assert "create it" in said["message"]


USER_GUIDE = Path(__file__).resolve().parents[1] / "docs" / "user-guide.md"
FENCED_YAML = re.compile(r"^```yaml\n(.*?)^```", re.S | re.M)


def _documented_kueue_objects() -> list[dict[str, Any]]:
    """The Kueue objects of the user guide's two-teams example, as written there."""
    found = []
    for block in FENCED_YAML.findall(USER_GUIDE.read_text()):
        documents = [d for d in yaml.safe_load_all(block) if d]
        found += [d for d in documents if str(d.get("apiVersion", "")).startswith("kueue.x-k8s.io/")]
    return found


@pytest.mark.usefixtures("local_cluster")
def test_the_user_guides_two_teams_in_a_cohort_are_accepted_by_kueue_and_become_active(bed: Bed) -> None:
    """Its manifests through Kueue's own webhooks: each team's namespace and ClusterQueue renamed for
    this test (ClusterQueues are cluster-wide), nothing else changed."""
    objects = _documented_kueue_objects()
    kinds = sorted(o["kind"] for o in objects)
    assert kinds == ["ClusterQueue", "ClusterQueue", "LocalQueue", "LocalQueue", "ResourceFlavor"], kinds
    with _second_namespace(bed) as team_b:
        namespaces = {"team-a": bed.namespace, "team-b": team_b.namespace}
        for obj in objects:
            if obj["kind"] == "LocalQueue":
                obj["metadata"]["namespace"] = namespaces[obj["metadata"]["namespace"]]
                obj["spec"]["clusterQueue"] = f"{bed.namespace}-{obj['spec']['clusterQueue']}"
            elif obj["kind"] == "ClusterQueue":
                obj["metadata"]["name"] = f"{bed.namespace}-{obj['metadata']['name']}"
        kueuekit.apply(bed.cluster, *objects)
        try:
            names = [o["metadata"]["name"] for o in objects if o["kind"] == "ClusterQueue"]
            bed.wait_for(
                "both teams' ClusterQueues Active", lambda: kueuekit.active(bed.cluster, *names), timeout=60
            )
            cohorts = {
                json.loads(bed.cluster.kubectl("get", "clusterqueue", n, "-o", "json").stdout)["spec"][
                    "cohortName"
                ]
                for n in names
            }
            assert cohorts == {"shared-pool"}
        finally:
            kueuekit.delete(bed.cluster, *[o for o in objects if o["kind"] != "ResourceFlavor"])
