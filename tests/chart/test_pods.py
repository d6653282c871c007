"""Hardened pods: the chart's operator pod and the worker Jobs the operator creates.

One rule for both (`testbed.kits.chart.restricted_violations`): the "restricted" Pod Security Standard
plus a read-only root filesystem. The e2e tests run the same pods in namespaces that enforce the
standard, where the API server refuses a pod that breaks it.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from testbed.kits.chart import restricted_violations

from shardops.api.campaign import Campaign

HARDENED: dict[str, Any] = {
    "securityContext": {
        "runAsNonRoot": True,
        "runAsUser": 65532,
        "seccompProfile": {"type": "RuntimeDefault"},
    },
    "containers": [
        {
            "name": "main",
            "securityContext": {
                "allowPrivilegeEscalation": False,
                "readOnlyRootFilesystem": True,
                "capabilities": {"drop": ["ALL"]},
            },
        }
    ],
}


def test_a_hardened_spec_passes() -> None:
    assert restricted_violations(HARDENED) == []


@pytest.mark.parametrize(
    ("path", "value", "problem"),
    [
        (("securityContext", "runAsNonRoot"), False, "runAsNonRoot is not true"),
        (("securityContext", "runAsUser"), 0, "runAsUser is 0"),
        (("securityContext", "seccompProfile"), {"type": "Unconfined"}, "seccompProfile.type"),
        (("container", "allowPrivilegeEscalation"), True, "allowPrivilegeEscalation is not false"),
        (("container", "readOnlyRootFilesystem"), False, "readOnlyRootFilesystem is not true"),
        (("container", "capabilities"), {"drop": ["NET_RAW"]}, "capabilities.drop does not contain ALL"),
        (("container", "capabilities"), {"drop": ["ALL"], "add": ["NET_ADMIN"]}, "capabilities.add"),
        (("container", "privileged"), True, "privileged"),
    ],
)
def test_each_weakening_is_reported(path: tuple[str, str], value: Any, problem: str) -> None:
    spec = copy.deepcopy(HARDENED)
    where, key = path
    target = (
        spec["securityContext"] if where == "securityContext" else spec["containers"][0]["securityContext"]
    )
    target[key] = value
    problems = restricted_violations(spec)
    assert any(problem in p for p in problems), problems


def test_container_settings_override_the_pods() -> None:
    spec = copy.deepcopy(HARDENED)
    spec["containers"][0]["securityContext"]["runAsNonRoot"] = False
    assert restricted_violations(spec) == ["main: runAsNonRoot is not true"]


def _worker_job() -> dict[str, Any]:
    from shardops.scheduler.builders import worker_job_body

    campaign = Campaign.parse(
        {
            "apiVersion": "shardops.dev/v1alpha1",
            "kind": "Campaign",
            "metadata": {"name": "demo", "namespace": "team-a", "uid": "0000-1111"},
            "spec": {"items": [{"n": 1}], "worker": {"image": "example/agent:1", "command": ["agent"]}},
        }
    )
    job: dict[str, Any] = worker_job_body(campaign, campaign.spec.worker)
    return job


def test_worker_jobs_run_as_the_worker_service_account_with_its_token() -> None:
    pod = _worker_job()["spec"]["template"]["spec"]
    # The chart's worker ServiceAccount turns automounting off; the worker needs its token.
    assert pod["automountServiceAccountToken"] is True
    assert pod["serviceAccountName"] == "shardops-worker"


def test_worker_jobs_are_hardened_like_the_operator() -> None:
    pod = _worker_job()["spec"]["template"]["spec"]
    assert restricted_violations(pod) == []
    # A read-only root filesystem needs somewhere to write the items, results and error files.
    (container,) = pod["containers"]
    assert {"name": "tmp", "mountPath": "/tmp"} in container.get("volumeMounts", [])
    assert any(v.get("name") == "tmp" and "emptyDir" in v for v in pod.get("volumes", []))
