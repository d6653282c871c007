"""The local control plane is a real Kubernetes: CRDs, admission, the Job controller, pods as processes."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest
from kubernetes import client
from testbed.bed import Bed
from testbed.harness import Cluster

INVALID_SAMPLES = sorted((Bed.REPO_ROOT / "tests" / "data" / "invalid").glob("*.yaml"))


def _expectations(path: Path) -> list[str]:
    return [m.group(1).strip() for m in re.finditer(r"^#\s*expect:\s*(.+)$", path.read_text(), re.M)]


@pytest.mark.usefixtures("crds_installed")
@pytest.mark.parametrize(
    ("resource", "columns"),
    [
        ("shards", ["NAME", "CAMPAIGN", "PHASE", "ATTEMPT", "PROGRESS", "OWNER", "AGE"]),
        ("campaigns", ["NAME", "PHASE", "DONE/TOTAL", "RUNNING", "PENDING", "BLOCKED", "SPENT", "AGE"]),
    ],
)
def test_printer_columns_show_in_kubectl_get(bed: Bed, resource: str, columns: list[str]) -> None:
    for sample in sorted((bed.REPO_ROOT / "crds" / "samples").glob("*.yaml")):
        for obj in bed.objects_in(sample):
            obj["metadata"].pop("namespace", None)
            bed.cluster.kubectl("apply", "-n", bed.namespace, "-f", "-", stdin=bed.dump_json(obj))
    header = bed.cluster.kubectl("get", resource, "-n", bed.namespace).stdout.splitlines()[0].split()
    assert header == columns


@pytest.mark.usefixtures("crds_installed")
def test_short_names_and_category(bed: Bed) -> None:
    for args in (["get", "camp"], ["get", "shard"], ["get", "shardops"]):
        result = bed.cluster.kubectl(*args, "-n", bed.namespace, check=False)
        assert result.returncode == 0, result.stderr


@pytest.mark.usefixtures("crds_installed")
@pytest.mark.parametrize("sample", INVALID_SAMPLES, ids=lambda p: p.stem)
def test_invalid_samples_rejected_by_api_server(bed: Bed, sample: Path) -> None:
    expected = _expectations(sample)
    assert expected, f"{sample} has no '# expect:' line"
    result = bed.cluster.kubectl("create", "-n", bed.namespace, "-f", str(sample), check=False)
    assert result.returncode != 0, f"{sample.name} was accepted by the API server"
    for text in expected:
        assert text in result.stderr, (
            f"{sample.name}: {text!r} not in the API server's answer:\n{result.stderr}"
        )


@pytest.mark.usefixtures("crds_installed")
def test_the_crd_alone_refuses_edits_of_a_campaigns_inputs(bed: Bed) -> None:
    """The Campaign CRD's transition rules, no chart and no admission policy: once shards are cut,
    changing shardSize, the items or where they come from would skip or repeat items."""
    (campaign,) = bed.objects_in(bed.REPO_ROOT / "crds" / "samples" / "campaign-minimal.yaml")
    campaign["metadata"].pop("namespace", None)

    def apply(obj: dict[str, object]) -> subprocess.CompletedProcess[str]:
        return bed.cluster.kubectl(
            "apply", "-n", bed.namespace, "-f", "-", stdin=bed.dump_json(obj), check=False
        )

    assert apply(campaign).returncode == 0
    spec = campaign["spec"]
    edits = {
        "spec.shardSize": {**spec, "shardSize": 2},
        "spec.items": {**spec, "items": [*spec["items"], {"word": "delta"}]},
        "spec.itemsFrom": {
            **{k: v for k, v in spec.items() if k != "items"},
            "itemsFrom": {"configMapName": "words", "key": "items.jsonl"},
        },
    }
    for field, edited in edits.items():
        result = apply({**campaign, "spec": edited})
        assert result.returncode != 0, f"a change of {field} was accepted"
        assert f"{field} cannot change after the campaign is created" in result.stderr, result.stderr
        assert "delete the Campaign and apply it again, or apply it under a new name" in result.stderr
    # Everything else may change at any time, and the inputs as they were are accepted again.
    assert apply({**campaign, "spec": {**spec, "maxConcurrency": 2}}).returncode == 0
    stored = json.loads(
        bed.cluster.kubectl("get", "campaign", "minimal", "-n", bed.namespace, "-o", "json").stdout
    )
    assert stored["spec"]["maxConcurrency"] == 2 and stored["spec"]["items"] == spec["items"]


@pytest.mark.usefixtures("crds_installed")
def test_kubectl_explain_shows_field_descriptions(cluster: Cluster) -> None:
    result = cluster.kubectl("explain", "campaign.spec.maxConcurrency")
    assert "FIELD: maxConcurrency" in result.stdout or "maxConcurrency" in result.stdout
    description = result.stdout.split("DESCRIPTION:", 1)[1].strip()
    assert len(description) > 20, result.stdout


def _job(name: str, script: str) -> client.V1Job:
    return client.V1Job(
        metadata=client.V1ObjectMeta(name=name),
        spec=client.V1JobSpec(
            backoff_limit=0,
            template=client.V1PodTemplateSpec(
                spec=client.V1PodSpec(
                    restart_policy="Never",
                    termination_grace_period_seconds=5,
                    containers=[
                        client.V1Container(
                            name="main", image="python:3.11-slim", command=["python", "-c", script]
                        )
                    ],
                )
            ),
        ),
    )


def _job_condition(batch: client.BatchV1Api, namespace: str, name: str) -> str | None:
    job = batch.read_namespaced_job_status(name, namespace)
    for condition in job.status.conditions or []:
        if condition.type in ("Complete", "Failed") and condition.status == "True":
            return str(condition.type)
    return None


@pytest.mark.usefixtures("local_cluster")
def test_job_completes_through_the_job_controller(bed: Bed) -> None:
    batch = client.BatchV1Api(bed.cluster.api)
    batch.create_namespaced_job(
        bed.namespace,
        _job(
            "hello",
            "import os; print('hello from', os.environ['HOSTNAME'] if 'HOSTNAME' in os.environ else 'pod')",
        ),
    )
    assert (
        bed.wait_for("job hello to finish", lambda: _job_condition(batch, bed.namespace, "hello"))
        == "Complete"
    )
    job = batch.read_namespaced_job_status("hello", bed.namespace)
    assert job.status.succeeded == 1
    pods = (
        client.CoreV1Api(bed.cluster.api)
        .list_namespaced_pod(bed.namespace, label_selector="job-name=hello")
        .items
    )
    assert len(pods) == 1
    terminated = pods[0].status.container_statuses[0].state.terminated
    assert terminated.exit_code == 0 and terminated.finished_at is not None
    assert "hello from" in bed.cluster.pod_log(bed.namespace, pods[0].metadata.name, "main")


@pytest.mark.usefixtures("local_cluster")
def test_deleted_pod_gets_sigterm_and_job_records_failure(bed: Bed, tmp_path: Path) -> None:
    marker = tmp_path / f"sigterm-{uuid.uuid4().hex}"
    script = textwrap.dedent(
        f"""
        import os, signal, sys, time
        def on_term(signum, frame):
            # Written aside and renamed, so the test never sees a created-but-empty marker.
            with open({str(marker) + ".tmp"!r}, "w") as out:
                out.write("SIGTERM")
            os.rename({str(marker) + ".tmp"!r}, {str(marker)!r})
            sys.exit(143)
        signal.signal(signal.SIGTERM, on_term)
        print("ready", flush=True)
        time.sleep(300)
        """
    )
    core = client.CoreV1Api(bed.cluster.api)
    batch = client.BatchV1Api(bed.cluster.api)
    batch.create_namespaced_job(bed.namespace, _job("sleeper", script))

    def running_pod() -> str | None:
        for pod in core.list_namespaced_pod(bed.namespace, label_selector="job-name=sleeper").items:
            if "ready" in bed.cluster.pod_log(bed.namespace, pod.metadata.name, "main"):
                return str(pod.metadata.name)
        return None

    pod_name = bed.wait_for("the sleeper pod to run", running_pod)
    core.delete_namespaced_pod(pod_name, bed.namespace)
    bed.wait_for("the process to receive SIGTERM", marker.exists)
    assert marker.read_text() == "SIGTERM"
    assert (
        bed.wait_for("job sleeper to fail", lambda: _job_condition(batch, bed.namespace, "sleeper"))
        == "Failed"
    )
    assert batch.read_namespaced_job_status("sleeper", bed.namespace).status.failed == 1


@pytest.mark.usefixtures("local_cluster")
def test_deployment_pod_runs_through_process_kubelet(bed: Bed) -> None:
    apps = client.AppsV1Api(bed.cluster.api)
    labels = {"app": "idle"}
    apps.create_namespaced_deployment(
        bed.namespace,
        client.V1Deployment(
            metadata=client.V1ObjectMeta(name="idle"),
            spec=client.V1DeploymentSpec(
                replicas=1,
                selector=client.V1LabelSelector(match_labels=labels),
                template=client.V1PodTemplateSpec(
                    metadata=client.V1ObjectMeta(labels=labels),
                    spec=client.V1PodSpec(
                        termination_grace_period_seconds=2,
                        containers=[
                            client.V1Container(
                                name="main",
                                image="python:3.11-slim",
                                command=[sys.executable, "-c", "import time; time.sleep(3600)"],
                            )
                        ],
                    ),
                ),
            ),
        ),
    )
    bed.wait_for(
        "deployment idle to be available",
        lambda: (
            (apps.read_namespaced_deployment_status("idle", bed.namespace).status.available_replicas or 0)
            == 1
        ),
    )
