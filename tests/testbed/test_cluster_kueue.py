"""testbed/cluster/kueue.py: which of Kueue's webhooks the local control plane registers, and how."""

from __future__ import annotations

import base64
from pathlib import Path

import yaml
from testbed.cluster import kueue
from testbed.cluster import pki as pki_mod


def _webhook(name: str, group: str, resource: str, path: str) -> dict[str, object]:
    return {
        "name": name,
        "admissionReviewVersions": ["v1"],
        "clientConfig": {"service": {"name": "webhook-service", "namespace": "system", "path": path}},
        "failurePolicy": "Fail",
        "rules": [
            {"apiGroups": [group], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": [resource]}
        ],
        "sideEffects": "None",
    }


def _module(tmp_path: Path) -> Path:
    manifests = tmp_path / "config" / "components" / "webhook" / "manifests.yaml"
    manifests.parent.mkdir(parents=True)
    documents = [
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": kind,
            "metadata": {"name": "upstream-name"},
            "webhooks": [
                _webhook(f"{prefix}job.kb.io", "batch", "jobs", f"/{prefix}-batch-v1-job"),
                _webhook(f"{prefix}pod.kb.io", "", "pods", f"/{prefix}--v1-pod"),
                _webhook(f"{prefix}deployment.kb.io", "apps", "deployments", f"/{prefix}-apps-v1-deployment"),
                _webhook(f"{prefix}cq.kb.io", "kueue.x-k8s.io", "clusterqueues", f"/{prefix}-cq"),
            ],
        }
        for kind, prefix in (
            ("MutatingWebhookConfiguration", "mutate"),
            ("ValidatingWebhookConfiguration", "validate"),
        )
    ]
    manifests.write_text(yaml.safe_dump_all(documents))
    return tmp_path


def test_only_the_job_and_kueue_webhooks_are_registered_each_at_its_loopback_url(tmp_path: Path) -> None:
    ca = _ca(tmp_path)
    found = kueue.webhook_configurations(_module(tmp_path), 40123, ca)
    assert [c["metadata"]["name"] for c in found] == ["kueue-mutating-webhooks", "kueue-validating-webhooks"]
    mutating = found[0]["webhooks"]
    # Pods and Deployments: integrations not enabled, nothing would serve them and they fail closed.
    assert [w["name"] for w in mutating] == ["mutatejob.kb.io", "mutatecq.kb.io"]
    assert mutating[0]["clientConfig"] == {
        "url": "https://127.0.0.1:40123/mutate-batch-v1-job",
        "caBundle": base64.b64encode(ca.read_bytes()).decode(),
    }


def test_the_job_webhooks_see_only_jobs_labelled_with_a_queue(tmp_path: Path) -> None:
    found = kueue.webhook_configurations(_module(tmp_path), 40123, _ca(tmp_path))
    for configuration in found:
        by_name = {w["name"]: w for w in configuration["webhooks"]}
        job = next(w for name, w in by_name.items() if name.endswith("job.kb.io"))
        assert job["objectSelector"] == {
            "matchExpressions": [{"key": "kueue.x-k8s.io/queue-name", "operator": "Exists"}]
        }
        cluster_queue = next(w for name, w in by_name.items() if name.endswith("cq.kb.io"))
        assert "objectSelector" not in cluster_queue


def _ca(tmp_path: Path) -> Path:
    ca = tmp_path / "ca.crt"
    ca.write_bytes(b"CA")
    return ca


def test_the_configuration_manages_only_labelled_jobs_and_listens_on_loopback(tmp_path: Path) -> None:
    config = kueue.configuration(webhook_port=1, health_port=2, cert_dir=tmp_path)
    assert config["manageJobsWithoutQueueName"] is False
    assert config["integrations"] == {"frameworks": ["batch/job"]}
    assert config["webhook"]["host"] == "127.0.0.1"
    assert config["health"]["healthProbeBindAddress"] == "127.0.0.1:2"


def test_the_metrics_certificate_kueue_insists_on_is_written_once_and_kept(tmp_path: Path) -> None:
    pki = pki_mod.generate(tmp_path / "pki")
    where = tmp_path / "etc" / "certs"
    kueue.ensure_metrics_cert(pki, where)
    assert (where / "tls.crt").read_bytes() == pki.webhook_cert.read_bytes()
    (where / "tls.crt").write_bytes(b"another cluster's")
    kueue.ensure_metrics_cert(pki, where)
    assert (where / "tls.crt").read_bytes() == b"another cluster's", "one there is kept"
    assert sorted(p.name for p in where.iterdir()) == ["tls.crt", "tls.key"]
