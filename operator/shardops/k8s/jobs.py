"""Worker Jobs and their pods: list a campaign's, create one. The bodies are built in operator.builders."""

from __future__ import annotations

from typing import Any

from shardops.api.names import CAMPAIGN_LABEL, ROLE_LABEL
from shardops.k8s.api import JOBS, PODS, Kube

JSON = dict[str, Any]
WORKER_ROLE = "worker"


def worker_selector(campaign: str) -> str:
    return f"{CAMPAIGN_LABEL}={campaign},{ROLE_LABEL}={WORKER_ROLE}"


def list_workers(kube: Kube, namespace: str, campaign: str) -> list[JSON]:
    return kube.list(JOBS, namespace, label_selector=worker_selector(campaign))


def list_worker_pods(kube: Kube, namespace: str, campaign: str) -> list[JSON]:
    """Pods of the worker Jobs: the Job template carries the same labels."""
    return kube.list(PODS, namespace, label_selector=worker_selector(campaign))


def create(kube: Kube, namespace: str, body: JSON) -> JSON:
    return kube.create(JOBS, namespace, body)
