"""Worker Jobs and their pods: list a campaign's, create one. The bodies are built in operator.builders."""

from __future__ import annotations

from collections.abc import Sequence

from shardops.api.common import JSON, controller_uid
from shardops.api.names import CAMPAIGN_LABEL, ROLE_LABEL
from shardops.k8s.api import JOBS, PODS, AlreadyExists, KubeClient, Resource

WORKER_ROLE = "worker"
# core/v1 Events: what the Job controller records (FailedCreate) when a Job's pod is refused.
CORE_EVENTS = Resource("", "v1", "events")


def worker_selector(campaign: str) -> str:
    return f"{CAMPAIGN_LABEL}={campaign},{ROLE_LABEL}={WORKER_ROLE}"


def list_workers(kube: KubeClient, namespace: str, campaign: str) -> list[JSON]:
    return kube.list(JOBS, namespace, label_selector=worker_selector(campaign))


def list_worker_pods(kube: KubeClient, namespace: str, campaign: str) -> list[JSON]:
    """Pods of the worker Jobs: the Job template carries the same labels."""
    return kube.list(PODS, namespace, label_selector=worker_selector(campaign))


def create(kube: KubeClient, namespace: str, body: JSON) -> JSON:
    """Create the worker Job `body` names (its name is fixed before the create, never generated).

    A create whose answer was lost and that was sent again (`k8s.api` repeats named creates after
    a 5xx), or the same create by another operator process, finds the Job made: AlreadyExists from
    a Job with the same controller is that Job, returned as made. AlreadyExists from another
    owner's Job (a deleted campaign's of the same name) is raised: that name is taken."""
    try:
        return kube.create(JOBS, namespace, body)
    except AlreadyExists:
        # Listed by name, not read: the operator's role lists and creates Jobs, nothing more.
        name = body["metadata"]["name"]
        found = kube.list(JOBS, namespace, fieldSelector=f"metadata.name={name}")
        mine = [j for j in found if controller_uid(j.get("metadata")) == controller_uid(body.get("metadata"))]
        if not mine:
            raise
        return mine[0]


def failed_creates(kube: KubeClient, namespace: str, job_names: Sequence[str]) -> dict[str, str]:
    """Job name -> the message of the Job controller's newest FailedCreate Event for it (a quota with
    no room, an admission policy refusing the pod), for the Jobs that have one. One list per Job
    named: the caller names only alive Jobs that got no pod (`state.workers.podless_jobs`), at most
    maxConcurrency and none while every worker has its pod."""
    found: dict[str, str] = {}
    for name in job_names:
        events = kube.list(
            CORE_EVENTS,
            namespace,
            fieldSelector=f"involvedObject.kind=Job,involvedObject.name={name},reason=FailedCreate",
        )
        if events:
            newest = max(events, key=lambda e: str(e.get("lastTimestamp") or e.get("eventTime") or ""))
            found[name] = str(newest.get("message") or "FailedCreate")
    return found
